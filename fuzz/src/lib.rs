//! What the fuzz targets share: a family from the registry, driven
//! through the byte contract by operations decoded from libFuzzer's bytes
//! and compared, answer by answer, with a model
//! (`bpfmaps::conformance::Harness`); and, for the stack trace map, whose
//! stacks only `get_stackid` stores, a model of the kernel's algorithm.
//!
//! Any difference panics, which libFuzzer reports as a crash with the
//! input that caused it.

use std::collections::BTreeMap;

use bpfmaps::conformance::{Harness, Op, SIZES};
use bpfmaps::registry::family;
use bpfmaps::stackmap::{BPF_F_SKIP_FIELD_MASK, BPF_F_USER_STACK, StackTraceMap};
use bpfmaps::{BPF_F_FAST_STACK_CMP, BPF_F_REUSE_STACKID, Error, Map, MapType};

/// Runs the operations `data` encodes on a new map of `map_type`: the
/// first byte picks `max_entries` (1 to 32, its low five bits) and the
/// key and value sizes (its top three, one of `conformance::SIZES`), the
/// second the creation flags and hash (`conformance::spec_varied`; a
/// spec the family refuses is built without its flags), the rest are
/// operations.
pub fn run(map_type: MapType, data: &[u8]) {
    let [first, build, ref ops @ ..] = *data else {
        return;
    };
    let mut ops = ops;
    let family = family(map_type).expect("a registered family");
    let max_entries = u32::from(first % 32) + 1;
    let sizes = SIZES[usize::from(first >> 5)];
    let mut harness = Harness::varied(family, max_entries, sizes, build)
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a family with a model");
    while let Some(op) = Op::decode(&mut ops) {
        harness.apply(op).unwrap_or_else(|e| panic!("{e}"));
    }
    harness
        .check()
        .unwrap_or_else(|e| panic!("at the end: {e}"));
}

/// The stack trace map: `get_stackid` with fuzzed frames and flags, and
/// lookups, deletes and iteration through the byte contract, against a
/// model of the kernel's `__bpf_get_stackid`.
pub fn run_stack_trace(data: &[u8]) {
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let max_depth = u32::from(first % 4) + 1;
    let max_entries = u32::from(first >> 2 & 7) + 1;
    let map = StackTraceMap::new(max_depth, max_entries).expect("valid sizes");
    let buckets = map.bucket_count();
    // Bucket id -> (full hash, frames).
    let mut model: BTreeMap<u32, (u32, Vec<u64>)> = BTreeMap::new();
    let mut take = || -> Option<u8> {
        let (&b, r) = rest.split_first()?;
        rest = r;
        Some(b)
    };
    while let Some(tag) = take() {
        let Some(arg) = take() else { break };
        match tag % 4 {
            0 | 1 => {
                // Frames from a small alphabet, so stacks repeat and collide.
                let n = usize::from(arg % 6);
                let frames: Vec<u64> = (0..n)
                    .map(|i| u64::from(take().unwrap_or(i as u8) % 5) << 12)
                    .collect();
                let flags = match take().unwrap_or(0) % 8 {
                    0..=3 => 0,
                    4 => BPF_F_REUSE_STACKID,
                    5 => BPF_F_FAST_STACK_CMP,
                    6 => 1, // skip one frame
                    _ => 1 << 20,
                } | if arg & 0x80 != 0 { BPF_F_USER_STACK } else { 0 };
                let want =
                    model_get_stackid(&map, &mut model, buckets, max_entries, &frames, flags);
                let got = map.get_stackid(&frames, flags);
                assert_eq!(
                    errno(&got),
                    errno(&want),
                    "get_stackid({frames:?}, {flags:#x})"
                );
                if let (Ok(g), Ok(w)) = (got, want) {
                    assert_eq!(g, w, "get_stackid({frames:?}, {flags:#x})");
                }
            }
            2 => {
                let id = u32::from(arg) % (buckets + 2);
                let mut value = vec![0u8; map.value_size()];
                let got = if arg & 1 == 0 {
                    map.lookup(&id.to_ne_bytes(), &mut value)
                } else {
                    map.lookup_and_delete(&id.to_ne_bytes(), &mut value)
                };
                let want = model.get(&id).map(|(_, frames)| frames.clone());
                match (got, want) {
                    (Ok(()), Some(frames)) => {
                        let mut padded: Vec<u8> =
                            frames.iter().flat_map(|f| f.to_ne_bytes()).collect();
                        padded.resize(map.value_size(), 0);
                        assert_eq!(value, padded, "lookup({id})");
                        if arg & 1 == 1 {
                            model.remove(&id);
                        }
                    }
                    (Err(Error::NotFound), None) => {}
                    (got, want) => panic!("lookup({id}): map {got:?}, model {want:?}"),
                }
            }
            _ => {
                let id = u32::from(arg) % (buckets + 2);
                let got = map.delete(&id.to_ne_bytes());
                let want = if id >= buckets {
                    Err(Error::Full)
                } else {
                    model.remove(&id).map(drop).ok_or(Error::NotFound)
                };
                assert_eq!(got, want, "delete({id})");
            }
        }
        assert_eq!(map.len(), model.len(), "len");
        let mut ids = Vec::new();
        let mut next = [0u8; 4];
        let mut prev: Option<[u8; 4]> = None;
        while map
            .get_next_key(prev.as_ref().map(|p| &p[..]), &mut next)
            .is_ok()
        {
            ids.push(u32::from_ne_bytes(next));
            prev = Some(next);
        }
        assert_eq!(ids, model.keys().copied().collect::<Vec<_>>(), "iteration");
    }
}

/// The kernel's `__bpf_get_stackid` on the model.
fn model_get_stackid(
    map: &StackTraceMap,
    model: &mut BTreeMap<u32, (u32, Vec<u64>)>,
    buckets: u32,
    max_entries: u32,
    frames: &[u64],
    flags: u64,
) -> bpfmaps::Result<u32> {
    let known =
        BPF_F_SKIP_FIELD_MASK | BPF_F_USER_STACK | BPF_F_FAST_STACK_CMP | BPF_F_REUSE_STACKID;
    if flags & !known != 0 {
        return Err(Error::invalid("flags"));
    }
    let skip = (flags & BPF_F_SKIP_FIELD_MASK) as usize;
    if frames.len() <= skip {
        return Err(Error::invalid("no frames"));
    }
    let ips = &frames[skip..];
    let ips = &ips[..ips.len().min(map.max_depth() as usize)];
    let hash = map.stack_hash(ips);
    let id = hash & (buckets - 1);
    match model.get(&id) {
        Some((h, old)) if *h == hash && (flags & BPF_F_FAST_STACK_CMP != 0 || old == ips) => Ok(id),
        Some(_) if flags & BPF_F_REUSE_STACKID == 0 => Err(Error::Exists),
        Some(_) => {
            model.insert(id, (hash, ips.to_vec()));
            Ok(id)
        }
        None if model.len() >= max_entries as usize => Err(Error::NoMemory),
        None => {
            model.insert(id, (hash, ips.to_vec()));
            Ok(id)
        }
    }
}

fn errno<T>(r: &bpfmaps::Result<T>) -> i32 {
    r.as_ref().map_or_else(Error::errno, |_| 0)
}

/// Runs the operations `data` encodes on a `MapleTree` and a model (the
/// ranges as a sorted vector), comparing every answer: stores that cut
/// ranges, inserts, erases, loads, gap searches both ways and walks; with
/// the opcode's top bit, writes in place (`exclusive`), `get_mut`,
/// `for_each_mut` and `dup`. An
/// index is one byte: below 0x80 a small index, else one near `u64::MAX`,
/// so ranges collide and touch both ends of the space.
pub fn run_maple(data: &[u8]) {
    use bpfmaps::maple::MapleTree;

    fn index(b: u8) -> u64 {
        if b < 0x80 {
            u64::from(b)
        } else {
            u64::MAX - u64::from(b - 0x80)
        }
    }
    /// The model's store: `value` over `first..=last` (`None`: erase).
    fn store(model: &mut Vec<(u64, u64, u8)>, first: u64, last: u64, value: Option<u8>) {
        let mut out = Vec::new();
        for &(f, l, v) in model.iter() {
            if l < first || f > last {
                out.push((f, l, v));
                continue;
            }
            if f < first {
                out.push((f, first - 1, v));
            }
            if l > last {
                out.push((last + 1, l, v));
            }
        }
        out.extend(value.map(|v| (first, last, v)));
        out.sort();
        *model = out;
    }
    fn empty_area(
        model: &[(u64, u64, u8)],
        min: u64,
        max: u64,
        size: u64,
        rev: bool,
    ) -> Option<u64> {
        let mut runs = Vec::new();
        let mut next = Some(0u64);
        for &(f, l, _) in model {
            if let Some(n) = next.filter(|&n| f > n) {
                runs.push((n, f - 1));
            }
            next = l.checked_add(1);
        }
        runs.extend(next.map(|n| (n, u64::MAX)));
        let fit = |&(a, b): &(u64, u64)| {
            let (lo, hi) = (a.max(min), b.min(max));
            (lo <= hi && hi - lo >= size - 1).then(|| if rev { hi - (size - 1) } else { lo })
        };
        if rev {
            runs.iter().rev().find_map(fit)
        } else {
            runs.iter().find_map(fit)
        }
    }

    let mut tree = MapleTree::new();
    let mut model: Vec<(u64, u64, u8)> = Vec::new();
    for op in data.chunks_exact(4) {
        let (a, b, v) = (index(op[1]), index(op[2]), op[3]);
        let (lo, hi) = (a.min(b), a.max(b));
        // The top bit of the opcode sends a write through `exclusive`
        // (in place where it fits its leaf).
        let in_place = op[0] & 0x80 != 0;
        let guard = bpfmaps::pin();
        match (op[0] & 0x7f) % 7 {
            0 => {
                if in_place {
                    tree.exclusive().store_range(lo, hi, v).unwrap();
                } else {
                    tree.store_range(lo, hi, v).unwrap();
                }
                store(&mut model, lo, hi, Some(v));
            }
            1 => {
                let free = model.iter().all(|r| r.1 < lo || r.0 > hi);
                let got = if in_place {
                    tree.exclusive().insert_range(lo, hi, v)
                } else {
                    tree.insert_range(lo, hi, v)
                };
                assert_eq!(got.is_ok(), free);
                if free {
                    store(&mut model, lo, hi, Some(v));
                }
            }
            2 => {
                let want = model.iter().copied().find(|r| r.0 <= a && a <= r.1);
                let got = if in_place {
                    tree.exclusive().erase(a)
                } else {
                    tree.erase(a)
                };
                let got = got.map(|(r, v)| (*r.start(), *r.end(), v));
                assert_eq!(got, want);
                if let Some((f, l, _)) = want {
                    store(&mut model, f, l, None);
                }
            }
            6 => {
                let want = if in_place {
                    model.iter().rev().copied().find(|r| r.0 <= hi && r.1 >= lo)
                } else {
                    model.iter().copied().find(|r| r.1 >= lo && r.0 <= hi)
                };
                let got = if in_place {
                    tree.find_rev(hi, lo, &guard)
                } else {
                    tree.find(lo, hi, &guard)
                };
                assert_eq!(got.map(|e| (e.first, e.last, *e.value)), want);
                if !in_place {
                    let got = tree.find_cloned(lo, hi);
                    assert_eq!(got.map(|(r, value)| (*r.start(), *r.end(), value)), want);
                }
            }
            3 if in_place => {
                // `get_mut`: the range holding `a`, its value set to `v`.
                let want = model.iter().position(|r| r.0 <= a && a <= r.1);
                let mut ex = tree.exclusive();
                let got = ex.get_mut(a).map(|(r, value)| {
                    let old = *value;
                    *value = v;
                    (*r.start(), *r.end(), old)
                });
                assert_eq!(got, want.map(|k| model[k]));
                if let Some(k) = want {
                    model[k].2 = v;
                }
            }
            3 => {
                let want = model.iter().copied().find(|r| r.0 <= a && a <= r.1);
                let got = tree.load(a, &guard).map(|e| (e.first, e.last, *e.value));
                assert_eq!(got, want);
                let got = tree.get(a).map(|(r, value)| (*r.start(), *r.end(), value));
                assert_eq!(got, want);
                // A cursor's walk to `a` (straight down, its path not yet
                // recorded), then a step off it: after a hit, to either
                // side of the range; after a miss, to either side of the
                // free run `a` is in.
                let mut cursor = tree.cursor(&guard);
                let got = cursor.load(a).map(|e| (e.first, e.last, *e.value));
                assert_eq!(got, want);
                let after = model.iter().position(|r| r.0 > a).unwrap_or(model.len());
                let before = after - usize::from(want.is_some());
                let (got, want) = if v & 1 == 0 {
                    (cursor.next(), model.get(after).copied())
                } else {
                    (cursor.prev(), before.checked_sub(1).map(|i| model[i]))
                };
                assert_eq!(got.map(|e| (e.first, e.last, *e.value)), want);
            }
            4 if in_place && v & 0x40 != 0 => {
                // `dup`: the copy holds the model's ranges, and goes on
                // in the original's place (the original dropped, under a
                // reader's guard).
                let copy = tree.dup();
                let copied: Vec<_> = copy
                    .iter(&guard)
                    .map(|e| (e.first, e.last, *e.value))
                    .collect();
                assert_eq!(copied, model);
                tree = copy;
            }
            4 => {
                let size = u64::from(v % 16) + 1;
                if hi - lo >= size - 1 {
                    let rev = v & 0x80 != 0;
                    let got = if rev {
                        tree.empty_area_rev(lo, hi, size, &guard)
                    } else {
                        tree.empty_area(lo, hi, size, &guard)
                    };
                    assert_eq!(got.ok(), empty_area(&model, lo, hi, size, rev));
                }
            }
            _ if in_place => {
                // `for_each_mut`: every range in order, those meeting
                // `lo..=hi` given `v` more.
                let mut seen = Vec::new();
                tree.exclusive().for_each_mut(|r, value| {
                    seen.push((*r.start(), *r.end(), *value));
                    if *r.end() >= lo && *r.start() <= hi {
                        *value = value.wrapping_add(v);
                    }
                });
                assert_eq!(seen, model);
                for r in model.iter_mut().filter(|r| r.1 >= lo && r.0 <= hi) {
                    r.2 = r.2.wrapping_add(v);
                }
            }
            _ => {
                let want: Vec<_> = model
                    .iter()
                    .copied()
                    .filter(|r| r.1 >= lo && r.0 <= hi)
                    .collect();
                let mut got: Vec<_> = if v & 1 == 0 {
                    tree.range(lo..=hi, &guard)
                        .map(|e| (e.first, e.last, *e.value))
                        .collect()
                } else {
                    tree.range(lo..=hi, &guard)
                        .rev()
                        .map(|e| (e.first, e.last, *e.value))
                        .collect()
                };
                if v & 1 == 1 {
                    got.reverse();
                }
                assert_eq!(got, want);
            }
        }
        assert_eq!(tree.len(), model.len());
    }
    let all: Vec<_> = tree
        .iter(&bpfmaps::pin())
        .map(|e| (e.first, e.last, *e.value))
        .collect();
    assert_eq!(all, model);
}

/// Runs the operations `data` encodes on a `WildcardMap` and the
/// brute-force classifier, comparing every answer. The first bytes pick
/// a schema (1 to 4 fields of every kind and of 1, 2, 4 or 16 bytes) and a
/// collision limit (1 to 4, so tables split often) or the map `new` makes
/// (the prefix engine for one prefix field); then each 6-byte op
/// inserts (with a flag), removes or classifies. A field's value is one
/// byte spread over the field's top and bottom bits, so rules and packets
/// meet; a prefix length is one of a few, ranges are short.
pub fn run_wildcard(data: &[u8]) {
    use bpfmaps::wildcard::{BruteForce, Field, Rule, Schema, WildcardMap};

    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Some((&limit, rest)) = rest.split_first() else {
        return;
    };
    let n = 1 + usize::from(head % 4);
    let Some((kinds, ops)) = rest.split_at_checked(n) else {
        return;
    };
    let fields: Vec<Field> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let name = format!("f{i}");
            // The common sizes, and others that each way of reading a
            // key's field takes (under 4 bytes, 4 to 7, 8 or more).
            let size = [1, 2, 4, 16, 3, 6, 8, 13][usize::from(k >> 2) % 8];
            match k % 4 {
                0 => Field::prefix(&name, size),
                1 => Field::range(&name, size.min(8)),
                2 => Field::exact(&name, size),
                _ => Field::wildcard(&name, size),
            }
        })
        .collect();
    let schema = Schema::new(fields).unwrap();
    let value =
        |f: &Field, b: u8| -> u128 { (u128::from(b >> 4) << (f.bits() - 4)) | u128::from(b & 0xf) };
    let rule = |prio: u8, bytes: &[u8]| -> Rule {
        let mut r = schema.rule(u32::from(prio % 8));
        for (i, f) in schema.fields().iter().enumerate() {
            let b = bytes[i % bytes.len()].rotate_left(i as u32);
            let v = value(f, b);
            r = match f.kind {
                bpfmaps::wildcard::FieldKind::Prefix => {
                    let len = [0, 1, 4, f.bits() - 1, f.bits()][usize::from(b % 5)];
                    r.prefix(&f.name, v, len)
                }
                bpfmaps::wildcard::FieldKind::Range => {
                    r.range(&f.name, v, (v + u128::from(b % 7)).min(f.max()))
                }
                _ => r.exact(&f.name, v),
            };
        }
        r.build().unwrap()
    };
    // A limit byte of 0 takes the map `new` makes (for a schema of one
    // prefix field, the prefix engine rather than TupleMerge).
    let map = match limit % 5 {
        0 => WildcardMap::new(schema.clone(), 2, 64),
        l => WildcardMap::with_collision_limit(schema.clone(), 2, 64, usize::from(l)),
    }
    .unwrap();
    let mut oracle = BruteForce::new();
    // The last packets classified, classified again together.
    let mut recent = Vec::new();
    let mut taken = Vec::new();
    for (step, op) in ops.chunks_exact(6).enumerate() {
        let val = (step as u16).to_ne_bytes();
        match op[0] % 4 {
            0 | 1 if op[0] & 0x40 != 0 => {
                // A load of three rules (maybe the same one twice): all
                // or nothing, as inserts in turn would check them.
                let batch = [
                    rule(op[1], &op[2..]),
                    rule(op[1].wrapping_add(op[5] % 2), &op[3..]),
                    rule(op[1].wrapping_add(2), &op[4..]),
                ];
                let flags = u64::from(op[0] >> 2) % 3;
                let mut given = std::collections::BTreeMap::new();
                let mut ok = true;
                for r in &batch {
                    ok &= given.insert(r.clone(), ()).is_none() || flags != 1;
                }
                for r in given.keys() {
                    ok &= match (flags, oracle.get(r).is_some()) {
                        (1, true) | (2, false) => false,
                        _ => true,
                    };
                }
                let fresh = given.keys().filter(|r| oracle.get(r).is_none()).count();
                ok &= oracle.len() + fresh <= 64;
                let loaded = map.load(batch.iter().map(|r| (r, val)), flags);
                assert_eq!(loaded.is_ok(), ok, "{batch:?} flags {flags}");
                if ok {
                    for r in given.into_keys() {
                        oracle.insert(r, &val);
                    }
                }
            }
            0 | 1 => {
                let r = rule(op[1], &op[2..]);
                let flags = u64::from(op[0] >> 2) % 3;
                let there = oracle.get(&r).is_some();
                let ok = match (flags, there) {
                    (1, true) | (2, false) => false,
                    (_, false) => oracle.len() < 64,
                    _ => true,
                };
                assert_eq!(
                    map.insert(&r, &val, flags).is_ok(),
                    ok,
                    "{r:?} flags {flags}"
                );
                if ok {
                    oracle.insert(r, &val);
                }
            }
            2 if op[0] & 0x40 != 0 && !taken.is_empty() => {
                // A rule taken out before, put back (it keeps the exit
                // bound a load gave it).
                let r: Rule = taken.swap_remove(usize::from(op[1]) % taken.len());
                let ok = oracle.get(&r).is_none() && oracle.len() < 64;
                assert_eq!(map.insert(&r, &val, 1).is_ok(), ok, "{r:?} put back");
                if ok {
                    oracle.insert(r, &val);
                }
            }
            2 => {
                let r = rule(op[1], &op[2..]);
                let gone = map.take(&r).ok();
                assert_eq!(gone, oracle.remove(&r));
                if gone.is_some() {
                    taken.push(r);
                }
            }
            _ => {
                let values: Vec<u128> = schema
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(i, f)| value(f, op[1 + i % 5].rotate_left(i as u32)))
                    .collect();
                let p = schema.packet(&values).unwrap();
                let guard = bpfmaps::pin();
                let got = map
                    .classify(&p, &guard)
                    .map(|(r, v)| (r.clone(), v.to_vec()));
                let want = oracle.classify(&p).map(|(r, v)| (r.clone(), v.to_vec()));
                assert_eq!(got, want, "{p:?}");
                let by_key = map
                    .classify_key(&schema.packet_key(&p), &guard)
                    .expect("a key of the schema's size")
                    .map(|(r, v)| (r.clone(), v.to_vec()));
                assert_eq!(by_key, want, "{p:?} by its key");
                let value_by_key = map
                    .classify_key_as::<[u8; 2]>(&schema.packet_key(&p), &guard)
                    .expect("a key of the schema's size");
                let want_value = want.as_ref().map(|(_, v)| [v[0], v[1]]);
                assert_eq!(value_by_key, want_value, "{p:?}'s value by its key");
                // `classify_many`'s pipeline over the last packets.
                recent.push(p);
                if recent.len() > 4 {
                    recent.remove(0);
                }
                let mut out = vec![None; recent.len()];
                map.classify_many(&recent, &guard, &mut out)
                    .expect("room for each answer");
                // And by their keys, back to back.
                let keys: Vec<u8> = recent.iter().flat_map(|q| schema.packet_key(q)).collect();
                let mut by_keys = vec![None; recent.len()];
                map.classify_many_keys(&keys, &guard, &mut by_keys)
                    .expect("whole keys and room for each answer");
                assert!(by_keys == out, "a batch by keys");
                for (q, got) in recent.iter().zip(out) {
                    let want = oracle.classify(q).map(|(r, v)| (r.clone(), v.to_vec()));
                    let got = got.map(|(r, v)| (r.clone(), v.to_vec()));
                    assert_eq!(got, want, "{q:?} in a batch");
                }
            }
        }
        assert_eq!(map.len(), oracle.len());
    }
    let want: Vec<_> = oracle
        .iter()
        .map(|(r, v)| (r.clone(), v.to_vec()))
        .collect();
    assert_eq!(map.rules(), want);
}

//! What the fuzz targets share: a family from the registry, driven
//! through the byte contract by operations decoded from libFuzzer's bytes
//! and compared, answer by answer, with a model
//! (`bpfmaps::conformance::Harness`); and, for the stack trace map, whose
//! stacks only `get_stackid` stores, a model of the kernel's algorithm.
//!
//! Any difference panics, which libFuzzer reports as a crash with the
//! input that caused it.

use std::collections::BTreeMap;

use bpfmaps::conformance::{Harness, Op};
use bpfmaps::registry::family;
use bpfmaps::stackmap::{BPF_F_SKIP_FIELD_MASK, BPF_F_USER_STACK, StackTraceMap};
use bpfmaps::{BPF_F_FAST_STACK_CMP, BPF_F_REUSE_STACKID, Error, Map, MapType};

/// Runs the operations `data` encodes on a new map of `map_type`: the
/// first byte picks `max_entries` (1 to 32), the rest are operations.
pub fn run(map_type: MapType, data: &[u8]) {
    let Some((&first, mut ops)) = data.split_first() else {
        return;
    };
    let family = family(map_type).expect("a registered family");
    let max_entries = u32::from(first % 32) + 1;
    let mut harness = Harness::new(family, max_entries)
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

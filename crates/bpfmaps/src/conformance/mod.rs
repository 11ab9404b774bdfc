//! The contract tests every registered family passes, written once over
//! `&dyn Map` (papaya's `tests/common.rs`, fanf2/qp's one `test.c` for
//! every variant): a family added to [`registry::FAMILIES`] inherits all
//! of them.
//!
//! [`check_family`] runs, on maps the family's declaration says it can
//! build:
//! 1. creation: every flag bit, extra bit and size the family did not
//!    declare is `EINVAL`; `info()` says what was asked for;
//! 2. bad input to every operation (wrong key and value sizes, unknown
//!    update flags, operations the family lacks, a full map, `BPF_NOEXIST`
//!    and `BPF_EXIST` conflicts, missing keys, `get_next_key` with no key,
//!    an unknown key and the last key, batches that stop part way): the
//!    kernel's errno, and after every error the map's full contents
//!    unchanged;
//! 3. a differential run against a model ([`Model`]): seeded random
//!    operation sequences, every answer compared, for the families whose
//!    keys have a model (exact-match bytes, LPM prefixes, key-less push and
//!    peek).
//!
//! The fuzz targets (`fuzz/`) drive the same [`Harness`] with operations
//! libFuzzer chooses. The module is public under the `conformance`
//! feature for them; its own tests run the suite over the registry and
//! over planted bugs it must catch.
//!
//! [`registry::FAMILIES`]: crate::registry::FAMILIES

mod model;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod toy;

use std::collections::BTreeMap;
use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::core::contract::{BatchKeys, Caps, Map, MapInfo, MapSpec};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind};
use crate::core::flags::{BPF_ANY, BPF_EXIST, BPF_NOEXIST};

pub use model::Model;

/// A broken contract: what was done and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

/// `Err(Violation)` with a formatted message.
macro_rules! violation {
    ($($arg:tt)*) => {
        return Err(Violation(format!($($arg)*)))
    };
}

/// Checks that `got` is `want`, naming `what`.
fn expect<T: PartialEq + fmt::Debug>(what: &str, got: T, want: T) -> Result<(), Violation> {
    if got == want {
        Ok(())
    } else {
        violation!("{what}: got {got:?}, want {want:?}")
    }
}

/// An errno, or 0 for success: what answers are compared by.
fn errno<T>(r: &Result<T>) -> i32 {
    r.as_ref().map_or_else(Error::errno, |_| 0)
}

fn check_errno<T: fmt::Debug>(what: &str, r: Result<T>, want: i32) -> Result<(), Violation> {
    if errno(&r) == want {
        Ok(())
    } else {
        violation!("{what}: got {r:?}, want errno {want}")
    }
}

/// The spec the suite builds `family` with: the smallest ordinary key and
/// value sizes the family takes (8-byte keys where allowed: IPv4 for LPM
/// keys, a `u64` for hash keys; the family's sample key size and extra
/// where it has them), `max_entries` entries, no flags.
pub fn spec_for(family: &Family, max_entries: u32) -> MapSpec {
    spec_sized(family, max_entries, SIZES[0])
}

/// Key and value sizes the differential runs ask for ([`spec_sized`]):
/// the suite's own first, then the sizes a map may compile its paths for
/// (the hash maps' batch walk: 4, 8 and 16 bytes) and sizes it must read
/// at run time.
pub const SIZES: [(u32, u32); 8] = [
    (8, 8),
    (4, 4),
    (16, 16),
    (4, 16),
    (16, 4),
    (3, 5),
    (12, 24),
    (32, 8),
];

/// [`spec_for`] with `key_size` and `value_size` where the family takes
/// them (a family with a sample layout keeps its key size and extra), and
/// its smallest sizes otherwise.
pub fn spec_sized(
    family: &Family,
    max_entries: u32,
    (key_size, value_size): (u32, u32),
) -> MapSpec {
    let pick = |rule: crate::core::family::SizeRule, want: u32| {
        if rule.allows(want) {
            want
        } else {
            (rule.min..=rule.max)
                .find(|&n| rule.allows(n))
                .expect("a family takes some size")
        }
    };
    let value_size = pick(family.value_size, value_size);
    match family.sample_layout {
        Some((key_size, extra)) => {
            MapSpec::new(family.map_type, key_size, value_size, max_entries).extra(extra)
        }
        None => MapSpec::new(
            family.map_type,
            pick(family.key_size, key_size),
            value_size,
            max_entries,
        ),
    }
}

/// [`spec_sized`], with `build` choosing the rest: its low six bits which
/// of the family's creation flags are set (bit `k` for the family's
/// `k`-th declared flag), its top two the hash (the map's default, the
/// kernel's jhash, xxh3 or the hybrid). A spec the family refuses (an LRU
/// map without preallocation) is the caller's to drop.
pub fn spec_varied(family: &Family, max_entries: u32, sizes: (u32, u32), build: u8) -> MapSpec {
    let mut declared = family.map_flags;
    let mut flags = 0;
    for k in 0..6 {
        let bit = declared & declared.wrapping_neg();
        if build & (1 << k) != 0 {
            flags |= bit;
        }
        declared &= !bit;
    }
    let spec = spec_sized(family, max_entries, sizes).flags(flags);
    match build >> 6 {
        0 => spec,
        n => spec.hash(crate::hash::HashPolicy::ALL[usize::from(n - 1)]),
    }
}

/// The `i`-th of a family's distinct valid keys for a map with `info`.
pub fn key(kind: KeyKind, info: &MapInfo, i: u64) -> Vec<u8> {
    let ks = info.key_size as usize;
    match kind {
        // Odd multiplier: distinct for distinct i in every width.
        KeyKind::Bytes => {
            let word = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
            (0..ks).map(|j| word[j % 8] ^ (j / 8) as u8).collect()
        }
        KeyKind::Index => (i as u32).to_ne_bytes()[..ks.min(4)].to_vec(),
        KeyKind::LpmPrefix => {
            let data_size = ks - crate::lpm::key::KEY_HEADER;
            let mut data = vec![0u8; data_size];
            for (j, b) in i.to_be_bytes().iter().rev().enumerate().take(data_size) {
                data[data_size - 1 - j] = *b;
            }
            crate::lpm::key::encode_key(8 * data_size as u32, &data)
        }
        KeyKind::None => Vec::new(),
        // Disjoint ranges of 1 to 3 indices.
        KeyKind::Range => {
            let first = i * 4;
            [first.to_ne_bytes(), (first + i % 3).to_ne_bytes()].concat()
        }
        KeyKind::Wildcard => wildcard_rule_key(info, i),
    }
}

/// A rule key of the schema in `info.map_extra`: priority `i`, every
/// field something of its kind drawn from `i`, spelled as `get_next_key`
/// spells it.
fn wildcard_rule_key(info: &MapInfo, i: u64) -> Vec<u8> {
    use crate::wildcard::{FieldKind, Schema};
    let schema = Schema::from_map_extra(info.map_extra).expect("a wildcard map's schema");
    let mut rng = StdRng::seed_from_u64(i);
    let mut b = schema.rule(i as u32);
    for f in schema.fields() {
        let v = rng.random::<u128>() & f.max();
        b = match f.kind {
            FieldKind::Prefix => b.prefix(&f.name, v, rng.random_range(0..=f.bits())),
            FieldKind::Range => {
                let w = rng.random::<u128>() & f.max();
                b.range(&f.name, v.min(w), v.max(w))
            }
            FieldKind::Match | FieldKind::WildcardMatch => b.exact(&f.name, v),
        };
    }
    schema.rule_key(&b.build().expect("a rule of the schema"))
}

/// The `i`-th of distinct values for a map with `info` (never all zero).
pub fn value(info: &MapInfo, i: u64) -> Vec<u8> {
    let word = (i + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93).to_le_bytes();
    (0..info.value_size as usize)
        .map(|j| word[j % 8].wrapping_add((j / 8) as u8))
        .collect()
}

/// What a map holds, as seen through the contract: its length, and its
/// entries (iterated with `get_next_key`, each looked up), or for a
/// key-less map the answers to peeks of `probes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    len: usize,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    peeks: Vec<i32>,
}

/// Reads `map`'s contents. For a key-less map, `probes` are the values
/// whose peeks are compared.
pub fn contents(map: &dyn Map, probes: &[Vec<u8>]) -> Result<Contents, Violation> {
    let info = map.info();
    let caps = map.caps();
    let mut entries = BTreeMap::new();
    if caps.contains(Caps::NEXT_KEY | Caps::LOOKUP) {
        let mut prev: Option<Vec<u8>> = None;
        let mut next = vec![0u8; info.key_size as usize];
        for _ in 0..=map.len() + 1 {
            match map.get_next_key(prev.as_deref(), &mut next) {
                Ok(n) => {
                    let key = next[..n].to_vec();
                    let mut v = vec![0u8; info.value_size as usize];
                    map.lookup(&key, &mut v)
                        .map_err(|e| Violation(format!("lookup of iterated key {key:?}: {e}")))?;
                    if entries.insert(key.clone(), v).is_some() {
                        violation!("get_next_key returned {key:?} twice");
                    }
                    prev = Some(key);
                }
                Err(Error::NotFound) => break,
                Err(e) => violation!("get_next_key after {prev:?}: {e}"),
            }
        }
        if entries.len() != map.len() {
            violation!(
                "iteration found {} keys, len() says {}",
                entries.len(),
                map.len()
            );
        }
    }
    let peeks = if caps.contains(Caps::PUSH_PEEK) {
        probes
            .iter()
            .map(|p| errno(&map.peek(&mut p.clone())))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Contents {
        len: map.len(),
        entries,
        peeks,
    })
}

/// Runs every check of the suite on `family`.
pub fn check_family(family: &Family) -> Result<(), Violation> {
    let within = |e: Violation| Violation(format!("{}: {e}", family.name));
    check_creation(family).map_err(within)?;
    check_bad_input(family).map_err(within)?;
    // A seed a size of `SIZES` (one under Miri, the suite's own).
    for seed in 0..crate::scaled(SIZES.len(), 1) as u64 {
        differential(family, seed, crate::scaled(300, 60)).map_err(within)?;
    }
    Ok(())
}

/// Creation: undeclared flags, extra bits and sizes are `EINVAL`; a
/// created map's `info()` says what was asked for.
pub fn check_creation(family: &Family) -> Result<(), Violation> {
    let spec = spec_for(family, 16);
    let map = family
        .create(&spec)
        .map_err(|e| Violation(format!("creating {spec:?}: {e}")))?;
    expect("info() of a new map", map.info(), spec.info())?;
    expect("len() of a new map", map.len(), 0)?;
    for bit in 0..32 {
        let flag = 1u32 << bit;
        let r = family.create(&spec.clone().flags(flag));
        if family.map_flags & flag == 0 {
            check_errno(&format!("creation with undeclared flag {flag:#x}"), r, 22)?;
        } else if let Ok(m) = r {
            expect(
                &format!("map_flags with {flag:#x}"),
                m.info().map_flags,
                flag,
            )?;
        }
    }
    for bit in 0..64 {
        let extra = 1u64 << bit;
        if family.map_extra & extra == 0 {
            let r = family.create(&spec.clone().extra(extra));
            check_errno(&format!("creation with undeclared extra {extra:#x}"), r, 22)?;
        }
    }
    let sizes = |rule: crate::core::family::SizeRule| {
        [
            rule.min.checked_sub(1),
            rule.max.checked_add(1),
            Some(rule.min + 1),
        ]
        .into_iter()
        .flatten()
        .filter(move |&n| !rule.allows(n))
    };
    for ks in sizes(family.key_size) {
        let mut s = spec.clone();
        s.key_size = ks;
        check_errno(
            &format!("creation with key_size {ks}"),
            family.create(&s),
            22,
        )?;
    }
    for vs in sizes(family.value_size) {
        let mut s = spec.clone();
        s.value_size = vs;
        check_errno(
            &format!("creation with value_size {vs}"),
            family.create(&s),
            22,
        )?;
    }
    let mut s = spec.clone();
    s.max_entries = 0;
    check_errno("creation with max_entries 0", family.create(&s), 22)?;
    let mut s = spec;
    s.map_type.0 ^= 0x8000_0000;
    check_errno("a spec of another type", family.create(&s), 22)?;
    Ok(())
}

/// A map under test with what it held before the last operation.
struct Probe<'a> {
    map: &'a dyn Map,
    probes: Vec<Vec<u8>>,
}

impl Probe<'_> {
    /// Runs `op`, checks it answers `want` (an errno, 0 for success), and,
    /// when it fails, that it changed nothing.
    fn expect<T: fmt::Debug>(
        &self,
        what: &str,
        want: i32,
        op: impl FnOnce(&dyn Map) -> Result<T>,
    ) -> Result<Option<T>, Violation> {
        let before = contents(self.map, &self.probes)?;
        let r = op(self.map);
        if errno(&r) != want {
            violation!("{what}: got {r:?}, want errno {want}");
        }
        match r {
            Ok(v) => Ok(Some(v)),
            Err(_) => {
                expect(
                    &format!("contents after {what} failed"),
                    contents(self.map, &self.probes)?,
                    before,
                )?;
                Ok(None)
            }
        }
    }

    /// Like `expect` for batch operations: the error's `processed` count.
    fn expect_batch(
        &self,
        what: &str,
        want: i32,
        processed: usize,
        op: impl FnOnce(&dyn Map) -> Result<usize, crate::BatchError>,
    ) -> Result<(), Violation> {
        let before = contents(self.map, &self.probes)?;
        match op(self.map) {
            Ok(n) if want == 0 => expect(&format!("{what}: count"), n, processed),
            Err(e) if e.error.errno() == want => {
                expect(&format!("{what}: processed"), e.processed, processed)?;
                if processed == 0 {
                    expect(
                        &format!("contents after {what} refused"),
                        contents(self.map, &self.probes)?,
                        before,
                    )?;
                }
                Ok(())
            }
            r => violation!("{what}: got {r:?}, want errno {want} after {processed}"),
        }
    }
}

/// Buffers one byte short, one byte long and empty, beside `n` (those of
/// them that are wrong).
fn wrong_sizes(n: usize, var_keys: bool) -> Vec<usize> {
    let mut sizes = vec![n + 1, 0];
    if !var_keys {
        sizes.extend(n.checked_sub(1));
    }
    sizes.retain(|&s| s != n || var_keys);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Bad input to every operation, on an empty map and on a full one: the
/// kernel's errno, and nothing changed.
pub fn check_bad_input(family: &Family) -> Result<(), Violation> {
    const MAX: u32 = 8;
    let spec = spec_for(family, MAX);
    let map = family
        .create(&spec)
        .map_err(|e| Violation(format!("creating {spec:?}: {e}")))?;
    let map = &*map;
    let info = map.info();
    let caps = map.caps();
    let (ks, vs) = (info.key_size as usize, info.value_size as usize);
    let var = caps.contains(Caps::VAR_KEYS);
    let k = |i: u64| key(family.keys, &info, i);
    let v = |i: u64| value(&info, i);
    let probes: Vec<Vec<u8>> = (0..2 * u64::from(MAX)).map(v).collect();
    let p = Probe {
        map,
        probes: probes.clone(),
    };
    let has = |c: Caps| caps.contains(c);
    let or_unsupported = |c: Caps, errno: i32| if has(c) { errno } else { 95 };

    // Operations the family lacks, and push/peek on keyed maps.
    if !has(Caps::PUSH_PEEK) {
        p.expect("push on a keyed map", 95, |m| m.push(&v(0), BPF_ANY))?;
        p.expect("peek on a keyed map", 95, |m| m.peek(&mut v(0)))?;
    }

    // Fill: a keyed map through update, a key-less one through push.
    let writable = if has(Caps::PUSH_PEEK) {
        for i in 0..u64::from(MAX) {
            p.expect("push", 0, |m| m.update(&[], &v(i), BPF_ANY))?;
        }
        true
    } else {
        let first = map.update(&k(0), &v(0), BPF_NOEXIST);
        if first.is_ok() {
            for i in 1..u64::from(MAX) {
                p.expect("update of a new key", 0, |m| {
                    m.update(&k(i), &v(i), BPF_NOEXIST)
                })?;
            }
        }
        first.is_ok()
    };
    if writable {
        expect("len() of the filled map", map.len(), MAX as usize)?;
    }
    let stored = if writable && !has(Caps::PUSH_PEEK) {
        MAX
    } else {
        0
    };
    let present = if stored > 0 { k(0) } else { Vec::new() };
    let missing = k(u64::from(MAX) + 7);

    // Wrong sizes.
    if has(Caps::PUSH_PEEK) {
        p.expect("lookup with a key", 22, |m| m.lookup(&[0], &mut v(0)))?;
        p.expect("update with a key", 22, |m| m.update(&[0], &v(0), BPF_ANY))?;
        for n in wrong_sizes(vs, false) {
            p.expect(&format!("push of {n} bytes"), 22, |m| {
                m.push(&vec![1; n], BPF_ANY)
            })?;
            p.expect(&format!("peek of {n} bytes"), 22, |m| {
                m.peek(&mut vec![1; n])
            })?;
        }
    } else {
        for n in wrong_sizes(ks, var) {
            let bad = vec![1u8; n];
            p.expect(
                &format!("lookup with a {n}-byte key"),
                or_unsupported(Caps::LOOKUP, 22),
                |m| m.lookup(&bad, &mut v(0)),
            )?;
            p.expect(
                &format!("update with a {n}-byte key"),
                or_unsupported(Caps::UPDATE, 22),
                |m| m.update(&bad, &v(0), BPF_ANY),
            )?;
            p.expect(
                &format!("delete with a {n}-byte key"),
                or_unsupported(Caps::DELETE, 22),
                |m| m.delete(&bad),
            )?;
            p.expect(
                &format!("lookup_and_delete with a {n}-byte key"),
                or_unsupported(Caps::LOOKUP_AND_DELETE, 22),
                |m| m.lookup_and_delete(&bad, &mut v(0)),
            )?;
            p.expect(
                &format!("get_next_key after a {n}-byte key"),
                or_unsupported(Caps::NEXT_KEY, 22),
                |m| m.get_next_key(Some(&bad), &mut vec![0; ks]),
            )?;
            if !var {
                p.expect(
                    &format!("get_next_key into {n} bytes"),
                    or_unsupported(Caps::NEXT_KEY, 22),
                    |m| m.get_next_key(None, &mut vec![0; n]),
                )?;
            }
        }
        for n in wrong_sizes(vs, false) {
            let key = if stored > 0 { present.clone() } else { k(0) };
            p.expect(
                &format!("lookup into {n} bytes"),
                or_unsupported(Caps::LOOKUP, 22),
                |m| m.lookup(&key, &mut vec![0; n]),
            )?;
            p.expect(
                &format!("update with {n} bytes"),
                or_unsupported(Caps::UPDATE, 22),
                |m| m.update(&key, &vec![1; n], BPF_ANY),
            )?;
            p.expect(
                &format!("lookup_and_delete into {n} bytes"),
                or_unsupported(Caps::LOOKUP_AND_DELETE, 22),
                |m| m.lookup_and_delete(&key, &mut vec![0; n]),
            )?;
        }
    }

    // Unknown update flags.
    for flags in [3u64, 4, 1 << 40, u64::MAX] {
        let key = if has(Caps::PUSH_PEEK) {
            Vec::new()
        } else {
            k(1)
        };
        let want = if has(Caps::PUSH_PEEK) || has(Caps::UPDATE) {
            22
        } else {
            95
        };
        p.expect(&format!("update with flags {flags:#x}"), want, |m| {
            m.update(&key, &v(1), flags)
        })?;
        if has(Caps::BATCH) {
            p.expect_batch(&format!("update_batch with flags {flags:#x}"), 22, 0, |m| {
                m.update_batch(&key, &v(1), flags)
            })?;
        }
    }

    if stored > 0 {
        // Flags against presence, a full map, missing keys.
        p.expect("BPF_NOEXIST on a present key", 17, |m| {
            m.update(&present, &v(99), BPF_NOEXIST)
        })?;
        p.expect("BPF_EXIST on a missing key", 2, |m| {
            m.update(&missing, &v(99), BPF_EXIST)
        })?;
        if !has(Caps::EVICTS) {
            p.expect("a new key in a full map", 7, |m| {
                m.update(&missing, &v(99), BPF_ANY)
            })?;
        }
        p.expect("BPF_EXIST on a present key", 0, |m| {
            m.update(&present, &v(0), BPF_EXIST)
        })?;
        p.expect(
            "delete of a missing key",
            or_unsupported(Caps::DELETE, 2),
            |m| m.delete(&missing),
        )?;
        p.expect(
            "lookup_and_delete of a missing key",
            or_unsupported(Caps::LOOKUP_AND_DELETE, 2),
            |m| m.lookup_and_delete(&missing, &mut v(0)),
        )?;
        p.expect("lookup of a missing key", 2, |m| {
            m.lookup(&missing, &mut v(0))
        })?;
        check_iteration(&p, family, &info)?;
        if has(Caps::BATCH) {
            check_batches(&p, family, &info)?;
        }
        if has(Caps::LOOKUP_AND_DELETE) {
            let mut out = v(0);
            p.expect("lookup_and_delete of a present key", 0, |m| {
                m.lookup_and_delete(&k(2), &mut out)
            })?;
            expect("the value lookup_and_delete returned", out, v(2))?;
            p.expect("lookup after lookup_and_delete", 2, |m| {
                m.lookup(&k(2), &mut v(0))
            })?;
            map.update(&k(2), &v(2), BPF_NOEXIST)
                .map_err(|e| Violation(format!("reinserting: {e}")))?;
        }
        if has(Caps::EVICTS) {
            p.expect("a new key in a full evicting map", 0, |m| {
                m.update(&missing, &v(99), BPF_ANY)
            })?;
            expect("len() after an eviction", map.len(), MAX as usize)?;
        }
    } else if !has(Caps::PUSH_PEEK) {
        // Nothing can be stored through the contract (the stack trace
        // map): an empty map answers, and stays empty.
        p.expect(
            "lookup in an empty map",
            or_unsupported(Caps::LOOKUP, 2),
            |m| m.lookup(&k(0), &mut v(0)),
        )?;
        p.expect(
            "get_next_key of an empty map",
            or_unsupported(Caps::NEXT_KEY, 2),
            |m| m.get_next_key(None, &mut vec![0; ks]),
        )?;
        p.expect(
            "delete in an empty map",
            or_unsupported(Caps::DELETE, 2),
            |m| m.delete(&k(0)),
        )?;
    } else {
        // A key-less map holds what was pushed and nothing is removable.
        for probe in &probes[..MAX as usize] {
            p.expect("peek of a pushed value", 0, |m| m.peek(&mut probe.clone()))?;
        }
        p.expect("delete on a key-less map", 95, |m| m.delete(&[]))?;
        p.expect("get_next_key on a key-less map", 95, |m| {
            m.get_next_key(None, &mut [])
        })?;
    }
    Ok(())
}

/// `get_next_key` from none, from each key, from the last and from an
/// unknown key, on a map holding at least one key.
fn check_iteration(p: &Probe<'_>, family: &Family, info: &MapInfo) -> Result<(), Violation> {
    let map = p.map;
    let ks = info.key_size as usize;
    let all = contents(map, &p.probes)?;
    let order: Vec<Vec<u8>> = {
        let mut out = Vec::new();
        let mut next = vec![0u8; ks];
        let mut prev: Option<Vec<u8>> = None;
        while let Ok(n) = map.get_next_key(prev.as_deref(), &mut next) {
            out.push(next[..n].to_vec());
            prev = out.last().cloned();
        }
        out
    };
    expect("keys iterated", order.len(), all.entries.len())?;
    let last = order.last().expect("a filled map").clone();
    p.expect("get_next_key after the last key", 2, |m| {
        m.get_next_key(Some(&last), &mut vec![0; ks])
    })?;
    let unknown = key(family.keys, info, 1 << 20);
    let mut next = vec![0u8; ks];
    match map.get_next_key(Some(&unknown), &mut next) {
        Ok(n) if all.entries.contains_key(&next[..n]) => {}
        Err(Error::NotFound) => {}
        r => violation!("get_next_key after an unknown key: {r:?}, {next:?} is not stored"),
    }
    expect("contents after iterating", contents(map, &p.probes)?, all)
}

/// `map`'s entries read by `lookup_batch`, `room` at a time, each batch
/// after the last key of the one before; a key read twice is a
/// violation.
fn batched(map: &dyn Map, room: usize) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, Violation> {
    let layout = BatchKeys::of(map);
    let (ks, vs) = (layout.stride(), map.info().value_size as usize);
    let mut seen = BTreeMap::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (mut keys, mut values) = (vec![0u8; room * ks], vec![0u8; room * vs]);
        let n = map
            .lookup_batch(after.as_deref(), &mut keys, &mut values)
            .map_err(|e| Violation(format!("lookup_batch of {room} after {after:?}: {e}")))?;
        for i in 0..n {
            let key = layout
                .key(&keys, i)
                .map_err(|e| Violation(format!("batch key {i}: {e}")))?
                .to_vec();
            if seen
                .insert(key.clone(), values[i * vs..][..vs].to_vec())
                .is_some()
            {
                violation!("lookup_batch of {room} returned {key:?} twice");
            }
            after = Some(key);
        }
        if n < room {
            return Ok(seen);
        }
    }
}

/// Batches on a map holding `k(0..MAX)`: lookups in chunks, an update
/// batch and a delete batch that stop part way, a lookup-and-delete batch
/// that empties the map.
fn check_batches(p: &Probe<'_>, family: &Family, info: &MapInfo) -> Result<(), Violation> {
    let map = p.map;
    let layout = BatchKeys::of(map);
    let (ks, vs) = (layout.stride(), info.value_size as usize);
    let k = |i: u64| key(family.keys, info, i);
    let v = |i: u64| value(info, i);
    let batch_of = |keys: &[Vec<u8>]| {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        layout
            .encode(&keys)
            .map_err(|e| Violation(format!("encoding batch keys: {e}")))
    };
    let key_at = |keys: &[u8], i: usize| {
        layout
            .key(keys, i)
            .map(<[u8]>::to_vec)
            .map_err(|e| Violation(format!("batch key {i}: {e}")))
    };
    let all = contents(map, &p.probes)?;

    // Lookups, three at a time, cover the map exactly.
    expect(
        "entries from lookup_batch",
        batched(map, 3)?,
        all.entries.clone(),
    )?;
    p.expect_batch("lookup_batch into mismatched buffers", 22, 0, |m| {
        m.lookup_batch(None, &mut vec![0; ks + 1], &mut vec![0; vs])
    })?;
    let two = batch_of(&[k(0), k(1)])?;
    p.expect_batch("update_batch of mismatched counts", 22, 0, |m| {
        m.update_batch(&two, &v(0), BPF_ANY)
    })?;

    // Update: two present keys rewritten, then a missing key stops a
    // BPF_EXIST batch; a BPF_NOEXIST conflict stops one at its start.
    let keys = batch_of(&[k(0), k(1), k(100), k(2)])?;
    let values = [v(50), v(51), v(52), v(53)].concat();
    p.expect_batch("update_batch stopping at a missing key", 2, 2, |m| {
        m.update_batch(&keys, &values, BPF_EXIST)
    })?;
    let read = |i: u64| {
        let mut out = v(0);
        map.lookup(&k(i), &mut out)
            .map_err(|e| Violation(format!("lookup after update_batch: {e}")))
            .map(|()| out)
    };
    expect("a value update_batch wrote", read(1)?, v(51))?;
    expect("a value after where update_batch stopped", read(2)?, v(2))?;
    let keys = batch_of(&[k(4), k(5), k(6)])?;
    p.expect_batch("update_batch stopping at a present key", 17, 0, |m| {
        m.update_batch(&keys, &[v(1), v(2), v(3)].concat(), BPF_NOEXIST)
    })?;

    // Delete: two present keys, then a missing one stops the batch.
    let keys = batch_of(&[k(0), k(1), k(100), k(2)])?;
    p.expect_batch("delete_batch stopping at a missing key", 2, 2, |m| {
        m.delete_batch(&keys)
    })?;
    expect("len() after a partial delete_batch", map.len(), all.len - 2)?;
    p.expect("lookup of a key delete_batch removed", 2, |m| {
        m.lookup(&k(1), &mut v(0))
    })?;
    p.expect("lookup of a key after where delete_batch stopped", 0, |m| {
        m.lookup(&k(2), &mut v(0))
    })?;
    // Put them back so later checks see the full map.
    for i in 0..2 {
        map.update(&k(i), &v(i), BPF_NOEXIST)
            .map_err(|e| Violation(format!("reinserting: {e}")))?;
    }
    expect(
        "contents after the batches",
        contents(map, &p.probes)?,
        all.clone(),
    )?;

    if map.caps().contains(Caps::LOOKUP_AND_DELETE) {
        let room = all.len + 1;
        let (mut keys, mut values) = (vec![0u8; room * ks], vec![0u8; room * vs]);
        let moved = map
            .lookup_and_delete_batch(&mut keys, &mut values)
            .map_err(|e| Violation(format!("lookup_and_delete_batch: {e}")))?;
        let got = (0..moved)
            .map(|i| Ok((key_at(&keys, i)?, values[i * vs..][..vs].to_vec())))
            .collect::<Result<BTreeMap<_, _>, Violation>>()?;
        expect(
            "entries lookup_and_delete_batch moved",
            got,
            all.entries.clone(),
        )?;
        expect("len() after lookup_and_delete_batch", map.len(), 0)?;
        for (key, value) in &all.entries {
            map.update(key, value, BPF_NOEXIST)
                .map_err(|e| Violation(format!("refilling: {e}")))?;
        }
    } else {
        p.expect_batch(
            "lookup_and_delete_batch without lookup_and_delete",
            95,
            0,
            |m| m.lookup_and_delete_batch(&mut vec![0; ks], &mut vec![0; vs]),
        )?;
    }
    Ok(())
}

/// One operation of a differential run, with its inputs given as indices
/// into the harness's key and value spaces and as size changes, so that a
/// fuzzer's bytes decode into mostly-valid, sometimes-wrong calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `lookup(key)` (for a key-less map: a peek of `key`'s value).
    Lookup {
        /// The key.
        key: Input,
    },
    /// `update(key, value, flags)` (for a key-less map: a push of `key`'s
    /// value).
    Update {
        /// The key.
        key: Input,
        /// Which value.
        value: u8,
        /// Which update flags (see `update_flags`).
        flags: u8,
    },
    /// `delete(key)`.
    Delete {
        /// The key.
        key: Input,
    },
    /// `lookup_and_delete(key)`.
    LookupAndDelete {
        /// The key.
        key: Input,
    },
    /// `get_next_key(key)`, or from the start.
    NextKey {
        /// The key, if any.
        key: Option<Input>,
    },
    /// `update_batch` of `n` consecutive keys from `key`.
    UpdateBatch {
        /// The first key.
        key: Input,
        /// How many keys.
        n: u8,
        /// Which update flags.
        flags: u8,
    },
    /// `delete_batch` of `n` consecutive keys from `key`.
    DeleteBatch {
        /// The first key.
        key: Input,
        /// How many keys.
        n: u8,
    },
    /// A check of the whole contents against the model.
    Check,
}

/// A key (or pushed value) of a differential run: which one, and how it is
/// bent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    /// Index into the harness's inputs.
    pub index: u8,
    /// For LPM keys: the prefix length, modulo one more than the longest;
    /// for variable-length keys: the length, modulo the longest, plus one.
    pub shape: u8,
    /// Nonzero: the buffer is that much too long (odd) or short (even).
    pub bend: u8,
}

/// The update flags an op's `flags` byte picks: the three valid ones most
/// of the time, an unknown one otherwise.
fn update_flags(b: u8) -> u64 {
    match b % 8 {
        0..=2 => BPF_ANY,
        3 => BPF_NOEXIST,
        4 | 5 => BPF_EXIST,
        6 => 4,
        _ => 1 << 33,
    }
}

impl Op {
    /// Decodes one operation from the front of `bytes` (a fuzzer's input),
    /// or `None` when they run out.
    pub fn decode(bytes: &mut &[u8]) -> Option<Op> {
        let mut take = || -> Option<u8> {
            let (&b, rest) = bytes.split_first()?;
            *bytes = rest;
            Some(b)
        };
        let tag = take()?;
        let input = |take: &mut dyn FnMut() -> Option<u8>| -> Option<Input> {
            let index = take()?;
            let shape = take()?;
            // One input in eight has a bent buffer.
            let bend = match take()? {
                b @ 0..=31 => b % 4,
                _ => 0,
            };
            Some(Input { index, shape, bend })
        };
        Some(match tag % 16 {
            0..=3 => Op::Lookup {
                key: input(&mut take)?,
            },
            4..=7 => Op::Update {
                key: input(&mut take)?,
                value: take()?,
                flags: take()?,
            },
            8 | 9 => Op::Delete {
                key: input(&mut take)?,
            },
            10 => Op::LookupAndDelete {
                key: input(&mut take)?,
            },
            11 => Op::NextKey {
                key: if take()? % 4 == 0 {
                    None
                } else {
                    Some(input(&mut take)?)
                },
            },
            12 => Op::UpdateBatch {
                key: input(&mut take)?,
                n: take()? % 6,
                flags: take()?,
            },
            13 => Op::DeleteBatch {
                key: input(&mut take)?,
                n: take()? % 6,
            },
            _ => Op::Check,
        })
    }

    /// A random operation.
    fn random(rng: &mut StdRng) -> Op {
        let bytes: [u8; 8] = rng.random();
        Op::decode(&mut &bytes[..]).expect("8 bytes hold any op")
    }
}

/// A map and its model, driven in step by [`Op`]s.
pub struct Harness {
    map: Box<dyn Map>,
    model: Model,
    keys: KeyKind,
    info: MapInfo,
    /// Distinct keys (or pushed values) the ops index into.
    space: u64,
}

impl Harness {
    /// A harness for a new map of `family`, or `None` if the family has no
    /// model (its keys cannot be written through the contract).
    pub fn new(family: &Family, max_entries: u32) -> Result<Option<Harness>, Violation> {
        Self::sized(family, max_entries, SIZES[0])
    }

    /// [`new`](Self::new), with keys and values of `sizes` where the
    /// family takes them ([`spec_sized`]).
    pub fn sized(
        family: &Family,
        max_entries: u32,
        sizes: (u32, u32),
    ) -> Result<Option<Harness>, Violation> {
        Self::with_spec(family, spec_sized(family, max_entries, sizes))
    }

    /// [`sized`](Self::sized), with the creation flags and hash `build`
    /// picks ([`spec_varied`]), or without them where the family refuses
    /// them.
    pub fn varied(
        family: &Family,
        max_entries: u32,
        sizes: (u32, u32),
        build: u8,
    ) -> Result<Option<Harness>, Violation> {
        Self::with_spec(family, spec_varied(family, max_entries, sizes, build))
            .or_else(|_| Self::sized(family, max_entries, sizes))
    }

    /// A harness for a new map of `family` built from `spec`: a violation
    /// if the family refuses it.
    pub fn with_spec(family: &Family, spec: MapSpec) -> Result<Option<Harness>, Violation> {
        let max_entries = spec.max_entries;
        let map = family
            .create(&spec)
            .map_err(|e| Violation(format!("creating {spec:?}: {e}")))?;
        let info = map.info();
        let Some(model) = Model::new(family.keys, &info, map.caps()) else {
            return Ok(None);
        };
        // Evicting maps are kept under their capacity, where the model
        // (which does not know whom they evict) still holds.
        let space = if map.caps().contains(Caps::EVICTS) {
            u64::from(max_entries.saturating_sub(1).max(1))
        } else {
            u64::from(max_entries) * 3 / 2
        };
        Ok(Some(Harness {
            map,
            model,
            keys: family.keys,
            info,
            space,
        }))
    }

    /// The map under test.
    pub fn map(&self) -> &dyn Map {
        &*self.map
    }

    /// The buffer an input stands for.
    fn bytes(&self, input: Input) -> Vec<u8> {
        let i = u64::from(input.index) % self.space;
        let mut b = if self.keys == KeyKind::None {
            value(&self.info, i)
        } else {
            key(self.keys, &self.info, i)
        };
        if self.keys == KeyKind::LpmPrefix {
            let max = 8 * (b.len() - crate::lpm::key::KEY_HEADER) as u32;
            let len = u32::from(input.shape) % (max + 2); // max + 1 is invalid
            b[..4].copy_from_slice(&len.to_ne_bytes());
        }
        if self.map.caps().contains(Caps::VAR_KEYS) && !b.is_empty() {
            // Keys of every length, so that some are prefixes of others.
            b.truncate(1 + usize::from(input.shape) % b.len());
        }
        match input.bend {
            0 => {}
            n if n % 2 == 1 => b.push(n),
            _ => {
                b.pop();
            }
        }
        b
    }

    /// `key` as a batch lays it out: as it is for fixed-size keys; for
    /// variable-length ones its length and the key, zero-padded (cut at
    /// `key_size`, the length still telling how long it was).
    fn batch_slot(&self, key: Vec<u8>) -> Vec<u8> {
        if !self.map.caps().contains(Caps::VAR_KEYS) {
            return key;
        }
        let size = self.info.key_size as usize;
        let mut slot = (key.len() as u32).to_ne_bytes().to_vec();
        slot.extend(key.iter().take(size));
        slot.resize(4 + size, 0);
        slot
    }

    /// Applies `op` to the map and the model; a violation if their answers
    /// differ, or if an operation that failed changed the map.
    pub fn apply(&mut self, op: Op) -> Result<(), Violation> {
        let failed = self.answer(op)?;
        if failed {
            self.check()
                .map_err(|e| Violation(format!("after {op:?} failed: {e}")))?;
        }
        Ok(())
    }

    /// Applies `op`, compares the answers, and says whether it failed.
    fn answer(&mut self, op: Op) -> Result<bool, Violation> {
        let map = &*self.map;
        let vs = self.info.value_size as usize;
        let key_less = self.keys == KeyKind::None;
        match op {
            Op::Lookup { key } => {
                let k = if key_less {
                    Vec::new()
                } else {
                    self.bytes(key)
                };
                let mut out = if key_less {
                    self.bytes(key)
                } else {
                    vec![0u8; vs]
                };
                let want = self.model.lookup(&k, &out);
                let got = map.lookup(&k, &mut out).map(|()| out);
                compare(&format!("{op:?}"), got, want, key_less)
            }
            Op::Update {
                key,
                value: v,
                flags,
            } => {
                let (k, val) = if key_less {
                    (Vec::new(), self.bytes(key))
                } else {
                    (self.bytes(key), value(&self.info, u64::from(v)))
                };
                let flags = update_flags(flags);
                let want = self.model.update(&k, &val, flags);
                compare(&format!("{op:?}"), map.update(&k, &val, flags), want, false)
            }
            Op::Delete { key } => {
                let k = if key_less {
                    Vec::new()
                } else {
                    self.bytes(key)
                };
                let want = self.model.delete(&k);
                compare(&format!("{op:?}"), map.delete(&k), want, false)
            }
            Op::LookupAndDelete { key } => {
                let k = if key_less {
                    Vec::new()
                } else {
                    self.bytes(key)
                };
                let mut out = vec![0u8; vs];
                let want = self.model.lookup_and_delete(&k);
                let got = map.lookup_and_delete(&k, &mut out).map(|()| out);
                compare(&format!("{op:?}"), got, want, false)
            }
            Op::NextKey { key } => {
                let k = key.map(|k| if key_less { Vec::new() } else { self.bytes(k) });
                let mut next = vec![0u8; self.info.key_size as usize];
                let got = map
                    .get_next_key(k.as_deref(), &mut next)
                    .map(|n| next[..n].to_vec());
                self.model.check_next_key(k.as_deref(), got).map(|()| false)
            }
            Op::UpdateBatch { key, n, flags } => {
                let (mut keys, mut values) = (Vec::new(), Vec::new());
                for j in 0..n {
                    let input = Input {
                        index: key.index.wrapping_add(j),
                        ..key
                    };
                    keys.extend(self.batch_slot(self.bytes(input)));
                    values.extend(value(&self.info, u64::from(j)));
                }
                let flags = update_flags(flags);
                let want = self.model.update_batch(&keys, &values, flags);
                let got = map.update_batch(&keys, &values, flags);
                compare_batch(&format!("{op:?}"), got, want)
            }
            Op::DeleteBatch { key, n } => {
                let mut keys = Vec::new();
                for j in 0..n {
                    keys.extend(self.batch_slot(self.bytes(Input {
                        index: key.index.wrapping_add(j),
                        ..key
                    })));
                }
                let want = self.model.delete_batch(&keys);
                compare_batch(&format!("{op:?}"), map.delete_batch(&keys), want)
            }
            Op::Check => self.check().map(|()| false),
        }
    }

    /// Compares the whole contents of the map with the model.
    ///
    /// A map with batches is also read whole through `lookup_batch`, a
    /// few entries a batch and all in one: the same entries as its walk
    /// by `get_next_key`.
    pub fn check(&self) -> Result<(), Violation> {
        let probes: Vec<Vec<u8>> = (0..self.space).map(|i| value(&self.info, i)).collect();
        let got = contents(&*self.map, &probes)?;
        self.model.check_contents(&got, &probes)?;
        let caps = self.map.caps();
        if caps.contains(Caps::BATCH | Caps::NEXT_KEY | Caps::LOOKUP) {
            for room in [3, got.len + 1] {
                expect(
                    "entries from lookup_batch",
                    batched(&*self.map, room)?,
                    got.entries.clone(),
                )?;
            }
        }
        Ok(())
    }
}

/// Compares a map's answer with the model's: same errno, and on success
/// the same bytes (a key-less lookup's `Ok` may be a false positive).
/// Says whether the map answered an error.
fn compare<T: PartialEq + fmt::Debug>(
    what: &str,
    got: Result<T>,
    want: Result<T>,
    false_positives: bool,
) -> Result<bool, Violation> {
    match (&got, &want) {
        (Ok(g), Ok(w)) if g == w => Ok(false),
        (Err(g), Err(w)) if g.errno() == w.errno() => Ok(true),
        (Ok(_), Err(Error::NotFound)) if false_positives => Ok(false),
        _ => violation!("{what}: map answered {got:?}, model {want:?}"),
    }
}

/// `compare` for batches: the same count, or the same error after as many
/// elements. A batch that stopped part way changed the map (its first
/// elements), so only a refusal before the first counts as failed.
fn compare_batch(
    what: &str,
    got: Result<usize, crate::BatchError>,
    want: Result<usize, crate::BatchError>,
) -> Result<bool, Violation> {
    match (&got, &want) {
        (Ok(g), Ok(w)) if g == w => Ok(false),
        (Err(g), Err(w)) if g.processed == w.processed && g.error.errno() == w.error.errno() => {
            Ok(g.processed == 0)
        }
        _ => violation!("{what}: map answered {got:?}, model {want:?}"),
    }
}

/// A seeded differential run of `ops` random operations on a new map of
/// `family` (nothing to do for a family without a model), with the key
/// and value sizes of `SIZES[seed % 8]` and flags and hash from the seed
/// ([`spec_varied`]; seed 0 is the suite's own spec), or without the
/// flags where the family refuses them.
pub fn differential(family: &Family, seed: u64, ops: usize) -> Result<(), Violation> {
    let sizes = SIZES[(seed % SIZES.len() as u64) as usize];
    let build = (seed as u8).wrapping_mul(0x9d);
    let Some(mut h) = Harness::varied(family, 24, sizes, build)? else {
        return Ok(());
    };
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..ops {
        let op = Op::random(&mut rng);
        h.apply(op)
            .map_err(|e| Violation(format!("seed {seed}, op {i}: {e}")))?;
    }
    h.check()
        .map_err(|e| Violation(format!("seed {seed}, at the end: {e}")))
}

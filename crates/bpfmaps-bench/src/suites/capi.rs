//! `capi`: what the C library's call boundary costs. A lookup through
//! `bpfmaps_map_lookup_elem` (a handle to find under an epoch guard, raw
//! pointers to check, a call through a function pointer as C makes it)
//! against the byte contract's `Map::lookup` from Rust, on the same map.
//!
//! Varies: the map (a hash map with 4- and 16-byte keys, the LPM trie)
//! and the caller. Holds fixed: the map and its entries (built once
//! through the C calls), the keys looked up (2^20 present keys in a
//! random order, or addresses inside the stored prefixes), one thread.
//! The two callers are timed in turns.

use std::ffi::{c_int, c_void};

use bpfmaps::{BPF_F_NO_PREALLOC, Map};
use bpfmaps_capi::{
    BPFMAPS_MAP_TYPE_HASH, BPFMAPS_MAP_TYPE_LPM_TRIE, bpfmaps_map_close, bpfmaps_map_create,
    bpfmaps_map_create_opts, bpfmaps_map_lookup_elem, bpfmaps_map_update_elem, with_map,
};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::measure::rate_samples_interleaved;
use crate::prefixes::addrs_inside;
use crate::record::{NS_PER_LOOKUP, Record, case, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::lpm_data::ipv4_prefixes;
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct Capi;

/// `capi` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Entries in each hash map (the LPM trie holds the IPv4 table, or
    /// this many generated prefixes without it).
    #[arg(long, default_value_t = 100_000)]
    entries: usize,
}

const RUST: &str = "Map::lookup";
const C: &str = "bpfmaps_map_lookup_elem";

type LookupFn = unsafe extern "C" fn(c_int, *const c_void, *mut c_void) -> c_int;

/// One map behind a handle, and the keys its lookups take (`stride`
/// bytes each, back to back).
struct Subject {
    case: String,
    fd: c_int,
    keys: Vec<u8>,
    stride: usize,
    value_size: usize,
}

impl Drop for Subject {
    fn drop(&mut self) {
        bpfmaps_map_close(self.fd);
    }
}

/// A map of `map_type` made through the C call (also the
/// `capi_lookup_once` example's).
pub fn made(map_type: u32, key_size: usize, value_size: usize, max: usize, flags: u32) -> c_int {
    let opts = bpfmaps_map_create_opts {
        sz: size_of::<bpfmaps_map_create_opts>(),
        map_flags: flags,
        ..Default::default()
    };
    // SAFETY: a NUL-terminated name and valid options.
    let fd = unsafe {
        bpfmaps_map_create(
            map_type,
            c"bench".as_ptr(),
            key_size as u32,
            value_size as u32,
            max as u32,
            &opts,
        )
    };
    assert!(fd >= 0, "bpfmaps_map_create: {fd}");
    fd
}

/// `key` stored with `value` through the C call.
pub fn put(fd: c_int, key: &[u8], value: &[u8]) {
    // SAFETY: a key and a value of the map's sizes.
    let err = unsafe { bpfmaps_map_update_elem(fd, key.as_ptr().cast(), value.as_ptr().cast(), 0) };
    assert_eq!(err, 0, "bpfmaps_map_update_elem");
}

/// A hash map of `n` random `key_size`-byte keys with 8-byte values;
/// 2^20 lookups of them in random order.
fn hash_map(n: usize, key_size: usize) -> Subject {
    let fd = made(BPFMAPS_MAP_TYPE_HASH, key_size, 8, n, 0);
    let mut rng = StdRng::seed_from_u64(0xCA91);
    let mut stored = Vec::with_capacity(n * key_size);
    for i in 0..n {
        let mut key = vec![0u8; key_size];
        rng.fill(&mut key[..]);
        key[..4].copy_from_slice(&(i as u32).to_ne_bytes()); // distinct
        put(fd, &key, &(i as u64).to_ne_bytes());
        stored.extend_from_slice(&key);
    }
    let keys = (0..1 << 20)
        .flat_map(|_| {
            let i = rng.random_range(0..n);
            stored[i * key_size..(i + 1) * key_size].to_vec()
        })
        .collect();
    Subject {
        case: case(&[("map", &"hash"), ("key", &key_size), ("n", &n)]),
        fd,
        keys,
        stride: key_size,
        value_size: 8,
    }
}

/// The LPM trie holding the IPv4 table (or `n` generated prefixes);
/// lookups of 2^20 addresses inside them, as `/32` keys.
fn lpm_trie(ctx: &Ctx, n: usize) -> Subject {
    let set = ipv4_prefixes(ctx, n);
    let fd = made(
        BPFMAPS_MAP_TYPE_LPM_TRIE,
        8,
        4,
        set.prefixes.len(),
        BPF_F_NO_PREALLOC,
    );
    for (i, p) in set.prefixes.iter().enumerate() {
        let mut key = u32::from(p.len).to_ne_bytes().to_vec();
        key.extend_from_slice(&p.addr);
        put(fd, &key, &(i as u32).to_ne_bytes());
    }
    let keys = addrs_inside(&set.prefixes, 1 << 20, 0xCA92)
        .into_iter()
        .flat_map(|a| {
            let mut key = 32u32.to_ne_bytes().to_vec();
            key.extend_from_slice(&a);
            key
        })
        .collect();
    Subject {
        case: case(&[
            ("map", &"lpm_trie"),
            ("key", &8),
            ("n", &set.prefixes.len()),
        ]),
        fd,
        keys,
        stride: 8,
        value_size: 4,
    }
}

/// A batch loop over the subject's keys: `lookup(key, value)` per key,
/// `BATCH` keys a call; values folded so no lookup is optimised away.
fn lookup_loop<'a>(
    s: &'a Subject,
    mut lookup: impl FnMut(&[u8], &mut [u8]) -> c_int + 'a,
) -> impl FnMut() -> u64 + 'a {
    let count = s.keys.len() / s.stride;
    let mut at = 0;
    let mut value = vec![0u8; s.value_size];
    move || {
        let mut acc = 0u8;
        for _ in 0..BATCH {
            let key = &s.keys[at * s.stride..(at + 1) * s.stride];
            acc ^= lookup(key, &mut value) as u8 ^ value[0];
            at = if at + 1 == count { 0 } else { at + 1 };
        }
        std::hint::black_box(acc);
        BATCH as u64
    }
}

impl Capi {
    fn measure(ctx: &Ctx, s: &Subject) -> Vec<Record> {
        // C's call: through a pointer the compiler cannot see through.
        let c_lookup: LookupFn = std::hint::black_box(bpfmaps_map_lookup_elem);
        let rates = with_map(s.fd, |map: &dyn Map| {
            // Both callers give the same answers (every key is stored or
            // inside a stored prefix).
            let (mut a, mut b) = (vec![0u8; s.value_size], vec![0u8; s.value_size]);
            for key in s.keys.chunks_exact(s.stride).take(4096) {
                // SAFETY: a key and a value of the map's sizes.
                let c = unsafe { c_lookup(s.fd, key.as_ptr().cast(), b.as_mut_ptr().cast()) };
                assert_eq!((map.lookup(key, &mut a), c), (Ok(()), 0), "{}", s.case);
                assert_eq!(a, b, "{}: the C and Rust answers differ", s.case);
            }
            let mut rust = lookup_loop(s, |k, v| match map.lookup(k, v) {
                Ok(()) => 0,
                Err(e) => -e.errno(),
            });
            // SAFETY: keys and values of the map's sizes.
            let mut c = lookup_loop(s, |k, v| unsafe {
                c_lookup(s.fd, k.as_ptr().cast(), v.as_mut_ptr().cast())
            });
            let mut loops: [&mut dyn FnMut() -> u64; 2] = [&mut rust, &mut c];
            rate_samples_interleaved(ctx.plan(), &mut loops)
        })
        .expect("the handle is open");
        ctx.step();
        [RUST, C]
            .iter()
            .zip(rates)
            .map(|(name, samples)| {
                Record::stats(
                    ctx.suite(),
                    &s.case,
                    name,
                    &NS_PER_LOOKUP,
                    Stats::inverse_of(&samples, 1e9),
                )
            })
            .collect()
    }
}

impl Suite for Capi {
    type Opts = Opts;
    const NAME: &'static str = "capi";
    const ABOUT: &'static str =
        "the C library's lookup call against the byte contract's Map::lookup from Rust, same map";
    const DESCRIBE: &'static str = "Each map is made and filled through the C calls \
        (`bpfmaps_map_create`, `bpfmaps_map_update_elem`); its lookups are then timed in turns \
        from Rust through `Map::lookup` (the byte contract, a copy per call) and through \
        `bpfmaps_map_lookup_elem` called through a function pointer, as C calls it (the handle \
        found under an epoch guard, the pointers checked). Hash maps of random keys looked up \
        in random order; the LPM trie holding the IPv4 table, looked up with addresses inside \
        its prefixes.";
    const BASELINE: &'static str = RUST;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        ctx.set_steps(3);
        let mut recs = Vec::new();
        for key_size in [4, 16] {
            let s = hash_map(opts.entries, key_size);
            let r = Self::measure(ctx, &s);
            ctx.print(&r);
            recs.extend(r);
        }
        let s = lpm_trie(ctx, opts.entries);
        let r = Self::measure(ctx, &s);
        ctx.print(&r);
        recs.extend(r);
        recs
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "capi: a lookup through the C library against Map::lookup from Rust",
            &["map", "Map::lookup ns", "C call ns", "C time / Rust time"],
        )
        .with_note("Target (issue 14): a C lookup at most 1.3x the time of Map::lookup.");
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        for c in cases {
            let rust = find(records, c, RUST, NS_PER_LOOKUP.name);
            let cc = find(records, c, C, NS_PER_LOOKUP.name);
            let ns = |r: Option<&Record>| r.map_or("-".into(), |r| format!("{:.1}", r.value));
            t.push(vec![
                c.to_string(),
                ns(rust),
                ns(cc),
                fmt_ratio(ratio(cc, rust)),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {

    /// A small run: the two callers agree (the suite asserts it) and the
    /// summary has a row per map.
    #[test]
    fn runs_small() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let records = crate::suites::run_quick("capi", &["--entries", "3000"], no_data);
        let suite = crate::suites::by_name("capi").unwrap();
        assert_eq!(records.len(), 6);
        assert!(records.iter().all(|r| r.value > 0.0));
        assert_eq!(
            suite.summaries(&records)[0].to_text().lines().count(),
            2 + 1 + 3
        );
    }
}

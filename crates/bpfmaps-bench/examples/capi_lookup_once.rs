//! A fixed lookup workload for instruction counts of the C library's
//! call (the `capi` suite times loops that run for a time, so callgrind
//! on it cannot give a count a call). A hash map of 10,000 random keys
//! of 4 or 16 bytes (or the LPM trie with 10,000 generated `/24`s, looked
//! up by an address inside each, as a `/32` key), made through the C
//! calls, then each key looked up once through
//! `bpfmaps_map_lookup_elem` by a function pointer, as C calls it, and
//! once through `Map::lookup` from Rust.
//!
//! `cargo build --release -p bpfmaps-bench --example capi_lookup_once`,
//! then `valgrind --tool=callgrind --toggle-collect='*c_lookups*'
//! target/release/examples/capi_lookup_once hash4` (or `hash16`,
//! `lpm`; `'*rust_lookups*'` for `Map::lookup`): the total over the
//! 10,000 lookups, loop included (docs/benchmarks.md, "The C library's
//! call").

use std::ffi::{c_int, c_void};

use bpfmaps::{BPF_F_NO_PREALLOC, Map};
use bpfmaps_bench::suites::capi::{made, put};
use bpfmaps_capi::{
    BPFMAPS_MAP_TYPE_HASH, BPFMAPS_MAP_TYPE_LPM_TRIE, bpfmaps_map_lookup_elem, with_map,
};

const KEYS: usize = 10_000;

type LookupFn = unsafe extern "C" fn(c_int, *const c_void, *mut c_void) -> c_int;

/// The map's handle and its lookup keys, back to back, each stored (or,
/// in the LPM trie, inside a stored prefix).
fn subject(kind: &str) -> (c_int, Vec<u8>, usize) {
    let (fd, stride) = match kind {
        "hash4" => (made(BPFMAPS_MAP_TYPE_HASH, 4, 8, KEYS, 0), 4),
        "hash16" => (made(BPFMAPS_MAP_TYPE_HASH, 16, 8, KEYS, 0), 16),
        "lpm" => (
            made(BPFMAPS_MAP_TYPE_LPM_TRIE, 8, 8, KEYS, BPF_F_NO_PREALLOC),
            8,
        ),
        _ => panic!("usage: capi_lookup_once hash4|hash16|lpm"),
    };
    let mut keys = Vec::with_capacity(KEYS * stride);
    for i in 0..KEYS as u32 {
        let mixed = i.wrapping_mul(0x9E37_79B9);
        let (key, lookup): (Vec<u8>, Vec<u8>) = match kind {
            "lpm" => (
                [24u32.to_ne_bytes(), (mixed & !0xff).to_be_bytes()].concat(),
                [32u32.to_ne_bytes(), (mixed & !0xff | 0x2a).to_be_bytes()].concat(),
            ),
            _ => {
                let key = [i.to_ne_bytes(), mixed.to_ne_bytes(), [7; 4], [9; 4]].concat();
                (key[..stride].to_vec(), key[..stride].to_vec())
            }
        };
        put(fd, &key, &u64::from(i).to_ne_bytes());
        keys.extend_from_slice(&lookup);
    }
    (fd, keys, stride)
}

#[inline(never)]
fn c_lookups(lookup: LookupFn, fd: c_int, keys: &[u8], stride: usize) -> u8 {
    let mut value = [0u8; 8];
    let mut acc = 0;
    for key in keys.chunks_exact(stride) {
        // SAFETY: a key and a value of the map's sizes.
        acc ^= unsafe { lookup(fd, key.as_ptr().cast(), value.as_mut_ptr().cast()) } as u8;
        acc ^= value[0];
    }
    acc
}

#[inline(never)]
fn rust_lookups(map: &dyn Map, keys: &[u8], stride: usize) -> u8 {
    let mut value = [0u8; 8];
    let mut acc = 0;
    for key in keys.chunks_exact(stride) {
        acc ^= map.lookup(key, &mut value).is_ok() as u8;
        acc ^= value[0];
    }
    acc
}

fn main() {
    let kind = std::env::args().nth(1).unwrap_or_default();
    let (fd, keys, stride) = subject(&kind);
    let lookup: LookupFn = std::hint::black_box(bpfmaps_map_lookup_elem);
    let c = c_lookups(lookup, fd, &keys, stride);
    let rust = with_map(fd, |map| rust_lookups(map, &keys, stride)).expect("an open handle");
    println!(
        "{kind}: {} lookups each way ({c} {rust})",
        keys.len() / stride
    );
}

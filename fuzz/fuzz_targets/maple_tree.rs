//! `MapleTree` through its typed API (range stores, inserts, erases,
//! loads, gap searches and walks), against a sorted vector of ranges.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run_maple(data));

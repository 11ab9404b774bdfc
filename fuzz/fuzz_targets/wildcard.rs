//! `WildcardMap` (TupleMerge) on random schemas, rules and packets,
//! against the brute-force classifier.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run_wildcard(data));

//! `MapType::BLOOM_FILTER` through the byte contract, against its model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run(bpfmaps::MapType::BLOOM_FILTER, data));

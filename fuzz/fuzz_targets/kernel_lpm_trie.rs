//! `MapType::KERNEL_LPM_TRIE` through the byte contract, against its model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run(
    bpfmaps::MapType::KERNEL_LPM_TRIE,
    data
));

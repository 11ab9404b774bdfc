//! `MapType::TST` (the ternary search tree; variable-length keys) through
//! the byte contract, against its model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run(bpfmaps::MapType::TST, data));

//! The wildcard map through the byte contract (rule keys of the family's
//! sample schema: update flags, `max_entries`, iteration, batches),
//! against the exact-match model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run(bpfmaps::MapType::WILDCARD, data));

//! `MapType::STACK_TRACE`: `get_stackid` and the byte contract, against a
//! model of the kernel's algorithm.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bpfmaps_fuzz::run_stack_trace(data));

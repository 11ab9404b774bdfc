//! `libbpfmaps.so` and `libbpfmaps.a`: the C library, whose calls are
//! `bpfmaps-capi`'s. Linked here as a whole, so that every
//! `#[no_mangle]` call is in both libraries.

pub use bpfmaps_capi::*;

//! The atomics the shared memory primitives use: std's, or loom's under
//! `cfg(loom)` so that loom can check the protocols built on them.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};

//! The shared core: errors, flags, the byte-level map contract, what a
//! family declares, reclamation. It names no map family: the families
//! depend on it, and `crate::registry` lists them.

pub(crate) mod arena;
pub mod bytes;
pub mod contract;
pub mod error;
pub mod family;
pub mod flags;
pub(crate) mod free_list;
pub(crate) mod prefetch;
pub mod read_section;
pub mod reclaim;
mod sync;

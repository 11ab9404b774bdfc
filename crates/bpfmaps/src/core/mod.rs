//! The shared core: errors, flags, the byte-level map contract, reclamation.

pub mod contract;
pub mod error;
pub mod flags;
pub mod reclaim;

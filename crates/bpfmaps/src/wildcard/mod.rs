//! Multi-field classification: the wildcard map proposed for BPF
//! (2022-2023, never merged), on TupleMerge.
//!
//! A map has a [`Schema`] of up to 9 fields, each a prefix, a range, an
//! exact match or a wildcard match of 1 to 16 bytes. Rules say what they
//! match in each field and carry a priority (lower wins); classifying a
//! concrete key returns the best matching rule's value. [`WildcardMap`]
//! is the TupleMerge classifier with lock-free lookups; [`BruteForce`]
//! is the linear scan it is tested against; [`classbench`] reads the
//! ClassBench rule and trace files the benchmarks use.
//!
//! Status (issue 13): the classifier, its typed API, its tests, a fuzz
//! target (`fuzz/`, `wildcard`) and a benchmark (`wildcard-classbench`).
//! Not yet: the family in the registry (the byte contract with rule and
//! match keys), the conformance suite, the other benchmarks.

pub mod brute;
pub mod classbench;
mod map;
pub mod schema;
#[cfg(test)]
mod tests;

pub use brute::BruteForce;
pub use map::{DEFAULT_COLLISION_LIMIT, WildcardMap};
pub use schema::{Field, FieldKind, Packet, Rule, RuleBuilder, Schema};

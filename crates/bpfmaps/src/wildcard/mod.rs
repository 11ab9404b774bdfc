//! Multi-field classification: the wildcard map proposed for BPF
//! (2022-2023, never merged), on TupleMerge.
//!
//! A map has a [`Schema`] of up to 9 fields, each a prefix, a range, an
//! exact match or a wildcard match of 1 to 16 bytes. Rules say what they
//! match in each field and carry a priority (lower wins); classifying a
//! concrete key returns the best matching rule's value. [`WildcardMap`]
//! is the TupleMerge classifier with lock-free lookups (for a schema of
//! one prefix field, an LPM trie of each prefix's best rule instead,
//! `prefix.rs`); [`BruteForce`]
//! is the linear scan it is tested against; [`classbench`] reads the
//! ClassBench rule and trace files the benchmarks use.
//!
//! Through the byte contract (`create()` with `MapType::WILDCARD`) the
//! schema goes in `map_extra` and keys are rule keys or concrete keys,
//! laid out as the BPF proposal's (see `contract.rs`:
//! [`Schema::rule_key`], [`Schema::match_key`]).
//!
//! An update copies its bucket's chain and frees the old one a grace
//! period later, so its time depends on the program's allocator: cold
//! updates took 17-35 % less time under mimalloc than under glibc's
//! `malloc` (docs/benchmarks.md, "The allocator's share of an update").
//!
//! Status (issue 13): the classifier, its typed API and byte contract,
//! its tests, a fuzz target (`fuzz/`, `wildcard`) and benchmarks
//! (`wildcard-*`); not yet at the speed targets.

pub mod brute;
mod chain;
pub mod classbench;
mod contract;
mod exits;
mod map;
mod match_key;
mod order;
mod prefix;
pub mod schema;
#[cfg(test)]
mod tests;

pub use brute::BruteForce;
pub use contract::{
    BPF_WILDCARD_KEY_ELEM, BPF_WILDCARD_KEY_RULE, SCHEMA_EXTRA_BITS, WILDCARD_FAMILY,
};
pub use map::{DEFAULT_COLLISION_LIMIT, WildcardMap};
pub use schema::{Field, FieldKind, Packet, Rule, RuleBuilder, Schema};

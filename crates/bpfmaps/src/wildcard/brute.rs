//! The brute-force classifier: every rule in priority order, the first
//! that matches wins. The oracle the tests hold [`WildcardMap`] to, and
//! the baseline a benchmark puts beside it.
//!
//! [`WildcardMap`]: super::WildcardMap

use std::collections::BTreeMap;

use super::schema::{Packet, Rule};

/// Rules in their order (priority, then intervals), each with its value.
#[derive(Default, Clone, Debug)]
pub struct BruteForce {
    rules: BTreeMap<Rule, Vec<u8>>,
}

impl BruteForce {
    /// No rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces `rule`; returns the value it had.
    pub fn insert(&mut self, rule: Rule, value: &[u8]) -> Option<Vec<u8>> {
        self.rules.insert(rule, value.to_vec())
    }

    /// Removes `rule`; returns its value.
    pub fn remove(&mut self, rule: &Rule) -> Option<Vec<u8>> {
        self.rules.remove(rule)
    }

    /// The value of exactly `rule`.
    pub fn get(&self, rule: &Rule) -> Option<&[u8]> {
        self.rules.get(rule).map(Vec::as_slice)
    }

    /// The first rule in order that matches `packet`, with its value.
    pub fn classify(&self, packet: &Packet) -> Option<(&Rule, &[u8])> {
        self.rules
            .iter()
            .find(|(r, _)| r.matches(packet))
            .map(|(r, v)| (r, v.as_slice()))
    }

    /// Rules held.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether it holds no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules in order, with their values.
    pub fn iter(&self) -> impl Iterator<Item = (&Rule, &[u8])> {
        self.rules.iter().map(|(r, v)| (r, v.as_slice()))
    }
}

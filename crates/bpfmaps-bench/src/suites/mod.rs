//! The suite registry: one file per suite, listed in [`ALL`].
//!
//! To add a suite: write `NAME.rs` with a unit struct implementing
//! [`Suite`](crate::Suite), then add `mod NAME;` below and the struct to
//! [`ALL`]. The CLI subcommand, `--json`, the report section and its plots
//! come from the trait. New metric names go in
//! [`record::METRICS`](crate::record::METRICS) and `METRICS.md`.

use bpfmaps::HashPolicy;

use crate::suite::Suite;

mod bloom;
mod concurrency;
mod hash_sweep;
mod hashfn;
mod stackmap;

/// Every suite, in the order `report` runs them.
pub const ALL: &[&dyn Suite] = &[
    &hashfn::HashFn,
    &hash_sweep::HashSweep,
    &concurrency::Concurrency,
    &bloom::Bloom,
    &stackmap::StackMap,
];

/// The suite named `name`.
pub fn by_name(name: &str) -> Option<&'static dyn Suite> {
    ALL.iter().copied().find(|s| s.name() == name)
}

/// Parses a [`HashPolicy`] by its short name, for suite options.
pub fn parse_policy(s: &str) -> Result<HashPolicy, String> {
    HashPolicy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("unknown hash policy {s:?} (jhash, xxh3, hybrid)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::default_matches;

    #[test]
    fn names_are_unique_and_options_have_defaults() {
        for (i, s) in ALL.iter().enumerate() {
            assert!(
                ALL[..i].iter().all(|o| o.name() != s.name()),
                "{}",
                s.name()
            );
            assert!(by_name(s.name()).is_some());
            default_matches(*s);
        }
        assert_eq!(parse_policy("hybrid"), Ok(HashPolicy::Hybrid));
        assert!(parse_policy("crc32").is_err());
    }
}

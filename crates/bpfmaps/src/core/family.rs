//! What a map family declares, and the checks every map creation runs
//! before the family's own code: the kernel's `map_create()` in
//! `kernel/bpf/syscall.c`, which checks flags, `map_extra` and sizes
//! before any `map_alloc_check`.
//!
//! The families themselves are listed in one table outside the core,
//! `bpfmaps::registry` (the kernel's `include/linux/bpf_types.h`), which
//! feeds `create()`, the contract tests, the fuzz targets and the bench.

use super::contract::{Map, MapSpec, MapType};
use super::error::{Error, Result};
use super::flags::check_map_flags;

/// The sizes a family accepts for its keys or values: `min..=max` bytes,
/// a multiple of `multiple`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeRule {
    /// Smallest size.
    pub min: u32,
    /// Largest size.
    pub max: u32,
    /// Sizes are a multiple of this (1: any).
    pub multiple: u32,
}

impl SizeRule {
    /// Exactly `n` bytes.
    pub const fn exactly(n: u32) -> Self {
        SizeRule {
            min: n,
            max: n,
            multiple: 1,
        }
    }

    /// Any size from `min` to `max` bytes.
    pub const fn between(min: u32, max: u32) -> Self {
        SizeRule {
            min,
            max,
            multiple: 1,
        }
    }

    /// Sizes in `min..=max` that are a multiple of `multiple`.
    pub const fn multiples(multiple: u32, min: u32, max: u32) -> Self {
        SizeRule { min, max, multiple }
    }

    /// Whether `n` fits the rule.
    pub fn allows(&self, n: u32) -> bool {
        (self.min..=self.max).contains(&n) && n.is_multiple_of(self.multiple)
    }

    fn check(&self, what: &str, n: u32) -> Result<()> {
        if self.allows(n) {
            return Ok(());
        }
        let multiple = match self.multiple {
            1 => String::new(),
            m => format!(", a multiple of {m}"),
        };
        Err(Error::invalid(format!(
            "{what} {n}: this map type takes {}..={}{multiple}",
            self.min, self.max
        )))
    }
}

/// What a map's keys are, so that generic code (the contract tests, the
/// fuzz targets, front ends) can make valid keys and know what a lookup
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Any bytes; a lookup answers the value stored under exactly those
    /// bytes (hash maps).
    Bytes,
    /// A `u32` index below the number of slots (stack ids, arrays).
    Index,
    /// The kernel's `struct bpf_lpm_trie_key_u8`: a native-endian `u32`
    /// prefix length, then the prefix bytes, most significant bit first;
    /// a lookup answers the longest stored prefix that contains the key
    /// and is no longer than its prefix length.
    LpmPrefix,
    /// No keys (`key_size` 0): values are pushed and peeked.
    None,
    /// A range `{first: u64, last: u64}`, native-endian, `first <= last`:
    /// an update stores the range, a lookup answers the range holding
    /// `first`, a delete removes exactly that range (the maple tree).
    /// Disjoint ranges behave as exact-match keys.
    Range,
    /// A wildcard map's key (`bpfmaps::wildcard`, laid out as the BPF
    /// proposal's): a native-endian `u32` type (0 a rule, 1 a concrete
    /// key) and `u32` priority, then the rule's fields or the concrete
    /// key's values. Updates, deletes and iteration take rule keys; a
    /// lookup of a rule key answers that rule, of a concrete key the best
    /// rule matching it. Rule keys behave as exact-match keys.
    Wildcard,
}

/// One map family, as the registry lists it: its type, name, what
/// creation accepts, and its builder.
pub struct Family {
    /// The map type it builds.
    pub map_type: MapType,
    /// Short name, as `bpftool` prints it (`hash`, `lpm_trie`, ...).
    pub name: &'static str,
    /// Creation flags it accepts; others are `EINVAL`.
    pub map_flags: u32,
    /// Bits of `map_extra` it gives a meaning to; others are `EINVAL`
    /// (0: it takes no extra).
    pub map_extra: u64,
    /// Key sizes it accepts.
    pub key_size: SizeRule,
    /// Value sizes it accepts.
    pub value_size: SizeRule,
    /// What its keys are.
    pub keys: KeyKind,
    /// For a family whose key layout `map_extra` sets (the wildcard map's
    /// schema): a key size and extra that go together, which code that
    /// builds any family (the contract tests, the fuzz targets) uses.
    /// `None` for the others.
    pub sample_layout: Option<(u32, u64)>,
    /// Builds the map from a spec that passed the checks above.
    pub build: fn(&MapSpec) -> Result<Box<dyn Map>>,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Family")
            .field("map_type", &self.map_type)
            .field("name", &self.name)
            .field("map_flags", &format_args!("{:#x}", self.map_flags))
            .field("map_extra", &format_args!("{:#x}", self.map_extra))
            .field("key_size", &self.key_size)
            .field("value_size", &self.value_size)
            .field("keys", &self.keys)
            .field("sample_layout", &self.sample_layout)
            .finish_non_exhaustive()
    }
}

impl Family {
    /// Checks what every family has in common (type, flags, extra, sizes,
    /// a non-zero `max_entries`), then builds: `EINVAL` for any spec the
    /// family did not declare, before any of its code runs.
    pub fn create(&self, spec: &MapSpec) -> Result<Box<dyn Map>> {
        self.check(spec)?;
        (self.build)(spec)
    }

    /// The checks of [`create`](Self::create), without building.
    pub fn check(&self, spec: &MapSpec) -> Result<()> {
        if spec.map_type != self.map_type {
            return Err(Error::invalid(format!(
                "a {:?} spec given to the {} family",
                spec.map_type, self.name
            )));
        }
        check_map_flags(spec.flags, self.map_flags)?;
        if spec.extra & !self.map_extra != 0 {
            return Err(Error::invalid(format!(
                "map_extra {:#x}: the {} map takes {}",
                spec.extra,
                self.name,
                match self.map_extra {
                    0 => "none".to_string(),
                    bits => format!("only bits {bits:#x}"),
                }
            )));
        }
        self.key_size.check("key_size", spec.key_size)?;
        self.value_size.check("value_size", spec.value_size)?;
        if spec.max_entries == 0 {
            return Err(Error::invalid("max_entries must be non-zero"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_rules_say_what_they_take() {
        let rule = SizeRule::multiples(8, 8, 1016);
        assert!(rule.allows(8) && rule.allows(1016) && !rule.allows(12) && !rule.allows(0));
        assert_eq!(
            rule.check("value_size", 12).unwrap_err().to_string(),
            "invalid argument: value_size 12: this map type takes 8..=1016, a multiple of 8"
        );
        assert!(SizeRule::exactly(4).allows(4) && !SizeRule::exactly(4).allows(5));
    }
}

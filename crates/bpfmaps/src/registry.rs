//! The family registry: every map type bpfmaps builds, in one table, as
//! the kernel lists its map types in `include/linux/bpf_types.h`.
//!
//! Each family declares itself in its own module (a [`Family`]: type,
//! name, accepted flags and extra, key and value sizes, key kind,
//! builder); this table is the one place that lists them. [`create`],
//! the contract tests (`conformance`), the fuzz targets and the bench
//! read it, so adding a family is one module and one line here.
//!
//! ```
//! use bpfmaps::registry::{FAMILIES, family};
//! use bpfmaps::MapType;
//!
//! assert_eq!(family(MapType::LPM_TRIE).unwrap().name, "lpm_trie");
//! assert!(FAMILIES.iter().any(|f| f.map_type == MapType::KERNEL_LPM_TRIE));
//! ```

use crate::core::contract::{Map, MapSpec, MapType};
use crate::core::error::{Error, Result};
use crate::core::family::Family;

/// Every map family, in the order of their type numbers.
pub static FAMILIES: &[&Family] = &[
    &crate::hashtab::HASH_FAMILY,
    &crate::stackmap::STACK_TRACE_FAMILY,
    &crate::hashtab::LRU_HASH_FAMILY,
    &crate::lpm::LPM_TRIE_FAMILY,
    &crate::bloom::BLOOM_FILTER_FAMILY,
    &crate::lpm::KERNEL_LPM_TRIE_FAMILY,
    &crate::strmap::QP_TRIE_FAMILY,
    &crate::strmap::TST_FAMILY,
    &crate::maple::MAPLE_TREE_FAMILY,
    &crate::wildcard::WILDCARD_FAMILY,
    #[cfg(test)]
    &crate::conformance::toy::TOY_FAMILY,
];

/// The family of `map_type`, if bpfmaps has it.
pub fn family(map_type: MapType) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.map_type == map_type)
}

impl MapType {
    /// The family's short name (`hash`, `lpm_trie`, ...), or `None` for a
    /// type bpfmaps does not have.
    pub fn name(self) -> Option<&'static str> {
        family(self).map(|f| f.name)
    }
}

/// Builds any map from its spec, as `bpf_map_create` does: `EINVAL` for a
/// type bpfmaps does not have, then the checks common to every family
/// ([`Family::create`]), then the family's builder.
///
/// ```
/// use bpfmaps::{create, Map, MapSpec, MapType, BPF_ANY};
///
/// let map = create(&MapSpec::new(MapType::HASH, 4, 8, 1024)).unwrap();
/// map.update(&7u32.to_ne_bytes(), &42u64.to_ne_bytes(), BPF_ANY).unwrap();
/// let mut value = [0u8; 8];
/// map.lookup(&7u32.to_ne_bytes(), &mut value).unwrap();
/// assert_eq!(u64::from_ne_bytes(value), 42);
/// ```
pub fn create(spec: &MapSpec) -> Result<Box<dyn Map>> {
    family(spec.map_type)
        .ok_or_else(|| {
            Error::invalid(format!(
                "map type {} is not one bpfmaps has",
                spec.map_type.0
            ))
        })?
        .create(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_names_are_unique_and_ordered() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert!(
                FAMILIES[..i]
                    .iter()
                    .all(|g| g.name != f.name && g.map_type < f.map_type),
                "{f:?}"
            );
            assert_eq!(family(f.map_type).map(|g| g.name), Some(f.name));
        }
        assert_eq!(MapType::HASH.name(), Some("hash"));
        assert_eq!(MapType(12345).name(), None);
    }

    #[test]
    fn an_unknown_type_is_einval() {
        let err = create(&MapSpec::new(MapType(12345), 4, 4, 4)).unwrap_err();
        assert_eq!(err.errno(), 22);
    }
}

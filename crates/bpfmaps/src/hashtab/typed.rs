//! Typed front ends: keys and values are plain-old-data Rust types, values
//! are borrowed in place under a guard (zero-copy).

use std::marker::PhantomData;

use bytemuck::Pod;

use super::slab::ELEM_ALIGN;
use super::{HashMap, HashOptions, LruHashMap};
use crate::core::contract::Map;
use crate::core::error::{Error, Result};
use crate::core::flags::BPF_ANY;
use crate::core::reclaim::{Guard, pin};

fn check_types<K, V>() -> Result<()> {
    if align_of::<V>() > ELEM_ALIGN {
        return Err(Error::invalid(
            "value types aligned above 8 bytes cannot be borrowed in place",
        ));
    }
    if size_of::<K>() == 0 || size_of::<V>() == 0 {
        return Err(Error::invalid("zero-sized keys or values"));
    }
    Ok(())
}

macro_rules! typed_map {
    ($(#[$doc:meta])* $name:ident, $raw:ident) => {
        $(#[$doc])*
        pub struct $name<K, V> {
            raw: $raw,
            _types: PhantomData<fn() -> (K, V)>,
        }

        impl<K: Pod, V: Pod> $name<K, V> {
            /// A map of at most `max_entries` entries, default options.
            pub fn new(max_entries: u32) -> Result<Self> {
                Self::with_options(max_entries, HashOptions::default())
            }

            /// A map with explicit options.
            pub fn with_options(max_entries: u32, options: HashOptions) -> Result<Self> {
                check_types::<K, V>()?;
                let raw = $raw::with_options(size_of::<K>(), size_of::<V>(), max_entries, options)?;
                Ok($name { raw, _types: PhantomData })
            }

            /// The value under `key`, borrowed while `guard` is pinned.
            #[inline]
            pub fn get<'g>(&'g self, key: &K, guard: &'g Guard) -> Option<&'g V> {
                self.raw.get(bytemuck::bytes_of(key), guard).map(bytemuck::from_bytes)
            }

            /// A copy of the value under `key`.
            pub fn get_copy(&self, key: &K) -> Option<V> {
                self.get(key, &pin()).copied()
            }

            /// Inserts or replaces (`BPF_ANY`).
            pub fn insert(&self, key: &K, value: &V) -> Result<()> {
                self.update(key, value, BPF_ANY)
            }

            /// Inserts with explicit update flags.
            pub fn update(&self, key: &K, value: &V, flags: u64) -> Result<()> {
                self.raw.update(bytemuck::bytes_of(key), bytemuck::bytes_of(value), flags)
            }

            /// Removes `key`, returning its value.
            pub fn remove(&self, key: &K) -> Result<V> {
                let mut value = V::zeroed();
                self.raw.lookup_and_delete(bytemuck::bytes_of(key), bytemuck::bytes_of_mut(&mut value))?;
                Ok(value)
            }

            /// Number of entries.
            pub fn len(&self) -> usize {
                self.raw.len()
            }

            /// Whether the map is empty.
            pub fn is_empty(&self) -> bool {
                self.raw.len() == 0
            }

            /// Visits every entry under one guard (weakly consistent).
            pub fn for_each<'g>(&'g self, guard: &'g Guard, mut f: impl FnMut(&'g K, &'g V)) {
                self.raw.for_each(guard, |k, v| f(bytemuck::from_bytes(k), bytemuck::from_bytes(v)))
            }

            /// The byte-level map underneath.
            pub fn as_raw(&self) -> &$raw {
                &self.raw
            }
        }
    };
}

typed_map!(
    /// A [`HashMap`] with typed keys and values.
    ///
    /// ```
    /// use bpfmaps::hashtab::TypedHashMap;
    ///
    /// let flows: TypedHashMap<[u32; 4], u64> = TypedHashMap::new(1024).unwrap();
    /// flows.insert(&[10, 0, 0, 1], &1500).unwrap();
    /// let guard = bpfmaps::pin();
    /// assert_eq!(flows.get(&[10, 0, 0, 1], &guard), Some(&1500));
    /// ```
    TypedHashMap,
    HashMap
);

typed_map!(
    /// An [`LruHashMap`] with typed keys and values.
    ///
    /// ```
    /// use bpfmaps::hashtab::TypedLruHashMap;
    ///
    /// let lru: TypedLruHashMap<u32, u32> = TypedLruHashMap::new(2).unwrap();
    /// for k in 0..10 {
    ///     lru.insert(&k, &k).unwrap(); // never E2BIG: evicts instead
    /// }
    /// assert_eq!(lru.len(), 2);
    /// ```
    TypedLruHashMap,
    LruHashMap
);

//! What a string map is created for, checked once for every string map:
//! its longest key, its value size and its capacity ([`Limits`]); what it
//! counts as it changes ([`Counts`]); and the methods both maps have over
//! those and over their ordered walk, written once
//! ([`string_map_methods!`]).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use super::qptrie::MAX_KEY_SIZE;
use crate::core::error::{Error, Result};

/// A string map's creation sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Longest key, 1 to [`MAX_KEY_SIZE`] bytes.
    pub max_key_size: usize,
    /// Bytes of every value, 1 to 65535.
    pub value_size: usize,
    /// Most keys held.
    pub max_entries: u32,
}

impl Limits {
    /// `EINVAL` for sizes no string map takes.
    pub fn new(max_key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        if !(1..=MAX_KEY_SIZE).contains(&max_key_size) {
            return Err(Error::invalid(format!(
                "key_size {max_key_size}: a string map's keys are 1 to {MAX_KEY_SIZE} bytes"
            )));
        }
        if value_size == 0 || value_size > u16::MAX as usize {
            return Err(Error::invalid(format!(
                "value_size {value_size}: 1 to 65535 bytes"
            )));
        }
        if max_entries == 0 {
            return Err(Error::invalid("max_entries 0"));
        }
        Ok(Limits {
            max_key_size,
            value_size,
            max_entries,
        })
    }

    /// `EINVAL` for a key that is empty or longer than the longest.
    pub fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > self.max_key_size {
            return Err(Error::invalid(format!(
                "key of {} bytes: this map takes 1 to {} bytes",
                key.len(),
                self.max_key_size
            )));
        }
        Ok(())
    }
}

/// What a string map counts as it changes.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Keys held, at most `max_entries`.
    pub keys: AtomicUsize,
    /// Bytes of nodes allocated and not yet freed (retired ones included);
    /// shared with the deferred frees, which take off what they free.
    pub node_bytes: Arc<AtomicUsize>,
}

/// The methods both string maps have alike, expanded inside each map's
/// `impl`: the creation sizes, the key count and the capacity check over
/// the map's fields `limits: Limits` and `counts: Counts`, and
/// `for_each`, `next_key` and `with_next_key` over its `for_each_in`.
macro_rules! string_map_methods {
    () => {
        /// Longest key.
        pub fn max_key_size(&self) -> usize {
            self.limits.max_key_size
        }

        /// Value size in bytes.
        pub fn value_size(&self) -> usize {
            self.limits.value_size
        }

        /// Capacity.
        pub fn max_entries(&self) -> u32 {
            self.limits.max_entries
        }

        /// Number of keys.
        pub fn len(&self) -> usize {
            self.counts
                .keys
                .load(::std::sync::atomic::Ordering::Relaxed)
        }

        /// Whether the map holds no key.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        fn check_key(&self, key: &[u8]) -> $crate::core::error::Result<()> {
            self.limits.check_key(key)
        }

        /// Takes one of the `max_entries` places for a new key.
        fn reserve(&self) -> $crate::core::error::Result<()> {
            use ::std::sync::atomic::Ordering::Relaxed;
            let max = self.limits.max_entries as usize;
            self.counts
                .keys
                .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
                .map(drop)
                .map_err(|_| $crate::core::error::Error::Full)
        }

        /// Calls `f` with every key and value in order, until it breaks.
        pub fn for_each<'g>(
            &'g self,
            guard: &'g $crate::core::reclaim::Guard,
            mut f: impl FnMut(&[u8], &'g [u8]) -> ::std::ops::ControlFlow<()>,
        ) {
            use ::std::ops::Bound::Unbounded;
            self.for_each_in((Unbounded, Unbounded), guard, &mut f);
        }

        /// The key after `key` in order (`None`: the first) into `next`;
        /// `ENOENT` after the last. `key` need not be stored (a walk
        /// continues past a deleted key).
        pub fn next_key(
            &self,
            key: Option<&[u8]>,
            next: &mut Vec<u8>,
        ) -> $crate::core::error::Result<()> {
            self.with_next_key(key, &$crate::core::reclaim::pin(), |k| {
                next.clear();
                next.extend_from_slice(k);
            })
        }

        /// Calls `f` with the first stored key after `key` (`None`: the
        /// first key); `ENOENT` if there is none.
        pub(super) fn with_next_key(
            &self,
            key: Option<&[u8]>,
            guard: &$crate::core::reclaim::Guard,
            f: impl FnOnce(&[u8]),
        ) -> $crate::core::error::Result<()> {
            use ::std::ops::{Bound, ControlFlow};
            let lower = key.map_or(Bound::Unbounded, Bound::Excluded);
            let mut f = Some(f);
            self.for_each_in((lower, Bound::Unbounded), guard, |k, _| {
                f.take().expect("called once")(k);
                ControlFlow::Break(())
            });
            if f.is_none() {
                Ok(())
            } else {
                Err($crate::core::error::Error::NotFound)
            }
        }
    };
}
pub(super) use string_map_methods;

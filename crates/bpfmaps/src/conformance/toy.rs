//! A toy family for the contract tests: a `BTreeMap` behind a mutex,
//! registered in the table under `cfg(test)` to show that a family needs
//! one module and one table line, and wrapped in planted bugs the suite
//! must catch.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::core::contract::{BatchError, Caps, Map, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::UpdateFlag;
use crate::core::reclaim::Guard;

impl MapType {
    /// The toy map of the contract tests.
    pub const TOY: MapType = MapType(MapType::PRIVATE + 0xFFF);
}

/// The toy family, as registered.
pub const TOY_FAMILY: Family = Family {
    map_type: MapType::TOY,
    name: "toy",
    map_flags: 0,
    map_extra: 0,
    key_size: SizeRule::between(1, 64),
    value_size: SizeRule::between(1, 64),
    keys: KeyKind::Bytes,
    sample_layout: None,
    build: |spec| Ok(Box::new(ToyMap::new(spec))),
};

/// An exact-match map with every operation.
pub struct ToyMap {
    info: MapInfo,
    entries: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl ToyMap {
    fn new(spec: &MapSpec) -> Self {
        ToyMap {
            info: spec.info(),
            entries: Mutex::new(BTreeMap::new()),
        }
    }
}

impl MapOps for ToyMap {
    const CAPS: Caps = Caps::KEYED.union(Caps::LOOKUP_AND_DELETE);
    fn map_info(&self) -> MapInfo {
        self.info
    }
    fn map_len(&self) -> usize {
        self.entries.lock().len()
    }
    fn map_mem_usage(&self) -> usize {
        size_of::<Self>()
    }
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        value.copy_from_slice(self.entries.lock().get(key).ok_or(Error::NotFound)?);
        Ok(())
    }
    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        let mut entries = self.entries.lock();
        let present = entries.contains_key(key);
        flag.check(present)?;
        if !present && entries.len() >= self.info.max_entries as usize {
            return Err(Error::Full);
        }
        entries.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        self.entries
            .lock()
            .remove(key)
            .map(drop)
            .ok_or(Error::NotFound)
    }
    fn map_lookup_and_delete_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        value.copy_from_slice(&self.entries.lock().remove(key).ok_or(Error::NotFound)?);
        Ok(())
    }
    fn map_get_next_key(&self, key: Option<&[u8]>, next: &mut [u8], _: &Guard) -> Result<usize> {
        let entries = self.entries.lock();
        let after = key.filter(|k| entries.contains_key(*k));
        let found = match after {
            Some(k) => entries.range(k.to_vec()..).nth(1),
            None => entries.iter().next(),
        };
        next.copy_from_slice(found.ok_or(Error::NotFound)?.0);
        Ok(next.len())
    }
}

/// A bug planted in a [`Buggy`] map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// An update with a value of the wrong size stores the key (with a
    /// zeroed value) before answering `EINVAL`.
    ModifiesBeforeEinval,
    /// Unknown update flags are taken as `BPF_ANY`.
    AcceptsUnknownFlags,
    /// `get_next_key` never reports the end.
    EndlessIteration,
}

/// The toy map with a bug: implements [`Map`] by hand, as a family that
/// bypassed the generic layer would.
pub struct Buggy {
    toy: ToyMap,
    bug: Bug,
}

impl Buggy {
    /// A family building toy maps with `bug`.
    pub const fn family(bug: Bug) -> Family {
        Family {
            build: match bug {
                Bug::ModifiesBeforeEinval => {
                    |s| Ok(Box::new(Buggy::new(s, Bug::ModifiesBeforeEinval)))
                }
                Bug::AcceptsUnknownFlags => {
                    |s| Ok(Box::new(Buggy::new(s, Bug::AcceptsUnknownFlags)))
                }
                Bug::EndlessIteration => |s| Ok(Box::new(Buggy::new(s, Bug::EndlessIteration))),
            },
            ..TOY_FAMILY
        }
    }

    fn new(spec: &MapSpec, bug: Bug) -> Self {
        Buggy {
            toy: ToyMap::new(spec),
            bug,
        }
    }
}

impl Map for Buggy {
    fn info(&self) -> MapInfo {
        self.toy.info()
    }
    fn caps(&self) -> Caps {
        self.toy.caps()
    }
    fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.toy.lookup(key, value)
    }
    fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        let vs = self.toy.info.value_size as usize;
        match self.bug {
            Bug::ModifiesBeforeEinval if value.len() != vs && key.len() == self.toy.key_size() => {
                self.toy.entries.lock().insert(key.to_vec(), vec![0; vs]);
                Err(Error::invalid("value size"))
            }
            Bug::AcceptsUnknownFlags if flags > 2 => self.toy.update(key, value, 0),
            _ => self.toy.update(key, value, flags),
        }
    }
    fn delete(&self, key: &[u8]) -> Result<()> {
        self.toy.delete(key)
    }
    fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.toy.lookup_and_delete(key, value)
    }
    fn get_next_key(&self, key: Option<&[u8]>, next: &mut [u8]) -> Result<usize> {
        match (self.bug, self.toy.get_next_key(key, next)) {
            (Bug::EndlessIteration, Err(Error::NotFound)) if key.is_some() => {
                self.toy.get_next_key(None, next)
            }
            (_, r) => r,
        }
    }
    fn len(&self) -> usize {
        self.toy.len()
    }
    fn memory_usage(&self) -> usize {
        self.toy.memory_usage()
    }
    fn push(&self, value: &[u8], flags: u64) -> Result<()> {
        self.toy.push(value, flags)
    }
    fn peek(&self, value: &mut [u8]) -> Result<()> {
        self.toy.peek(value)
    }
    fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError> {
        self.toy.lookup_batch(after, keys, values)
    }
    fn lookup_and_delete_batch(
        &self,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError> {
        self.toy.lookup_and_delete_batch(keys, values)
    }
    fn update_batch(&self, keys: &[u8], values: &[u8], flags: u64) -> Result<usize, BatchError> {
        self.toy.update_batch(keys, values, flags)
    }
    fn delete_batch(&self, keys: &[u8]) -> Result<usize, BatchError> {
        self.toy.delete_batch(keys)
    }
}

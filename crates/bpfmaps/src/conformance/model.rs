//! Models of what a map answers, from `std::collections` and brute force:
//! the oracle of the differential runs and the fuzz targets.
//!
//! A model answers exactly as the contract says, checks included: the
//! operation's capability (`EOPNOTSUPP`), then flags and sizes (`EINVAL`),
//! then what the family's keys mean.

use std::collections::{BTreeMap, BTreeSet};

use super::{Contents, Violation};
use crate::core::contract::{BatchError, Caps, MapInfo};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::KeyKind;
use crate::core::flags::UpdateFlag;
use crate::lpm::key::{KEY_HEADER, KeyRef, encode_key, mask_host_bits, prefix_contains};

/// The model of one map.
#[derive(Debug)]
pub struct Model {
    info: MapInfo,
    caps: Caps,
    kind: Kind,
    /// Keyed maps: each stored key, normalised (LPM host bits cleared), to
    /// its value.
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug)]
enum Kind {
    /// Exact-match bytes keys.
    Exact,
    /// LPM keys: a lookup answers the longest stored prefix containing it.
    Lpm,
    /// A key-less map (the bloom filter): what was pushed, and how often.
    Pushed(BTreeSet<Vec<u8>>, usize),
}

impl Model {
    /// The model of an empty map with `info` and `caps` whose keys are
    /// `keys`; `None` for keys without a model (indices are only written
    /// by the family's own API).
    pub fn new(keys: KeyKind, info: &MapInfo, caps: Caps) -> Option<Model> {
        let kind = match keys {
            // The suite's range keys are disjoint, and its wildcard keys
            // rule keys in their one spelling: exact-match keys.
            KeyKind::Bytes | KeyKind::Range | KeyKind::Wildcard => Kind::Exact,
            KeyKind::LpmPrefix => Kind::Lpm,
            KeyKind::None => Kind::Pushed(BTreeSet::new(), 0),
            KeyKind::Index => return None,
        };
        Some(Model {
            info: *info,
            caps,
            kind,
            entries: BTreeMap::new(),
        })
    }

    fn require(&self, caps: Caps) -> Result<()> {
        if self.caps.contains(caps) {
            Ok(())
        } else {
            Err(Error::Unsupported)
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        let max = self.info.key_size as usize;
        if self.caps.contains(Caps::VAR_KEYS) {
            if (1..=max).contains(&key.len()) {
                Ok(())
            } else {
                Err(Error::invalid("key size"))
            }
        } else {
            check_len("key", key.len(), max)
        }
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        check_len("value", value.len(), self.info.value_size as usize)
    }

    fn len(&self) -> usize {
        match &self.kind {
            Kind::Pushed(_, pushes) => *pushes,
            _ => self.entries.len(),
        }
    }

    /// The key under which the model stores `key` (size checked): itself,
    /// or for LPM keys the prefix with its host bits cleared (`EINVAL` for
    /// a prefix length over the data's bits).
    fn normal(&self, key: &[u8]) -> Result<Vec<u8>> {
        match self.kind {
            Kind::Lpm => {
                let k = KeyRef::parse(key, self.info.key_size as usize - KEY_HEADER)?;
                let mut data = k.data.to_vec();
                mask_host_bits(&mut data, k.prefixlen);
                Ok(encode_key(k.prefixlen, &data))
            }
            _ => Ok(key.to_vec()),
        }
    }

    /// `lookup(key)` into a value buffer like `out` (for a key-less map,
    /// `out` is the value peeked).
    pub fn lookup(&self, key: &[u8], out: &[u8]) -> Result<Vec<u8>> {
        if let Kind::Pushed(values, _) = &self.kind {
            check_len("key", key.len(), 0)?;
            self.check_value(out)?;
            return if values.contains(out) {
                Ok(out.to_vec())
            } else {
                Err(Error::NotFound)
            };
        }
        self.require(Caps::LOOKUP)?;
        self.check_key(key)?;
        self.check_value(out)?;
        if let Kind::Exact = self.kind {
            return self.entries.get(key).cloned().ok_or(Error::NotFound);
        }
        // The kernel's LPM lookup: the longest stored prefix no longer than
        // the key's that contains its data; nothing for a prefix length
        // over the data's bits.
        let data_size = self.info.key_size as usize - KEY_HEADER;
        let len = prefixlen(key);
        if len as usize > 8 * data_size {
            return Err(Error::NotFound);
        }
        self.entries
            .iter()
            .filter(|(p, _)| {
                prefixlen(p) <= len
                    && prefix_contains(&p[KEY_HEADER..], prefixlen(p), &key[KEY_HEADER..])
            })
            .max_by_key(|(p, _)| prefixlen(p))
            .map(|(_, v)| v.clone())
            .ok_or(Error::NotFound)
    }

    /// `update(key, value, flags)`.
    pub fn update(&mut self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        if let Kind::Pushed(values, pushes) = &mut self.kind {
            check_len("key", key.len(), 0)?;
            let flag = UpdateFlag::from_bits(flags)?;
            check_len("value", value.len(), self.info.value_size as usize)?;
            // The bloom filter's push takes BPF_ANY only.
            if flag != UpdateFlag::Any {
                return Err(Error::invalid("push flags"));
            }
            values.insert(value.to_vec());
            *pushes += 1;
            return Ok(());
        }
        self.require(Caps::UPDATE)?;
        let flag = UpdateFlag::from_bits(flags)?;
        self.check_key(key)?;
        self.check_value(value)?;
        let key = self.normal(key)?;
        let present = self.entries.contains_key(&key);
        flag.check(present)?;
        let full = self.entries.len() >= self.info.max_entries as usize;
        if !present && full && !self.caps.contains(Caps::EVICTS) {
            return Err(Error::Full);
        }
        self.entries.insert(key, value.to_vec());
        Ok(())
    }

    /// `delete(key)`.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.require(Caps::DELETE)?;
        self.check_key(key)?;
        let key = self.normal(key)?;
        self.entries.remove(&key).map(drop).ok_or(Error::NotFound)
    }

    /// `lookup_and_delete(key)` into a buffer of the right size.
    pub fn lookup_and_delete(&mut self, key: &[u8]) -> Result<Vec<u8>> {
        self.require(Caps::LOOKUP_AND_DELETE)?;
        self.check_key(key)?;
        let key = self.normal(key)?;
        self.entries.remove(&key).ok_or(Error::NotFound)
    }

    /// Bytes per key in a batch: a variable-length key is preceded by its
    /// length (`u32`) and padded to `key_size`.
    fn batch_key_size(&self) -> usize {
        self.info.key_size as usize
            + if self.caps.contains(Caps::VAR_KEYS) {
                4
            } else {
                0
            }
    }

    /// The key a batch slot holds. A variable-length key's length past
    /// the slot gives a key one byte too long (which `update` and
    /// `delete` then refuse).
    fn batch_key(&self, slot: &[u8]) -> Vec<u8> {
        if !self.caps.contains(Caps::VAR_KEYS) {
            return slot.to_vec();
        }
        let (len, key) = slot.split_at(4);
        let len = u32::from_ne_bytes(len.try_into().expect("4 bytes")) as usize;
        match key.get(..len) {
            Some(key) => key.to_vec(),
            None => vec![0; key.len() + 1],
        }
    }

    /// The batch checks before the first element.
    fn batch_room(&self, keys: usize, values: usize, caps: Caps) -> Result<usize> {
        self.require(Caps::BATCH | caps)?;
        let (ks, vs) = (self.batch_key_size(), self.info.value_size as usize);
        if !keys.is_multiple_of(ks) || !values.is_multiple_of(vs) {
            return Err(Error::invalid("batch buffers"));
        }
        Ok((keys / ks).min(values / vs))
    }

    /// `update_batch(keys, values, flags)`.
    pub fn update_batch(
        &mut self,
        keys: &[u8],
        values: &[u8],
        flags: u64,
    ) -> Result<usize, BatchError> {
        let at_start = |error| BatchError {
            processed: 0,
            error,
        };
        self.require(Caps::BATCH | Caps::UPDATE).map_err(at_start)?;
        UpdateFlag::from_bits(flags).map_err(at_start)?;
        let n = self
            .batch_room(keys.len(), values.len(), Caps::UPDATE)
            .map_err(at_start)?;
        let (ks, vs) = (self.batch_key_size(), self.info.value_size as usize);
        if keys.len() != n * ks || values.len() != n * vs {
            return Err(at_start(Error::invalid("counts")));
        }
        for i in 0..n {
            let key = self.batch_key(&keys[i * ks..][..ks]);
            self.update(&key, &values[i * vs..][..vs], flags)
                .map_err(|error| BatchError {
                    processed: i,
                    error,
                })?;
        }
        Ok(n)
    }

    /// `delete_batch(keys)`.
    pub fn delete_batch(&mut self, keys: &[u8]) -> Result<usize, BatchError> {
        let at_start = |error| BatchError {
            processed: 0,
            error,
        };
        self.require(Caps::BATCH | Caps::DELETE).map_err(at_start)?;
        let ks = self.batch_key_size();
        if !keys.len().is_multiple_of(ks) {
            return Err(at_start(Error::invalid("batch keys")));
        }
        for (i, slot) in keys.chunks_exact(ks).enumerate() {
            self.delete(&self.batch_key(slot))
                .map_err(|error| BatchError {
                    processed: i,
                    error,
                })?;
        }
        Ok(keys.len() / ks)
    }

    /// Checks what `get_next_key(key)` answered: a stored key, or `ENOENT`
    /// only if the map is empty or `key` was given (the last key, or a key
    /// the family does not restart from). Which key comes next is the
    /// family's order, which the model does not know.
    pub fn check_next_key(
        &self,
        key: Option<&[u8]>,
        got: Result<Vec<u8>>,
    ) -> Result<(), Violation> {
        let want_err = match self.require(Caps::NEXT_KEY) {
            Err(e) => Some(e),
            Ok(()) => key.and_then(|k| self.check_key(k).err()),
        };
        // A prefix length over the data's bits: the LPM trie says EINVAL,
        // the kernel port restarts from the first key.
        let lenient = key.is_some_and(|k| self.normal(k).is_err());
        match (want_err, got) {
            (Some(w), Err(g)) if w.errno() == g.errno() => Ok(()),
            (Some(w), got) => Err(Violation(format!(
                "get_next_key after {key:?}: map answered {got:?}, model errno {}",
                w.errno()
            ))),
            (None, Err(Error::Invalid(_))) if lenient => Ok(()),
            (None, Err(Error::NotFound)) if key.is_some() || self.entries.is_empty() => Ok(()),
            (None, Ok(next)) => match self.normal(&next) {
                Ok(n) if self.entries.contains_key(&n) => Ok(()),
                _ => Err(Violation(format!(
                    "get_next_key after {key:?} gave {next:?}, which is not stored"
                ))),
            },
            (None, got) => Err(Violation(format!(
                "get_next_key after {key:?}: map answered {got:?} with {} keys stored",
                self.entries.len()
            ))),
        }
    }

    /// Checks a map's whole contents against the model; `probes` are the
    /// values `contents` peeked for a key-less map.
    pub fn check_contents(&self, got: &Contents, probes: &[Vec<u8>]) -> Result<(), Violation> {
        if got.len != self.len() {
            return Err(Violation(format!(
                "len() is {}, the model holds {}",
                got.len,
                self.len()
            )));
        }
        if let Kind::Pushed(values, _) = &self.kind {
            for (probe, &errno) in probes.iter().zip(&got.peeks) {
                if values.contains(probe) && errno != 0 {
                    return Err(Violation(format!(
                        "peek of pushed {probe:?} answered errno {errno}: a false negative"
                    )));
                }
                if errno != 0 && errno != 2 {
                    return Err(Violation(format!(
                        "peek of {probe:?} answered errno {errno}"
                    )));
                }
            }
            return Ok(());
        }
        let mut entries = BTreeMap::new();
        for (k, v) in &got.entries {
            let n = self
                .normal(k)
                .map_err(|e| Violation(format!("iterated key {k:?}: {e}")))?;
            entries.insert(n, v.clone());
        }
        if entries != self.entries {
            return Err(Violation(format!(
                "contents differ from the model: map {entries:?}, model {:?}",
                self.entries
            )));
        }
        Ok(())
    }
}

/// The prefix length of a (size-checked) LPM key.
fn prefixlen(key: &[u8]) -> u32 {
    u32::from_ne_bytes(key[..KEY_HEADER].try_into().expect("4 bytes"))
}

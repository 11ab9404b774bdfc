//! The LPM trie's byte contract: `BPF_MAP_TYPE_LPM_TRIE`'s family entry
//! and its `bpf_map_ops`.

use std::sync::atomic::Ordering;

use super::LpmTrie;
use crate::core::contract::{
    BatchError, Caps, MapInfo, MapOps, MapSpec, MapType, update_each, update_in_bulk,
};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::Guard;
use crate::lpm::key::{self, KeyRef};

impl MapType {
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    pub const LPM_TRIE: MapType = MapType(11);
}

/// `BPF_MAP_TYPE_LPM_TRIE`, for the registry: `key_size = 4 + data_size`;
/// flags 0 or `BPF_F_NO_PREALLOC` (which the kernel requires; here it
/// changes nothing).
pub const LPM_TRIE_FAMILY: Family = Family {
    map_type: MapType::LPM_TRIE,
    name: "lpm_trie",
    map_flags: BPF_F_NO_PREALLOC,
    map_extra: 0,
    key_size: key::KEY_SIZE,
    value_size: key::VALUE_SIZE,
    keys: KeyKind::LpmPrefix,
    sample_layout: None,
    build: |spec| Ok(Box::new(LpmTrie::from_spec(spec)?)),
};

impl LpmTrie {
    /// Builds from a spec that passed [`LPM_TRIE_FAMILY`]'s checks.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        let data_size = spec.key_size as usize - key::KEY_HEADER;
        let mut trie = Self::new(data_size, spec.value_size as usize, spec.max_entries)?;
        trie.map_flags = spec.flags;
        Ok(trie)
    }

    fn check_key_data<'k>(&self, key: &'k [u8]) -> Result<KeyRef<'k>> {
        KeyRef::parse(key, self.data_size)
    }
}

/// The kernel's `trie_map_ops`, plus lookup-and-delete.
impl MapOps for LpmTrie {
    const CAPS: Caps = Caps::KEYED.union(Caps::LOOKUP_AND_DELETE);

    fn map_info(&self) -> MapInfo {
        let (ds, vs) = (self.data_size, self.value_size);
        key::info(MapType::LPM_TRIE, ds, vs, self.max_entries, self.map_flags)
    }

    fn map_len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn map_mem_usage(&self) -> usize {
        LpmTrie::memory_usage(self)
    }

    /// Longest match for the key's data among prefixes no longer than the
    /// key's `prefixlen` (as the kernel); full-length keys take the fast path.
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        // The kernel's lookup finds nothing, rather than failing, for a
        // prefix length over the data's bits.
        let k = self.check_key_data(key).map_err(|_| Error::NotFound)?;
        if k.prefixlen as usize == 8 * self.data_size {
            value.copy_from_slice(&self.get(k.data, guard).ok_or(Error::NotFound)?);
        } else {
            let best = self
                .covering(k.data, k.prefixlen, guard)?
                .pop()
                .ok_or(Error::NotFound)?;
            value.copy_from_slice(&self.value_of(&best, guard));
        }
        Ok(())
    }

    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.insert(k.data, k.prefixlen, value, flag.bits())
    }

    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.remove(k.data, k.prefixlen, None)
    }

    fn map_lookup_and_delete_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.remove(k.data, k.prefixlen, Some(value))
    }

    /// A batch of `BPF_ANY` updates as large as a quarter of the trie (and
    /// at least 64) is one bulk load (`extend`): each node built once.
    /// Elements up to the first bad key go in; the error then says where
    /// it stopped, as one by one would. Anything the bulk load refuses
    /// (`E2BIG`, `EBUSY`) is retried one by one, so the count is exact.
    fn map_update_batch(
        &self,
        keys: &[u8],
        values: &[u8],
        n: usize,
        flag: UpdateFlag,
    ) -> Result<usize, BatchError> {
        let len = self.len.load(Ordering::Relaxed);
        if flag != UpdateFlag::Any || n < 64 || 4 * n < len {
            return update_each(self, keys, values, n, flag);
        }
        update_in_bulk(
            self,
            (keys, values),
            n,
            flag,
            |key| self.check_key_data(key).map(|k| (k.data, k.prefixlen)),
            |parsed| {
                self.extend(
                    parsed
                        .into_iter()
                        .map(|((data, prefixlen), value)| (data, prefixlen, value)),
                )
            },
        )
    }

    /// Post-order, like the kernel (a prefix comes after every prefix it
    /// contains, so deleting each key as it is returned is safe). Unlike
    /// the kernel, a key that is not stored does not restart the walk: the
    /// next stored prefix after where it would be is returned, so an
    /// iteration survives concurrent deletes of its cursor.
    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let after = match key {
            Some(key) => {
                let k = self.check_key_data(key)?;
                Some((k.data, k.prefixlen))
            }
            None => None,
        };
        let mut data = [0; key::DATA_SIZE_MAX];
        let (prefixlen, _) = self
            .next_after_in(after, &mut data, guard)?
            .ok_or(Error::NotFound)?;
        key::write_key(next, prefixlen, &data[..self.data_size]);
        Ok(next.len())
    }
}

//! The maple tree's byte contract: a key is a range `{first: u64, last:
//! u64}` (native-endian, `first <= last`, 16 bytes), a value any fixed
//! size.
//!
//! - `update` stores the range: `BPF_ANY` overwrites what it covers (as
//!   `mtree_store_range`, cutting ranges that reach past its ends),
//!   `BPF_NOEXIST` stores it only if no index of it is taken (`EEXIST`,
//!   as `mtree_insert_range`), `BPF_EXIST` only replaces the value of
//!   exactly that stored range (`ENOENT` otherwise).
//! - `lookup` answers the range holding the key's `first` (a point
//!   lookup; `last` need only be valid).
//! - `delete` and `lookup_and_delete` remove exactly the stored range
//!   `first..=last` (`ENOENT` for any other): a key from `get_next_key`
//!   deletes what it names, never a neighbour.
//! - `get_next_key` walks the ranges in order of their first index, and
//!   from a key no longer stored goes on with the range after it.
//! - `max_entries` bounds the ranges held: a store that would leave more
//!   (a store cutting a range in two adds one) is `E2BIG`.

use std::sync::Arc;

use super::tree::MapleTree;
use crate::core::contract::{Caps, MapInfo, MapOps, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::Guard;

impl MapType {
    /// The maple tree range map (not in the kernel as a BPF map: a
    /// private number).
    pub const MAPLE_TREE: MapType = MapType(MapType::PRIVATE + 3);
}

/// Bytes of a range key.
const KEY_SIZE: usize = 16;

/// The maple tree family, for the registry: 16-byte range keys, values
/// of 1 to 65535 bytes, flags 0 or `BPF_F_NO_PREALLOC` (nodes are always
/// allocated as ranges come; the flag changes nothing).
pub const MAPLE_TREE_FAMILY: Family = Family {
    map_type: MapType::MAPLE_TREE,
    name: "maple_tree",
    map_flags: BPF_F_NO_PREALLOC,
    map_extra: 0,
    key_size: SizeRule::exactly(KEY_SIZE as u32),
    value_size: SizeRule::between(1, u16::MAX as u32),
    keys: KeyKind::Range,
    sample_layout: None,
    build: |spec| {
        Ok(Box::new(MapleMap {
            tree: MapleTree::new(),
            value_size: spec.value_size,
            max_entries: spec.max_entries,
            map_flags: spec.flags,
        }))
    },
};

/// A maple tree behind the byte contract (see the module docs): values
/// are byte strings, shared between the pieces of a cut range.
pub struct MapleMap {
    tree: MapleTree<Arc<[u8]>>,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

impl MapleMap {
    /// The typed tree underneath.
    pub fn tree(&self) -> &MapleTree<Arc<[u8]>> {
        &self.tree
    }
}

/// A key's range: `EINVAL` unless `first <= last`.
fn range_key(key: &[u8]) -> Result<(u64, u64)> {
    check_len("key", key.len(), KEY_SIZE)?;
    let word = |i: usize| u64::from_ne_bytes(key[i..i + 8].try_into().expect("8 bytes"));
    let (first, last) = (word(0), word(8));
    if first > last {
        return Err(Error::invalid(format!(
            "range key {first:#x}..={last:#x}: first is above last"
        )));
    }
    Ok((first, last))
}

impl MapOps for MapleMap {
    const CAPS: Caps = Caps::LOOKUP
        .union(Caps::UPDATE)
        .union(Caps::DELETE)
        .union(Caps::LOOKUP_AND_DELETE)
        .union(Caps::NEXT_KEY)
        .union(Caps::BATCH);

    fn map_info(&self) -> MapInfo {
        MapInfo {
            map_type: MapType::MAPLE_TREE,
            key_size: KEY_SIZE as u32,
            value_size: self.value_size,
            max_entries: self.max_entries,
            map_flags: self.map_flags,
            map_extra: 0,
        }
    }

    fn map_len(&self) -> usize {
        self.tree.len()
    }

    fn map_mem_usage(&self) -> usize {
        // The values: one allocation each (an `Arc` header and the bytes),
        // shared by the pieces of a cut range, so counted once a range.
        self.tree.memory_usage() + self.tree.len() * (16 + self.value_size as usize)
    }

    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        let (first, _) = range_key(key)?;
        let hit = self.tree.load(first, guard).ok_or(Error::NotFound)?;
        value.copy_from_slice(hit.value);
        Ok(())
    }

    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        let (first, last) = range_key(key)?;
        let max = self.max_entries as usize;
        self.tree
            .store_checked(first, last, Arc::from(value), |tree, guard| {
                let delta = match flag {
                    UpdateFlag::NoExist => {
                        if tree.find(first, last, guard).is_some() {
                            return Err(Error::Exists);
                        }
                        1
                    }
                    UpdateFlag::Exist => {
                        return match tree.load(first, guard) {
                            Some(e) if (e.first, e.last) == (first, last) => Ok(()),
                            _ => Err(Error::NotFound),
                        };
                    }
                    // Only a map near its limit pays for counting what the
                    // store cuts.
                    UpdateFlag::Any if tree.len() + 2 <= max => return Ok(()),
                    UpdateFlag::Any => tree.store_delta(first, last, guard),
                };
                if delta > 0 && tree.len() + delta as usize > max {
                    return Err(Error::Full);
                }
                Ok(())
            })
    }

    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        let (first, last) = range_key(key)?;
        self.tree.erase_exact(first, last).map(drop)
    }

    fn map_lookup_and_delete_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        let (first, last) = range_key(key)?;
        value.copy_from_slice(&self.tree.erase_exact(first, last)?);
        Ok(())
    }

    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let after = key.map(range_key).transpose()?;
        let mut cursor = self.tree.cursor(guard);
        let mut e = cursor.seek_at_or_after(after.map_or(0, |(first, _)| first));
        if let (Some(hit), Some((first, _))) = (e, after)
            && hit.first <= first
        {
            e = cursor.next();
        }
        let e = e.ok_or(Error::NotFound)?;
        next[..8].copy_from_slice(&e.first.to_ne_bytes());
        next[8..].copy_from_slice(&e.last.to_ne_bytes());
        Ok(KEY_SIZE)
    }
}

/// The conformance suite runs over this family with every other (on
/// disjoint range keys); here, what ranges add.
#[cfg(test)]
mod tests {
    use crate::core::contract::{MapSpec, MapType};
    use crate::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, Error, Map};

    fn key(first: u64, last: u64) -> [u8; 16] {
        let mut k = [0; 16];
        k[..8].copy_from_slice(&first.to_ne_bytes());
        k[8..].copy_from_slice(&last.to_ne_bytes());
        k
    }

    fn keys(map: &dyn Map) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut next = [0u8; 16];
        let mut prev: Option<[u8; 16]> = None;
        while map
            .get_next_key(prev.as_ref().map(|k| &k[..]), &mut next)
            .is_ok()
        {
            let word = |i: usize| u64::from_ne_bytes(next[i..i + 8].try_into().unwrap());
            out.push((word(0), word(8)));
            prev = Some(next);
        }
        out
    }

    #[test]
    fn ranges_through_the_contract() {
        let map = crate::create(&MapSpec::new(MapType::MAPLE_TREE, 16, 4, 4)).unwrap();
        assert_eq!(map.map_type().name(), Some("maple_tree"));
        map.update(&key(100, 199), &1u32.to_ne_bytes(), BPF_ANY)
            .unwrap();
        // A lookup answers the range holding the key's first index.
        let mut v = [0u8; 4];
        map.lookup(&key(150, 150), &mut v).unwrap();
        assert_eq!(u32::from_ne_bytes(v), 1);
        assert_eq!(map.lookup(&key(200, 300), &mut v), Err(Error::NotFound));
        // NOEXIST: any taken index is EEXIST; EXIST: only exactly the range.
        assert_eq!(
            map.update(&key(199, 250), &[2; 4], BPF_NOEXIST),
            Err(Error::Exists)
        );
        assert_eq!(
            map.update(&key(100, 150), &[2; 4], BPF_EXIST),
            Err(Error::NotFound)
        );
        map.update(&key(100, 199), &2u32.to_ne_bytes(), BPF_EXIST)
            .unwrap();
        // A store inside cuts the range in three; at the limit, E2BIG, and
        // the map unchanged.
        map.update(&key(120, 129), &3u32.to_ne_bytes(), BPF_ANY)
            .unwrap();
        assert_eq!(keys(&*map), vec![(100, 119), (120, 129), (130, 199)]);
        assert_eq!(
            map.update(&key(140, 149), &[4; 4], BPF_ANY),
            Err(Error::Full)
        );
        assert_eq!(keys(&*map), vec![(100, 119), (120, 129), (130, 199)]);
        // Covering ranges instead of cutting one: fewer, so allowed.
        map.update(&key(110, 135), &5u32.to_ne_bytes(), BPF_ANY)
            .unwrap();
        assert_eq!(keys(&*map), vec![(100, 109), (110, 135), (136, 199)]);
        // Delete takes exactly a stored range; get_next_key goes on past
        // a deleted one.
        assert_eq!(map.delete(&key(110, 134)), Err(Error::NotFound));
        map.delete(&key(110, 135)).unwrap();
        let mut next = [0u8; 16];
        map.get_next_key(Some(&key(110, 135)), &mut next).unwrap();
        assert_eq!(next, key(136, 199));
        map.lookup_and_delete(&key(136, 199), &mut v).unwrap();
        assert_eq!((u32::from_ne_bytes(v), map.len()), (2, 1));
        // Bad keys: first above last.
        for bad in [key(5, 4), key(u64::MAX, 0)] {
            assert!(matches!(
                map.update(&bad, &[0; 4], BPF_ANY),
                Err(Error::Invalid(_))
            ));
            assert!(matches!(map.lookup(&bad, &mut v), Err(Error::Invalid(_))));
            assert!(matches!(map.delete(&bad), Err(Error::Invalid(_))));
            assert!(matches!(
                map.get_next_key(Some(&bad), &mut next),
                Err(Error::Invalid(_))
            ));
        }
        assert_eq!(keys(&*map), vec![(100, 109)]);
    }
}

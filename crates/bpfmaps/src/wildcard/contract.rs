//! The wildcard map's byte contract, with the keys laid out as the BPF
//! proposal laid them out (`struct wildcard_key`, packed):
//!
//! | bytes | rule key (`BPF_WILDCARD_KEY_RULE`, 0) | concrete key (`BPF_WILDCARD_KEY_ELEM`, 1) |
//! |---|---|---|
//! | 0-3 | type, native-endian `u32` | type |
//! | 4-7 | priority, native-endian `u32` (lower wins) | ignored |
//! | 8.. | per field: prefix = value, then its length as a native-endian `u32`; range = min, max; match and wildcard match = value (a wildcard match's 0: anything) | per field: its value |
//!
//! Field values are big-endian (network order, as a packet carries them),
//! each the field's size. The key size is the rule key's; a concrete key
//! fills the start of a key-sized buffer, and the bytes after its values
//! are ignored.
//!
//! The schema is given at creation in `map_extra` ([`Schema::map_extra`]),
//! and the key size must be its rule key's ([`Schema::rule_key_size`]).
//!
//! - `update`, `delete`, `lookup_and_delete` take rule keys (a concrete
//!   key is `EINVAL`, as in the proposal); `max_entries` bounds the rules.
//! - `update_batch` of at least as many rules as the map holds is one
//!   [`WildcardMap::load`]: the count, error and rules held are those of
//!   updates one by one.
//! - `lookup` of a rule key answers exactly that rule; of a concrete key,
//!   the best rule matching it (`ENOENT` if none). Lock-free either way.
//! - `get_next_key` walks the rules in rule order (priority, then
//!   intervals; [`Rule`]) and from a rule no longer held goes on with the
//!   rule after it. It takes the writer's lock, which only the rule order
//!   is kept under; lookups never do.
//! - A rule key comes back from `get_next_key` in one spelling: a prefix's
//!   host bits cleared, a wildcard match on anything as 0.

use super::map::WildcardMap;
use super::schema::{FieldKind, MAX_FIELD_SIZE, MAX_FIELDS, Packet, Rule, Schema};
use crate::core::contract::{
    BatchError, Caps, MapInfo, MapOps, MapType, update_each, update_in_bulk,
};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::Guard;

impl MapType {
    /// The wildcard map (proposed for BPF, never merged: a private
    /// number).
    pub const WILDCARD: MapType = MapType(MapType::PRIVATE + 4);
}

/// A key's type: a rule.
pub const BPF_WILDCARD_KEY_RULE: u32 = 0;
/// A key's type: a concrete key to classify (the proposal's "element").
pub const BPF_WILDCARD_KEY_ELEM: u32 = 1;

/// Bytes before a key's fields: its type and priority.
const HEADER: usize = 8;
/// Bytes of a prefix length in a rule key.
const PREFIX_LEN: usize = 4;

/// The bits of `map_extra` a schema is encoded in ([`Schema::map_extra`]).
pub const SCHEMA_EXTRA_BITS: u64 = (1 << (4 + 6 * MAX_FIELDS)) - 1;

/// The schema the contract tests and fuzz targets build the family with:
/// 4 fields, one of each kind (prefix of 4 bytes: code 12; range of 2:
/// 5; match of 1: 2; wildcard match of 2: 7), rule keys of 23 bytes.
const SAMPLE_SCHEMA: u64 = 4 | 12 << 4 | 5 << 10 | 2 << 16 | 7 << 22;

/// The wildcard map family, for the registry: the schema in `map_extra`,
/// rule-sized keys, values of 1 to 65535 bytes, flags 0 or
/// `BPF_F_NO_PREALLOC` (rules are always allocated as they come).
pub const WILDCARD_FAMILY: Family = Family {
    map_type: MapType::WILDCARD,
    name: "wildcard",
    map_flags: BPF_F_NO_PREALLOC,
    map_extra: SCHEMA_EXTRA_BITS,
    key_size: SizeRule::between(
        HEADER as u32 + 1,
        (HEADER + MAX_FIELDS * (MAX_FIELD_SIZE + PREFIX_LEN)) as u32,
    ),
    value_size: SizeRule::between(1, u16::MAX as u32),
    keys: KeyKind::Wildcard,
    sample_layout: Some((23, SAMPLE_SCHEMA)),
    build: |spec| {
        let schema = Schema::from_map_extra(spec.extra)?;
        if spec.key_size as usize != schema.rule_key_size() {
            return Err(Error::invalid(format!(
                "key_size {}: this schema's rule keys are {} bytes",
                spec.key_size,
                schema.rule_key_size()
            )));
        }
        let mut map = WildcardMap::new(schema, spec.value_size as usize, spec.max_entries)?;
        map.info.map_flags = spec.flags;
        Ok(Box::new(map))
    },
};

/// Bytes of a field in a rule key.
fn rule_bytes(kind: FieldKind, size: usize) -> usize {
    match kind {
        FieldKind::Prefix => size + PREFIX_LEN,
        FieldKind::Range => 2 * size,
        FieldKind::Match | FieldKind::WildcardMatch => size,
    }
}

/// `v`'s low `size` bytes, big-endian.
fn put_be(out: &mut Vec<u8>, v: u128, size: usize) {
    out.extend_from_slice(&v.to_be_bytes()[16 - size..]);
}

/// A big-endian number of `bytes.len()` bytes.
fn get_be(bytes: &[u8]) -> u128 {
    bytes.iter().fold(0, |v, &b| v << 8 | u128::from(b))
}

fn native_u32(bytes: &[u8]) -> u32 {
    u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes"))
}

impl Schema {
    /// The schema as the byte contract takes it at creation, in
    /// `map_extra` (the BPF proposal passed a `struct wildcard_desc`; 58
    /// bits hold the same): the number of fields in bits 0-3, then 6 bits
    /// per field, its kind in the low 2 (prefix 0, range 1, match 2,
    /// wildcard match 3) and its size less one in the high 4. Field names
    /// are not kept: [`from_map_extra`] names them `f0`, `f1`, ...
    ///
    /// [`from_map_extra`]: Self::from_map_extra
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema};
    ///
    /// let schema = Schema::new(vec![Field::prefix("src", 4), Field::range("dport", 2)]).unwrap();
    /// let back = Schema::from_map_extra(schema.map_extra()).unwrap();
    /// assert_eq!(back.fields()[1], Field::range("f1", 2));
    /// ```
    pub fn map_extra(&self) -> u64 {
        self.fields()
            .iter()
            .enumerate()
            .fold(self.fields().len() as u64, |extra, (i, f)| {
                extra | (kind_code(f.kind) | (f.size as u64 - 1) << 2) << (4 + 6 * i)
            })
    }

    /// The schema `map_extra` encodes ([`map_extra`](Self::map_extra));
    /// `EINVAL` for 0 or more than [`MAX_FIELDS`] fields, bits set past
    /// the last field, or a field [`new`](Self::new) refuses.
    pub fn from_map_extra(extra: u64) -> Result<Schema> {
        let n = (extra & 0xf) as usize;
        if !(1..=MAX_FIELDS).contains(&n) || extra >> (4 + 6 * n) != 0 {
            return Err(Error::invalid(format!(
                "map_extra {extra:#x} is no wildcard schema: 1 to {MAX_FIELDS} fields in bits \
                 0-3, 6 bits each after them, nothing past the last"
            )));
        }
        let fields = (0..n)
            .map(|i| {
                let code = extra >> (4 + 6 * i) & 0x3f;
                let kind = match code & 3 {
                    0 => FieldKind::Prefix,
                    1 => FieldKind::Range,
                    2 => FieldKind::Match,
                    _ => FieldKind::WildcardMatch,
                };
                super::schema::Field::new(&format!("f{i}"), kind, (code >> 2) as usize + 1)
            })
            .collect();
        Schema::new(fields)
    }

    /// Bytes of a rule key: the map's key size through the contract.
    pub fn rule_key_size(&self) -> usize {
        HEADER
            + self
                .fields()
                .iter()
                .map(|f| rule_bytes(f.kind, f.size))
                .sum::<usize>()
    }

    /// `rule` as a rule key (laid out as `wildcard/contract.rs` shows).
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema};
    ///
    /// let schema = Schema::new(vec![Field::prefix("src", 4), Field::range("dport", 2)]).unwrap();
    /// let rule = schema.parse_rule("src 10.0.0.0/8, dport 1-1024", 3).unwrap();
    /// let key = schema.rule_key(&rule);
    /// assert_eq!(key.len(), schema.rule_key_size());
    /// assert_eq!(&key[8..12], &[10, 0, 0, 0]);
    /// assert_eq!(schema.rule_from_key(&key).unwrap(), rule);
    /// ```
    pub fn rule_key(&self, rule: &Rule) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.rule_key_size());
        key.extend_from_slice(&BPF_WILDCARD_KEY_RULE.to_ne_bytes());
        key.extend_from_slice(&rule.priority.to_ne_bytes());
        let lengths = rule.prefix_lengths(self);
        for (i, (f, &(lo, hi))) in self.fields().iter().zip(rule.bounds()).enumerate() {
            match f.kind {
                FieldKind::Prefix => {
                    put_be(&mut key, lo, f.size);
                    key.extend_from_slice(&u32::from(lengths[i]).to_ne_bytes());
                }
                FieldKind::Range => {
                    put_be(&mut key, lo, f.size);
                    put_be(&mut key, hi, f.size);
                }
                FieldKind::Match => put_be(&mut key, lo, f.size),
                FieldKind::WildcardMatch => put_be(&mut key, if lo == hi { lo } else { 0 }, f.size),
            }
        }
        key
    }

    /// The rule a rule key names; `EINVAL` for a key of the wrong size or
    /// type, a prefix length past its field, or a range whose min is past
    /// its max.
    pub fn rule_from_key(&self, key: &[u8]) -> Result<Rule> {
        self.check_key(key, BPF_WILDCARD_KEY_RULE)?;
        let mut b = self.rule(native_u32(&key[4..]));
        let mut at = HEADER;
        for f in self.fields() {
            let value = get_be(&key[at..at + f.size]);
            b = match f.kind {
                FieldKind::Prefix => b.prefix(&f.name, value, native_u32(&key[at + f.size..])),
                FieldKind::Range => {
                    b.range(&f.name, value, get_be(&key[at + f.size..at + 2 * f.size]))
                }
                FieldKind::Match | FieldKind::WildcardMatch => b.exact(&f.name, value),
            };
            at += rule_bytes(f.kind, f.size);
        }
        b.build()
    }

    /// `packet` as a concrete key, `rule_key_size` bytes (zero after
    /// its values).
    pub fn match_key(&self, packet: &Packet) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.rule_key_size());
        key.extend_from_slice(&BPF_WILDCARD_KEY_ELEM.to_ne_bytes());
        key.extend_from_slice(&0u32.to_ne_bytes());
        key.extend_from_slice(&self.packet_key(packet));
        key.resize(self.rule_key_size(), 0);
        key
    }

    /// The packet a concrete key carries.
    pub fn packet_from_match_key(&self, key: &[u8]) -> Result<Packet> {
        self.check_key(key, BPF_WILDCARD_KEY_ELEM)?;
        self.packet_from_bytes(&key[HEADER..HEADER + self.key_size()])
    }

    /// `EINVAL` unless `key` is a key of this schema of type `want`.
    fn check_key(&self, key: &[u8], want: u32) -> Result<()> {
        crate::core::error::check_len("key", key.len(), self.rule_key_size())?;
        match native_u32(key) {
            t if t == want => Ok(()),
            t => Err(key_type_error(t, want)),
        }
    }
}

#[cold]
fn key_type_error(got: u32, want: u32) -> Error {
    let name = |t| match t {
        BPF_WILDCARD_KEY_RULE => "a rule key (type 0)",
        BPF_WILDCARD_KEY_ELEM => "a concrete key (type 1)",
        _ => "an unknown key type",
    };
    Error::invalid(format!(
        "key type {got} is {}; this takes {}",
        name(got),
        name(want)
    ))
}

impl MapOps for WildcardMap {
    const CAPS: Caps = Caps::KEYED.union(Caps::LOOKUP_AND_DELETE);

    #[inline]
    fn map_info(&self) -> MapInfo {
        self.info
    }

    fn map_len(&self) -> usize {
        self.len()
    }

    fn map_mem_usage(&self) -> usize {
        self.memory_usage()
    }

    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        if native_u32(key) != BPF_WILDCARD_KEY_ELEM {
            let found = self.get(&self.schema().rule_from_key(key)?, guard);
            value.copy_from_slice(found.ok_or(Error::NotFound)?);
            return Ok(());
        }
        // A concrete key: the rule key's size (the contract's own size,
        // not the schema's worked out again), its fields at the start.
        crate::core::error::check_len("key", key.len(), self.info.key_size as usize)?;
        let fields = &key[HEADER..HEADER + self.schema().key_size()];
        // Values of up to 4 bytes by `classify_key_as`: a one-prefix
        // schema's come from its trie of values, one cache line fewer.
        // (`value` is the map's value size: the contract checked it.)
        fn small<const N: usize>(
            map: &WildcardMap,
            fields: &[u8],
            value: &mut [u8],
            guard: &Guard,
        ) -> Result<()> {
            let found: [u8; N] = map.classify_key_as(fields, guard)?.ok_or(Error::NotFound)?;
            value.copy_from_slice(&found);
            Ok(())
        }
        match value.len() {
            1 => small::<1>(self, fields, value, guard),
            2 => small::<2>(self, fields, value, guard),
            3 => small::<3>(self, fields, value, guard),
            4 => small::<4>(self, fields, value, guard),
            _ => {
                let found = self.classify_key(fields, guard)?.map(|(_, v)| v);
                value.copy_from_slice(found.ok_or(Error::NotFound)?);
                Ok(())
            }
        }
    }

    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        self.insert_flagged(&self.schema().rule_from_key(key)?, value, flag)
    }

    /// A batch of at least as many rules as the map holds (an install
    /// into an empty map, a policy replaced) is one
    /// [`load`](WildcardMap::load): its tables shaped
    /// after the whole set, merged, and its exit bounds worked out, where
    /// updates one by one keep the tables their order made and void the
    /// bounds. On ClassBench's sets its lookups ran 1.4-2.4x as fast, its
    /// build took 1.4-5x as long (docs/benchmarks.md, "A rule set through
    /// `update_batch`"). A smaller batch goes one by one, so that a load's
    /// work over every rule held stays within twice the batch's own.
    ///
    /// What it leaves is what updates one by one would: the keys up to
    /// the first bad one go in and the error says where it stopped; a
    /// load is all or nothing, so one the flag or `max_entries` refuses
    /// is done again one by one, for the exact count. What readers see
    /// while it runs differs: the rules appear one by one, each whole, in
    /// the load's scrambled order, not the batch's.
    fn map_update_batch(
        &self,
        keys: &[u8],
        values: &[u8],
        n: usize,
        flag: UpdateFlag,
    ) -> Result<usize, BatchError> {
        if n == 0 || n < self.len() {
            return update_each(self, keys, values, n, flag);
        }
        update_in_bulk(
            self,
            (keys, values),
            n,
            flag,
            |key| self.schema().rule_from_key(key),
            |rules| self.load(rules, flag.bits()),
        )
    }

    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        self.remove(&self.schema().rule_from_key(key)?)
    }

    fn map_lookup_and_delete_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        let old = self.take(&self.schema().rule_from_key(key)?)?;
        value.copy_from_slice(&old);
        Ok(())
    }

    fn map_get_next_key(&self, key: Option<&[u8]>, next: &mut [u8], _: &Guard) -> Result<usize> {
        let after = key.map(|k| self.schema().rule_from_key(k)).transpose()?;
        let rule = self.next_rule(after.as_ref()).ok_or(Error::NotFound)?;
        let bytes = self.schema().rule_key(&rule);
        next.copy_from_slice(&bytes);
        Ok(bytes.len())
    }
}

/// A field kind's 2-bit code in `map_extra`.
fn kind_code(kind: FieldKind) -> u64 {
    match kind {
        FieldKind::Prefix => 0,
        FieldKind::Range => 1,
        FieldKind::Match => 2,
        FieldKind::WildcardMatch => 3,
    }
}

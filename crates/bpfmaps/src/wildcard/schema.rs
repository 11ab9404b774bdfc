//! What a wildcard map classifies on: its fields, what a rule matches in
//! each, and the concrete keys (packets) it classifies.
//!
//! Every field is a big-endian unsigned number of 1 to 16 bytes (network
//! order, as a packet carries it), held as a `u128`. A rule matches each
//! field with an inclusive interval `[lo, hi]`, whatever the field's
//! kind: a prefix is the interval of the addresses under it, a
//! wildcard-match on zero the whole field. So one match test serves every
//! kind, and two spellings of the same match (a prefix with host bits
//! set, a range written as one value) are the same rule.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::core::error::{Error, Result};

/// Most fields a schema has (the BPF proposal's limit).
pub const MAX_FIELDS: usize = 9;
/// Widest field, in bytes.
pub const MAX_FIELD_SIZE: usize = 16;
/// Widest field a `Range` may be, in bytes.
pub const MAX_RANGE_SIZE: usize = 8;

/// How a rule matches one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// A value and a prefix length (0 to 8 x size bits): addresses.
    Prefix,
    /// An inclusive range `min..=max`: ports.
    Range,
    /// One exact value: protocols, identities.
    Match,
    /// One exact value, or anything when the rule's value is zero.
    WildcardMatch,
}

/// One field of a schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its name in rules written as text and in the typed builder.
    pub name: String,
    /// How rules match it.
    pub kind: FieldKind,
    /// Its size in bytes, 1 to 16.
    pub size: usize,
}

impl Field {
    /// A field of `kind`, `size` bytes wide.
    pub fn new(name: &str, kind: FieldKind, size: usize) -> Self {
        Field {
            name: name.to_string(),
            kind,
            size,
        }
    }

    /// A prefix field (addresses).
    pub fn prefix(name: &str, size: usize) -> Self {
        Field::new(name, FieldKind::Prefix, size)
    }

    /// A range field (ports).
    pub fn range(name: &str, size: usize) -> Self {
        Field::new(name, FieldKind::Range, size)
    }

    /// An exact-match field.
    pub fn exact(name: &str, size: usize) -> Self {
        Field::new(name, FieldKind::Match, size)
    }

    /// An exact-match field where a rule's zero means anything.
    pub fn wildcard(name: &str, size: usize) -> Self {
        Field::new(name, FieldKind::WildcardMatch, size)
    }

    /// Its width in bits.
    pub fn bits(&self) -> u32 {
        8 * self.size as u32
    }

    /// Its largest value.
    pub fn max(&self) -> u128 {
        u128::MAX >> (128 - self.bits())
    }
}

/// The fields a map classifies on, in the order a key carries them.
///
/// ```
/// use bpfmaps::wildcard::{Field, Schema};
///
/// let schema = Schema::new(vec![
///     Field::prefix("src", 4),
///     Field::prefix("dst", 4),
///     Field::range("sport", 2),
///     Field::range("dport", 2),
///     Field::exact("proto", 1),
/// ])
/// .unwrap();
/// let rule = schema.parse_rule("src 10.0.0.0/8, dport 1-1024, proto 6", 10).unwrap();
/// let packet = schema.parse_packet("src 10.1.2.3, dst 192.0.2.1, sport 40000, dport 22, proto 6").unwrap();
/// assert!(rule.matches(&packet));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    fields: Vec<Field>,
    /// The fields' sizes summed once: checked on every key's bytes.
    key_size: usize,
}

impl Schema {
    /// Checks the fields: 1 to [`MAX_FIELDS`], each 1 to
    /// [`MAX_FIELD_SIZE`] bytes, ranges at most [`MAX_RANGE_SIZE`], names
    /// distinct and non-empty without spaces or commas. `EINVAL`
    /// otherwise.
    pub fn new(fields: Vec<Field>) -> Result<Self> {
        if fields.is_empty() || fields.len() > MAX_FIELDS {
            return Err(Error::invalid(format!(
                "a schema has 1 to {MAX_FIELDS} fields, not {}",
                fields.len()
            )));
        }
        for (i, f) in fields.iter().enumerate() {
            if !(1..=MAX_FIELD_SIZE).contains(&f.size) {
                return Err(Error::invalid(format!(
                    "field {:?} is {} bytes; fields are 1 to {MAX_FIELD_SIZE}",
                    f.name, f.size
                )));
            }
            if f.kind == FieldKind::Range && f.size > MAX_RANGE_SIZE {
                return Err(Error::invalid(format!(
                    "range field {:?} is {} bytes; ranges are at most {MAX_RANGE_SIZE}",
                    f.name, f.size
                )));
            }
            if f.name.is_empty() || f.name.contains([' ', ',', '\t']) {
                return Err(Error::invalid(format!("bad field name {:?}", f.name)));
            }
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(Error::invalid(format!("two fields named {:?}", f.name)));
            }
        }
        let key_size = fields.iter().map(|f| f.size).sum();
        Ok(Schema { fields, key_size })
    }

    /// The fields, in key order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Bytes of a concrete key: the fields back to back.
    pub fn key_size(&self) -> usize {
        self.key_size
    }

    /// The index of the field called `name`.
    pub fn index(&self, name: &str) -> Result<usize> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| Error::invalid(format!("no field named {name:?}")))
    }

    /// A rule builder at `priority` (lower wins), every field matching
    /// anything until set; a `Match` field must be set.
    pub fn rule(&self, priority: u32) -> RuleBuilder<'_> {
        RuleBuilder {
            schema: self,
            priority,
            bounds: self.fields.iter().map(|f| (0, f.max())).collect(),
            set: 0,
            error: None,
        }
    }

    /// A rule written as text: comma-separated `name value` pairs, fields
    /// left out match anything. Values: `a.b.c.d` or an IPv6 address
    /// (fields of 4 and 16 bytes), decimal or `0x` hex numbers; a prefix
    /// `value/len`, a range `lo-hi` (or one value), `*` for anything.
    pub fn parse_rule(&self, text: &str, priority: u32) -> Result<Rule> {
        let mut b = self.rule(priority);
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once(char::is_whitespace)
                .ok_or_else(|| Error::invalid(format!("{part:?} is not `field value`")))?;
            let value = value.trim();
            let i = self.index(name)?;
            let field = &self.fields[i];
            b = if value == "*" {
                b.any(name)
            } else {
                match field.kind {
                    FieldKind::Prefix => match value.split_once('/') {
                        Some((v, len)) => {
                            let len = len.parse().map_err(|_| {
                                Error::invalid(format!("bad prefix length {len:?}"))
                            })?;
                            b.prefix(name, parse_value(field, v)?, len)
                        }
                        None => b.exact(name, parse_value(field, value)?),
                    },
                    FieldKind::Range => match value.split_once('-') {
                        Some((lo, hi)) => {
                            b.range(name, parse_value(field, lo)?, parse_value(field, hi)?)
                        }
                        None => b.exact(name, parse_value(field, value)?),
                    },
                    FieldKind::Match | FieldKind::WildcardMatch => {
                        b.exact(name, parse_value(field, value)?)
                    }
                }
            };
        }
        b.build()
    }

    /// A concrete key from one value per field, in order. `EINVAL` when
    /// the count is wrong or a value is wider than its field.
    pub fn packet(&self, values: &[u128]) -> Result<Packet> {
        if values.len() != self.fields.len() {
            return Err(Error::invalid(format!(
                "{} values for {} fields",
                values.len(),
                self.fields.len()
            )));
        }
        let mut p = Packet::default();
        for (i, (f, &v)) in self.fields.iter().zip(values).enumerate() {
            if v > f.max() {
                return Err(Error::invalid(format!(
                    "{v:#x} does not fit field {:?} ({} bytes)",
                    f.name, f.size
                )));
            }
            p.values[i] = v;
        }
        Ok(p)
    }

    /// A concrete key from its bytes: the fields back to back, each in
    /// network order ([`key_size`](Self::key_size) bytes).
    #[inline]
    pub fn packet_from_bytes(&self, bytes: &[u8]) -> Result<Packet> {
        crate::core::error::check_len("key", bytes.len(), self.key_size())?;
        let mut p = Packet::default();
        let mut rest = bytes;
        for (v, f) in p.values.iter_mut().zip(&self.fields) {
            let (field, after) = rest.split_at(f.size);
            *v = be_value(field);
            rest = after;
        }
        Ok(p)
    }

    /// `packet`'s concrete key bytes: the fields back to back, each in
    /// network order ([`key_size`](Self::key_size) bytes; the inverse of
    /// [`packet_from_bytes`](Self::packet_from_bytes)).
    pub fn packet_key(&self, packet: &Packet) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.key_size());
        for (f, &v) in self.fields.iter().zip(&packet.values) {
            key.extend_from_slice(&v.to_be_bytes()[16 - f.size..]);
        }
        key
    }

    /// A concrete key written as text: `name value` pairs for every field.
    pub fn parse_packet(&self, text: &str) -> Result<Packet> {
        let mut values = vec![None; self.fields.len()];
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once(char::is_whitespace)
                .ok_or_else(|| Error::invalid(format!("{part:?} is not `field value`")))?;
            let i = self.index(name)?;
            values[i] = Some(parse_value(&self.fields[i], value.trim())?);
        }
        let values: Option<Vec<u128>> = values.into_iter().collect();
        self.packet(&values.ok_or_else(|| Error::invalid("a packet needs every field"))?)
    }
}

/// A field's bytes (at most 16) as the big-endian number they are: two
/// overlapping loads of a word where the field fills one, rather than a
/// shift a byte.
#[inline]
pub(crate) fn be_value(bytes: &[u8]) -> u128 {
    let n = bytes.len();
    debug_assert!(n <= MAX_FIELD_SIZE, "a field is at most 16 bytes");
    if n >= 8 {
        // The first 8 bytes shifted over the last 8: the bytes both
        // hold land on themselves.
        let first = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
        let last = u64::from_be_bytes(bytes[n - 8..].try_into().expect("8 bytes"));
        (u128::from(first) << (8 * (n - 8))) | u128::from(last)
    } else if n >= 4 {
        let first = u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"));
        let last = u32::from_be_bytes(bytes[n - 4..].try_into().expect("4 bytes"));
        u128::from((u64::from(first) << (8 * (n - 4))) | u64::from(last))
    } else {
        bytes.iter().fold(0, |v, &b| v << 8 | u128::from(b))
    }
}

/// A number for `field`: an IPv4 address (4-byte fields), an IPv6 one
/// (16-byte fields), `0x` hex or decimal.
fn parse_value(field: &Field, text: &str) -> Result<u128> {
    let bad = || Error::invalid(format!("bad value {text:?} for field {:?}", field.name));
    let v = if let Some(hex) = text.strip_prefix("0x") {
        u128::from_str_radix(hex, 16).map_err(|_| bad())?
    } else if field.size == 4
        && let Ok(a) = text.parse::<std::net::Ipv4Addr>()
    {
        u128::from(u32::from(a))
    } else if field.size == 16
        && let Ok(a) = text.parse::<std::net::Ipv6Addr>()
    {
        u128::from(a)
    } else {
        text.parse().map_err(|_| bad())?
    };
    if v > field.max() {
        return Err(bad());
    }
    Ok(v)
}

/// A concrete key: one value per field (unused fields 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Packet {
    /// Field `i`'s value.
    pub values: [u128; MAX_FIELDS],
}

/// A rule: what it matches in each field (an inclusive interval) and its
/// priority, lower first. Rules order by priority, then by their
/// intervals field by field (lower bounds first): that order breaks ties
/// between matching rules of one priority, the same whichever order they
/// were inserted in. A rule is identified by its intervals and priority.
///
/// A clone shares the intervals (an `Arc`): the map's entry for a rule
/// inserted by reference costs no copy of them, one allocation fewer an
/// update (docs/benchmarks.md, "Shared bounds").
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// Lower wins.
    pub priority: u32,
    bounds: Arc<[(u128, u128)]>,
}

impl Rule {
    /// Field `i`'s interval.
    pub fn bounds(&self) -> &[(u128, u128)] {
        &self.bounds
    }

    /// A copy that shares nothing with this rule (a clone shares its
    /// intervals): for a measure of what a map holds that must not find
    /// the intervals already counted elsewhere.
    pub fn unshared(&self) -> Rule {
        Rule {
            priority: self.priority,
            bounds: Arc::from(&self.bounds[..]),
        }
    }

    /// Whether every field of `packet` is inside this rule's interval.
    #[inline]
    pub fn matches(&self, packet: &Packet) -> bool {
        self.bounds
            .iter()
            .zip(&packet.values)
            .all(|(&(lo, hi), &v)| lo <= v && v <= hi)
    }

    /// Per field, how many leading bits every value the rule matches
    /// shares (the prefix length of a prefix; of a range, its bounds'
    /// common prefix): what a TupleMerge table may hash on.
    pub fn prefix_lengths(&self, schema: &Schema) -> [u8; MAX_FIELDS] {
        let mut t = [0; MAX_FIELDS];
        for (i, (&(lo, hi), f)) in self.bounds.iter().zip(schema.fields()).enumerate() {
            let differ = (lo ^ hi).leading_zeros() - (128 - f.bits());
            t[i] = differ.min(f.bits()) as u8;
        }
        t
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rule(prio {}", self.priority)?;
        for (lo, hi) in self.bounds.iter() {
            write!(f, ", {lo:#x}-{hi:#x}")?;
        }
        write!(f, ")")
    }
}

/// Builds a [`Rule`] field by field ([`Schema::rule`]); the first error
/// sticks and [`build`](Self::build) returns it.
pub struct RuleBuilder<'s> {
    schema: &'s Schema,
    priority: u32,
    bounds: SmallVec<[(u128, u128); MAX_FIELDS]>,
    /// Bit `i`: field `i` was set.
    set: u16,
    error: Option<Error>,
}

impl RuleBuilder<'_> {
    fn with(mut self, name: &str, f: impl FnOnce(&Field) -> Result<(u128, u128)>) -> Self {
        if self.error.is_some() {
            return self;
        }
        match self.schema.index(name).and_then(|i| {
            let bounds = f(&self.schema.fields[i])?;
            Ok((i, bounds))
        }) {
            Ok((i, bounds)) => {
                self.bounds[i] = bounds;
                self.set |= 1 << i;
            }
            Err(e) => self.error = Some(e),
        }
        self
    }

    /// `name` under the prefix `value/len` (host bits ignored). Prefix
    /// fields only.
    pub fn prefix(self, name: &str, value: u128, len: u32) -> Self {
        self.with(name, |f| {
            if f.kind != FieldKind::Prefix {
                return Err(Error::invalid(format!(
                    "field {:?} is not a prefix",
                    f.name
                )));
            }
            if len > f.bits() || value > f.max() {
                return Err(Error::invalid(format!(
                    "prefix {value:#x}/{len} does not fit field {:?} ({} bits)",
                    f.name,
                    f.bits()
                )));
            }
            let host = f.max().checked_shr(len).unwrap_or(0);
            Ok((value & !host, value | host))
        })
    }

    /// `name` in `min..=max`. Range fields only; `EINVAL` when `min > max`.
    pub fn range(self, name: &str, min: u128, max: u128) -> Self {
        self.with(name, |f| {
            if f.kind != FieldKind::Range {
                return Err(Error::invalid(format!("field {:?} is not a range", f.name)));
            }
            if min > max || max > f.max() {
                return Err(Error::invalid(format!(
                    "range {min}-{max} is empty or does not fit field {:?}",
                    f.name
                )));
            }
            Ok((min, max))
        })
    }

    /// `name` equal to `value` (on a `WildcardMatch` field, zero means
    /// anything; on a prefix, the full-length prefix; on a range, a range
    /// of one).
    pub fn exact(self, name: &str, value: u128) -> Self {
        self.with(name, |f| {
            if value > f.max() {
                return Err(Error::invalid(format!(
                    "{value:#x} does not fit field {:?}",
                    f.name
                )));
            }
            Ok(match f.kind {
                FieldKind::WildcardMatch if value == 0 => (0, f.max()),
                _ => (value, value),
            })
        })
    }

    /// `name` matching anything (not for `Match` fields, which always
    /// match one value).
    pub fn any(self, name: &str) -> Self {
        self.with(name, |f| {
            if f.kind == FieldKind::Match {
                return Err(Error::invalid(format!(
                    "field {:?} is an exact match: it needs a value",
                    f.name
                )));
            }
            Ok((0, f.max()))
        })
    }

    /// The rule, or the first error; `EINVAL` if a `Match` field was left
    /// unset.
    pub fn build(self) -> Result<Rule> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some(i) = (0..self.bounds.len())
            .find(|&i| self.set & (1 << i) == 0 && self.schema.fields[i].kind == FieldKind::Match)
        {
            return Err(Error::invalid(format!(
                "field {:?} is an exact match: it needs a value",
                self.schema.fields[i].name
            )));
        }
        Ok(Rule {
            priority: self.priority,
            bounds: Arc::from(&self.bounds[..]),
        })
    }
}

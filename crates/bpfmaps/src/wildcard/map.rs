//! [`WildcardMap`]: TupleMerge (Daly, Liu and Torng, ANCS 2017), with
//! lookups that take no lock.
//!
//! Rules live in hash tables, each keyed by a *tuple*: how many leading
//! bits of each field it hashes. A rule fits a table whose tuple asks for
//! no more bits than the rule fixes in any field (its prefix lengths;
//! for a range, its bounds' common prefix), so one packet probe per table
//! (the packet's leading bits, hashed) finds every rule of the table that
//! might match; each candidate is then checked whole. A new rule goes to
//! the first table it fits; when none does, a table is made for it with
//! its prefix lengths *relaxed* (a few bits shorter), so that later rules
//! close to it fit too. Too many rules in one bucket (more than the
//! collision limit, 64 by default where the reference's is 10) split
//! the table: the colliding rules' tuples say which field to hash on
//! more bits, and a table with that tuple takes every rule that fits it.
//! A [`load`](WildcardMap::load) of many rules at once ends by merging
//! each table into a coarser one whose tuple its rules fit, and by
//! moving rules of a priority two tables share into one, where buckets
//! stay short: which tables were made depends on the order the rules
//! came in, and fewer tables, and fewer ties between them, are fewer
//! probes.
//!
//! Classification probes the tables in order of their best priority and
//! stops as soon as the next table's best cannot beat the match in hand;
//! a bucket's rules are in rule order, so its first match is its best.
//! After a load, each rule carries an *exit bound* (`exits.rs`): the
//! worst priority of the better rules that overlap it, and a probe stops
//! once the next table's best is worse than that (on ipc1_10k, 4.7
//! tables probed a packet to 3.2), until a rule is added.
//!
//! Concurrency: one writer at a time (a mutex); readers take none. What a
//! reader follows (the list of tables, each table's bucket array, each
//! bucket's rules) is immutable once published: a writer builds the new
//! one, publishes it with one release store and frees the old after the
//! epoch's grace period. A split puts the rules it moves into their new
//! table and publishes it before it takes them out of the old one, so a
//! reader of the new view finds a moving rule in one table or both. A
//! reader of the view before (which may lack the new table) could find
//! it in neither: the split counts itself in `moves` before it takes
//! the rules out, and a reader that sees the count change while it
//! probed probes again ([`WildcardMap::read_view`]). Splits are rare
//! beside lookups, so a reader pays two loads of a line it reads anyway
//! and almost never probes twice; the writer waits for no one.
//! Its work is the overflowing bucket's, not the table's: no update
//! rebuilds a table, but for doubling its buckets.
//!
//! Here: the tables, the view readers start from, the map and its
//! accessors. `lookup.rs`: the probes (one packet, a key's bytes, a
//! batch in a pipeline). `write.rs`: the writer (inserts, removes,
//! loads, splits, merges, exit bounds).

mod lookup;
mod write;

use lookup::{Probes, probes_for};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_epoch::{Atomic, Owned, Pointer, Shared};
use parking_lot::Mutex;

use super::chain::{
    Chain, Edit, Entry, HOME, Hit, Layout, Width, Word, answer_of, exit_word, rule_order,
};
use super::exits::{TableRules, exit_bounds};
use super::match_key::KeyReader;
use super::order::RuleOrder;
use super::prefix::PrefixIndex;
use super::schema::{Field, FieldKind, MAX_FIELDS, Packet, Rule, Schema, be_value};
use crate::core::contract::{MapInfo, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::flags::UpdateFlag;
use crate::core::prefetch::prefetch;
use crate::core::reclaim::{Guard, drop_in_background, pin, synchronize};

/// Rules one bucket holds before its table splits: 64, where the
/// reference's default (`TM.Limit.Collide`) is 10. A bucket here is one
/// flat array of narrow words, cheap to scan, so fewer and fuller tables
/// win until the longer chains cost more than the probes saved: 48 made
/// lookups 1.0-1.7x faster than 10 on the ClassBench sets, 64 took 4-11 %
/// more off those it merges (ipc1's), at some update cost on acl1's;
/// 96 and 128 merged no more on ipc1 and acl1 (docs/benchmarks.md,
/// "Collision limit" and "Collision limit: 64").
pub const DEFAULT_COLLISION_LIMIT: usize = 64;

/// The most rules a table may hold for a split during a
/// [`WildcardMap::load`] to move every rule of it that fits the new
/// table (the reference's split), not only the overflowing bucket's: a
/// bound on the work of one split.
const WHOLE_SPLIT_MAX: usize = 1 << 16;

/// The most rules, on average over the rules, of the bucket a rule sits
/// in after [`WildcardMap::load`] moves rules into a table (a merge, or
/// rules of a tied priority): a few narrow rules scanned cost less than
/// one more table probed.
const ABSORB_MEAN: usize = 4;

/// The most rules taken out that a map remembers with their exit
/// bounds while `held` rules are held: one for every two held, or 64
/// ([`Writer::exits_after_taking`]). Past that the bounds are voided, so
/// that the entries kept for them stay under half the map's (past 128
/// rules held).
fn gone_most(held: usize) -> usize {
    (held / 2).max(64)
}

/// Bytes of a hash index of rules (`Placed` to a table id) with room for
/// `capacity`: a slot and a control byte a bucket, 7/8 of them usable.
fn index_bytes(capacity: usize) -> usize {
    capacity * 8 / 7 * (size_of::<(Placed, u64)>() + 1)
}

/// Rounds of merges and gathers a load ends with, at most
/// ([`WildcardMap::absorb`]).
const GATHER_ROUNDS: usize = 8;

/// Splits of crowded tables a load ends with, at most
/// ([`WildcardMap::split_crowded`]).
const CROWDED_SPLITS: usize = 16;

/// A probe's cost in rules scanned, for [`WildcardMap::split_crowded`].
const PROBE_COST: usize = 4;

/// Buckets a table keeps for each rule it holds (at least; a power of
/// two of them). A probe's chain scan ends on a branch that mispredicts
/// when a bucket holds rules before the match: with one bucket a rule,
/// 0.45 mispredictions a probe of Cilium's exact rules, with four 0.11,
/// for 8-12 % more bytes a rule (docs/benchmarks.md, "Sparser buckets").
const SLOTS_PER_RULE: usize = 4;

/// Buckets a rule past [`SPARSE_SLOTS_MAX`]. Buckets that big no longer
/// stay in a core's cache, so a probe's read of its bucket is likely a
/// miss; half as many buckets miss less often, which saves more than
/// the mispredictions of fuller buckets cost (100K of Cilium's exact
/// rules one at a time: 0.99x and 1.04x the six lookups' speed, 0.89x
/// and 0.93x with four a rule; docs/benchmarks.md, "Fewer buckets for
/// big tables").
const DENSE_SLOTS_PER_RULE: usize = 2;

/// The most buckets a table keeps [`SLOTS_PER_RULE`] a rule for: 2^17,
/// a MiB of them (32K rules); bigger tables keep
/// [`DENSE_SLOTS_PER_RULE`].
const SPARSE_SLOTS_MAX: usize = 1 << 17;

/// Lines of a chain a remove asks for before it knows the chain's
/// length ([`WildcardMap::ask_for_bucket`]): 4 took the cold pass of
/// updates 4-14 % lower, one line 4-9 %.
const CHAIN_LINES_ASKED: usize = 4;

/// The seed of the order [`WildcardMap::load`] inserts in: fixed, so a
/// rule set always loads into the same tables.
const LOAD_SEED: u64 = 0x7475_706c_654d_7267;

/// Per field, the leading bits a table hashes.
pub(super) type Tuple = [u8; MAX_FIELDS];

/// Who holds a rule, in the writer's index: the entry, hashed and
/// ordered by its rule and looked up by it.
pub(super) struct Placed(pub(super) Arc<Entry>);

impl std::hash::Hash for Placed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.rule.hash(state);
    }
}

impl PartialEq for Placed {
    fn eq(&self, other: &Self) -> bool {
        self.0.rule == other.0.rule
    }
}
impl Eq for Placed {}
impl PartialOrd for Placed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Placed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.rule.cmp(&other.0.rule)
    }
}
impl std::borrow::Borrow<Rule> for Placed {
    fn borrow(&self) -> &Rule {
        &self.0.rule
    }
}

/// One TupleMerge table: the bits it hashes and its buckets (a power of
/// two of them). Only its buckets' chains change once it is published; a
/// table that outgrows its buckets is rebuilt larger and published anew.
struct Table {
    tuple: Tuple,
    /// Per field, the mask of the leading `tuple` bits it hashes (0 for
    /// a field it does not).
    masks: [u128; MAX_FIELDS],
    /// The word its chains use.
    width: Width,
    slots: Box<[Atomic<Chain>]>,
    /// The address of the first home of the block its chains were last
    /// carved from, 0 if that block had none
    /// ([`HOMED_SLOTS`](super::chain::HOMED_SLOTS)). The block may be
    /// gone (its chains all replaced): a probe only asks for the line,
    /// never reads it.
    homes: AtomicUsize,
}

/// The bucket among `slots` of a table's hash `h`: the high word of
/// `h * slots`, which depends on `h`'s top bits (one multiply, where a
/// mask of its low bits would need the hash finalized first).
#[inline(always)]
fn bucket_index(h: u64, slots: usize) -> usize {
    ((u128::from(h) * slots as u128) >> 64) as usize
}

/// A table's hash multiplies each field's lane by its own odd constant
/// (the fractional digits of pi, made odd).
const LANE_MIX: [u64; MAX_FIELDS] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7345,
    0xa409_3822_299f_31d1,
    0x082e_fa98_ec4e_6c89,
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6d,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
    0x9216_d5d9_8979_fb1b,
];

/// [`Table::hash`] under `masks`.
#[inline(always)]
fn hash_masked<W: Word, const N: usize>(masks: &[u128; MAX_FIELDS], values: &[W; N]) -> u64 {
    let mut h = 0u64;
    for i in 0..N.min(MAX_FIELDS) {
        let lane = values[i].masked_lane(masks[i]);
        h = h.wrapping_add(lane.wrapping_mul(LANE_MIX[i]));
    }
    h
}

impl Table {
    fn new(tuple: Tuple, schema: &Schema, slots: usize) -> Self {
        let mut masks = [0; MAX_FIELDS];
        for (i, f) in schema.fields().iter().enumerate() {
            if tuple[i] > 0 {
                let keep = u32::from(tuple[i]);
                masks[i] = (u128::MAX >> (128 - keep)) << (f.bits() - keep);
            }
        }
        Table {
            tuple,
            masks,
            width: Width::of(schema),
            slots: (0..slots).map(|_| Atomic::null()).collect(),
            homes: AtomicUsize::new(0),
        }
    }

    /// The hash of the leading bits this table keys on, from the first
    /// `N` fields' values (any fields after those hash as zeros) in words
    /// of any width that holds them (the same hash in each: a narrow
    /// word's lane is the wide one's).
    ///
    /// A sum of each field's masked lane times its own odd constant: the
    /// products are independent of each other and the loop has no
    /// branch, where a chain of rotate, xor and multiply waits on each
    /// field in turn. A product carries every bit of its lane upward, so
    /// the sum's top bits pick the bucket ([`bucket_index`]), as in
    /// Fibonacci hashing, and no finalizer is needed. (Two 32-bit fields
    /// to a lane would halve the multiplies, but spreads ClassBench's
    /// rules worse: 2.3 more rules scanned a packet of acl1_10k.)
    ///
    /// Scalar on purpose: the compiler vectorizes this loop once a
    /// word's masks sit side by side (or under AVX2), and the vector
    /// hash took 1.5-15 % fewer instructions but 4-20 % more time a
    /// ClassBench packet. Its latency, not its instructions, counts:
    /// the bucket's address waits on it, and 9 cycles more of it cost
    /// a packet 8-13 (docs/benchmarks.md, "A vector hash and probes
    /// compiled for AVX2"). Hence `masks` are `u128`s.
    #[inline(always)]
    fn hash<W: Word, const N: usize>(&self, values: &[W; N]) -> u64 {
        hash_masked(&self.masks, values)
    }

    /// The index of the bucket `values` hash to.
    #[inline(always)]
    fn slot_index<W: Word, const N: usize>(&self, values: &[W; N]) -> usize {
        bucket_index(self.hash(values), self.slots.len())
    }

    /// The bucket `values` hash to.
    #[inline(always)]
    fn slot<W: Word, const N: usize>(&self, values: &[W; N]) -> &Atomic<Chain> {
        &self.slots[self.slot_index(values)]
    }
}

/// The buckets a map's first table needs before `classify_many` asks
/// for a burst's buckets ahead: those of 2^14 rules (their chains and
/// buckets outgrow a core's L2; below that the extra hashing costs more
/// than the misses it overlaps).
pub(super) const BURST_TABLE_SLOTS: usize = (1 << 14) * SLOTS_PER_RULE;

impl Drop for Table {
    fn drop(&mut self) {
        for slot in self.slots.iter() {
            // SAFETY: a table is dropped with its last reference: no view
            // a reader can reach holds it, and its chains are its own.
            unsafe {
                let chain = slot.load(Ordering::Relaxed, crossbeam_epoch::unprotected());
                if !chain.is_null() {
                    drop(chain.into_owned());
                }
            }
        }
    }
}

/// What readers start from: the tables in order of their best priority,
/// each with that priority (a lower bound: a stale one is only lower).
struct View {
    tables: Box<[(u32, Arc<Table>)]>,
    /// What a probe reads of each table, in the same order, side by
    /// side: its best priority, masks and buckets. A probe reads the
    /// list and then the bucket, where through `tables` it reads the
    /// list and the table in turn before it can ask for the bucket.
    probes: Box<[TableProbe]>,
    /// The only table's probe, when there is one table (a policy of one
    /// shape of rule, as Cilium's exact rules), in the view itself: the
    /// bucket's address waits on one read, not two.
    only: Option<TableProbe>,
    /// Whether the rules' exit bounds hold (no rule was added since a
    /// load worked them out): if not, a probe stops by its match's
    /// priority alone.
    exits: bool,
    /// Whether a table has homes: if so, probes ask for them
    /// ([`TableProbe::slot_in`]).
    homed: bool,
}

impl View {
    fn new(tables: Box<[(u32, Arc<Table>)]>, exits: bool) -> View {
        let probes: Box<[TableProbe]> = tables
            .iter()
            .map(|(top, t)| TableProbe {
                top: *top,
                len: t.slots.len(),
                slots: t.slots.as_ptr(),
                homes: t.homes.load(Ordering::Relaxed),
                masks: t.masks,
            })
            .collect();
        let only = match &probes[..] {
            [only] => Some(*only),
            _ => None,
        };
        let homed = probes.iter().any(|p| p.homes != 0);
        View {
            tables,
            probes,
            only,
            exits,
            homed,
        }
    }
}

/// A copy of a table's best priority and masks and the address of its
/// buckets, held in a view beside the table (whose buckets it keeps
/// alive).
#[derive(Clone, Copy)]
struct TableProbe {
    top: u32,
    len: usize,
    slots: *const Atomic<Chain>,
    /// The table's homes ([`Table::homes`]), as the view was made.
    homes: usize,
    masks: [u128; MAX_FIELDS],
}

// SAFETY: the buckets it points to are the table's, shared by design
// (readers load them, the writer stores them atomically) and alive as
// long as the view that holds both.
unsafe impl Send for TableProbe {}
// SAFETY: as above.
unsafe impl Sync for TableProbe {}

impl TableProbe {
    /// The bucket `values` hash to; with `HOMES`, in a table with homes,
    /// its home's line is asked for too, where the bucket's chain likely
    /// starts: that miss overlaps the bucket's, where the chain's
    /// address waits on the bucket's. `HOMES` is the view's
    /// ([`View::homed`]): a view of small tables checks for none.
    #[inline(always)]
    fn slot_in<const HOMES: bool, W: Word, const N: usize>(
        &self,
        values: &[W; N],
    ) -> &Atomic<Chain> {
        let i = bucket_index(hash_masked(&self.masks, values), self.len);
        if HOMES && self.homes != 0 {
            prefetch(std::ptr::without_provenance::<u8>(self.homes + i * HOME));
        }
        // SAFETY: `i < len`; the buckets live as long as the view and
        // `self` with it.
        unsafe { &*self.slots.add(i) }
    }
}

/// A table as the writer keeps it.
struct TableState {
    table: Arc<Table>,
    /// Rules held per priority.
    priorities: BTreeMap<u32, usize>,
    rules: usize,
}

impl TableState {
    fn best(&self) -> u32 {
        self.priorities.keys().next().copied().unwrap_or(u32::MAX)
    }
}

/// The writer's bookkeeping, under the writer lock.
#[derive(Default)]
struct Writer {
    tables: BTreeMap<u64, TableState>,
    /// Table ids in the published order, with their tuples (what a new
    /// rule's search for a table it fits reads, not each table).
    order: Vec<(u64, Tuple)>,
    /// Which table holds each rule.
    placed: HashMap<Placed, u64, foldhash::fast::RandomState>,
    /// The rules in rule order, for [`next_rule`](WildcardMap::next_rule)
    /// (built by the first walk, kept until the updates since wear it
    /// out: `order.rs`).
    rule_order: Option<RuleOrder>,
    /// A [`load`](WildcardMap::load) into an empty map is under way:
    /// `placed` is left alone until it ends, and then built from the
    /// tables in one pass ([`Writer::place_all`]).
    placing_later: bool,
    next_id: u64,
    /// The rules' exit bounds hold, and some is better than its rule's
    /// priority (as published in the view).
    exits: bool,
    /// Rules taken out while the bounds hold, with the bounds they had:
    /// one put back gets its bound again, and the bounds still hold
    /// ([`Writer::exits_after_adding`]).
    gone: Gone,
}

/// The entries of rules taken out while the exit bounds hold, and the
/// tables they were in: the first
/// [`GONE_LISTED`] in a list, scanned, so that a rule taken out and put
/// back at once (a policy's toggle, the suites' updates) costs no hash of
/// it (a hash set's insert and take added 8 % to an update's
/// instructions); the rest in a set.
#[derive(Default)]
struct Gone {
    listed: Vec<(Arc<Entry>, u64)>,
    set: HashMap<Placed, u64, foldhash::fast::RandomState>,
}

/// Rules taken out that [`Gone`] lists before it hashes them.
const GONE_LISTED: usize = 8;

impl Gone {
    fn len(&self) -> usize {
        self.listed.len() + self.set.len()
    }

    fn is_empty(&self) -> bool {
        self.listed.is_empty() && self.set.is_empty()
    }

    /// Records `entry`, taken out of table `id`.
    fn insert(&mut self, entry: Arc<Entry>, id: u64) {
        if self.listed.len() < GONE_LISTED {
            self.listed.push((entry, id));
        } else {
            self.set.insert(Placed(entry), id);
        }
    }

    /// The entry of `rule` and its table, taken out of the books.
    fn take(&mut self, rule: &Rule) -> Option<(Arc<Entry>, u64)> {
        if let Some(at) = self.listed.iter().position(|(e, _)| e.rule == *rule) {
            return Some(self.listed.swap_remove(at));
        }
        if self.set.is_empty() {
            return None;
        }
        self.set.remove_entry(rule).map(|(Placed(e), id)| (e, id))
    }

    #[cfg(test)]
    fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        (self.listed.iter().map(|(e, _)| e)).chain(self.set.keys().map(|p| &p.0))
    }

    /// Bytes of its list and set themselves (not the entries).
    fn bytes(&self) -> usize {
        self.listed.capacity() * size_of::<(Arc<Entry>, u64)>() + index_bytes(self.set.capacity())
    }
}

/// A multi-field classifier map: rules of per-field matches (prefix,
/// range, exact, wildcard) with priorities; a concrete key gets the value
/// of the best rule that matches it (lowest priority; ties by the rules'
/// order, [`Rule`]).
///
/// ```
/// use bpfmaps::wildcard::{Field, Schema, WildcardMap};
/// use bpfmaps::{BPF_ANY, pin};
///
/// let schema = Schema::new(vec![
///     Field::prefix("src", 4),
///     Field::range("dport", 2),
///     Field::exact("proto", 1),
/// ])
/// .unwrap();
/// let map = WildcardMap::new(schema, 4, 1000).unwrap();
/// let ssh = map.schema().parse_rule("src 10.0.0.0/8, dport 22, proto 6", 1).unwrap();
/// let low = map.schema().parse_rule("dport 0-1023, proto 6", 5).unwrap();
/// map.insert(&ssh, &1u32.to_ne_bytes(), BPF_ANY).unwrap();
/// map.insert(&low, &2u32.to_ne_bytes(), BPF_ANY).unwrap();
///
/// let guard = pin();
/// let packet = map.schema().parse_packet("src 10.9.9.9, dport 22, proto 6").unwrap();
/// assert_eq!(map.classify(&packet, &guard).unwrap().1, 1u32.to_ne_bytes());
/// let packet = map.schema().parse_packet("src 192.0.2.1, dport 22, proto 6").unwrap();
/// assert_eq!(map.classify(&packet, &guard).unwrap().1, 2u32.to_ne_bytes());
/// ```
pub struct WildcardMap {
    schema: Schema,
    value_size: usize,
    max_entries: u32,
    collision_limit: usize,
    /// Tables of this many buckets or more carve their chains at their
    /// buckets' homes: [`HOMED_SLOTS`](super::chain::HOMED_SLOTS), lower
    /// in tests so that small maps have homes.
    homes_from: usize,
    /// A map's only table has homes when it holds more rules than this:
    /// [`LONE_HOMED_RULES`](super::chain::LONE_HOMED_RULES).
    lone_homes_over: usize,
    writer: Mutex<Writer>,
    view: Atomic<View>,
    /// Splits that took rules out of a table, counted before they do:
    /// a reader whose probe saw this change probes again
    /// ([`read_view`](Self::read_view)).
    moves: AtomicU64,
    len: AtomicUsize,
    /// The tables' probe (and burst prefetch) for its word and number of
    /// fields, chosen once here: one call where a lookup would otherwise
    /// match on both.
    probes: Probes,
    /// How [`classify_key`](Self::classify_key) reads a key's fields.
    key_reader: KeyReader,
    /// Where a rule's parts sit among its words in the chains (computed
    /// once here, not on each probe).
    layout: Layout,
    /// The engine of a schema of one prefix field, in place of the
    /// tables (`prefix.rs`).
    index: Option<PrefixIndex>,
    /// What the byte contract reports (`map_info`) and checks each key
    /// against, worked out once: the rule key's size, the schema as
    /// `map_extra`, the creation flags (`BPF_F_NO_PREALLOC`). Worked out
    /// from the schema on each lookup, they were a sixth of a contract
    /// lookup's instructions on acl1_10k (docs/benchmarks.md, "Keys'
    /// bytes on the prefix engine").
    pub(super) info: MapInfo,
}

impl WildcardMap {
    /// An empty map of `schema` with values of `value_size` bytes (1 or
    /// more) and room for `max_entries` rules (1 or more).
    ///
    /// A schema of one prefix field (geoIP, routes with priorities) gets
    /// an LPM trie whose every prefix holds the best rule among its own
    /// and its ancestors': a classification is one trie lookup, where
    /// TupleMerge probes a table per group of prefix lengths. Any other
    /// schema gets TupleMerge.
    pub fn new(schema: Schema, value_size: usize, max_entries: u32) -> Result<Self> {
        let mut map =
            Self::with_collision_limit(schema, value_size, max_entries, DEFAULT_COLLISION_LIMIT)?;
        if let [field] = map.schema.fields()
            && field.kind == FieldKind::Prefix
        {
            map.index = Some(PrefixIndex::new(field, value_size, max_entries)?);
        }
        Ok(map)
    }

    /// A TupleMerge map (whatever the schema) with another collision
    /// limit (1 or more).
    pub fn with_collision_limit(
        schema: Schema,
        value_size: usize,
        max_entries: u32,
        collision_limit: usize,
    ) -> Result<Self> {
        if value_size == 0 || max_entries == 0 || collision_limit == 0 {
            return Err(Error::invalid(
                "value size, max entries and collision limit must be non-zero",
            ));
        }
        let info = MapInfo {
            map_type: MapType::WILDCARD,
            key_size: schema.rule_key_size() as u32,
            value_size: value_size as u32,
            max_entries,
            map_flags: 0,
            map_extra: schema.map_extra(),
        };
        Ok(WildcardMap {
            probes: probes_for(Width::of(&schema), schema.fields().len()),
            key_reader: KeyReader::new(&schema, Width::of(&schema).bytes()),
            layout: Layout::of(Width::of(&schema), schema.fields().len(), value_size),
            schema,
            value_size,
            max_entries,
            collision_limit,
            writer: Mutex::new(Writer::default()),
            view: Atomic::new(View::new(Box::new([]), false)),
            moves: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            index: None,
            info,
            homes_from: super::chain::HOMED_SLOTS,
            lone_homes_over: super::chain::LONE_HOMED_RULES,
        })
    }

    /// The same map whose tables of `slots` buckets or more have homes,
    /// alone or not: tests give small maps homes with it.
    #[cfg(test)]
    pub(super) fn with_homes_from(mut self, slots: usize) -> Self {
        self.homes_from = slots;
        self
    }

    /// The same map whose only table has homes when it holds more than
    /// `rules` rules (and a table among others as
    /// [`with_homes_from`](Self::with_homes_from) says).
    #[cfg(test)]
    pub(super) fn with_lone_homes_over(mut self, rules: usize) -> Self {
        self.lone_homes_over = rules;
        self
    }

    /// Its schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Rules held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether it holds no rule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value size in bytes.
    pub fn value_size(&self) -> usize {
        self.value_size
    }

    /// Most rules it holds.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }

    /// Tables in use (for benchmarks and tests; the prefix engine's trie
    /// counts as one).
    pub fn tables(&self) -> usize {
        match &self.index {
            Some(_) => usize::from(!self.is_empty()),
            None => self.writer.lock().tables.len(),
        }
    }

    /// The moves a load ends with ([`absorb`](Self::absorb)), over every
    /// table, for tests that shape the tables by inserts first.
    #[cfg(test)]
    pub(super) fn absorb_all(&self) {
        let mut w = self.writer.lock();
        self.absorb(&mut w, 0, &pin());
    }

    /// Each table's tuple (its first fields', as many as the schema
    /// has), in the published order.
    #[cfg(test)]
    pub(super) fn tuples(&self) -> Vec<Vec<u8>> {
        let n = self.schema.fields().len();
        let w = self.writer.lock();
        w.order.iter().map(|(_, t)| t[..n].to_vec()).collect()
    }

    /// Each table's tuple (its first fields') and rules, in the
    /// published order.
    #[cfg(test)]
    pub(super) fn table_rules(&self) -> Vec<(Vec<u8>, Vec<Rule>)> {
        let n = self.schema.fields().len();
        let w = self.writer.lock();
        let mut tables: Vec<_> = w
            .order
            .iter()
            .map(|(_, t)| (t[..n].to_vec(), Vec::new()))
            .collect();
        for (placed, id) in &w.placed {
            let i = w
                .order
                .iter()
                .position(|(t, _)| t == id)
                .expect("a placed rule's table");
            tables[i].1.push(placed.0.rule.clone());
        }
        tables
    }

    /// What a probe's match of `rule` (held) stops it by: its exit bound
    /// while the bounds hold, else its priority.
    #[cfg(test)]
    pub(super) fn exit_bound(&self, rule: &Rule) -> u32 {
        let w = self.writer.lock();
        let (placed, _) = w.placed.get_key_value(rule).expect("a held rule");
        if w.exits {
            placed.0.exit.load(Ordering::Relaxed)
        } else {
            rule.priority
        }
    }

    /// The published tables' best priorities, in probe order.
    #[cfg(test)]
    pub(super) fn bests(&self) -> Vec<u32> {
        let guard = &pin();
        // SAFETY: as in `classify_counting`.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        view.tables.iter().map(|(best, _)| *best).collect()
    }

    /// Per table, its chains carved from a block and those allocated
    /// alone, and the blocks the carved ones came from.
    #[cfg(test)]
    pub(super) fn chain_blocks(&self) -> Vec<(usize, usize, usize)> {
        let w = self.writer.lock();
        let guard = &pin();
        w.tables
            .values()
            .map(|state| {
                let (mut carved, mut alone, mut blocks) = (0, 0, Vec::new());
                for slot in state.table.slots.iter() {
                    // SAFETY: under the guard.
                    if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
                        match chain.carved_from() {
                            Some(block) => {
                                carved += 1;
                                if !blocks.contains(&block) {
                                    blocks.push(block);
                                }
                            }
                            None => alone += 1,
                        }
                    }
                }
                (carved, alone, blocks.len())
            })
            .collect()
    }

    /// The most rules any bucket of any table holds.
    #[cfg(test)]
    pub(super) fn longest_bucket(&self) -> usize {
        let w = self.writer.lock();
        let guard = &pin();
        w.tables
            .values()
            .flat_map(|s| s.table.slots.iter())
            .map(|slot| chain_entries(slot, guard).len())
            .max()
            .unwrap_or(0)
    }

    /// Per table in probe order: its chains at their bucket's home
    /// ([`HOME`]), the chains it holds, and whether the view's probe asks
    /// for the table's homes.
    #[cfg(test)]
    pub(super) fn chains_at_home(&self) -> Vec<(usize, usize, bool)> {
        let guard = &pin();
        // SAFETY: as in `classify_counting`.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        view.tables
            .iter()
            .zip(view.probes.iter())
            .map(|((_, table), probe)| {
                let homes = table.homes.load(Ordering::Relaxed);
                let (mut home, mut held) = (0, 0);
                for (i, slot) in table.slots.iter().enumerate() {
                    let chain = slot.load(Ordering::Acquire, guard);
                    if !chain.is_null() {
                        held += 1;
                        home += usize::from(homes != 0 && chain.into_usize() == homes + i * HOME);
                    }
                }
                (home, held, probe.homes == homes)
            })
            .collect()
    }

    /// Buckets in the first table probed (0 without one).
    #[cfg(test)]
    pub(super) fn first_table_buckets(&self) -> usize {
        let guard = &pin();
        // SAFETY: as in `classify_counting`.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        view.tables.first().map_or(0, |(_, t)| t.slots.len())
    }

    /// The first rule after `after` in rule order (`None`: the first
    /// rule), whether or not `after` is held. Takes the writer lock: the
    /// rule order is kept only by the writer. The first call after many
    /// updates sorts the rules (`order.rs`); the calls after it search
    /// that run.
    pub fn next_rule(&self, after: Option<&Rule>) -> Option<Rule> {
        if let Some(index) = &self.index {
            return index.next_rule(after);
        }
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let order = w
            .rule_order
            .get_or_insert_with(|| RuleOrder::build(w.placed.keys().map(|p| &p.0)));
        order.next(after, |r| w.placed.contains_key(r)).cloned()
    }

    /// Bytes held: tables, buckets, rules and values, and the writer's
    /// index of the rules (an estimate from sizes, not the allocator's
    /// count).
    pub fn memory_usage(&self) -> usize {
        use std::mem::size_of;
        if let Some(index) = &self.index {
            return size_of::<Self>() + index.memory_usage();
        }
        let guard = &pin();
        let w = self.writer.lock();
        let mut bytes = size_of::<Self>();
        let fields = self.schema.fields().len();
        for state in w.tables.values() {
            let table = &state.table;
            bytes += size_of::<Table>() + 16 + table.slots.len() * size_of::<Atomic<Chain>>();
            // A chain carved from a block counts as the whole block, once
            // (the chains an edit replaced are held until the last goes).
            let mut blocks = Vec::new();
            for slot in table.slots.iter() {
                // SAFETY: under the guard.
                if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
                    match chain.carved_from() {
                        Some(block) if !blocks.contains(&block) => blocks.push(block),
                        Some(_) => {}
                        None => bytes += chain.bytes(),
                    }
                }
            }
            bytes += blocks.iter().map(|&(_, size)| size).sum::<usize>();
            bytes += size_of::<TableState>() + state.priorities.len() * 24;
        }
        // Each entry once (an `Arc` header, the rule and the value), held
        // or remembered for its exit bound, and the writer's indexes.
        let entry =
            16 + size_of::<Entry>() + fields * 32 + Entry::value_bytes_outside(self.value_size);
        bytes
            + (w.placed.len() + w.gone.len()) * entry
            + index_bytes(w.placed.capacity())
            + w.gone.bytes()
            + w.rule_order.as_ref().map_or(0, RuleOrder::bytes)
    }

    /// Every rule with its value, in rule order (a copy).
    pub fn rules(&self) -> Vec<(Rule, Vec<u8>)> {
        if let Some(index) = &self.index {
            return index.rules();
        }
        let guard = &pin();
        let mut all = self.read_view(guard, |view| {
            let mut all = Vec::with_capacity(self.len());
            for (_, table) in view.tables.iter() {
                for e in table_entries(table, guard) {
                    all.push((e.rule.clone(), e.value.to_vec()));
                }
            }
            all
        });
        // A rule a split is moving is in two tables for a moment.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.dedup_by(|a, b| a.0 == b.0);
        all
    }
}

impl Drop for WildcardMap {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader; the view goes to the reaper
        // thread, so a huge map's free stalls no caller.
        let view = unsafe {
            self.view
                .swap(
                    Shared::null(),
                    Ordering::Relaxed,
                    crossbeam_epoch::unprotected(),
                )
                .into_owned()
        };
        let writer = std::mem::take(self.writer.get_mut());
        drop_in_background((view.into_box(), writer, self.index.take()));
    }
}

/// How many of `rules` are not held (`held`), if a load of them under
/// `flag` may go ahead: `EEXIST` with `BPF_NOEXIST` for one held,
/// `ENOENT` with `BPF_EXIST` for one not held, `E2BIG` when the new ones
/// would take the map's `len` past `max_entries`.
pub(super) fn count_fresh<'a>(
    rules: impl Iterator<Item = &'a Rule>,
    flag: UpdateFlag,
    held: impl Fn(&Rule) -> bool,
    len: usize,
    max_entries: usize,
) -> Result<usize> {
    let mut fresh = 0;
    for rule in rules {
        match (held(rule), flag) {
            (true, UpdateFlag::NoExist) => return Err(Error::Exists),
            (false, UpdateFlag::Exist) => return Err(Error::NotFound),
            (held, _) => fresh += usize::from(!held),
        }
    }
    if len + fresh > max_entries {
        return Err(Error::Full);
    }
    Ok(fresh)
}

/// The entries of `given` (rules of a schema of `fields`, checked), the
/// last given for each rule, in rule order; `EEXIST` for a rule given
/// twice under `BPF_NOEXIST`.
///
/// Sorted by each rule's priority and its bounds packed into one number
/// ([`pack`]), held beside each entry: comparing the rules themselves
/// reads their bounds, boxed and scattered in memory, at every step (a
/// `BTreeMap` of the rules did, and took most of the time of loading a
/// million; docs/benchmarks.md, "Loading many rules").
pub(super) fn last_of_each(
    fields: &[Field],
    given: Vec<Arc<Entry>>,
    flag: UpdateFlag,
) -> Result<Vec<Arc<Entry>>> {
    let mut keyed: Vec<(u32, u128, Arc<Entry>)> = given
        .into_iter()
        .map(|e| (e.rule.priority, pack(fields, &e.rule), e))
        .collect();
    // Stable: a rule's last value ends its run.
    keyed.sort_by(|a, b| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| a.2.rule.cmp(&b.2.rule))
    });
    let same = |a: &(u32, u128, Arc<Entry>), b: &(u32, u128, Arc<Entry>)| {
        (a.0, a.1) == (b.0, b.1) && a.2.rule == b.2.rule
    };
    // The last of each run of the same rule, moved out (no count taken).
    let mut last = Vec::with_capacity(keyed.len());
    let mut sorted = keyed.into_iter().peekable();
    while let Some(k) = sorted.next() {
        if sorted.peek().is_some_and(|next| same(&k, next)) {
            if flag == UpdateFlag::NoExist {
                return Err(Error::Exists);
            }
            continue;
        }
        last.push(k.2);
    }
    Ok(last)
}

/// A rule's bounds as one number that orders as they do (given its
/// priority): each field's lower and upper bound in the field's own
/// bits, one after the other, cut at 128 bits (all of Cilium's 8 bytes
/// of fields, a 5-tuple's addresses). Rules that tie on it compare by
/// their bounds. For a rule of the schema of `fields` (checked).
pub(super) fn pack(fields: &[Field], rule: &Rule) -> u128 {
    let (mut packed, mut used) = (0u128, 0u32);
    for (f, &(lo, hi)) in fields.iter().zip(rule.bounds()) {
        for v in [lo, hi] {
            // The bound's leading bits that still fit, after those before.
            let take = f.bits().min(128 - used);
            if take > 0 {
                packed |= (v >> (f.bits() - take)) << (128 - used - take);
                used += take;
            }
        }
    }
    packed
}

/// Whether a rule fixing `fixed` bits per field fits a table hashing
/// `tuple` bits.
pub(super) fn fits(fixed: &Tuple, tuple: &Tuple) -> bool {
    fixed.iter().zip(tuple).all(|(f, t)| f >= t)
}

/// A new table's tuple for a rule fixing `fixed` bits, so that rules of
/// nearby lengths share the table: a prefix field more than 4 bits
/// shorter than the longest prefix field is not hashed at all (the
/// reference does so with the shorter of the two addresses: fewer
/// tables), and prefix fields longer than 8 bits are a few bits shorter
/// (the reference's steps for IPv4 addresses, 9-16 bits one less, 17-24
/// two, 25-32 three, and so on); other fields as they are. On the
/// ClassBench 10K sets the first rule took the tables from 84, 102 and
/// 170 to 52, 38 and 61 (acl1, fw1, ipc1; a scratch program).
fn relax(fixed: &Tuple, schema: &Schema) -> Tuple {
    let mut t = *fixed;
    let prefixes = || {
        schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == FieldKind::Prefix)
            .map(|(i, _)| i)
    };
    let longest = prefixes().map(|i| t[i]).max().unwrap_or(0);
    for i in prefixes() {
        if t[i] + 4 < longest {
            t[i] = 0;
        }
    }
    for (i, f) in schema.fields().iter().enumerate() {
        if f.kind == FieldKind::Prefix && t[i] > 8 {
            t[i] -= (t[i] - 1) / 8;
        }
    }
    t
}

fn count(priorities: &mut BTreeMap<u32, usize>, priority: u32, add: bool) {
    if add {
        *priorities.entry(priority).or_default() += 1;
    } else if let std::collections::btree_map::Entry::Occupied(mut held) =
        priorities.entry(priority)
    {
        // One search, where `get_mut` then `remove` made two.
        *held.get_mut() -= 1;
        if *held.get() == 0 {
            held.remove();
        }
    }
}

/// Each field's lower bound, as a packet: where a rule hashes.
fn lows(rule: &Rule) -> [u128; MAX_FIELDS] {
    let mut v = [0; MAX_FIELDS];
    for (i, &(lo, _)) in rule.bounds().iter().enumerate() {
        v[i] = lo;
    }
    v
}

/// Every entry of `table`.
fn table_entries(table: &Table, guard: &Guard) -> Vec<Arc<Entry>> {
    let mut all = Vec::new();
    for slot in table.slots.iter() {
        // SAFETY: under the guard (the writer's, or a reader's).
        if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
            all.extend(chain.entries());
        }
    }
    all
}

#[cfg(test)]
thread_local! {
    /// A test's update, run once on this thread between a reader's load
    /// of the view and its probe: the window a split must not open.
    pub(super) static IN_THE_WINDOW: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::Cell::new(None) };
}

/// Runs the update a test put in [`IN_THE_WINDOW`], if any.
#[cfg(test)]
fn in_the_window() {
    if let Some(update) = IN_THE_WINDOW.take() {
        update();
    }
}

/// The rules in the bucket of `rule` in `table`.
fn bucket_of(table: &Table, rule: &Rule, guard: &Guard) -> Vec<Arc<Entry>> {
    let chain = table.slot(&lows(rule)).load(Ordering::Acquire, guard);
    // SAFETY: under the guard (the writer's).
    unsafe { chain.as_ref() }.map_or_else(Vec::new, Chain::entries)
}

/// Publishes `entries` as the chain of `slot`, freeing the one it
/// replaces after the grace period.
fn publish_chain(slot: &Atomic<Chain>, entries: Vec<Arc<Entry>>, width: Width, guard: &Guard) {
    let new = (!entries.is_empty()).then(|| Owned::<Chain>::init((entries, width)));
    install(slot, new, guard);
}

/// Publishes `new` (`None`: an empty bucket) as the chain of `slot`,
/// freeing the one it replaces after the grace period (which keeps,
/// until then, the counts of the entries it still owns).
fn install(slot: &Atomic<Chain>, new: Option<Owned<Chain>>, guard: &Guard) {
    let new = new.map_or(Shared::null(), |n| n.into_shared(guard));
    let old = slot.swap(new, Ordering::AcqRel, guard);
    if !old.is_null() {
        // SAFETY: replaced: unreachable for new readers.
        unsafe { guard.defer_destroy(old) };
    }
}

/// The entries of `slot`'s chain.
fn chain_entries(slot: &Atomic<Chain>, guard: &Guard) -> Vec<Arc<Entry>> {
    // SAFETY: under the writer's guard.
    unsafe { slot.load(Ordering::Acquire, guard).as_ref() }.map_or_else(Vec::new, Chain::entries)
}

/// Changes `slot`'s bucket of `table`: its chain copied with the change
/// ([`Chain::edited`]) and published in its place (a reader sees the
/// bucket before or after), the old one freed after the grace period.
/// `edit` names the change from the bucket's chain (`None`: nothing
/// changes, and `None` is returned). Returns the bucket's new length.
fn edit_bucket(
    table: &Table,
    slot: &Atomic<Chain>,
    guard: &Guard,
    edit: impl FnOnce(Option<&Chain>) -> Option<Edit>,
) -> Option<usize> {
    // SAFETY: under the writer's guard; only the writer replaces chains.
    let chain = unsafe { slot.load(Ordering::Acquire, guard).as_ref() };
    let new = match (chain, edit(chain)?) {
        (Some(c), edit) => c.edited(table.width, edit),
        (None, Edit::Insert(e)) => Some(Owned::<Chain>::init((vec![e], table.width))),
        (None, _) => unreachable!("an edit of a rule held in an empty bucket"),
    };
    let len = new.as_deref().map_or(0, Chain::len);
    install(slot, new, guard);
    Some(len)
}

/// Puts `entry` in place of the entry of the same rule in `table` (one
/// new chain, published: a reader sees the old value or the new).
fn chain_replace(table: &Table, entry: Arc<Entry>, guard: &Guard) {
    let slot = table.slot(&lows(&entry.rule));
    edit_bucket(table, slot, guard, |c| {
        let at = c?.find(table.width, &entry.rule)?;
        Some(Edit::Replace(at, entry))
    })
    .expect("a held rule");
}

/// Puts `entry` (a rule not held) in its bucket of `table` (a new
/// chain, published); returns the bucket's new length.
fn chain_insert(table: &Table, entry: Arc<Entry>, guard: &Guard) -> usize {
    let slot = table.slot(&lows(&entry.rule));
    edit_bucket(table, slot, guard, |_| Some(Edit::Insert(entry))).expect("an insert")
}

/// Takes `rule` out of its bucket of `table` (a new chain, or none,
/// published); false if the bucket does not hold it.
fn chain_remove(table: &Table, rule: &Rule, guard: &Guard) -> bool {
    let slot = table.slot(&lows(rule));
    edit_bucket(table, slot, guard, |c| {
        c?.find(table.width, rule).map(Edit::Remove)
    })
    .is_some()
}

/// Whether `moving` (rules that fit `target`'s tuple) and `target`'s
/// own rules, in one table of `target`'s tuple and buckets enough for
/// both, would keep chains short: no bucket over `limit` (the collision
/// limit) and the bucket a rule sits in holding at most [`ABSORB_MEAN`]
/// rules on average.
fn stays_short(moving: &[Arc<Entry>], target: &TableState, limit: usize, guard: &Guard) -> bool {
    let slots = merged_slots(moving.len(), target);
    let table = &target.table;
    let mut held = vec![0usize; slots];
    let mut add = |rule: &Rule| held[bucket_index(table.hash(&lows(rule)), slots)] += 1;
    moving.iter().for_each(|e| add(&e.rule));
    for slot in table.slots.iter() {
        // SAFETY: under the writer's guard.
        if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
            chain.entry_refs().for_each(|e| add(&e.rule));
        }
    }
    short(held.into_iter(), limit)
}

/// Whether `table`'s buckets are short ([`short`]).
fn is_short(table: &Table, limit: usize, guard: &Guard) -> bool {
    // SAFETY: under the writer's guard.
    let held = table
        .slots
        .iter()
        .filter_map(|slot| unsafe { slot.load(Ordering::Acquire, guard).as_ref() })
        .map(Chain::len);
    short(held, limit)
}

/// Whether buckets holding `held` rules each are short: none over
/// `limit` (the collision limit), and the bucket a rule sits in holding
/// at most [`ABSORB_MEAN`] rules on average.
fn short(held: impl Iterator<Item = usize>, limit: usize) -> bool {
    let (mut rules, mut squares) = (0, 0);
    for n in held {
        if n > limit {
            return false;
        }
        rules += n;
        squares += n * n;
    }
    squares <= ABSORB_MEAN * rules
}

/// Buckets of a table holding `target`'s rules and `adding` more.
fn merged_slots(adding: usize, target: &TableState) -> usize {
    slots_for(adding + target.rules).max(target.table.slots.len())
}

/// Buckets for a table of `rules`, a power of two: [`SLOTS_PER_RULE`] a
/// rule up to [`SPARSE_SLOTS_MAX`] buckets, [`DENSE_SLOTS_PER_RULE`]
/// beyond; at least 8. Never fewer for more rules.
pub(super) fn slots_for(rules: usize) -> usize {
    let sparse = rules * SLOTS_PER_RULE;
    let wanted = if sparse <= SPARSE_SLOTS_MAX {
        sparse
    } else {
        (rules * DENSE_SLOTS_PER_RULE).max(SPARSE_SLOTS_MAX)
    };
    wanted.next_power_of_two().max(8)
}

/// Whether `table` holds fewer buckets than [`slots_for`] its `rules`.
fn outgrows(rules: usize, table: &Table) -> bool {
    slots_for(rules) > table.slots.len()
}

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
use super::schema::{Field, FieldKind, MAX_FIELDS, Packet, Rule, Schema};
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

/// The better of `best` and the first rule of `chain` matching `values`
/// (a chain's rules are in rule order, so its first match is its best).
#[inline(always)]
fn scan<'g, W: Word, const N: usize>(
    rules: impl Iterator<Item = &'g [W]>,
    values: &[W; N],
    best: Option<&'g [W]>,
) -> Option<&'g [W]> {
    for key in rules {
        // A tie of priorities goes to the first in rule order: nothing
        // from this rule on beats the best so far. Compared in the
        // words, not the entries.
        if best.is_some_and(|b| rule_order(key, b, N).is_ge()) {
            break;
        }
        // Every field's two compares, without a branch between them.
        debug_assert!(key.len() > 2 * N, "a rule's words hold its bounds");
        // SAFETY: a rule's words start with its priority and bounds
        // (`Layout`: its value and entry follow them).
        let (lows, highs) = unsafe {
            (
                key.get_unchecked(1..1 + N),
                key.get_unchecked(1 + N..1 + 2 * N),
            )
        };
        let mut hit = true;
        for i in 0..N {
            hit &= (lows[i] <= values[i]) & (values[i] <= highs[i]);
        }
        if hit {
            return Some(key);
        }
    }
    best
}

/// Per field, the leading bits a table hashes.
pub(super) type Tuple = [u8; MAX_FIELDS];

/// A probe of a map's tables: its best rule for a packet and the number
/// of tables probed. The rule comes back as the address of its words, in
/// a register, and the caller reads its entry and value from them (a
/// rule and a value slice went through memory: 8 more instructions).
type Probe = for<'g> fn(&WildcardMap, &Packet, &'g Guard) -> (Option<Hit<'g>>, usize);

/// Classifies a batch of packets, each answer into its place in `out`
/// (at least as long as the batch): [`WildcardMap::classify_many`].
type ManyProbe = for<'g, 'h> fn(&WildcardMap, &'h [Packet], &'g Guard, &mut [Option<Answer<'g>>]);

/// [`ManyProbe`] of keys' bytes: [`WildcardMap::classify_many_keys`].
type ManyKeysProbe = for<'g, 'h> fn(&WildcardMap, Keys<'h>, &'g Guard, &mut [Option<Answer<'g>>]);

/// A classification's answer: the best rule and its value.
type Answer<'g> = (&'g Rule, &'g [u8]);

/// A probe of a concrete key's bytes (of the schema's key size).
type KeyProbe = for<'g> fn(&WildcardMap, &[u8], &'g Guard) -> Option<Hit<'g>>;

/// A map's probe and prefetch, for its word and number of fields.
#[derive(Clone, Copy)]
struct Probes {
    classify: Probe,
    classify_many: ManyProbe,
    classify_many_keys: ManyKeysProbe,
    classify_key: KeyProbe,
}

impl Probes {
    fn of<W: Word, const N: usize>() -> Probes {
        Probes {
            classify: WildcardMap::classify_in::<W, N>,
            classify_many: WildcardMap::classify_packets_in::<W, N>,
            classify_many_keys: WildcardMap::classify_keys_in::<W, N>,
            classify_key: WildcardMap::classify_key_in::<W, N>,
        }
    }
}

/// The probes for chains of `width` words and `fields` fields.
fn probes_for(width: Width, fields: usize) -> Probes {
    fn of<W: Word>(fields: usize) -> Probes {
        match fields {
            1 => Probes::of::<W, 1>(),
            2 => Probes::of::<W, 2>(),
            3 => Probes::of::<W, 3>(),
            4 => Probes::of::<W, 4>(),
            5 => Probes::of::<W, 5>(),
            6 => Probes::of::<W, 6>(),
            7 => Probes::of::<W, 7>(),
            8 => Probes::of::<W, 8>(),
            _ => Probes::of::<W, MAX_FIELDS>(),
        }
    }
    match width {
        Width::W32 => of::<u32>(fields),
        Width::W64 => of::<u64>(fields),
        Width::W128 => of::<u128>(fields),
    }
}

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

/// A packet's first `N` values as words of `W`; `None` for a value wider
/// than every field, which matches no rule. (One test of all the values'
/// bits: a compare of each `u128` is four instructions and a branch.)
#[inline(always)]
fn words_of<W: Word, const N: usize>(packet: &Packet) -> Option<[W; N]> {
    if packet.values[..N].iter().fold(0, |all, &v| all | v) > W::MAX {
        return None;
    }
    Some(std::array::from_fn(|i| W::of(packet.values[i])))
}

/// A batch of concrete headers for [`WildcardMap::classify_many`]
/// (typed packets) or [`WildcardMap::classify_many_keys`] (keys' bytes
/// back to back): the batch's probe is compiled for each.
trait Headers: Copy {
    /// Headers in the batch.
    fn count(self) -> usize;
    /// Headers `from..to`.
    fn part(self, from: usize, to: usize) -> Self;
    /// Header `i`'s first `N` values as words of `W` (`None`: a value
    /// wider than every field, which matches no rule).
    fn words<W: Word, const N: usize>(self, map: &WildcardMap, i: usize) -> Option<[W; N]>;
}

impl Headers for &[Packet] {
    #[inline(always)]
    fn count(self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn part(self, from: usize, to: usize) -> Self {
        &self[from..to]
    }
    #[inline(always)]
    fn words<W: Word, const N: usize>(self, _: &WildcardMap, i: usize) -> Option<[W; N]> {
        words_of(&self[i])
    }
}

/// Keys of the schema's key size, back to back, each field in network
/// order ([`WildcardMap::classify_many_keys`]).
#[derive(Clone, Copy)]
struct Keys<'a> {
    bytes: &'a [u8],
    size: usize,
}

impl Headers for Keys<'_> {
    #[inline(always)]
    fn count(self) -> usize {
        self.bytes.len() / self.size
    }
    #[inline(always)]
    fn part(self, from: usize, to: usize) -> Self {
        Keys {
            bytes: &self.bytes[from * self.size..to * self.size],
            size: self.size,
        }
    }
    #[inline(always)]
    fn words<W: Word, const N: usize>(self, map: &WildcardMap, i: usize) -> Option<[W; N]> {
        let key = &self.bytes[i * self.size..(i + 1) * self.size];
        Some(map.key_reader.read_in_batch::<W, N>(key))
    }
}

/// `out[i] = probe(stage(i))` for each of `n` headers, each staged (its
/// buckets found and asked for) before the one before it is probed; a
/// header `stage` turns away gets `None`.
#[inline(always)]
fn pipeline<S: Copy, A>(
    n: usize,
    out: &mut [Option<A>],
    stage: impl Fn(usize) -> Option<S>,
    probe: impl Fn(S) -> Option<A>,
) {
    // One call of each closure (with two, LLVM left the stage out of
    // line: Cilium's wildcard rules at 1K, 46 instructions a packet).
    let n = n.min(out.len());
    let mut staged = None;
    for i in 0..=n {
        let this = std::mem::replace(&mut staged, if i < n { stage(i) } else { None });
        if i > 0 {
            out[i - 1] = this.and_then(&probe);
        }
    }
}

/// Packets [`WildcardMap::classify_many`] asks the buckets of at once.
const BURST: usize = 16;

/// Packets [`WildcardMap::classify_many`] reads one view for (a multiple
/// of [`BURST`]): what it reads again should a split overlap them.
const MANY_RUN: usize = 64;

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

    /// Asks for each header's bucket, then for the bucket's chain: the
    /// misses of a burst overlap, where one header at a time waits for
    /// its own two in turn.
    ///
    /// Chains of `W` words, `N` fields (a packet with a value wider than
    /// the word matches nothing, and is not asked for).
    #[inline(always)]
    fn prefetch_buckets<W: Word, const N: usize, H: Headers>(
        &self,
        map: &WildcardMap,
        headers: H,
        guard: &Guard,
    ) {
        let mut slots = [None; BURST];
        for (i, s) in slots.iter_mut().enumerate().take(headers.count()) {
            let Some(values) = headers.words::<W, N>(map, i) else {
                continue;
            };
            let slot = self.slot_in::<true, W, N>(&values);
            prefetch(slot);
            *s = Some(slot);
        }
        for slot in slots.iter().flatten() {
            let chain = slot.load(Ordering::Relaxed, guard).into_usize();
            if chain != 0 {
                // A chain of one rule may straddle two lines.
                prefetch(std::ptr::without_provenance::<u8>(chain));
                prefetch(std::ptr::without_provenance::<u8>(chain + 64));
            }
        }
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
    /// Creation flags through the byte contract (`BPF_F_NO_PREALLOC`).
    pub(super) map_flags: u32,
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
            map_flags: 0,
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

    /// The best rule matching `packet`, with its value.
    #[inline]
    pub fn classify<'g>(&self, packet: &Packet, guard: &'g Guard) -> Option<(&'g Rule, &'g [u8])> {
        self.classify_counting(packet, guard).0
    }

    /// The best matching rule's value alone, copied out as a `V`: a
    /// plain-old-data type of the map's value size (`u32`, `[u8; 6]`,
    /// ...); `None` when no rule matches or `V` is another size.
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema, WildcardMap};
    ///
    /// let schema = Schema::new(vec![Field::prefix("addr", 4)])?;
    /// let geo = WildcardMap::new(schema, 2, 100)?;
    /// let de = geo.schema().parse_rule("addr 10.0.0.0/8", 24)?;
    /// let fr = geo.schema().parse_rule("addr 10.9.0.0/16", 16)?;
    /// geo.insert(&de, b"DE", 0)?;
    /// geo.insert(&fr, b"FR", 0)?;
    /// let guard = bpfmaps::pin();
    /// let at = |a: &str| geo.schema().parse_packet(&format!("addr {a}")).unwrap();
    /// assert_eq!(geo.classify_as::<[u8; 2]>(&at("10.9.1.1"), &guard), Some(*b"FR"));
    /// assert_eq!(geo.classify_as::<[u8; 2]>(&at("10.1.1.1"), &guard), Some(*b"DE"));
    /// assert_eq!(geo.classify_as::<[u8; 2]>(&at("11.1.1.1"), &guard), None);
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    ///
    /// Why beside `classify`: a schema of one prefix field with values of
    /// up to 4 bytes keeps each prefix's best value in the leaves of a
    /// trie of its own, so this is one LPM lookup; `classify`, which
    /// returns the rule too, reads one more cache line (`prefix.rs`).
    // Always inlined: a caller's loop then overlaps more lookups.
    #[inline(always)]
    pub fn classify_as<V: bytemuck::Pod>(&self, packet: &Packet, guard: &Guard) -> Option<V> {
        if size_of::<V>() != self.value_size {
            return None;
        }
        match &self.index {
            Some(index) => index.classify_as(packet.values[0], guard),
            None => self
                .classify(packet, guard)
                .map(|(_, v)| bytemuck::pod_read_unaligned(v)),
        }
    }

    /// [`classify`](Self::classify), and how many tables it probed.
    #[inline]
    pub fn classify_counting<'g>(
        &self,
        packet: &Packet,
        guard: &'g Guard,
    ) -> (Option<(&'g Rule, &'g [u8])>, usize) {
        if let Some(index) = &self.index {
            return (index.classify(packet.values[0], guard), 1);
        }
        let (hit, probed) = (self.probes.classify)(self, packet, guard);
        (hit.map(|h| self.answer(h)), probed)
    }

    /// [`classify_counting`](Self::classify_counting) on chains of `W`
    /// words, for a schema of `N` fields (known at compile time here: a
    /// rule's test is then a fixed run of compares without a branch per
    /// field).
    fn classify_in<'g, W: Word, const N: usize>(
        &self,
        packet: &Packet,
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        debug_assert_eq!(N, self.schema.fields().len());
        match words_of::<W, N>(packet) {
            Some(values) => self.probe(&values, guard),
            None => (None, 0),
        }
    }

    /// [`classify_key`](Self::classify_key)'s probe on chains of `W`
    /// words, for a schema of `N` fields.
    fn classify_key_in<'g, W: Word, const N: usize>(
        &self,
        key: &[u8],
        guard: &'g Guard,
    ) -> Option<Hit<'g>> {
        let values = self.key_reader.read::<W, N>(key);
        self.probe(&values, guard).0
    }

    /// [`classify_many_in`](Self::classify_many_in) of packets.
    fn classify_packets_in<'g, W: Word, const N: usize>(
        &self,
        packets: &[Packet],
        guard: &'g Guard,
        out: &mut [Option<Answer<'g>>],
    ) {
        self.classify_many_in::<W, N, _>(packets, guard, out);
    }

    /// [`classify_many_in`](Self::classify_many_in) of keys.
    fn classify_keys_in<'g, W: Word, const N: usize>(
        &self,
        keys: Keys<'_>,
        guard: &'g Guard,
        out: &mut [Option<Answer<'g>>],
    ) {
        self.classify_many_in::<W, N, _>(keys, guard, out);
    }

    /// [`classify_many`](WildcardMap::classify_many) (or
    /// [`classify_many_keys`](WildcardMap::classify_many_keys)) on chains
    /// of `W` words, for a schema of `N` fields, `out` as long as the
    /// batch or longer.
    ///
    /// A run of [`MANY_RUN`] headers reads one view, and is read again
    /// if a split overlapped it ([`read_view`](Self::read_view)): runs
    /// keep that from redoing a whole call. Where the first table
    /// outgrows a core's L2, a run goes in bursts of [`BURST`] whose
    /// buckets in that table are asked for first.
    #[inline(always)]
    fn classify_many_in<'g, W: Word, const N: usize, H: Headers>(
        &self,
        headers: H,
        guard: &'g Guard,
        out: &mut [Option<Answer<'g>>],
    ) {
        let n = headers.count();
        for (r, outs) in (0..n).step_by(MANY_RUN).zip(out.chunks_mut(MANY_RUN)) {
            let run = headers.part(r, (r + MANY_RUN).min(n));
            self.read_view(guard, |view| {
                let m = run.count();
                let first = view.probes.first().filter(|t| t.len >= BURST_TABLE_SLOTS);
                let step = if first.is_some() { BURST } else { MANY_RUN };
                for (b, outs) in (0..m).step_by(step).zip(outs.chunks_mut(step)) {
                    let part = run.part(b, (b + step).min(m));
                    if let Some(first) = first {
                        first.prefetch_buckets::<W, N, H>(self, part, guard);
                        if view.probes.len() == 1 {
                            // One table: its buckets are asked for already.
                            for (i, o) in outs.iter_mut().enumerate().take(part.count()) {
                                *o = part
                                    .words::<W, N>(self, i)
                                    .and_then(|values| self.probe_one(first, &values, guard))
                                    .map(|h| self.answer(h));
                            }
                            continue;
                        }
                    }
                    self.pipeline_view::<W, N, H>(view, part, guard, outs);
                }
            });
        }
    }

    /// The headers through `view`'s tables: a pipeline across them.
    /// The next header's buckets in the first two tables (the only one,
    /// in a view of one) are found and asked for before this one is
    /// probed, so their hashes and misses overlap this probe (and
    /// survive its mispredicted branches), where one `classify` at a
    /// time starts each packet with them.
    ///
    /// Out of line: a call a run, and LLVM then inlines the probe into
    /// the pipeline's loop.
    #[inline(never)]
    fn pipeline_view<'g, W: Word, const N: usize, H: Headers>(
        &self,
        view: &'g View,
        headers: H,
        guard: &'g Guard,
        out: &mut [Option<Answer<'g>>],
    ) {
        let n = headers.count();
        let tables = &*view.probes;
        match tables {
            [] => out.iter_mut().take(n).for_each(|o| *o = None),
            [only] => pipeline(
                n,
                out,
                |i| {
                    let values = headers.words::<W, N>(self, i)?;
                    let slot = only.slot_in::<true, W, N>(&values);
                    prefetch(slot);
                    Some((values, slot))
                },
                |(values, slot)| {
                    self.scan_slot(slot, &values, None, guard)
                        .map(|words| self.answer(Hit::of(words)))
                },
            ),
            // Whether the bounds hold and the tables have homes are read
            // once a run, not a packet.
            _ => match (view.exits, view.homed) {
                (true, true) => {
                    self.pipeline_tables::<W, N, H, true, true>(view, headers, guard, out)
                }
                (true, false) => {
                    self.pipeline_tables::<W, N, H, true, false>(view, headers, guard, out)
                }
                (false, true) => {
                    self.pipeline_tables::<W, N, H, false, true>(view, headers, guard, out)
                }
                (false, false) => {
                    self.pipeline_tables::<W, N, H, false, false>(view, headers, guard, out)
                }
            },
        }
    }

    /// [`pipeline_view`](Self::pipeline_view) over a view of two tables
    /// or more, `EXITS` and `HOMES` as in
    /// [`probe_tables_from`](Self::probe_tables_from). Out of line, as
    /// `pipeline_view`.
    #[inline(never)]
    fn pipeline_tables<
        'g,
        W: Word,
        const N: usize,
        H: Headers,
        const EXITS: bool,
        const HOMES: bool,
    >(
        &self,
        view: &'g View,
        headers: H,
        guard: &'g Guard,
        out: &mut [Option<Answer<'g>>],
    ) {
        let (first, second) = (&view.probes[0], &view.probes[1]);
        pipeline(
            headers.count(),
            out,
            |i| {
                let values = headers.words::<W, N>(self, i)?;
                let ahead = [
                    first.slot_in::<HOMES, W, N>(&values),
                    second.slot_in::<HOMES, W, N>(&values),
                ];
                ahead.iter().for_each(|s| prefetch(*s));
                Some((values, ahead))
            },
            |(values, [a, b])| {
                self.probe_tables_from::<W, N, EXITS, HOMES>(
                    &values,
                    view,
                    [Some(a), Some(b)],
                    guard,
                )
                .0
                .map(|h| self.answer(h))
            },
        )
    }

    /// The best rule matching `values`, a packet's fields as words of
    /// the map's chains, and the number of tables probed.
    #[inline(always)]
    fn probe<'g, W: Word, const N: usize>(
        &self,
        values: &[W; N],
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        // `read_view`'s check, written out, with its loop out of line
        // (`probe_again`): a loop here kept the key, the map and the
        // count across the call below in callee-saved registers, saved
        // and restored on every probe (Cilium's exact rules at 1K,
        // `classify_key`: 104 -> 121 instructions a packet).
        let (moves, view) = self.view_now(guard);
        // A view of one table (a policy of one shape of rule, as Cilium's
        // exact rules) is probed without the pipeline below: a third of
        // the instructions of a classification, and the shorter path
        // lets the misses of a caller's consecutive lookups overlap
        // (docs/benchmarks.md, "One table, probed alone"). Its masks and
        // buckets are the view's own copy: the bucket's address waits on
        // one read, not three (docs/benchmarks.md, "Fewer buckets for
        // big tables").
        let Some(only) = &view.only else {
            return self.probe_tables(values, view, moves, guard);
        };
        let best = self.probe_one(only, values, guard);
        if self.unmoved_since(moves) {
            return (best, 1);
        }
        self.probe_again(values, guard)
    }

    /// [`probe`](Self::probe) again, after a split overlapped it, until
    /// none does ([`read_view`](Self::read_view)): rare, and out of the
    /// way of the probe.
    #[cold]
    #[inline(never)]
    fn probe_again<'g, W: Word, const N: usize>(
        &self,
        values: &[W; N],
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        self.read_view(guard, |view| match &view.only {
            Some(only) => (self.probe_one(only, values, guard), 1),
            None => self.probe_tables_once(values, view, guard),
        })
    }

    /// The best rule matching `values` in the one table `table`.
    #[inline(always)]
    fn probe_one<'g, W: Word, const N: usize>(
        &self,
        table: &TableProbe,
        values: &[W; N],
        guard: &'g Guard,
    ) -> Option<Hit<'g>> {
        self.scan_slot(table.slot_in::<true, W, N>(values), values, None, guard)
            .map(Hit::of)
    }

    /// What `read` finds in the published view, read again until no
    /// split took rules out of a table while it ran.
    ///
    /// Why: a split publishes the view with the rules' new table, then
    /// takes them out of the old one. A reader that loaded the view
    /// before (without the new table) and reads the old table's bucket
    /// after would find a moving rule in neither. The split counts
    /// itself in `moves` (release) before it takes any rule out, and the
    /// reader's bucket loads acquire what the split stored: a reader
    /// that saw a rule gone sees the count changed, and reads the view
    /// again, which then has the new table. A reader that saw the count
    /// changed at its start loads the view the split published, or a
    /// later one.
    #[inline(always)]
    fn read_view<'g, T>(&self, guard: &'g Guard, mut read: impl FnMut(&'g View) -> T) -> T {
        loop {
            let (moves, view) = self.view_now(guard);
            let found = read(view);
            if self.unmoved_since(moves) {
                return found;
            }
        }
    }

    /// The split count and then the published view, as a read of the
    /// view starts ([`read_view`](Self::read_view)).
    #[inline(always)]
    fn view_now<'g>(&self, guard: &'g Guard) -> (u64, &'g View) {
        let moves = self.moves.load(Ordering::Acquire);
        // SAFETY: a published view is freed only after the grace period
        // of its replacement, and the guard is pinned.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        #[cfg(test)]
        in_the_window();
        (moves, view)
    }

    /// Whether no split took rules out of a table since the count was
    /// `moves` ([`read_view`](Self::read_view)).
    #[inline(always)]
    fn unmoved_since(&self, moves: u64) -> bool {
        self.moves.load(Ordering::Acquire) == moves
    }

    /// [`probe`](Self::probe) of a view of several tables, read with the
    /// split count `moves` (again, should a split have overlapped it):
    /// out of line, so that a probe of one table saves only the
    /// registers it uses.
    #[inline(never)]
    fn probe_tables<'g, W: Word, const N: usize>(
        &self,
        values: &[W; N],
        view: &'g View,
        moves: u64,
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        let found = self.probe_tables_once(values, view, guard);
        if self.unmoved_since(moves) {
            return found;
        }
        self.probe_again(values, guard)
    }

    /// The walk of [`probe_tables`](Self::probe_tables) over `view`.
    #[inline(always)]
    fn probe_tables_once<'g, W: Word, const N: usize>(
        &self,
        values: &[W; N],
        view: &'g View,
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        match (view.exits, view.homed) {
            (true, true) => self.probe_tables_in::<W, N, true, true>(values, view, guard),
            (true, false) => self.probe_tables_in::<W, N, true, false>(values, view, guard),
            (false, true) => self.probe_tables_in::<W, N, false, true>(values, view, guard),
            (false, false) => self.probe_tables_in::<W, N, false, false>(values, view, guard),
        }
    }

    /// [`probe_tables_once`](Self::probe_tables_once), `EXITS` and
    /// `HOMES` as in [`probe_tables_from`](Self::probe_tables_from).
    #[inline(always)]
    fn probe_tables_in<'g, W: Word, const N: usize, const EXITS: bool, const HOMES: bool>(
        &self,
        values: &[W; N],
        view: &'g View,
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        let slot_of = |i: usize| view.probes.get(i).map(|t| t.slot_in::<HOMES, W, N>(values));
        let ahead = [slot_of(0), slot_of(1)];
        ahead.iter().flatten().for_each(|s| prefetch(*s));
        self.probe_tables_from::<W, N, EXITS, HOMES>(values, view, ahead, guard)
    }

    /// [`probe_tables`](Self::probe_tables) with the buckets of the
    /// first two tables already found (and asked for).
    ///
    /// The walk stops at the first table whose best priority is worse
    /// than the match's exit bound, while the bounds hold: no rule of
    /// that table or the ones after it can beat the match (`exits.rs`).
    ///
    /// `EXITS`: whether the view's bounds hold (a constant, so that a map
    /// without them runs the walk it ran before them). `HOMES`: whether
    /// its tables have homes to ask for ([`View::homed`]).
    #[inline(always)]
    fn probe_tables_from<'g, W: Word, const N: usize, const EXITS: bool, const HOMES: bool>(
        &self,
        values: &[W; N],
        view: &'g View,
        mut ahead: [Option<&'g Atomic<Chain>>; 2],
        guard: &'g Guard,
    ) -> (Option<Hit<'g>>, usize) {
        let tables = &*view.probes;
        // The word a match's bound is read from: its exit bound, or its
        // priority.
        let exit = if EXITS { exit_word(N) } else { 0 };
        // The best match's words in its chain.
        let mut best: Option<&'g [W]> = None;
        let mut probed = 0;
        // The probes of different tables are independent: while one
        // table's chain is read, the next table's chain and the bucket
        // after it are already asked for, so their misses overlap.
        let slot_of = |i: usize| tables.get(i).map(|t| t.slot_in::<HOMES, W, N>(values));
        for (i, TableProbe { top, .. }) in tables.iter().enumerate() {
            if best.is_some_and(|b| W::of(u128::from(*top)) > b[exit]) {
                break;
            }
            let after = slot_of(i + 2);
            if let Some(s) = after {
                prefetch(s);
            }
            if let Some(next) = ahead[1] {
                let chain = next.load(Ordering::Relaxed, guard);
                prefetch(std::ptr::without_provenance::<u8>(chain.into_usize()));
            }
            let slot = ahead[0].expect("the slot of table i");
            ahead = [ahead[1], after];
            probed += 1;
            best = self.scan_slot(slot, values, best, guard);
        }
        (best.map(Hit::of), probed)
    }

    /// The better of `best` and the first match for `values` in the
    /// chain of `slot`, a bucket of this map's tables.
    // Always inlined: once the walk over several tables had two callers,
    // LLVM left this out of line, and a ClassBench classification took
    // 13 % more instructions (acl1_10k: 9,330,889 -> 10,563,563 for
    // `wildcard_probe_once`'s 20,000 packets).
    #[inline(always)]
    fn scan_slot<'g, W: Word, const N: usize>(
        &self,
        slot: &Atomic<Chain>,
        values: &[W; N],
        best: Option<&'g [W]>,
        guard: &'g Guard,
    ) -> Option<&'g [W]> {
        let chain = slot.load(Ordering::Acquire, guard).into_usize();
        if chain == 0 {
            return best;
        }
        // SAFETY: as the view: chains are freed after the grace period
        // of their replacement; a chain of this map's rules, untagged, of
        // the layout's stride.
        let rules = unsafe { Chain::rules_at::<W>(chain, self.layout.stride) };
        scan(rules, values, best)
    }

    /// [`classify`](Self::classify) of a concrete key as a packet's
    /// header carries it: the fields back to back, each in network order
    /// ([`Schema::key_size`] bytes, `EINVAL` for another length).
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema, WildcardMap};
    ///
    /// // Cilium's policy key: identity, port, protocol, direction.
    /// let schema = Schema::new(vec![
    ///     Field::wildcard("id", 4),
    ///     Field::range("dport", 2),
    ///     Field::wildcard("proto", 1),
    ///     Field::exact("dir", 1),
    /// ])?;
    /// let policy = WildcardMap::new(schema, 4, 100)?;
    /// let web = policy.schema().parse_rule("id 0, dport 80-443, proto 6, dir 1", 3)?;
    /// policy.insert(&web, &7u32.to_ne_bytes(), 0)?;
    /// let guard = bpfmaps::pin();
    /// let key = [0, 0, 0x30, 0x39, 0x01, 0xbb, 6, 1]; // id 12345, port 443
    /// assert_eq!(policy.classify_key(&key, &guard)?.unwrap().1, 7u32.to_ne_bytes());
    /// assert!(policy.classify_key(&key[..7], &guard).is_err());
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    ///
    /// Why beside `classify`: the key's fields are read straight into
    /// the probe's words (`match_key.rs`), and a caller streaming
    /// packets reads their key's bytes (8 for Cilium's key) where a
    /// [`Packet`] is 144.
    #[inline]
    pub fn classify_key<'g>(
        &self,
        key: &[u8],
        guard: &'g Guard,
    ) -> Result<Option<(&'g Rule, &'g [u8])>> {
        check_len("key", key.len(), self.key_reader.key_size())?;
        Ok(match &self.index {
            Some(index) => {
                let packet = self.schema.packet_from_bytes(key)?;
                index.classify(packet.values[0], guard)
            }
            None => (self.probes.classify_key)(self, key, guard).map(|h| self.answer(h)),
        })
    }

    /// The rule and value of a match.
    #[inline(always)]
    fn answer<'g>(&self, hit: Hit<'g>) -> (&'g Rule, &'g [u8]) {
        // SAFETY: a hit is a rule's words in a chain of this map (its
        // layout and value size) published to a reader whose guard
        // outlives 'g; the chain owns its entry.
        let (entry, value) = unsafe { answer_of(hit, &self.layout, self.value_size) };
        (&entry.rule, value)
    }

    /// [`classify`](Self::classify) for each packet, into `out[i]`;
    /// `EINVAL` if `out` is shorter than `packets`.
    ///
    /// The packets go through a pipeline: the next packet's buckets in
    /// the first two tables (the only one, in a view of one) are found
    /// and asked for before this one is probed, so that their hashes
    /// and misses overlap this probe, where one `classify` at a time
    /// starts each packet waiting on them (ClassBench's 10K sets, 32
    /// packets a call: 1.10-1.22x less time a packet than `classify`
    /// one at a time; docs/benchmarks.md, "Packets in a pipeline").
    ///
    /// Where the first table outgrows a core's L2 (the buckets of 2^14
    /// rules or more), the packets go in bursts of 16: each burst's
    /// buckets in that table, and then their chains, are asked for
    /// before the first packet is probed, so their misses overlap (a
    /// million exact rules of Cilium's key: 1.8-2.0x less time a packet
    /// than one `classify` at a time, docs/benchmarks.md, "One table,
    /// probed alone"); a burst over several tables then goes through
    /// the pipeline.
    pub fn classify_many<'g>(
        &self,
        packets: &[Packet],
        guard: &'g Guard,
        out: &mut [Option<(&'g Rule, &'g [u8])>],
    ) -> Result<()> {
        if out.len() < packets.len() {
            return Err(Error::invalid(format!(
                "{} packets but room for {} answers",
                packets.len(),
                out.len()
            )));
        }
        if self.index.is_some() {
            for (p, o) in packets.iter().zip(out.iter_mut()) {
                *o = self.classify(p, guard);
            }
            return Ok(());
        }
        (self.probes.classify_many)(self, packets, guard, out);
        Ok(())
    }

    /// [`classify_key`](Self::classify_key) for each key of `keys` (keys
    /// of [`Schema::key_size`] bytes back to back, each field in network
    /// order, as a receive batch's headers hold them), into `out[i]`;
    /// `EINVAL` if `keys` is not a whole number of keys or `out` is
    /// shorter than their number.
    ///
    /// As [`classify_many`](Self::classify_many), through the same
    /// pipeline and bursts; a key's fields are read straight into the
    /// probe's words, where a [`Packet`] is 144 bytes to read.
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema, WildcardMap};
    ///
    /// let schema = Schema::new(vec![Field::wildcard("id", 4), Field::range("dport", 2)])?;
    /// let policy = WildcardMap::new(schema, 4, 100)?;
    /// let web = policy.schema().parse_rule("id 0, dport 80-443", 3)?;
    /// policy.insert(&web, &7u32.to_ne_bytes(), 0)?;
    /// let guard = bpfmaps::pin();
    /// // Two keys of 6 bytes: id 1 port 443, id 2 port 22.
    /// let keys = [0, 0, 0, 1, 0x01, 0xbb, 0, 0, 0, 2, 0, 22];
    /// let mut out = [None; 2];
    /// policy.classify_many_keys(&keys, &guard, &mut out)?;
    /// assert_eq!(out[0].unwrap().1, 7u32.to_ne_bytes());
    /// assert!(out[1].is_none());
    /// assert!(policy.classify_many_keys(&keys[..7], &guard, &mut out).is_err());
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    pub fn classify_many_keys<'g>(
        &self,
        keys: &[u8],
        guard: &'g Guard,
        out: &mut [Option<(&'g Rule, &'g [u8])>],
    ) -> Result<()> {
        let size = self.key_reader.key_size();
        if !keys.len().is_multiple_of(size) || out.len() < keys.len() / size {
            return Err(Error::invalid(format!(
                "{} bytes of {size}-byte keys but room for {} answers",
                keys.len(),
                out.len()
            )));
        }
        if self.index.is_some() {
            for (key, o) in keys.chunks_exact(size).zip(out.iter_mut()) {
                *o = self.classify_key(key, guard)?;
            }
            return Ok(());
        }
        (self.probes.classify_many_keys)(self, Keys { bytes: keys, size }, guard, out);
        Ok(())
    }

    /// The value of exactly `rule` (its intervals and priority).
    pub fn get<'g>(&self, rule: &Rule, guard: &'g Guard) -> Option<&'g [u8]> {
        if let Some(index) = &self.index {
            return index.get(rule, guard);
        }
        let fixed = rule.prefix_lengths(&self.schema);
        let lows = lows(rule);
        self.read_view(guard, |view| {
            view.tables
                .iter()
                .filter(|(_, t)| fits(&fixed, &t.tuple))
                .find_map(|(_, table)| {
                    let chain = table.slot(&lows).load(Ordering::Acquire, guard);
                    // SAFETY: as in `classify_counting`.
                    let chain = unsafe { chain.as_ref() }?;
                    chain
                        .entry_refs()
                        .find(|e| e.rule == *rule)
                        .map(|e| &*e.value)
                })
        })
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

    /// Stores `value` for `rule` under update `flags` (`BPF_ANY`,
    /// `BPF_NOEXIST`, `BPF_EXIST`). `E2BIG` when a new rule finds the map
    /// holding `max_entries`; `EINVAL` for a rule of another schema.
    pub fn insert(&self, rule: &Rule, value: &[u8], flags: u64) -> Result<()> {
        self.insert_flagged(rule, value, UpdateFlag::from_bits(flags)?)
    }

    /// [`insert`](Self::insert) with its flag decoded.
    pub(super) fn insert_flagged(&self, rule: &Rule, value: &[u8], flag: UpdateFlag) -> Result<()> {
        self.check_rule(rule)?;
        check_len("value", value.len(), self.value_size)?;
        if let Some(index) = &self.index {
            if index.insert(rule, value, flag, self.max_entries as usize)? {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        let entry = || Entry::shared(rule, value);
        match (w.placed.get(rule).copied(), flag) {
            (Some(_), UpdateFlag::NoExist) => Err(Error::Exists),
            (None, UpdateFlag::Exist) => Err(Error::NotFound),
            (Some(id), _) => {
                w.replace(id, entry(), guard);
                Ok(())
            }
            (None, _) => {
                if self.len() >= self.max_entries as usize {
                    return Err(Error::Full);
                }
                self.add(&mut w, entry(), false, guard);
                self.len.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Inserts every rule of `rules` with its value under `flags`, as a
    /// rule set is loaded: all or nothing (every rule is checked first:
    /// `EINVAL` for a rule of another schema or a value of another size,
    /// `EEXIST` with `BPF_NOEXIST` for a rule held or given twice,
    /// `ENOENT` with `BPF_EXIST` for one not held, `E2BIG` past
    /// `max_entries`; a rule given twice otherwise keeps its last value,
    /// as inserts in turn would).
    ///
    /// The new rules go in in a scrambled (but fixed) order, and a split
    /// moves every rule of its table that fits the new one. Rules inserted
    /// in priority order, one at a time, shape the tables after the first
    /// rules (the tables made for them, then split for their neighbours);
    /// a scrambled order shapes them after the whole set, as the
    /// reference's loader (which shuffles the rules) does. On the
    /// ClassBench sets that is about half the tables and half the probes
    /// a packet makes (docs/benchmarks.md, "Loading a rule set"). Then
    /// tables merge into coarser ones their rules fit, and rules of a
    /// priority two tables share move into one, where buckets stay short
    /// (Cilium's wildcard policies of 1,000 rules: 8 tables to 4, 4.7
    /// probes a packet to 1.7; its mixed ones of 100K: 2.1 to 1.3;
    /// docs/benchmarks.md, "Tables merged after a load"), or, where the
    /// tied rules fit neither table, gather into a table of their own
    /// (its mixed ones of 1,000: 2.4 probes a packet to 1.3; "Exact
    /// fields split whole; tied priorities gathered"). Last, each rule's
    /// exit bound is worked out over every rule held, so that a probe
    /// stops where no later table can beat its match (`exits.rs`; ipc1
    /// 10K: 4.7 tables probed a packet to 3.2, at twice the load's
    /// time), until the next insert of a rule that was not held then (a
    /// rule taken out and put back keeps its bound).
    ///
    /// Readers see the rules appear one by one, each whole. It returns
    /// after a grace period (as `synchronize_rcu`), having freed what it
    /// replaced, so that the updates after it do not pay for that; a
    /// caller holding a guard of its own skips the wait.
    pub fn load<R, V>(&self, rules: impl IntoIterator<Item = (R, V)>, flags: u64) -> Result<()>
    where
        R: std::borrow::Borrow<Rule>,
        V: AsRef<[u8]>,
    {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let flag = UpdateFlag::from_bits(flags)?;
        let mut given = Vec::new();
        for (rule, value) in rules {
            let (rule, value) = (rule.borrow(), value.as_ref());
            self.check_rule(rule)?;
            check_len("value", value.len(), self.value_size)?;
            given.push(Entry::shared(rule, value));
        }
        let given = last_of_each(self.schema.fields(), given, flag)?;
        if let Some(index) = &self.index {
            let fresh = index.load(given, flag, self.max_entries as usize)?;
            self.len.fetch_add(fresh, Ordering::Relaxed);
            return Ok(());
        }
        let mut w = self.writer.lock();
        let pinned = pin();
        let guard = &pinned;
        let empty = w.placed.is_empty();
        count_fresh(
            given.iter().map(|e| &e.rule),
            flag,
            |r| !empty && w.placed.contains_key(r),
            self.len(),
            self.max_entries as usize,
        )?;
        // Into an empty map every rule is new (`given` holds each once).
        w.placing_later = empty;
        let mut entries = given;
        entries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(LOAD_SEED));
        let first_new = w.next_id;
        for entry in entries {
            let held = if empty {
                None
            } else {
                w.placed.get(&entry.rule).copied()
            };
            match held {
                Some(id) => w.replace(id, entry, guard),
                None => {
                    self.add(&mut w, entry, true, guard);
                    self.len.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.absorb(&mut w, first_new, guard);
        self.set_exits(&mut w, guard);
        self.carve_loaded(&mut w, first_new, guard);
        if empty {
            w.place_all(guard);
        }
        drop(w);
        // The buckets and tables the load replaced are freed now, on the
        // loader's time (a grace period, then this thread's deferred
        // frees), not by whichever update or lookup pins next.
        drop(pinned);
        synchronize();
        Ok(())
    }

    /// Removes `rule`; `ENOENT` if it is not held.
    pub fn remove(&self, rule: &Rule) -> Result<()> {
        self.take_with(rule, |_| ())
    }

    /// Removes `rule` and returns its value.
    pub fn take(&self, rule: &Rule) -> Result<Vec<u8>> {
        self.take_with(rule, <[u8]>::to_vec)
    }

    /// Removes `rule` and returns what `read` makes of its value (a
    /// removal copies nothing).
    fn take_with<T>(&self, rule: &Rule, read: impl FnOnce(&[u8]) -> T) -> Result<T> {
        self.check_rule(rule)?;
        if let Some(index) = &self.index {
            let value = index.take(rule)?;
            self.len.fetch_sub(1, Ordering::Relaxed);
            return Ok(read(&value));
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        self.ask_for_bucket(&w, rule, guard);
        let (Placed(entry), id) = w.placed.remove_entry(rule).ok_or(Error::NotFound)?;
        let voided = w.exits_after_taking(&entry, id);
        w.rule_order_changed(|o| o.remove(rule));
        let state = w.tables.get_mut(&id).expect("a placed rule's table");
        assert!(chain_remove(&state.table, rule, guard), "a placed rule");
        let before = state.best();
        count(&mut state.priorities, rule.priority, false);
        state.rules -= 1;
        let (after, empty) = (state.best(), state.rules == 0);
        if empty {
            w.tables.remove(&id);
        }
        // An emptied table's best is `u32::MAX`: it leaves the list.
        if before != after || voided {
            self.publish(&mut w, guard);
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        Ok(read(&entry.value))
    }

    /// Asks for the first lines of the chain of `rule`'s bucket in the
    /// table it most likely sits in, the first in published order it
    /// fits (where [`add`](Self::add) puts a new rule; 89-100 % of the
    /// removes of the ClassBench sets' cold passes), before the index of
    /// rules says which table holds it: the chain's misses then overlap
    /// the index's. A wrong guess costs a few wasted prefetches. The cold
    /// pass of updates took 4-14 % less time (docs/benchmarks.md, "The
    /// bucket asked for before the index").
    fn ask_for_bucket(&self, w: &Writer, rule: &Rule, guard: &Guard) {
        let Some(id) = w.first_fit(&rule.prefix_lengths(&self.schema)) else {
            return;
        };
        let chain = w.tables[&id]
            .table
            .slot(&lows(rule))
            .load(Ordering::Relaxed, guard);
        if !chain.is_null() {
            for line in 0..CHAIN_LINES_ASKED {
                prefetch(std::ptr::without_provenance::<u8>(
                    chain.into_usize() + 64 * line,
                ));
            }
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        if let Some(index) = &self.index {
            // Under the index's writer lock, so no update runs between.
            index.clear(|| self.len.store(0, Ordering::Relaxed));
            return;
        }
        let mut w = self.writer.lock();
        let guard = &pin();
        w.tables.clear();
        w.placed.clear();
        w.rule_order = None;
        w.exits = false;
        w.forget_gone();
        self.publish(&mut w, guard);
        self.len.store(0, Ordering::Relaxed);
    }

    fn check_rule(&self, rule: &Rule) -> Result<()> {
        let fields = self.schema.fields();
        let ok = rule.bounds().len() == fields.len()
            && rule
                .bounds()
                .iter()
                .zip(fields)
                .all(|(&(lo, hi), f)| lo <= hi && hi <= f.max());
        if ok {
            Ok(())
        } else {
            Err(Error::invalid("a rule of another schema"))
        }
    }

    /// Places a new rule: the first table (in published order) it fits,
    /// or a new one; splits the table if the rule's bucket overflows
    /// (moving the table's fitting rules if `whole`, else the bucket's).
    fn add(&self, w: &mut Writer, entry: Arc<Entry>, whole: bool, guard: &Guard) {
        let fixed = entry.rule.prefix_lengths(&self.schema);
        let (voided, was_in) = w.exits_after_adding(&entry);
        // A rule put back goes back to its table, if it is still there:
        // elsewhere it could lower a table's best priority, and packets
        // whose bounds stopped them before that table would probe it.
        let was_in = was_in
            .filter(|id| (w.tables.get(id)).is_some_and(|state| fits(&fixed, &state.table.tuple)));
        let (id, fresh) = match was_in.or_else(|| w.first_fit(&fixed)) {
            Some(id) => (id, false),
            None => {
                let tuple = relax(&fixed, &self.schema);
                (w.new_table(Table::new(tuple, &self.schema, 8)), true)
            }
        };
        let placed = Arc::clone(&entry);
        let rule = &placed.rule;
        let lone = w.tables.len() == 1;
        let state = w.tables.get_mut(&id).expect("its table");
        let before = state.best();
        let bucket = chain_insert(&state.table, entry, guard);
        count(&mut state.priorities, rule.priority, true);
        state.rules += 1;
        // Outgrown, twice the buckets: a new table, published below with
        // a new view.
        let grown = outgrows(state.rules, &state.table);
        if grown {
            let slots = slots_for(state.rules);
            state.table = self.rebuilt(&state.table, slots, &[], lone, guard);
        }
        let after = state.best();
        w.place_new(&placed, id);
        if bucket > self.collision_limit {
            let colliding = bucket_of(&w.tables[&id].table, rule, guard);
            if self.split(w, id, &colliding, whole, guard) {
                return; // published
            }
        }
        if fresh || grown || before != after || voided {
            self.publish(w, guard);
        }
    }

    /// Splits the overflowing bucket of table `id` (its rules are
    /// `colliding`) as the reference does: hash more bits of the field
    /// where the colliding rules' prefix lengths differ most (half way
    /// between their least and most), in a table of that tuple (made if
    /// there is none), which takes the colliding rules that fit it, or
    /// if `whole` (a [`load`](Self::load)) every rule of the table that
    /// fits it, as the reference's split does, while the table holds at
    /// most [`WHOLE_SPLIT_MAX`] rules. Otherwise the work is the
    /// bucket's, not the table's. The moved rules go into the target's
    /// buckets (and are published with it) before they leave the
    /// source's, so a reader finds each in one table or both, never in
    /// neither. False when no tuple separates them (nothing changes).
    fn split(
        &self,
        w: &mut Writer,
        id: u64,
        colliding: &[Arc<Entry>],
        whole: bool,
        guard: &Guard,
    ) -> bool {
        let n = self.schema.fields().len();
        let tuples: Vec<Tuple> = colliding
            .iter()
            .map(|e| e.rule.prefix_lengths(&self.schema))
            .collect();
        let mut least = tuples[0];
        let mut most = tuples[0];
        for t in &tuples {
            for d in 0..n {
                least[d] = least[d].min(t[d]);
                most[d] = most[d].max(t[d]);
            }
        }
        let Some(d) = (0..n)
            .filter(|&d| most[d] > least[d])
            .max_by_key(|&d| (most[d] - least[d], std::cmp::Reverse(d)))
        else {
            return false;
        };
        let mut target = least;
        target[d] = match self.schema.fields()[d].kind {
            // An exact field's rules fix all its bits or none: fewer bits
            // split nothing more, and leave the bucket longer.
            FieldKind::Match | FieldKind::WildcardMatch => most[d],
            FieldKind::Prefix | FieldKind::Range => least[d] + (most[d] - least[d]).div_ceil(2),
        };
        let source = Arc::clone(&w.tables[&id].table);
        if target == source.tuple {
            return false;
        }
        let whole = whole && w.tables[&id].rules <= WHOLE_SPLIT_MAX;
        let moving: Vec<Arc<Entry>> = if whole {
            table_entries(&source, guard)
                .into_iter()
                .filter(|e| fits(&e.rule.prefix_lengths(&self.schema), &target))
                .collect()
        } else {
            colliding
                .iter()
                .zip(&tuples)
                .filter(|(_, t)| fits(t, &target))
                .map(|(e, _)| Arc::clone(e))
                .collect()
        };
        if moving.is_empty() {
            return false;
        }
        // Into the target: a new table, a rebuilt larger one, or its
        // buckets one chain at a time.
        let existing = w
            .tables
            .iter()
            .find(|(_, s)| s.table.tuple == target)
            .map(|(&tid, _)| tid);
        let target_id = match existing {
            None => w.new_table(self.build_table(target, slots_for(moving.len()), &moving, false)),
            Some(t) => {
                let state = w.tables.get_mut(&t).expect("target");
                if outgrows(state.rules + moving.len(), &state.table) {
                    let slots = slots_for(state.rules + moving.len());
                    state.table = self.rebuilt(&state.table, slots, &moving, false, guard);
                } else {
                    for e in &moving {
                        chain_insert(&state.table, Arc::clone(e), guard);
                    }
                }
                t
            }
        };
        let state = w.tables.get_mut(&target_id).expect("target");
        for e in &moving {
            count(&mut state.priorities, e.rule.priority, true);
            state.rules += 1;
        }
        w.place(&moving, target_id);
        self.publish(w, guard);
        // Readers of the view before this one probe again if they see
        // a rule gone (`read_view`).
        self.moves.fetch_add(1, Ordering::Release);
        // Out of the source: each bucket they leave rewritten once (a
        // bucket's split empties one; a whole-table split, many).
        let moved: std::collections::HashSet<*const Entry> =
            moving.iter().map(Arc::as_ptr).collect();
        let mut left: Vec<usize> = moving
            .iter()
            .map(|e| source.slot_index(&lows(&e.rule)))
            .collect();
        left.sort_unstable();
        left.dedup();
        for i in left {
            let slot = &source.slots[i];
            let staying: Vec<Arc<Entry>> = chain_entries(slot, guard)
                .into_iter()
                .filter(|e| !moved.contains(&Arc::as_ptr(e)))
                .collect();
            publish_chain(slot, staying, source.width, guard);
        }
        let state = w.tables.get_mut(&id).expect("source");
        let before = state.best();
        for e in &moving {
            count(&mut state.priorities, e.rule.priority, false);
            state.rules -= 1;
        }
        if state.rules == 0 {
            w.tables.remove(&id);
            self.publish(w, guard);
        } else if state.best() != before {
            self.publish(w, guard);
        }
        true
    }

    /// Moves rules between tables once a load is in, two ways:
    /// - a table whose rules all fit another table's tuple merges into
    ///   it: one probe fewer for the packets that reach both;
    /// - of two tables with the same best priority, the rules of that
    ///   priority in one move to the other, if they all fit its tuple:
    ///   the first table's best rises past the second's, and a packet
    ///   matched at that priority no longer probes both (a tie sends the
    ///   probe on; a table whose best is worse ends it).
    ///
    /// Either only while the receiving table keeps every bucket within
    /// the collision limit and the bucket a rule sits in holds at most
    /// [`ABSORB_MEAN`] rules on average. A packet probes every table
    /// whose best priority is at or below its answer's; neither move adds
    /// to those tables at any priority, so no packet probes more. At
    /// least one of the two tables is one this load made (its id
    /// `first_new` or later), so a small load into a large map does not
    /// count its old tables again. Then gathers tied rules
    /// ([`gather_ties`](Self::gather_ties)) and, last, splits crowded
    /// tables ([`split_crowded`](Self::split_crowded)). Publishes the
    /// result once.
    ///
    /// Why: rules arrive in any order, so a table made for the first
    /// rule of a shape may be finer than the table its later kin needed
    /// (Cilium's exact ports, then port blocks of 16: one table hashing
    /// 16 bits of the port and one hashing 12), and rules of one priority
    /// spread over the tables that existed as they came (Cilium's exact
    /// rules among the identity rules' table and the ports'). Once the
    /// whole set is in, which moves keep buckets short is known.
    fn absorb(&self, w: &mut Writer, first_new: u64, guard: &Guard) {
        let mut changed = false;
        // A gather can open a merge, and a merge a tie: a few rounds
        // settle them (a bound, should they chase each other).
        for _ in 0..GATHER_ROUNDS {
            changed |= self.merge_and_move(w, first_new, guard);
            if !self.gather_ties(w, first_new, guard) {
                break;
            }
            changed = true;
        }
        changed |= self.split_crowded(w, first_new, guard);
        if changed {
            self.publish(w, guard);
        }
    }

    /// Moves the chains of each table this load made (an id from
    /// `first_new` on) that holds some not carved from its block into
    /// one new block, one after another in bucket order: a load inserts
    /// its rules one at a time, and those after a table's last growth
    /// got chains allocated alone, up to half of them. (Tables the map
    /// held before are left as they are: a small load into a big map
    /// copies only what it made.) The copies replace the chains in
    /// their buckets one by one (each the same rules, so a reader sees
    /// the one or the other alike), and the originals are retired. A
    /// copy of every chain's words, no entry read: a rebuild of each
    /// table instead took a million exact rules' load 4.6 s, against
    /// 2.9-3.4 s without it and with this copy (docs/benchmarks.md,
    /// "Each table's chains in one block").
    ///
    /// A table with homes ([`HOMED_SLOTS`](super::chain::HOMED_SLOTS))
    /// gets the new block's, and the view is published again so that
    /// probes ask for them.
    fn carve_loaded(&self, w: &mut Writer, first_new: u64, guard: &Guard) {
        let mut homed = false;
        let lone = w.tables.len() == 1;
        for state in w.tables.range(first_new..).map(|(_, state)| state) {
            let table = &state.table;
            let held: Vec<(usize, &Chain)> = table
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| {
                    // SAFETY: under the guard (the writer's).
                    unsafe { slot.load(Ordering::Acquire, guard).as_ref() }.map(|c| (i, c))
                })
                .collect();
            if held.iter().all(|(_, chain)| chain.carved_from().is_some()) {
                continue;
            }
            let slots = table.slots.len();
            let Some(copies) =
                Chain::carve_copies(&held, slots, self.homed(slots, state.rules, lone))
            else {
                continue;
            };
            for ((i, _), copy) in held.into_iter().zip(copies.chains) {
                install(&table.slots[i], Some(copy), guard);
            }
            table.homes.store(copies.homes, Ordering::Relaxed);
            homed |= copies.homes != 0;
        }
        if homed {
            self.publish(w, guard);
        }
    }

    /// Whether a table of `slots` buckets holding `rules` rules gets
    /// homes for its chains ([`homes_from`](Self::homes_from)), or, when
    /// it is the map's only table (`lone`), by its rules
    /// ([`lone_homes_over`](Self::lone_homes_over)).
    fn homed(&self, slots: usize, rules: usize, lone: bool) -> bool {
        slots >= self.homes_from || (lone && rules > self.lone_homes_over)
    }

    /// A fresh, unpublished table like `table` (its tuple) with `slots`
    /// buckets, holding `table`'s entries and `more`; `lone` if it is the
    /// map's only table.
    fn rebuilt(
        &self,
        table: &Table,
        slots: usize,
        more: &[Arc<Entry>],
        lone: bool,
        guard: &Guard,
    ) -> Arc<Table> {
        let mut all = table_entries(table, guard);
        all.extend(more.iter().cloned());
        Arc::new(self.build_table(table.tuple, slots, &all, lone))
    }

    /// A fresh, unpublished table of `tuple` with `slots` buckets holding
    /// `entries`, with homes if [`homed`](Self::homed) (`lone`: it is the
    /// map's only table).
    fn build_table(&self, tuple: Tuple, slots: usize, entries: &[Arc<Entry>], lone: bool) -> Table {
        let table = Table::new(tuple, &self.schema, slots);
        let mut chains: Vec<Vec<Arc<Entry>>> = vec![Vec::new(); slots];
        for e in entries {
            let i = bucket_index(table.hash(&lows(&e.rule)), slots);
            chains[i].push(Arc::clone(e));
        }
        // The chains of the buckets that hold rules, carved from one block
        // in bucket order.
        let buckets: Vec<(usize, Vec<Arc<Entry>>)> = chains
            .into_iter()
            .enumerate()
            .filter(|(_, chain)| !chain.is_empty())
            .map(|(i, mut chain)| {
                chain.sort_by(|a, b| a.rule.cmp(&b.rule));
                (i, chain)
            })
            .collect();
        let held: Vec<usize> = buckets.iter().map(|(i, _)| *i).collect();
        let carved = Chain::carve(
            buckets,
            slots,
            self.homed(slots, entries.len(), lone),
            table.width,
        );
        for (i, chain) in held.into_iter().zip(carved.chains) {
            table.slots[i].store(chain, Ordering::Relaxed);
        }
        table.homes.store(carved.homes, Ordering::Relaxed);
        table
    }

    /// Works out every rule's exit bound (`exits.rs`) and publishes the
    /// chains whose bounds changed, then a view whose probes read them.
    /// Nothing to skip with one table; nothing to do for a layout
    /// without the word.
    fn set_exits(&self, w: &mut Writer, guard: &Guard) {
        // Bounds over the rules held now: a rule taken out before is not
        // of that set.
        w.forget_gone();
        if w.tables.len() < 2 || !self.layout.exit {
            return;
        }
        let ids: Vec<u64> = w.tables.keys().copied().collect();
        let tables: Vec<TableRules> = ids
            .iter()
            .map(|id| TableRules {
                tuple: w.tables[id].table.tuple,
                rules: table_entries(&w.tables[id].table, guard),
            })
            .collect();
        let bounds = exit_bounds(
            &tables,
            Width::of(&self.schema),
            |rule| rule.prefix_lengths(&self.schema),
            |t, rule, visit| {
                let slot = w.tables[&ids[t]].table.slot(&lows(rule));
                // SAFETY: under the writer's guard.
                if let Some(chain) = unsafe { slot.load(Ordering::Acquire, guard).as_ref() } {
                    chain.entry_refs().for_each(visit);
                }
            },
        );
        let mut changed = std::collections::HashSet::<_, foldhash::fast::RandomState>::default();
        w.exits = false;
        for (table, bounds) in tables.iter().zip(&bounds) {
            for (e, &bound) in table.rules.iter().zip(bounds) {
                w.exits |= bound < e.rule.priority;
                if e.exit.swap(bound, Ordering::Relaxed) != bound {
                    changed.insert(Arc::as_ptr(e));
                }
            }
        }
        for id in &ids {
            let table = &w.tables[id].table;
            for slot in table.slots.iter() {
                // SAFETY: under the writer's guard.
                let chain = unsafe { slot.load(Ordering::Acquire, guard).as_ref() };
                if chain.is_some_and(|c| {
                    c.entry_refs()
                        .any(|e| changed.contains(&std::ptr::from_ref(e)))
                }) {
                    publish_chain(slot, chain_entries(slot, guard), table.width, guard);
                }
            }
        }
        self.publish(w, guard);
    }

    /// Splits crowded tables this load made while a split pays (at most
    /// [`CROWDED_SPLITS`] of them, the best first): the rules that fix at
    /// least `L` bits of one field go to a new table hashing `L` bits of
    /// it, the rest stay. Unpublished; whether it split.
    ///
    /// Why: a table hashes what its first rule fixed (relaxed), and may
    /// hash too little of its later rules to tell them apart, with no
    /// bucket over the collision limit to split it: acl1_10k's rules of
    /// a /21-/32 source and a /14-/32 destination shared 127 buckets of a
    /// table hashing 21 bits of the source alone, 28 rules in a rule's
    /// bucket (docs/benchmarks.md, "Crowded tables split").
    fn split_crowded(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        // Each table's best split, kept while it is unchanged: a split
        // moves rules between two tables only, so the others' scores
        // stand (unless their split's tuple came to exist).
        let mut scored: HashMap<u64, Option<(usize, Tuple)>> = HashMap::new();
        let mut changed = false;
        for _ in 0..CROWDED_SPLITS {
            let stale: Vec<u64> = w
                .tables
                .keys()
                .copied()
                .filter(|&id| id >= first_new)
                .filter(|id| {
                    scored
                        .get(id)
                        .is_none_or(|s| s.is_some_and(|(_, t)| w.has_table_of(&t)))
                })
                .collect();
            for id in stale {
                scored.insert(id, self.best_split(w, id, guard));
            }
            let Some((from, tuple)) = scored
                .iter()
                .filter_map(|(&id, s)| s.map(|(gain, t)| (gain, id, t)))
                .max()
                .map(|(_, id, t)| (id, t))
            else {
                break;
            };
            let (moving, staying): (Vec<_>, Vec<_>) = table_entries(&w.tables[&from].table, guard)
                .into_iter()
                .partition(|e| fits(&e.rule.prefix_lengths(&self.schema), &tuple));
            let into = w.new_table(Table::new(tuple, &self.schema, 8));
            self.move_rules(w, (from, staying), (into, &moving), guard);
            scored.remove(&from);
            changed = true;
        }
        changed
    }

    /// The split of table `id` that saves the most rules scanned, and
    /// how many, if any does ([`split_crowded`](Self::split_crowded)).
    /// Scored with packets in proportion to rules: a rule's packet scans
    /// about half its bucket (its rules summed over the rules, halved);
    /// a packet probes each half whose best priority is at or above its
    /// answer's, and a probe costs [`PROBE_COST`] rules scanned. Only
    /// tables whose rules' buckets hold over [`ABSORB_MEAN`] on average,
    /// of at most [`WHOLE_SPLIT_MAX`] rules (a bound on the work).
    fn best_split(&self, w: &Writer, id: u64, guard: &Guard) -> Option<(usize, Tuple)> {
        let state = &w.tables[&id];
        if state.rules > WHOLE_SPLIT_MAX {
            return None;
        }
        let entries = table_entries(&state.table, guard);
        let fixed: Vec<Tuple> = entries
            .iter()
            .map(|e| e.rule.prefix_lengths(&self.schema))
            .collect();
        let lows: Vec<_> = entries.iter().map(|e| lows(&e.rule)).collect();
        let all: Vec<usize> = (0..entries.len()).collect();
        let now = self.crowding(state.table.tuple, &lows, &all);
        if now <= ABSORB_MEAN * entries.len() {
            return None;
        }
        // The other tables' rules' priorities, sorted: how many answer
        // below a priority is a binary search.
        let mut others: Vec<u32> = w
            .tables
            .iter()
            .filter(|&(&other, _)| other != id)
            .flat_map(|(_, s)| s.priorities.iter())
            .flat_map(|(&p, &n)| std::iter::repeat_n(p, n))
            .collect();
        others.sort_unstable();
        let mut best = None;
        for d in 0..self.schema.fields().len() {
            let mut lengths: Vec<u8> = fixed
                .iter()
                .map(|t| t[d])
                .filter(|&l| l > state.table.tuple[d])
                .collect();
            lengths.sort_unstable();
            lengths.dedup();
            for l in lengths {
                let mut tuple = state.table.tuple;
                tuple[d] = l;
                if w.has_table_of(&tuple) {
                    continue;
                }
                let (moving, staying): (Vec<usize>, Vec<usize>) =
                    all.iter().partition(|&&i| fits(&fixed[i], &tuple));
                let best_of = |ix: &[usize]| {
                    ix.iter()
                        .map(|&i| entries[i].rule.priority)
                        .min()
                        .unwrap_or(u32::MAX)
                };
                let (best_moving, best_staying) = (best_of(&moving), best_of(&staying));
                let answered_below = |half: &[usize], best: u32| {
                    half.iter()
                        .filter(|&&i| entries[i].rule.priority >= best)
                        .count()
                };
                // Packets answered by other tables below both halves'
                // best probe both, where they probed one table.
                let through =
                    others.len() - others.partition_point(|&p| p < best_moving.max(best_staying));
                let probes = through
                    + answered_below(&moving, best_staying)
                    + answered_below(&staying, best_moving);
                let cost = self.crowding(tuple, &lows, &moving)
                    + self.crowding(state.table.tuple, &lows, &staying)
                    + 2 * PROBE_COST * probes;
                if cost < now && best.is_none_or(|(gain, _)| now - cost > gain) {
                    best = Some((now - cost, tuple));
                }
            }
        }
        best
    }

    /// The rules at `which` (of those whose low bounds are `lows`), in a
    /// table of `tuple` and [`slots_for`] them: the sum over them of
    /// their bucket's rules.
    fn crowding(&self, tuple: Tuple, lows: &[[u128; MAX_FIELDS]], which: &[usize]) -> usize {
        let table = Table::new(tuple, &self.schema, 1);
        let slots = slots_for(which.len());
        let mut held = vec![0u32; slots];
        for &i in which {
            held[bucket_index(table.hash(&lows[i]), slots)] += 1;
        }
        held.iter().map(|&n| (n as usize) * (n as usize)).sum()
    }

    /// [`absorb`](Self::absorb)'s merges and moves, until none is left;
    /// unpublished. Whether it made any.
    fn merge_and_move(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        // Pairs (from, into) refused: unchanged tables are not counted
        // again.
        let mut refused = std::collections::HashSet::new();
        let mut changed = false;
        loop {
            // The smallest tables first: the cheapest to move.
            let mut ids: Vec<u64> = w.tables.keys().copied().collect();
            ids.sort_by_key(|id| (w.tables[id].rules, *id));
            let mut found = None;
            'search: for &from in &ids {
                for &into in &ids {
                    if into == from || from.max(into) < first_new || refused.contains(&(from, into))
                    {
                        continue;
                    }
                    let (source, target) = (&w.tables[&from], &w.tables[&into]);
                    let tuple = target.table.tuple;
                    let whole = fits(&source.table.tuple, &tuple);
                    if !whole && source.best() != target.best() {
                        continue;
                    }
                    // The whole table, or its rules of the tied priority.
                    let (moving, staying): (Vec<_>, Vec<_>) = table_entries(&source.table, guard)
                        .into_iter()
                        .partition(|e| whole || e.rule.priority == source.best());
                    let all_fit = whole
                        || moving
                            .iter()
                            .all(|e| fits(&e.rule.prefix_lengths(&self.schema), &tuple));
                    if all_fit && stays_short(&moving, target, self.collision_limit, guard) {
                        found = Some((from, into, moving, staying));
                        break 'search;
                    }
                    refused.insert((from, into));
                }
            }
            let Some((from, into, moving, staying)) = found else {
                break;
            };
            refused.retain(|&(a, b)| ![a, b].iter().any(|t| *t == from || *t == into));
            self.move_rules(w, (from, staying), (into, &moving), guard);
            changed = true;
        }
        changed
    }

    /// Where tables tie on their best priority and no move settled it
    /// (the tied rules fit neither table's tuple, or would crowd its
    /// buckets), gathers the rules of that priority from all of them
    /// into a new table whose tuple each fits (per field, the fewest
    /// bits any of them fixes), if its buckets stay short. A packet
    /// answered at that priority then probes one table, not each of the
    /// tied ones; one answered below it probes at most one table more,
    /// so only where the tied rules (times the tables less one)
    /// outnumber the tables' other rules.
    ///
    /// Cilium's mixed policies: exact rules, some with port blocks,
    /// spread over the identity rules' table and the ports' (which
    /// neither takes whole). One gather, unpublished; whether it made
    /// one.
    fn gather_ties(&self, w: &mut Writer, first_new: u64, guard: &Guard) -> bool {
        let mut by_best: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (&id, state) in &w.tables {
            by_best.entry(state.best()).or_default().push(id);
        }
        let n = self.schema.fields().len();
        for (best, ids) in by_best {
            if ids.len() < 2 || ids.iter().all(|&id| id < first_new) {
                continue;
            }
            let mut moving = Vec::new();
            let mut staying = Vec::new();
            for &id in &ids {
                let (tied, rest): (Vec<_>, Vec<_>) = table_entries(&w.tables[&id].table, guard)
                    .into_iter()
                    .partition(|e| e.rule.priority == best);
                moving.extend(tied);
                staying.push((id, rest));
            }
            // A packet answered at `best` saves a probe of each tied
            // table but one; one answered worse may pay one more (the new
            // table). With packets in proportion to rules, worth it when
            // the first outweigh the second.
            let worse: usize = staying.iter().map(|(_, rest)| rest.len()).sum();
            if moving.len() * (ids.len() - 1) < worse {
                continue;
            }
            let mut meet = moving[0].rule.prefix_lengths(&self.schema);
            for e in &moving[1..] {
                let t = e.rule.prefix_lengths(&self.schema);
                for d in 0..n {
                    meet[d] = meet[d].min(t[d]);
                }
            }
            if w.has_table_of(&meet) {
                continue;
            }
            let table = self.build_table(meet, slots_for(moving.len()), &moving, false);
            if !is_short(&table, self.collision_limit, guard) {
                continue;
            }
            for (id, rest) in staying {
                let state = w.tables.get_mut(&id).expect("a tied table");
                state.priorities.remove(&best);
                state.rules = rest.len();
                if rest.is_empty() {
                    w.tables.remove(&id);
                } else {
                    let tuple = state.table.tuple;
                    let slots = slots_for(rest.len());
                    state.table = Arc::new(self.build_table(tuple, slots, &rest, false));
                }
            }
            let id = w.new_table(table);
            let state = w.tables.get_mut(&id).expect("the new table");
            state.priorities.insert(best, moving.len());
            state.rules = moving.len();
            w.place(&moving, id);
            return true;
        }
        false
    }

    /// Moves `moving` (rules of table `from` that fit table `into`) into
    /// `into`, `from` keeping `staying` (the rest of its rules): both
    /// tables rebuilt unpublished (`from` dropped if emptied), the books
    /// updated; the caller publishes.
    fn move_rules(
        &self,
        w: &mut Writer,
        (from, staying): (u64, Vec<Arc<Entry>>),
        (into, moving): (u64, &[Arc<Entry>]),
        guard: &Guard,
    ) {
        let source = w.tables.get_mut(&from).expect("the source");
        for e in moving {
            count(&mut source.priorities, e.rule.priority, false);
        }
        source.rules -= moving.len();
        if staying.is_empty() {
            w.tables.remove(&from);
        } else {
            let tuple = source.table.tuple;
            let slots = slots_for(staying.len());
            source.table = Arc::new(self.build_table(tuple, slots, &staying, false));
        }
        let lone = w.tables.len() == 1;
        let target = w.tables.get_mut(&into).expect("the target");
        let slots = merged_slots(moving.len(), target);
        target.table = self.rebuilt(&target.table, slots, moving, lone, guard);
        for e in moving {
            count(&mut target.priorities, e.rule.priority, true);
        }
        target.rules += moving.len();
        w.place(moving, into);
    }

    /// Panics unless the writer's books agree with the tables: each
    /// table's rule count and priorities with its chains, each rule in
    /// the bucket it hashes to, of the table `placed` names, once; the
    /// published order that of the tables' best priorities; the rule
    /// order, if built, every held rule once, in order. The tests
    /// call it after every change, so a broken split fails there, not
    /// later as a wrong answer or a runaway table.
    #[cfg(test)]
    pub(crate) fn check_structure(&self) {
        if let Some(index) = &self.index {
            index.check_structure(self.len());
            return;
        }
        let w = self.writer.lock();
        let guard = &pin();
        let mut total = 0;
        for (&id, state) in &w.tables {
            let mut priorities = BTreeMap::new();
            let mut rules = 0;
            for (i, slot) in state.table.slots.iter().enumerate() {
                for e in chain_entries(slot, guard) {
                    assert_eq!(
                        state.table.slot_index(&lows(&e.rule)),
                        i,
                        "a rule in another bucket"
                    );
                    assert!(fits(
                        &e.rule.prefix_lengths(&self.schema),
                        &state.table.tuple
                    ));
                    assert_eq!(
                        w.placed.get(&e.rule),
                        Some(&id),
                        "a rule its table does not own"
                    );
                    count(&mut priorities, e.rule.priority, true);
                    rules += 1;
                }
            }
            assert!(rules > 0, "an empty table kept");
            assert_eq!(
                (rules, &priorities),
                (state.rules, &state.priorities),
                "a table's books"
            );
            total += rules;
        }
        assert_eq!(
            (total, w.placed.len()),
            (self.len(), self.len()),
            "rules counted"
        );
        // Rules taken out and remembered: only while the bounds hold,
        // none held, no more than the cap.
        assert!(
            w.exits || w.gone.is_empty(),
            "rules remembered for void bounds"
        );
        assert!(
            w.gone.len() <= gone_most(w.placed.len()),
            "too many remembered"
        );
        for e in w.gone.entries() {
            assert!(
                !w.placed.contains_key(&e.rule),
                "a rule remembered and held"
            );
        }
        if let Some(order) = &w.rule_order {
            let mut held: Vec<&Rule> = w.placed.keys().map(|p| &p.0.rule).collect();
            held.sort_unstable();
            let (mut walked, mut at) = (Vec::new(), None);
            while let Some(r) = order.next(at, |r| w.placed.contains_key(r)) {
                walked.push(r);
                at = Some(r);
            }
            assert_eq!(walked, held, "the rule order");
        }
        let mut order: Vec<(u32, u64)> = w.tables.iter().map(|(&id, s)| (s.best(), id)).collect();
        order.sort_unstable();
        let published: Vec<(u64, Tuple)> = order
            .iter()
            .map(|&(_, id)| (id, w.tables[&id].table.tuple))
            .collect();
        assert_eq!(published, w.order);
        // SAFETY: under the guard.
        let view = unsafe { self.view.load(Ordering::Acquire, guard).deref() };
        assert_eq!(view.tables.len(), w.order.len(), "the published view");
        for ((best, table), (id, _)) in view.tables.iter().zip(&w.order) {
            assert_eq!(*best, w.tables[id].best());
            assert!(
                Arc::ptr_eq(table, &w.tables[id].table),
                "a table not published"
            );
        }
        assert_eq!(view.exits, w.exits, "the published exit bounds");
        self.check_exits(&w, guard);
    }

    /// Panics unless every rule's chains hold its entry's exit bound, and
    /// the bound is no worse than its priority and, while the bounds
    /// hold, no better than any rule that overlaps it and comes before
    /// it.
    /// Every pair of rules: for maps of up to 2,048 rules.
    #[cfg(test)]
    fn check_exits(&self, w: &Writer, guard: &Guard) {
        fn words_hold<W: Word>(chain: &Chain, layout: &Layout, fields: usize) {
            for (words, e) in chain.rules::<W>(layout).zip(chain.entry_refs()) {
                let held = W::of(u128::from(e.exit.load(Ordering::Relaxed)));
                assert!(words[exit_word(fields)] == held, "a chain's exit word");
            }
        }
        let fields = self.schema.fields().len();
        let mut held: Vec<Arc<Entry>> = Vec::new();
        for state in w.tables.values() {
            for slot in state.table.slots.iter() {
                // SAFETY: under the guard.
                let chain = unsafe { slot.load(Ordering::Acquire, guard).as_ref() };
                if let Some(chain) = chain.filter(|_| self.layout.exit) {
                    match state.table.width {
                        Width::W32 => words_hold::<u32>(chain, &self.layout, fields),
                        Width::W64 => words_hold::<u64>(chain, &self.layout, fields),
                        Width::W128 => words_hold::<u128>(chain, &self.layout, fields),
                    }
                }
                held.extend(chain_entries(slot, guard));
            }
        }
        if held.len() > 2048 {
            return;
        }
        for r in &held {
            let exit = r.exit.load(Ordering::Relaxed);
            assert!(exit <= r.rule.priority, "an exit bound past its priority");
            if !w.exits {
                break;
            }
            for q in &held {
                if q.rule < r.rule && super::exits::overlap(&q.rule, &r.rule) {
                    assert!(
                        exit >= q.rule.priority,
                        "{:?}'s exit bound {exit} misses {:?}",
                        r.rule,
                        q.rule
                    );
                }
            }
        }
    }

    /// Publishes the tables in order of their best priority.
    fn publish(&self, w: &mut Writer, guard: &Guard) {
        let mut order: Vec<(u32, u64)> = w.tables.iter().map(|(&id, s)| (s.best(), id)).collect();
        order.sort_unstable();
        w.order = order
            .iter()
            .map(|&(_, id)| (id, w.tables[&id].table.tuple))
            .collect();
        let view = View::new(
            order
                .iter()
                .map(|&(best, id)| (best, Arc::clone(&w.tables[&id].table)))
                .collect(),
            w.exits,
        );
        let old = self.view.swap(Owned::new(view), Ordering::AcqRel, guard);
        // SAFETY: unreachable for new readers; freed after the grace
        // period of those that may hold it.
        unsafe { guard.defer_destroy(old) };
    }
}

impl Writer {
    /// A new rule, `entry`: the exit bounds, which do not count it, no
    /// longer hold, unless it is a rule taken out since they were worked
    /// out. Whether the view needs publishing for it, and the table a
    /// rule put back was in.
    ///
    /// Why a rule put back keeps them: the bounds were worked out over a
    /// set of rules, and while every rule held is of that set, each
    /// rule's bound still counts every held rule that overlaps it and
    /// comes before it (a removal only leaves a bound too high). A rule
    /// taken out and put back (a policy's rule toggled, the suites'
    /// updates) is of the set, with the bound it had then. Any other
    /// rule voids them all until the next load.
    fn exits_after_adding(&mut self, entry: &Entry) -> (bool, Option<u64>) {
        if !self.exits {
            return (false, None);
        }
        if let Some((was, id)) = self.gone.take(&entry.rule) {
            entry
                .exit
                .store(was.exit.load(Ordering::Relaxed), Ordering::Relaxed);
            return (false, Some(id));
        }
        self.exits = false;
        self.forget_gone();
        (true, None)
    }

    /// Records `entry`'s rule as taken out of table `id`, with its bound,
    /// while the bounds hold; past [`gone_most`] of them (a map emptied
    /// rule by rule), the bounds are voided instead. Whether the view
    /// needs publishing for it.
    fn exits_after_taking(&mut self, entry: &Arc<Entry>, id: u64) -> bool {
        if !self.exits {
            return false;
        }
        if self.gone.len() >= gone_most(self.placed.len()) {
            self.exits = false;
            self.forget_gone();
            return true;
        }
        self.gone.insert(Arc::clone(entry), id);
        false
    }

    /// Empties [`gone`](Self::gone) (the bounds were voided or worked out
    /// again), its entries freed off the writer's path.
    fn forget_gone(&mut self) {
        if !self.gone.is_empty() {
            drop_in_background(std::mem::take(&mut self.gone));
        }
    }

    /// Records a new rule, held in table `id` (unless a load records
    /// every rule at its end, [`place_all`](Self::place_all)).
    fn place_new(&mut self, entry: &Arc<Entry>, id: u64) {
        if !self.placing_later {
            self.placed.insert(Placed(Arc::clone(entry)), id);
            self.rule_order_changed(|o| o.add(entry));
        }
    }

    /// Tells the rule order of a change (if there is one), and drops it
    /// once the changes wear it out.
    fn rule_order_changed(&mut self, change: impl FnOnce(&mut RuleOrder)) {
        if let Some(order) = &mut self.rule_order {
            change(order);
            if order.worn() {
                self.rule_order = None;
            }
        }
    }

    /// Records that `moved` rules are now in table `id` (as
    /// [`place_new`](Self::place_new)).
    fn place(&mut self, moved: &[Arc<Entry>], id: u64) {
        if self.placing_later {
            return;
        }
        for e in moved {
            *self.placed.get_mut(&e.rule).expect("a placed rule") = id;
        }
    }

    /// Builds `placed` from the tables, for a load into an empty map
    /// that left it alone: each of the load's searches of it (is the
    /// rule held? then its insert, and one for each rule a split or a
    /// merge moves) compared rules whose bounds sit in boxes scattered
    /// in memory: loads of 100K and 1M Cilium rules took 1.11-1.71x
    /// the time (docs/benchmarks.md, "Loading into an empty map", when
    /// the index was a B-tree).
    // A `Placed` hashes and compares by its entry's rule alone, never by
    // the exit bound the entry's atomic holds.
    #[allow(clippy::mutable_key_type)]
    fn place_all(&mut self, guard: &Guard) {
        let rules = self.tables.values().map(|s| s.rules).sum();
        let mut placed = HashMap::with_capacity_and_hasher(rules, Default::default());
        for (&id, state) in &self.tables {
            for e in table_entries(&state.table, guard) {
                placed.insert(Placed(e), id);
            }
        }
        self.placed = placed;
        self.rule_order = None;
        self.placing_later = false;
    }

    /// Puts `entry` in place of the entry of its rule, held in table `id`.
    fn replace(&mut self, id: u64, entry: Arc<Entry>, guard: &Guard) {
        // The index holds the entry in use, not the one replaced.
        let (Placed(was), _) = self.placed.remove_entry(&entry.rule).expect("a held rule");
        // The same rule: its bound still holds.
        entry
            .exit
            .store(was.exit.load(Ordering::Relaxed), Ordering::Relaxed);
        chain_replace(&self.tables[&id].table, Arc::clone(&entry), guard);
        self.rule_order_changed(|o| o.replace(&entry));
        self.placed.insert(Placed(entry), id);
    }

    /// The first table, in published order, whose tuple a rule fixing
    /// `fixed` bits fits: where [`WildcardMap::add`] puts a new rule, and
    /// so where a remove first looks for one.
    fn first_fit(&self, fixed: &Tuple) -> Option<u64> {
        self.order
            .iter()
            .find(|(id, tuple)| fits(fixed, tuple) && self.tables.contains_key(id))
            .map(|&(id, _)| id)
    }

    /// Whether a table of `tuple` exists.
    fn has_table_of(&self, tuple: &Tuple) -> bool {
        self.tables.values().any(|s| s.table.tuple == *tuple)
    }

    fn new_table(&mut self, table: Table) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.tables.insert(
            id,
            TableState {
                table: Arc::new(table),
                priorities: BTreeMap::new(),
                rules: 0,
            },
        );
        id
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

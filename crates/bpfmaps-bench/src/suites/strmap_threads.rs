//! `strmap-threads`: string-key maps under concurrent writers, on a real
//! key set (kernel symbol names): (a) lookups per second with 1 and 2
//! reader threads while one writer inserts and removes keys without pause;
//! (b) inserts and removes per second with 1 and 2 writers whose keys are
//! split by first byte, so that in bpfmaps' qp-trie they take different
//! subtree locks.
//!
//! Varies: the map, the number of readers and of writers. Holds fixed: the
//! key set (in one random order), which keys the writers churn (a random
//! quarter, the rest never touched), and each writer's churn: a window
//! sliding over its keys, one insert ahead of it and one remove behind it
//! per step, so that half of the churned keys are stored at any time. The
//! maps are built again for each number of threads and timed in turns
//! (one repetition of each at a time, the first rotating); the windows
//! carry on from one repetition to the next.
//!
//! The maps are behind one small trait, [`SharedStrMap`]. bpfmaps' string
//! maps share one API (`new(max_key, value_size, max_entries)`,
//! `get(key, &guard)`, `insert(key, value, flags)`, `remove(key, out)`),
//! so each is one line of [`bpfmaps_string_maps!`] (the qp-trie, and the
//! ternary search tree map with its one global writer lock).

use std::collections::BTreeMap;
use std::ops::{AddAssign, Range};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, RwLock};
use std::time::{Duration, Instant};

use bpfmaps::strmap::{QpTrieMap, TstMap};
use bpfmaps::{BPF_NOEXIST, Error};
use clap::Args;

use crate::measure::{in_turns, settle_reaper, thread_cpu_time};
use crate::plot::LinePlot;
use crate::record::{
    LOOKUPS_PER_CPU_SEC, LOOKUPS_PER_SEC, LOST_READS, MISMATCHES, READ_MISSES, Record,
    WRITES_PER_SEC, case, case_param, find, ratio,
};
use crate::stats::Stats;
use crate::str_tables::{BASELINE, FixedKeyHash, read_u64};
use crate::strings::{DATA_SETS, Keys, Synthetic, hit_order, shuffled};
use crate::suite::{BATCH, Ctx, Suite};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct StrmapThreads;

/// `strmap-threads` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Key set: a data set of `strmap-real` (`kallsyms` falls back to this
    /// machine's `/proc/kallsyms` when the shared file is absent, then to
    /// generated path-like keys).
    #[arg(long, default_value = "kallsyms")]
    set: String,
    /// At most this many keys, the first in file order (0: all).
    #[arg(long, default_value_t = 0)]
    max_keys: usize,
    /// Milliseconds per repetition [quick: 100; full: 1000].
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Inserts and removes per second the writer beside the readers does
    /// (it sleeps between batches to keep to it); 0: as fast as it can.
    /// The runs without readers always go flat out.
    #[arg(long, default_value_t = 0)]
    writer_rate: u64,
}

/// Seed of the key order and the readers' orders.
const SEED: u64 = 0x7468_7264;

/// Writer steps (an insert and a remove each) per stop check.
const WRITER_BATCH: usize = 32;

/// Keys generated when no real set can be read.
const GENERATED_KEYS: usize = 100_000;

/// What readers saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reads {
    /// Lookups that found the key with a value written for it.
    pub found: u64,
    /// Lookups of a churned key that found nothing (allowed).
    pub missing: u64,
    /// Lookups of a key no writer touches that found nothing (must be 0).
    pub lost: u64,
    /// Lookups that found a value not written for that key (must be 0).
    pub bad: u64,
}

impl Reads {
    /// Counts one lookup of key `id` that answered `value`; keys below
    /// `stable` are never churned.
    #[inline(always)]
    pub fn note(&mut self, id: u32, value: Option<u64>, stable: u32) {
        match value {
            Some(v) if v >> 32 == u64::from(id) => self.found += 1,
            Some(_) => self.bad += 1,
            None if id < stable => self.lost += 1,
            None => self.missing += 1,
        }
    }

    /// Lookups done.
    pub fn total(&self) -> u64 {
        self.found + self.missing + self.lost + self.bad
    }
}

impl AddAssign for Reads {
    fn add_assign(&mut self, o: Reads) {
        self.found += o.found;
        self.missing += o.missing;
        self.lost += o.lost;
        self.bad += o.bad;
    }
}

/// Reader probes: keys back to back in one reader's random order, with
/// their ids (`ids[i]` is the id of `keys.key(i)`).
pub struct Probes {
    keys: Keys,
    ids: Vec<u32>,
}

/// A string map that takes inserts and removes through `&self` while
/// other threads look up. Values are `u64`.
pub trait SharedStrMap: Send + Sync + Sized {
    /// Implementation name in records.
    const NAME: &'static str;
    /// Why it cannot hold `keys`, if it cannot (the suite then leaves it
    /// out with a note).
    fn refuses(_keys: &Keys) -> Option<String> {
        None
    }
    /// An empty map for keys of 1 to `max_len` bytes, room for `capacity`.
    fn with_capacity(max_len: usize, capacity: usize) -> Self;
    /// Looks up the probes of `range`, noting each answer in the result
    /// (keys below `stable` are never churned): one batch of a reader.
    fn read_batch(&self, probes: &Probes, range: Range<usize>, stable: u32) -> Reads;
    /// Inserts `key`, which is absent.
    fn insert(&self, key: &[u8], value: u64);
    /// Removes `key`, which is present.
    fn remove(&self, key: &[u8]);
    /// Keys held.
    fn len(&self) -> usize;
}

/// Implements [`SharedStrMap`] for bpfmaps' string maps, which share
/// `QpTrieMap`'s API, and lists them in [`visit_bpfmaps`].
macro_rules! bpfmaps_string_maps {
    ($($ty:ty => $name:literal,)*) => {
        $(
            impl SharedStrMap for $ty {
                const NAME: &'static str = $name;
                fn refuses(keys: &Keys) -> Option<String> {
                    let max = bpfmaps::strmap::MAX_KEY_SIZE;
                    (keys.max_len() > max)
                        .then(|| format!("a key is longer than its {max}-byte limit"))
                }
                fn with_capacity(max_len: usize, capacity: usize) -> Self {
                    let entries = u32::try_from(capacity).expect("entries fit u32");
                    <$ty>::new(max_len, 8, entries).expect("creating the map")
                }
                #[inline]
                fn read_batch(&self, probes: &Probes, range: Range<usize>, stable: u32) -> Reads {
                    let guard = bpfmaps::pin();
                    let mut reads = Reads::default();
                    for i in range {
                        let v = <$ty>::get(self, probes.keys.key(i), &guard).map(read_u64);
                        reads.note(probes.ids[i], v, stable);
                    }
                    reads
                }
                fn insert(&self, key: &[u8], value: u64) {
                    <$ty>::insert(self, key, &value.to_ne_bytes(), BPF_NOEXIST).expect("insert");
                }
                fn remove(&self, key: &[u8]) {
                    <$ty>::remove(self, key, None).expect("remove");
                }
                fn len(&self) -> usize {
                    <$ty>::len(self)
                }
            }
        )*

        /// bpfmaps' string maps, in report order.
        fn visit_bpfmaps(v: &mut impl Visit) {
            $(v.visit::<$ty>();)*
        }
    };
}

// One line per map with `QpTrieMap`'s API.
bpfmaps_string_maps! {
    QpTrieMap => "bpfmaps-qp-trie",
    TstMap => "bpfmaps-tst",
}

/// `std`'s ordered map behind `std`'s reader-writer lock: a read lock per
/// lookup, a write lock per insert or remove.
impl SharedStrMap for RwLock<BTreeMap<Box<[u8]>, u64>> {
    const NAME: &'static str = "rwlock-btreemap";
    fn with_capacity(_max_len: usize, _capacity: usize) -> Self {
        RwLock::new(BTreeMap::new())
    }
    #[inline]
    fn read_batch(&self, probes: &Probes, range: Range<usize>, stable: u32) -> Reads {
        let mut reads = Reads::default();
        for i in range {
            let v = self
                .read()
                .expect("not poisoned")
                .get(probes.keys.key(i))
                .copied();
            reads.note(probes.ids[i], v, stable);
        }
        reads
    }
    fn insert(&self, key: &[u8], value: u64) {
        let old = self
            .write()
            .expect("not poisoned")
            .insert(key.into(), value);
        assert!(old.is_none(), "insert of a stored key");
    }
    fn remove(&self, key: &[u8]) {
        let old = self.write().expect("not poisoned").remove(key);
        assert!(old.is_some(), "remove of an absent key");
    }
    fn len(&self) -> usize {
        self.read().expect("not poisoned").len()
    }
}

/// bpfmaps' hash map with `key_size` the longest key, keys zero-padded,
/// preallocated for twice the keys (so that elements waiting for their
/// grace period never run it out).
impl SharedStrMap for FixedKeyHash {
    const NAME: &'static str = BASELINE;
    fn refuses(keys: &Keys) -> Option<String> {
        <FixedKeyHash as crate::str_tables::StrTable>::refuses(keys)
    }
    fn with_capacity(max_len: usize, capacity: usize) -> Self {
        let entries = u32::try_from(capacity * 2).expect("entries fit u32");
        FixedKeyHash::with_capacity(max_len, entries)
    }
    #[inline]
    fn read_batch(&self, probes: &Probes, range: Range<usize>, stable: u32) -> Reads {
        let mut reads = Reads::default();
        self.get_each(&probes.keys, range, |i, v| {
            reads.note(probes.ids[i], v, stable)
        });
        reads
    }
    fn insert(&self, key: &[u8], value: u64) {
        FixedKeyHash::insert(self, key, value, BPF_NOEXIST).expect("insert");
    }
    fn remove(&self, key: &[u8]) {
        match FixedKeyHash::remove(self, key) {
            Ok(()) => {}
            Err(Error::NotFound) => panic!("remove of an absent key"),
            Err(e) => panic!("remove: {e}"),
        }
    }
    fn len(&self) -> usize {
        crate::str_tables::StrTable::len(self)
    }
}

/// Called once per implementation, in report order.
trait Visit {
    fn visit<M: SharedStrMap + 'static>(&mut self);
}

/// Every map, in report order: bpfmaps' string maps, then the baselines.
fn visit_all(v: &mut impl Visit) {
    visit_bpfmaps(v);
    v.visit::<RwLock<BTreeMap<Box<[u8]>, u64>>>();
    v.visit::<FixedKeyHash>();
}

/// The implementations' names, in report order.
fn names() -> Vec<&'static str> {
    struct Names(Vec<&'static str>);
    impl Visit for Names {
        fn visit<M: SharedStrMap + 'static>(&mut self) {
            self.0.push(M::NAME);
        }
    }
    let mut n = Names(Vec::new());
    visit_all(&mut n);
    n.0
}

/// A writer's churn over one group of keys: `ids` in a fixed random order,
/// of which the `ids.len() / 2` from `cursor` on (wrapping) are stored.
/// A step inserts the one after them and removes the one at `cursor`.
#[derive(Debug, Clone)]
struct Window {
    ids: Vec<u32>,
    cursor: usize,
}

impl Window {
    fn half(&self) -> usize {
        self.ids.len() / 2
    }

    /// The ids stored before the first step.
    fn initial(&self) -> &[u32] {
        &self.ids[..self.half()]
    }

    /// One insert and one remove (none if the group is empty); returns
    /// the operations done. `generation` goes into the value.
    #[inline]
    fn step<M: SharedStrMap>(&mut self, map: &M, keys: &Keys, generation: u32) -> u64 {
        let n = self.ids.len();
        if n == 0 {
            return 0;
        }
        let add = self.ids[(self.cursor + self.half()) % n];
        let del = self.ids[self.cursor];
        map.insert(keys.key(add as usize), value(add, generation));
        map.remove(keys.key(del as usize));
        self.cursor = (self.cursor + 1) % n;
        2
    }
}

/// The value written for key `id`: its id in the high half, so a reader
/// can tell a value written for another key.
fn value(id: u32, generation: u32) -> u64 {
    u64::from(id) << 32 | u64::from(generation)
}

/// The key set and how it is split among readers and writers.
struct Layout {
    keys: Keys,
    /// Keys `0..stable` are never churned.
    stable: u32,
    /// The churned keys in two groups by first byte.
    groups: [Window; 2],
    /// One probe order per reader thread (at most 2).
    probes: Vec<Probes>,
    /// Writes per second beside readers (0: flat out).
    writer_rate: u64,
}

impl Layout {
    fn new(keys: Keys, readers: usize) -> Layout {
        let n = keys.len();
        let stable = (n - n / 4) as u32;
        // Split the churned keys by first byte into two groups of about
        // equal size: bytes by descending count, each to the smaller group.
        let mut count = [0usize; 256];
        for id in stable..n as u32 {
            count[keys.key(id as usize)[0] as usize] += 1;
        }
        let mut bytes: Vec<usize> = (0..256).filter(|&b| count[b] > 0).collect();
        bytes.sort_by_key(|&b| (std::cmp::Reverse(count[b]), b));
        let mut group_of = [0u8; 256];
        let mut sizes = [0usize; 2];
        for b in bytes {
            let g = usize::from(sizes[1] < sizes[0]);
            group_of[b] = g as u8;
            sizes[g] += count[b];
        }
        let groups = [0u8, 1].map(|g| Window {
            ids: (stable..n as u32)
                .filter(|&id| group_of[keys.key(id as usize)[0] as usize] == g)
                .collect(),
            cursor: 0,
        });
        let probes = (0..readers as u64)
            .map(|r| {
                let ids = hit_order(&keys, SEED + 1 + r);
                Probes {
                    keys: keys.permuted(&ids),
                    ids,
                }
            })
            .collect();
        Layout {
            keys,
            stable,
            groups,
            probes,
            writer_rate: 0,
        }
    }

    /// Keys stored at every moment between writer steps.
    fn stored(&self) -> usize {
        self.stable as usize + self.groups.iter().map(Window::half).sum::<usize>()
    }

    /// A map holding the stable keys and each window's initial half.
    fn build<M: SharedStrMap>(&self) -> M {
        let map = M::with_capacity(self.keys.max_len(), self.keys.len());
        let initial = self.groups.iter().flat_map(|w| w.initial().iter().copied());
        for id in (0..self.stable).chain(initial) {
            map.insert(self.keys.key(id as usize), value(id, 0));
        }
        map
    }
}

/// One timed repetition.
#[derive(Debug, Clone, Copy, Default)]
struct Once {
    lookups_per_sec: f64,
    lookups_per_cpu_sec: f64,
    writes_per_sec: f64,
    reads: Reads,
}

/// Runs `readers` reader threads and one writer per window chunk of
/// `windows` against `map` for `duration`.
fn run_once<M: SharedStrMap>(
    map: &M,
    layout: &Layout,
    windows: &mut [Window],
    readers: usize,
    writers: usize,
    duration: Duration,
) -> Once {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(readers + writers + 1);
    let (keys, stable) = (&layout.keys, layout.stable);
    // Each writer's share of the rate, as seconds per operation.
    let pace =
        (readers > 0 && layout.writer_rate > 0).then(|| writers as f64 / layout.writer_rate as f64);
    std::thread::scope(|s| {
        let reader_threads: Vec<_> = layout.probes[..readers]
            .iter()
            .map(|probes| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let n = probes.ids.len();
                    let (mut reads, mut pos) = (Reads::default(), 0);
                    barrier.wait();
                    let (start, cpu) = (Instant::now(), thread_cpu_time());
                    while !stop.load(Ordering::Relaxed) {
                        let end = (pos + BATCH).min(n);
                        reads += map.read_batch(probes, pos..end, stable);
                        pos = if end == n { 0 } else { end };
                    }
                    (reads, start.elapsed(), thread_cpu_time() - cpu)
                })
            })
            .collect();
        let per_writer = windows.len().div_ceil(writers);
        let writer_threads: Vec<_> = windows
            .chunks_mut(per_writer)
            .map(|mine| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let mut generation = 0u32;
                    let mut ops = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..WRITER_BATCH {
                            generation = generation.wrapping_add(1);
                            for w in mine.iter_mut() {
                                ops += w.step(map, keys, generation);
                            }
                        }
                        if let Some(pace) = pace {
                            let due = start + Duration::from_secs_f64(ops as f64 * pace);
                            std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        }
                    }
                    ops as f64 / start.elapsed().as_secs_f64()
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let mut once = Once::default();
        for t in writer_threads {
            once.writes_per_sec += t.join().expect("writer thread");
        }
        for t in reader_threads {
            let (reads, elapsed, cpu) = t.join().expect("reader thread");
            once.lookups_per_sec += reads.total() as f64 / elapsed.as_secs_f64();
            once.lookups_per_cpu_sec += reads.total() as f64 / cpu.as_secs_f64().max(1e-9);
            once.reads += reads;
        }
        once
    })
}

/// A map under test: built, with its own windows, behind one type.
trait Running {
    fn name(&self) -> &'static str;
    fn run(&mut self, layout: &Layout, readers: usize, writers: usize, d: Duration) -> Once;
    fn len(&self) -> usize;
}

struct Kept<M> {
    map: M,
    windows: Vec<Window>,
}

impl<M: SharedStrMap> Running for Kept<M> {
    fn name(&self) -> &'static str {
        M::NAME
    }
    fn run(&mut self, layout: &Layout, readers: usize, writers: usize, d: Duration) -> Once {
        run_once(&self.map, layout, &mut self.windows, readers, writers, d)
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Builds every map for `layout` that takes its keys, in report order;
/// one that refuses them is left out with a note.
fn build_all<'a>(ctx: &Ctx, layout: &'a Layout) -> Vec<Box<dyn Running + 'a>> {
    struct Build<'a, 'c>(&'c Ctx, &'a Layout, Vec<Box<dyn Running + 'a>>);
    impl<'a> Visit for Build<'a, '_> {
        fn visit<M: SharedStrMap + 'static>(&mut self) {
            if let Some(why) = M::refuses(&self.1.keys) {
                let s = self.0.suite();
                self.0.note(&format!("{s}: {} left out: {why}", M::NAME));
                return;
            }
            let kept = Kept {
                map: self.1.build::<M>(),
                windows: self.1.groups.to_vec(),
            };
            self.2.push(Box::new(kept));
        }
    }
    let mut b = Build(ctx, layout, Vec::new());
    visit_all(&mut b);
    b.2
}

/// Measures one thread configuration: every map built afresh, then timed
/// in turns.
fn measure(
    ctx: &Ctx,
    layout: &Layout,
    readers: usize,
    writers: usize,
    duration: Duration,
    base: &str,
) -> Vec<Record> {
    let c = format!("readers={readers},writers={writers},{base}");
    let mut maps = build_all(ctx, layout);
    settle_reaper();
    let n = maps.len();
    let mut onces: Vec<Vec<Once>> = vec![Vec::new(); n];
    in_turns(n, ctx.reps(), |i| {
        let once = maps[i].run(layout, readers, writers, duration);
        assert_eq!(
            maps[i].len(),
            layout.stored(),
            "{}: keys lost",
            maps[i].name()
        );
        onces[i].push(once);
        ctx.step();
        0.0
    });
    let s = ctx.suite();
    let mut recs = Vec::new();
    for (m, onces) in maps.iter().zip(onces) {
        let name = m.name();
        let stats =
            |f: fn(&Once) -> f64| Stats::from_samples(&onces.iter().map(f).collect::<Vec<_>>());
        if readers > 0 {
            let mut reads = Reads::default();
            for o in &onces {
                reads += o.reads;
            }
            recs.extend([
                Record::stats(s, &c, name, &LOOKUPS_PER_SEC, stats(|o| o.lookups_per_sec)),
                Record::stats(
                    s,
                    &c,
                    name,
                    &LOOKUPS_PER_CPU_SEC,
                    stats(|o| o.lookups_per_cpu_sec),
                ),
            ]);
            recs.push(Record::stats(
                s,
                &c,
                name,
                &WRITES_PER_SEC,
                stats(|o| o.writes_per_sec),
            ));
            recs.extend([
                Record::single(s, &c, name, &MISMATCHES, reads.bad as f64),
                Record::single(s, &c, name, &LOST_READS, reads.lost as f64),
                Record::single(s, &c, name, &READ_MISSES, reads.missing as f64),
            ]);
            for (what, count) in [
                ("values of another key", reads.bad),
                ("lost keys", reads.lost),
            ] {
                if count > 0 {
                    ctx.note(&format!("WARNING: {name} readers saw {count} {what} ({c})"));
                }
            }
        } else {
            recs.push(Record::stats(
                s,
                &c,
                name,
                &WRITES_PER_SEC,
                stats(|o| o.writes_per_sec),
            ));
        }
    }
    drop(maps);
    settle_reaper();
    recs
}

/// The thread configurations: (readers, writers).
const CONFIGS: [(usize, usize); 4] = [(1, 1), (2, 1), (0, 1), (0, 2)];

/// The key set named `name`, with the fallbacks of `--set kallsyms`.
fn load_keys(ctx: &Ctx, name: &str) -> (String, Vec<Vec<u8>>) {
    let mut tries = vec![name];
    if name == "kallsyms" {
        tries.push("machine-kallsyms");
    }
    for t in tries {
        match DATA_SETS.iter().find(|d| d.name == t) {
            Some(d) => match d.load(ctx.data_dir()) {
                Ok(keys) => return (t.to_string(), keys),
                Err(why) => ctx.note(&format!("{}: cannot read {t}: {why}", ctx.suite())),
            },
            None => ctx.note(&format!("{}: no data set {t:?}", ctx.suite())),
        }
    }
    let set = Synthetic::ALL[0];
    ctx.note(&format!(
        "{}: using {GENERATED_KEYS} generated {} keys",
        ctx.suite(),
        set.name()
    ));
    let keys = set.generate(GENERATED_KEYS, SEED);
    (set.name(), keys.iter().map(<[u8]>::to_vec).collect())
}

impl Suite for StrmapThreads {
    type Opts = Opts;
    const NAME: &'static str = "strmap-threads";
    const ABOUT: &'static str = "string-key maps under concurrent writers: lookups/s with 1-2 readers beside a writer, inserts+removes/s with 1-2 writers in disjoint first-byte subtrees";

    const DESCRIBE: &'static str = "Kernel symbol names: `strings/kallsyms.txt.gz` \
         from the data directory, or this machine's `/proc/kallsyms` names when \
         it is absent (`--set` picks another set of `strmap-real`), in one \
         random order, 8-byte values. A random quarter of the keys is churned, \
         the rest is never touched. The churned keys are split by first byte \
         into two groups of about equal size (no first byte in both), and a \
         writer churns a group as a window sliding over its keys in a fixed \
         random order: each step inserts the key after the window and removes \
         its first, so half of each group is stored at any time and every \
         insert and remove succeeds. (a) `readers=1` and `readers=2`: one \
         writer steps both groups in turn while each reader looks up every \
         key (churned or not) in its own random order, in batches of 256 (one \
         epoch pin per batch for bpfmaps; one read lock per lookup for \
         `rwlock-btreemap`); a reader checks each value was written for its \
         key (`mismatches`) and that a key no writer touches is always found \
         (`lost_reads`), both must be 0; `read_misses` are churned keys found \
         absent, as expected. `lookups_per_sec` sums the readers; \
         `lookups_per_cpu_sec` divides by their own CPU time. On a 2-core \
         machine 2 readers and a writer are 3 busy threads, more than the \
         cores: the scheduler shares them, so the 2-reader figure and its \
         ratio to 1 reader are bounded by the cores, not by the map alone \
         (the per-CPU-second figure is not). (b) `readers=0`: `writers=1` \
         steps both groups, `writers=2` one group each, so that in \
         `bpfmaps-qp-trie` the two writers never take the same subtree lock; \
         `rwlock-btreemap` has one lock for both; the hash map locks per \
         bucket. `writes_per_sec` counts inserts and removes over all \
         writers. The maps are built again for each thread configuration, \
         then take turns, one repetition each at a time, the first rotating; \
         the median and spread are over repetitions. `bpfmaps-hash` has \
         `key_size` the longest key, keys zero-padded, and room for twice \
         the keys. bpfmaps' string maps share one API, so the ternary search \
         tree map joins with one line (`bpfmaps_string_maps!`).";

    const BASELINE: &'static str = BASELINE;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let duration =
            Duration::from_millis(
                opts.duration_ms
                    .unwrap_or(if ctx.quick() { 100 } else { 1000 }),
            );
        let (set, mut keys) = load_keys(ctx, &opts.set);
        if opts.max_keys > 0 {
            keys.truncate(opts.max_keys);
        }
        let keys = shuffled(keys, SEED);
        let readers_max = CONFIGS.iter().map(|c| c.0).max().unwrap_or(0);
        let mut layout = Layout::new(keys, readers_max);
        layout.writer_rate = opts.writer_rate;
        let base = if opts.writer_rate > 0 {
            case(&[
                ("set", &set),
                ("n", &layout.keys.len()),
                ("writer_rate", &opts.writer_rate),
            ])
        } else {
            case(&[("set", &set), ("n", &layout.keys.len())])
        };
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        ctx.note(&format!(
            "{}: {base}: {} keys never churned, {} and {} churned by first byte (half \
             of each stored at any time); {cores} cores: 2 readers and a writer are \
             3 busy threads{}",
            ctx.suite(),
            layout.stable,
            layout.groups[0].ids.len(),
            layout.groups[1].ids.len(),
            if cores < 3 {
                ", more than the cores (oversubscribed)"
            } else {
                ""
            }
        ));
        ctx.set_steps((CONFIGS.len() * names().len() * ctx.reps()) as u64);
        let mut all = Vec::new();
        for (readers, writers) in CONFIGS {
            let recs = measure(ctx, &layout, readers, writers, duration, &base);
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let Some(base) = base_of(records) else {
            return Vec::new();
        };
        let at =
            |readers: usize, writers: usize| format!("readers={readers},writers={writers},{base}");
        let get = |c: &str, imp: &str, m: &str| find(records, c, imp, m);
        let mut reads = Table::new(
            format!("strmap-threads: lookups beside one writer ({base})"),
            &[
                "impl",
                "1 reader M/s",
                "2 readers M/s",
                "2 / 1",
                "1 reader M/CPU-s",
                "2 readers M/CPU-s",
                "2 / 1 per CPU-s",
                "writer M/s (1 reader)",
                "writer M/s (2 readers)",
                "mismatches, lost",
            ],
        )
        .with_note(
            "Medians. Lookups summed over readers; M/CPU-s divides by the readers' own \
             CPU time. 2 readers and the writer are 3 busy threads: on a 2-core machine \
             they are oversubscribed, which bounds the 2 / 1 ratio of lookups/s. \
             Mismatches and lost reads must be 0.",
        );
        let mut writes = Table::new(
            format!("strmap-threads: inserts and removes, writers in disjoint first-byte subtrees ({base})"),
            &["impl", "1 writer M/s", "2 writers M/s", "2 / 1"],
        )
        .with_note("Medians, summed over writers; no readers.");
        let (r1, r2, w1, w2) = (at(1, 1), at(2, 1), at(0, 1), at(0, 2));
        for imp in names() {
            let v = |c: &str, m: &str| fmt_mops(get(c, imp, m).map(|r| r.value));
            let vs = |a: &str, b: &str, m: &str| fmt_ratio(ratio(get(a, imp, m), get(b, imp, m)));
            let count = |m: &str| {
                [r1.as_str(), r2.as_str()]
                    .iter()
                    .filter_map(|c| get(c, imp, m))
                    .map(|r| r.value)
                    .sum::<f64>()
            };
            if get(&r1, imp, LOOKUPS_PER_SEC.name).is_some() {
                reads.push(vec![
                    imp.to_string(),
                    v(&r1, LOOKUPS_PER_SEC.name),
                    v(&r2, LOOKUPS_PER_SEC.name),
                    vs(&r2, &r1, LOOKUPS_PER_SEC.name),
                    v(&r1, LOOKUPS_PER_CPU_SEC.name),
                    v(&r2, LOOKUPS_PER_CPU_SEC.name),
                    vs(&r2, &r1, LOOKUPS_PER_CPU_SEC.name),
                    v(&r1, WRITES_PER_SEC.name),
                    v(&r2, WRITES_PER_SEC.name),
                    format!(
                        "{:.0}, {:.0}",
                        count(MISMATCHES.name),
                        count(LOST_READS.name)
                    ),
                ]);
            }
            if get(&w1, imp, WRITES_PER_SEC.name).is_some() {
                writes.push(vec![
                    imp.to_string(),
                    v(&w1, WRITES_PER_SEC.name),
                    v(&w2, WRITES_PER_SEC.name),
                    vs(&w2, &w1, WRITES_PER_SEC.name),
                ]);
            }
        }
        vec![reads, writes]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut reads = LinePlot::new(
            "strmap-threads-readers",
            "Lookups/s (all readers) beside one writer, by reader threads",
            "reader threads",
            "million lookups per second",
        );
        let mut writes = LinePlot::new(
            "strmap-threads-writers",
            "Inserts + removes/s, writers in disjoint first-byte subtrees",
            "writer threads",
            "million operations per second",
        );
        for imp in names() {
            let points = |metric: &str, x: &str, other: (&str, &str)| -> Vec<(f64, f64)> {
                records
                    .iter()
                    .filter(|r| r.impl_name == imp && r.metric == metric)
                    .filter(|r| r.param(other.0) == Some(other.1))
                    .filter_map(|r| Some((r.param(x)?.parse().ok()?, r.value / 1e6)))
                    .collect()
            };
            reads.add(
                imp,
                points(LOOKUPS_PER_SEC.name, "readers", ("writers", "1")),
            );
            writes.add(
                imp,
                points(WRITES_PER_SEC.name, "writers", ("readers", "0")),
            );
        }
        let mut plots = vec![reads, writes];
        plots.retain(|p| !p.is_empty());
        plots
    }
}

/// The key set's part of the cases (`set=...,n=...`).
fn base_of(records: &[Record]) -> Option<String> {
    let r = records.first()?;
    let (set, n) = (case_param(&r.case, "set")?, case_param(&r.case, "n")?);
    Some(match case_param(&r.case, "writer_rate") {
        Some(rate) => case(&[("set", &set), ("n", &n), ("writer_rate", &rate)]),
        None => case(&[("set", &set), ("n", &n)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suites::by_name;

    /// `--writer-rate`: the writer beside readers keeps under its rate
    /// (it only ever sleeps, so at most one batch ahead of the schedule),
    /// and the cases say the rate.
    #[test]
    fn a_paced_writer_keeps_to_its_rate() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let args = [
            "--set",
            "none",
            "--max-keys",
            "3000",
            "--duration-ms",
            "50",
            "--writer-rate",
            "20000",
        ];
        let records = crate::suites::run_quick("strmap-threads", &args, no_data);
        let writes: Vec<_> = records
            .iter()
            .filter(|r| r.metric == WRITES_PER_SEC.name)
            .collect();
        assert!(!writes.is_empty());
        for r in writes {
            assert_eq!(r.param("writer_rate"), Some("20000"), "{}", r.case);
            // One batch (64 operations) ahead over 50 ms is 1,280/s.
            if r.param("readers") != Some("0") {
                assert!(
                    r.value <= 21_300.0,
                    "{} {}: {} writes/s",
                    r.case,
                    r.impl_name,
                    r.value
                );
            }
        }
    }

    /// Runs quick on a few thousand generated keys (no data directory and,
    /// with `--set`, no machine set): every map keeps its keys, readers see
    /// no wrong value and no lost key, and the tables have every map's row.
    #[test]
    fn runs_on_generated_keys() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let args = ["--set", "none", "--max-keys", "3000", "--duration-ms", "20"];
        let records = crate::suites::run_quick("strmap-threads", &args, no_data);
        for r in &records {
            assert!(crate::record::metric(&r.metric).is_some(), "{}", r.metric);
            if [MISMATCHES.name, LOST_READS.name].contains(&r.metric.as_str()) {
                assert_eq!(r.value, 0.0, "{} {} {}", r.metric, r.case, r.impl_name);
            }
        }
        let names = names();
        assert_eq!(
            names,
            [
                "bpfmaps-qp-trie",
                "bpfmaps-tst",
                "rwlock-btreemap",
                "bpfmaps-hash"
            ]
        );
        let lookups = records.iter().filter(|r| r.metric == LOOKUPS_PER_SEC.name);
        assert_eq!(lookups.count(), 2 * names.len());
        let writes = records.iter().filter(|r| r.metric == WRITES_PER_SEC.name);
        assert_eq!(writes.count(), 4 * names.len());
        assert!(records.iter().all(|r| r.param("n") == Some("3000")));
        let suite = by_name("strmap-threads").unwrap();
        let tables = suite.summaries(&records);
        assert_eq!(tables.len(), 2);
        assert!(tables.iter().all(|t| t.rows.len() == names.len()));
        assert_eq!(suite.plots(&records).len(), 2);
    }

    /// The two groups take disjoint first bytes, about half each, and the
    /// windows keep what they store.
    #[test]
    fn layout_splits_by_first_byte() {
        let keys = Synthetic::ALL[2].generate(4000, 1);
        let layout = Layout::new(keys, 1);
        let first = |w: &Window| -> std::collections::HashSet<u8> {
            w.ids
                .iter()
                .map(|&id| layout.keys.key(id as usize)[0])
                .collect()
        };
        let (a, b) = (first(&layout.groups[0]), first(&layout.groups[1]));
        assert!(a.is_disjoint(&b));
        let (na, nb) = (layout.groups[0].ids.len(), layout.groups[1].ids.len());
        assert_eq!(na + nb, 1000);
        assert!(na.abs_diff(nb) < 100, "{na} {nb}");
        let nul = Keys::new([&b"a\0"[..], b"a"]);
        assert!(<FixedKeyHash as SharedStrMap>::refuses(&nul).is_some());
        assert!(<QpTrieMap as SharedStrMap>::refuses(&nul).is_none());
        let map: QpTrieMap = layout.build();
        assert_eq!(map.len(), layout.stored());
        let mut w = layout.groups[0].clone();
        for g in 0..3 * na as u32 {
            w.step(&map, &layout.keys, g);
            assert_eq!(map.len(), layout.stored());
        }
    }
}

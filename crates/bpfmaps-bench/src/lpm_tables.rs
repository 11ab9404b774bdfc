//! The LPM implementations the suites compare, behind one trait (with its
//! object-safe views: [`SharedLpm`] for writers beside readers, [`AnyLpm`]
//! to keep several built tables side by side), the one list every LPM
//! suite iterates ([`each_lpm`], [`lpm_names`]), and the shared
//! building, verification and lookup-timing helpers.
//!
//! | name | type | lookup |
//! |---|---|---|
//! | `kernel` | `bpfmaps::lpm::KernelLpmTrie` (port of `lpm_trie.c`) | `lookup_data(addr, &guard)` |
//! | `bpfmaps` | `bpfmaps::lpm::LpmTrie` | `get_as::<u32>(addr, &guard)` |
//! | `bpfmaps-get` (`lpm-real`) | the same | `get(addr, &guard)` (bytes) |
//! | `bpfmaps-get_many_as` (`lpm-real`) | the same | `get_many_as::<u32>(addrs, &guard, out)` |
//! | `prefix-trie` | `prefix_trie::PrefixMap<Ipv4Net/Ipv6Net, u32>` | `get_lpm(&addr/32)` |
//! | `ip_network_table` | `ip_network_table::IpNetworkTable<u32>` | `longest_match_ipv4/6(addr)` |
//!
//! Values are `u32` (4 bytes) everywhere. bpfmaps and the kernel port pin
//! one guard per batch of lookups ([`BATCH`]), as a BPF program runs its
//! lookups under one RCU read section. A batch sums the values it finds
//! (a miss adds 0; stored values are never 0), which is both what keeps
//! the loop from being optimised away and the checksum that shows the
//! implementations agree.

use std::hint::black_box;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use bpfmaps::lpm::{KernelLpmTrie, LpmTrie};
use bpfmaps::{BPF_ANY, Error, Guard, Map};
use ip_network_table::IpNetworkTable;
use prefix_trie::PrefixMap;

use crate::alloc::MemProbe;
use crate::measure::{Plan, rate_samples};
use crate::prefixes::{Family, Prefix, V4};
use crate::suite::Ctx;

pub use crate::suite::BATCH;

/// `max_entries` of the bpfmaps and kernel tries: room for any table here.
pub const MAX_ENTRIES: u32 = 1 << 24;

/// A longest-prefix-match table with `u32` values.
pub trait LpmTable<F: Family>: Sized {
    /// Implementation name in records.
    const NAME: &'static str;
    /// An empty table.
    fn empty() -> Self;
    /// A table of `prefixes`, prefix `i` with [`value_of`]`(i)`: inserted
    /// one by one unless the table loads in bulk.
    fn load(prefixes: &[Prefix<F>]) -> Self {
        insert_each(Self::empty(), prefixes)
    }
    /// Inserts or replaces (`BPF_ANY`).
    fn insert(&mut self, p: &Prefix<F>, value: u32);
    /// Removes the exact prefix; false if it was not stored.
    fn remove(&mut self, p: &Prefix<F>) -> bool;
    /// The value of the longest stored prefix containing `a`.
    fn get(&self, a: &F::Addr) -> Option<u32>;
    /// Sum of the values found for `addrs` (0 per miss): one batch of a
    /// lookup loop.
    fn sum_batch(&self, addrs: &[F::Addr]) -> u64 {
        let mut acc = 0u64;
        for a in addrs {
            if let Some(v) = self.get(black_box(a)) {
                acc += u64::from(v);
            }
        }
        acc
    }
    /// Calls `f` with the answer for each address in turn; bpfmaps and
    /// the kernel port hold one guard for the whole batch.
    fn visit_batch(&self, addrs: &[F::Addr], mut f: impl FnMut(Option<u32>)) {
        for a in addrs {
            f(self.get(black_box(a)));
        }
    }
    /// Stored prefixes.
    fn count(&self) -> usize;
    /// The table's own account of its memory, if it keeps one.
    fn reported(&self) -> Option<usize> {
        None
    }
    /// The bytes it uses of those, if it tells them apart.
    fn live(&self) -> Option<usize> {
        None
    }
    /// Writers through `&self` while readers read, if it takes them.
    fn shared(&self) -> Option<&dyn SharedLpm<F>> {
        None
    }
    /// The table's own walks over every prefix (`lpm-real`).
    fn walks(&self) -> Vec<Walk<'_>> {
        Vec::new()
    }
}

/// One way to walk every prefix of a table: `run` walks the whole table
/// once and returns how many prefixes it saw and a digest of them (of
/// their order too for `get_next_key`, so walks can be compared).
pub struct Walk<'a> {
    /// The API walked: `get_next_key` (the byte contract, from no key to
    /// `ENOENT`, as `bpftool map dump` does), `for_each` or `iter`.
    pub api: &'static str,
    /// One whole walk: (prefixes seen, digest).
    pub run: Box<dyn FnMut() -> (u64, u64) + 'a>,
}

impl<'a> Walk<'a> {
    /// A walk through `api`.
    pub fn new(api: &'static str, run: impl FnMut() -> (u64, u64) + 'a) -> Self {
        Walk {
            api,
            run: Box::new(run),
        }
    }
}

/// Walks every key of `map` through the byte contract: `get_next_key`
/// from no key, then from each key it returned, until `ENOENT`. Returns
/// the keys seen and a digest of them in order.
pub fn contract_walk(map: &impl Map) -> (u64, u64) {
    let key_size = map.info().key_size as usize;
    let mut keys = [vec![0u8; key_size], vec![0u8; key_size]];
    let (mut count, mut digest) = (0u64, 0u64);
    loop {
        let [prev, next] = &mut keys;
        let key = (count > 0).then_some(&prev[..]);
        match map.get_next_key(key, next) {
            Ok(_) => {}
            Err(Error::NotFound) => return (count, digest),
            Err(e) => panic!("get_next_key: {e}"),
        }
        digest = fold_digest(digest, next);
        count += 1;
        keys.swap(0, 1);
    }
}

/// Adds `bytes` to an order-sensitive digest.
#[inline]
pub fn fold_digest(digest: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(digest, |d, &b| {
        (d ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `table` with `prefixes` inserted one by one, prefix `i` with
/// [`value_of`]`(i)`.
fn insert_each<F: Family, T: LpmTable<F>>(mut table: T, prefixes: &[Prefix<F>]) -> T {
    for (i, p) in prefixes.iter().enumerate() {
        table.insert(p, value_of(i));
    }
    table
}

/// What an implementation is to the suites, which take some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The kernel port: the baseline and the reference for answers.
    Kernel,
    /// bpfmaps' `LpmTrie` through its fastest single lookup (`get_as`).
    Bpfmaps,
    /// bpfmaps' `LpmTrie` through another of its lookup APIs (`lpm-real`).
    Api,
    /// A userspace peer (skipped by `--no-peers`).
    Peer,
}

/// What a suite does with one implementation, generic over its type so
/// that the suite's timed loops are monomorphic: given the kernel port's
/// answers (`None` for the kernel port itself), returns its output and its
/// own answers.
pub trait LpmStep<F: Family> {
    /// What the step gives per implementation (records, a kept table).
    type Out;
    /// The answers implementations are checked against.
    type Reference;
    /// Runs the step on `T`.
    fn step<T: LpmTable<F> + Sync + 'static>(
        &self,
        reference: Option<&Self::Reference>,
    ) -> (Self::Out, Self::Reference);
}

/// Called once per implementation of the list, in report order.
trait Visit<F: Family> {
    fn visit<T: LpmTable<F> + Sync + 'static>(&mut self, role: Role);
}

/// Every LPM implementation, in report order (the kernel port first: the
/// baseline, and the reference for answers): the one list every LPM suite
/// iterates. Adding a peer is an impl of [`LpmTable`] and one line here.
fn visit_all<F: Family>(v: &mut impl Visit<F>) {
    v.visit::<KernelLpmTrie>(Role::Kernel);
    v.visit::<LpmTrie>(Role::Bpfmaps);
    v.visit::<ValueLpm>(Role::Api);
    v.visit::<ManyLpm>(Role::Api);
    v.visit::<BulkLpm>(Role::Api);
    v.visit::<PrefixTrie<F>>(Role::Peer);
    v.visit::<IpNetworkTable<u32>>(Role::Peer);
}

/// Runs `step` on every implementation playing one of `roles`, in report
/// order. Without a `reference`, the first (the kernel port, which
/// `roles` must then include) gives it.
pub fn each_lpm<F: Family, S: LpmStep<F>>(
    step: &S,
    roles: &[Role],
    reference: Option<S::Reference>,
) -> Vec<S::Out> {
    struct Each<'a, S: LpmStep<F>, F: Family> {
        step: &'a S,
        roles: &'a [Role],
        reference: Option<S::Reference>,
        out: Vec<S::Out>,
    }
    impl<S: LpmStep<F>, F: Family> Visit<F> for Each<'_, S, F> {
        fn visit<T: LpmTable<F> + Sync + 'static>(&mut self, role: Role) {
            if !self.roles.contains(&role) {
                return;
            }
            assert!(
                self.reference.is_some() || role == Role::Kernel,
                "the kernel port runs first and gives the reference"
            );
            let (out, answers) = self.step.step::<T>(self.reference.as_ref());
            self.reference.get_or_insert(answers);
            self.out.push(out);
        }
    }
    let mut each = Each {
        step,
        roles,
        reference,
        out: Vec::new(),
    };
    visit_all::<F>(&mut each);
    each.out
}

/// The names of the implementations playing one of `roles`, in report
/// order (for summary tables and charts).
pub fn lpm_names(roles: &[Role]) -> Vec<&'static str> {
    struct Names<'a>(&'a [Role], Vec<&'static str>);
    impl Visit<V4> for Names<'_> {
        fn visit<T: LpmTable<V4> + Sync + 'static>(&mut self, role: Role) {
            if self.0.contains(&role) {
                self.1.push(T::NAME);
            }
        }
    }
    let mut names = Names(roles, Vec::new());
    visit_all(&mut names);
    names.1
}

/// The roles most suites run: the kernel port and bpfmaps, and the peers
/// unless `--no-peers`.
pub fn roles(peers: bool) -> &'static [Role] {
    if peers {
        &[Role::Kernel, Role::Bpfmaps, Role::Peer]
    } else {
        &[Role::Kernel, Role::Bpfmaps]
    }
}

/// Every role (`lpm-real`, which shows each lookup API).
pub const ALL_ROLES: &[Role] = &[Role::Kernel, Role::Bpfmaps, Role::Api, Role::Peer];

/// A table that writers change through `&self` while readers look up
/// (bpfmaps and the kernel port).
pub trait SharedLpm<F: Family>: Sync {
    /// Inserts or replaces (`BPF_ANY`).
    fn insert_shared(&self, p: &Prefix<F>, value: u32);
    /// Removes the exact prefix; false if it was not stored (`ENOENT`).
    fn remove_shared(&self, p: &Prefix<F>) -> bool;
    /// The value of the longest stored prefix containing `a`, read under
    /// `guard`.
    fn get_pinned(&self, a: &F::Addr, guard: &Guard) -> Option<u32>;
}

/// `LpmTable::sum_batch` of a `SharedLpm`: one guard for the batch, as a
/// BPF program runs its lookups under one RCU read section.
#[inline]
fn pinned_sum<F: Family, T: SharedLpm<F>>(t: &T, addrs: &[F::Addr]) -> u64 {
    let guard = bpfmaps::pin();
    let mut acc = 0u64;
    for a in addrs {
        if let Some(v) = t.get_pinned(black_box(a), &guard) {
            acc += u64::from(v);
        }
    }
    acc
}

/// `LpmTable::visit_batch` of a `SharedLpm`, likewise.
fn pinned_visit<F: Family, T: SharedLpm<F>>(
    t: &T,
    addrs: &[F::Addr],
    mut f: impl FnMut(Option<u32>),
) {
    let guard = bpfmaps::pin();
    for a in addrs {
        f(t.get_pinned(black_box(a), &guard));
    }
}

/// A map's 4-byte value as the `u32` the suites store in it.
#[inline]
pub fn value_u32(v: &[u8]) -> u32 {
    u32::from_ne_bytes(v.try_into().expect("4-byte values"))
}

fn removed(r: bpfmaps::Result<()>) -> bool {
    match r {
        Ok(()) => true,
        Err(Error::NotFound) => false,
        Err(e) => panic!("remove: {e}"),
    }
}

/// `LpmTable` for a `SharedLpm` made by `new(data_size, value_size,
/// max_entries)` (bpfmaps and the kernel port): changes go through `&self`,
/// and a batch's lookups run under one guard.
macro_rules! shared_lpm_table {
    ($t:ty, $name:literal, $live:expr, $walks:expr) => {
        impl<F: Family> LpmTable<F> for $t {
            const NAME: &'static str = $name;
            fn empty() -> Self {
                <$t>::new(F::BITS as usize / 8, 4, MAX_ENTRIES).expect("creating the trie")
            }
            fn insert(&mut self, p: &Prefix<F>, value: u32) {
                self.insert_shared(p, value);
            }
            fn remove(&mut self, p: &Prefix<F>) -> bool {
                self.remove_shared(p)
            }
            fn get(&self, a: &F::Addr) -> Option<u32> {
                SharedLpm::<F>::get_pinned(self, a, &bpfmaps::pin())
            }
            #[inline]
            fn sum_batch(&self, addrs: &[F::Addr]) -> u64 {
                pinned_sum::<F, _>(self, addrs)
            }
            fn visit_batch(&self, addrs: &[F::Addr], f: impl FnMut(Option<u32>)) {
                pinned_visit::<F, _>(self, addrs, f);
            }
            fn count(&self) -> usize {
                Map::len(self)
            }
            fn reported(&self) -> Option<usize> {
                Some(Map::memory_usage(self))
            }
            fn live(&self) -> Option<usize> {
                $live(self)
            }
            fn shared(&self) -> Option<&dyn SharedLpm<F>> {
                Some(self)
            }
            fn walks(&self) -> Vec<Walk<'_>> {
                $walks(self)
            }
        }
    };
}

shared_lpm_table!(
    LpmTrie,
    "bpfmaps",
    |t: &LpmTrie| Some(t.memory_live()),
    bpfmaps_walks
);
shared_lpm_table!(KernelLpmTrie, "kernel", |_| None, kernel_walks);

/// bpfmaps' walks: the byte contract's, and `for_each` under one guard.
fn bpfmaps_walks(t: &LpmTrie) -> Vec<Walk<'_>> {
    vec![
        Walk::new("get_next_key", move || contract_walk(t)),
        Walk::new("for_each", move || {
            let guard = bpfmaps::pin();
            let (mut count, mut sum) = (0u64, 0u64);
            t.for_each(&guard, |_, len, v| {
                count += 1;
                sum += u64::from(value_u32(v)) + u64::from(len);
            });
            (count, sum)
        }),
    ]
}

/// The kernel port's walk: the byte contract's.
fn kernel_walks(t: &KernelLpmTrie) -> Vec<Walk<'_>> {
    vec![Walk::new("get_next_key", move || contract_walk(t))]
}

/// bpfmaps' `LpmTrie` looked up through another of its APIs than the
/// `bpfmaps` row's `get_as`, to show what each costs in the same run.
pub struct LpmVia<A: LookupApi>(pub LpmTrie, PhantomData<A>);

/// A lookup API of `LpmTrie`: the row's name and its batch loop.
pub trait LookupApi {
    /// Implementation name in records.
    const NAME: &'static str;
    /// `LpmTable::sum_batch` through this API.
    fn sum_batch<F: Family>(t: &LpmTrie, addrs: &[F::Addr]) -> u64;
    /// Whether the row's table is built by one bulk load.
    const BULK_LOAD: bool = false;
}

/// `get_many_as`, which overlaps the cache misses of a batch's lookups in
/// stages (what a dataplane handling packets in bursts would call), its
/// answers copied out as `u32` as `get_as` gives them.
pub struct GetManyAs;

impl LookupApi for GetManyAs {
    const NAME: &'static str = "bpfmaps-get_many_as";
    #[inline]
    fn sum_batch<F: Family>(t: &LpmTrie, addrs: &[F::Addr]) -> u64 {
        let guard = bpfmaps::pin();
        let mut out = [None; BATCH];
        let out = &mut out[..addrs.len()];
        t.get_many_as::<u32, _>(black_box(addrs), &guard, out)
            .expect("room for every answer");
        out.iter().map(|v| u64::from(v.unwrap_or(0))).sum()
    }
}

/// `get`, the byte-level lookup: its `Value` answer keeps a branch on
/// whether anything matched in the caller's loop, which `get_as` avoids.
pub struct GetValue;

impl LookupApi for GetValue {
    const NAME: &'static str = "bpfmaps-get";
    #[inline]
    fn sum_batch<F: Family>(t: &LpmTrie, addrs: &[F::Addr]) -> u64 {
        let guard = bpfmaps::pin();
        let mut acc = 0u64;
        for a in addrs {
            if let Some(v) = t.get(black_box(a).as_ref(), &guard) {
                acc += u64::from(value_u32(&v));
            }
        }
        acc
    }
}

/// The `bpfmaps-get_many_as` row.
pub type ManyLpm = LpmVia<GetManyAs>;

/// bpfmaps' `LpmTrie` loaded in bulk (`LpmTrie::extend`: each node built
/// once) rather than by one insert per prefix; looked up as the `bpfmaps`
/// row is.
pub struct BulkLoad;

impl LookupApi for BulkLoad {
    const NAME: &'static str = "bpfmaps-bulk";
    const BULK_LOAD: bool = true;
    #[inline]
    fn sum_batch<F: Family>(t: &LpmTrie, addrs: &[F::Addr]) -> u64 {
        LpmTable::<F>::sum_batch(t, addrs)
    }
}

/// The `bpfmaps-bulk` row.
pub type BulkLpm = LpmVia<BulkLoad>;

/// The `bpfmaps-get` row.
pub type ValueLpm = LpmVia<GetValue>;

impl<F: Family, A: LookupApi> LpmTable<F> for LpmVia<A> {
    const NAME: &'static str = A::NAME;
    fn empty() -> Self {
        LpmVia(<LpmTrie as LpmTable<F>>::empty(), PhantomData)
    }
    fn load(prefixes: &[Prefix<F>]) -> Self {
        let t = <Self as LpmTable<F>>::empty();
        if !A::BULK_LOAD {
            return insert_each(t, prefixes);
        }
        let entries = prefixes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.addr, u32::from(p.len), value_of(i).to_ne_bytes()));
        t.0.extend(entries).expect("a valid table");
        t
    }
    fn insert(&mut self, p: &Prefix<F>, value: u32) {
        LpmTable::<F>::insert(&mut self.0, p, value);
    }
    fn remove(&mut self, p: &Prefix<F>) -> bool {
        LpmTable::<F>::remove(&mut self.0, p)
    }
    fn get(&self, a: &F::Addr) -> Option<u32> {
        LpmTable::<F>::get(&self.0, a)
    }
    #[inline]
    fn sum_batch(&self, addrs: &[F::Addr]) -> u64 {
        A::sum_batch::<F>(&self.0, addrs)
    }
    fn count(&self) -> usize {
        Map::len(&self.0)
    }
    fn reported(&self) -> Option<usize> {
        Some(LpmTrie::memory_usage(&self.0))
    }
    fn live(&self) -> Option<usize> {
        Some(self.0.memory_live())
    }
}

impl<F: Family> SharedLpm<F> for LpmTrie {
    fn insert_shared(&self, p: &Prefix<F>, value: u32) {
        LpmTrie::insert(
            self,
            p.addr.as_ref(),
            p.len.into(),
            &value.to_ne_bytes(),
            BPF_ANY,
        )
        .expect("insert");
    }
    fn remove_shared(&self, p: &Prefix<F>) -> bool {
        removed(LpmTrie::remove(self, p.addr.as_ref(), p.len.into(), None))
    }
    // Always inlined into the batch loop, as a caller's own loop would
    // have it (out of line, the call itself shows in the timings).
    #[inline(always)]
    fn get_pinned(&self, a: &F::Addr, guard: &Guard) -> Option<u32> {
        LpmTrie::get_as::<u32>(self, a.as_ref(), guard)
    }
}

impl<F: Family> SharedLpm<F> for KernelLpmTrie {
    fn insert_shared(&self, p: &Prefix<F>, value: u32) {
        self.insert_data(p.addr.as_ref(), p.len.into(), &value.to_ne_bytes(), BPF_ANY)
            .expect("insert");
    }
    fn remove_shared(&self, p: &Prefix<F>) -> bool {
        removed(self.remove_data(p.addr.as_ref(), p.len.into()))
    }
    // Always inlined into the batch loop, as a caller's own loop would
    // have it (out of line, the call itself shows in the timings).
    #[inline(always)]
    fn get_pinned(&self, a: &F::Addr, guard: &Guard) -> Option<u32> {
        self.lookup_data(a.as_ref(), guard).map(value_u32)
    }
}

/// `prefix-trie`'s map for family `F`.
pub type PrefixTrie<F> = PrefixMap<<F as Family>::Net, u32>;

impl<F: Family> LpmTable<F> for PrefixMap<F::Net, u32> {
    const NAME: &'static str = "prefix-trie";
    fn empty() -> Self {
        PrefixMap::new()
    }
    fn insert(&mut self, p: &Prefix<F>, value: u32) {
        PrefixMap::insert(self, F::net(p), value);
    }
    fn remove(&mut self, p: &Prefix<F>) -> bool {
        PrefixMap::remove(self, &F::net(p)).is_some()
    }
    #[inline]
    fn get(&self, a: &F::Addr) -> Option<u32> {
        self.get_lpm(&F::host_net(a)).map(|(_, v)| *v)
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn walks(&self) -> Vec<Walk<'_>> {
        vec![Walk::new("iter", move || {
            let (mut count, mut sum) = (0u64, 0u64);
            for (p, v) in self.iter() {
                count += 1;
                sum += u64::from(*v) + u64::from(prefix_trie::Prefix::prefix_len(&p) as u32);
            }
            (count, sum)
        })]
    }
}

impl<F: Family> LpmTable<F> for IpNetworkTable<u32> {
    const NAME: &'static str = "ip_network_table";
    fn empty() -> Self {
        IpNetworkTable::new()
    }
    fn insert(&mut self, p: &Prefix<F>, value: u32) {
        IpNetworkTable::insert(self, F::ip_network(p), value);
    }
    fn remove(&mut self, p: &Prefix<F>) -> bool {
        IpNetworkTable::remove(self, F::ip_network(p)).is_some()
    }
    #[inline]
    fn get(&self, a: &F::Addr) -> Option<u32> {
        F::ip_network_match(self, a)
    }
    fn count(&self) -> usize {
        let (v4, v6) = self.len();
        v4 + v6
    }
    fn walks(&self) -> Vec<Walk<'_>> {
        vec![Walk::new("iter", move || {
            let (mut count, mut sum) = (0u64, 0u64);
            for (net, v) in self.iter() {
                count += 1;
                sum += u64::from(*v) + u64::from(net.netmask());
            }
            (count, sum)
        })]
    }
}

/// The value stored for prefix number `i` of a set: never 0, so a miss is
/// told apart from a hit in the checksum.
pub fn value_of(i: usize) -> u32 {
    i as u32 + 1
}

/// A table built from a prefix set, with what building it cost.
pub struct Built<T> {
    /// The table.
    pub table: T,
    /// Wall time of the inserts.
    pub time: Duration,
    /// Bytes the building thread holds afterwards (counting allocator).
    pub held: usize,
}

/// Lets deferred frees (replaced nodes) run on this thread, so they are
/// counted as freed by it before memory is read.
pub fn flush_deferred() {
    // A flush frees a bounded number of deferred bags: flush until the
    // process stops giving memory back (a load that split tables retires
    // thousands of chains).
    let mut last = usize::MAX;
    for _ in 0..10_000 {
        for _ in 0..4 {
            bpfmaps::pin().flush();
        }
        let now = crate::alloc::current();
        if now >= last {
            break;
        }
        last = now;
    }
}

/// Drops `t` and waits until the process holds no more than `before`
/// bytes (plus `slack`) again, flushing deferred frees on this thread
/// meanwhile (bpfmaps frees replaced blocks, and with the last of them its
/// arena, after an epoch grace period). Returns the time taken, or the
/// time until `limit` if the memory did not come back by then.
pub fn drop_and_reclaim<T>(t: T, before: usize, slack: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    drop(t);
    while crate::alloc::current() > before + slack && start.elapsed() < limit {
        bpfmaps::pin().flush();
    }
    start.elapsed()
}

/// Builds `T` from `prefixes` (prefix `i` gets [`value_of`]`(i)`), in order.
pub fn build<F: Family, T: LpmTable<F>>(prefixes: &[Prefix<F>]) -> Built<T> {
    // The thread's first pin registers it with the epoch collector (a few
    // KiB): not the table's memory.
    flush_deferred();
    let probe = MemProbe::start();
    let start = Instant::now();
    let table = T::load(prefixes);
    let time = start.elapsed();
    flush_deferred();
    Built {
        table,
        time,
        held: probe.held(),
    }
}

/// Sum of the values found for every address, batch by batch as the timed
/// loop does it.
pub fn checksum<F: Family, T: LpmTable<F>>(t: &T, addrs: &[F::Addr]) -> u64 {
    addrs
        .chunks(BATCH)
        .map(|c| t.sum_batch(c))
        .fold(0, u64::wrapping_add)
}

/// Addresses whose answers are compared one by one (the checksum covers
/// the whole lookup set).
pub const VERIFY_SAMPLE: usize = 1 << 16;

/// Each address's answer (0 for a miss).
pub fn answers<F: Family, T: LpmTable<F>>(t: &T, addrs: &[F::Addr]) -> Vec<u32> {
    addrs.iter().map(|a| t.get(a).unwrap_or(0)).collect()
}

/// What a table answered for a lookup set, to compare with the baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answers {
    /// [`checksum`].
    pub checksum: u64,
    /// [`answers`] for the first [`VERIFY_SAMPLE`] addresses.
    pub values: Vec<u32>,
}

impl Answers {
    /// Records `t`'s answers for `addrs`.
    pub fn of<F: Family, T: LpmTable<F>>(t: &T, addrs: &[F::Addr]) -> Answers {
        Answers {
            checksum: checksum(t, addrs),
            values: answers(t, &addrs[..addrs.len().min(VERIFY_SAMPLE)]),
        }
    }

    /// Lookups answered differently from `reference` (plus one if only
    /// the batch checksums differ).
    pub fn disagreements(&self, reference: &Answers) -> usize {
        let differ = self
            .values
            .iter()
            .zip(&reference.values)
            .filter(|(a, b)| a != b)
            .count();
        differ + usize::from(differ == 0 && self.checksum != reference.checksum)
    }
}

/// Counts `got`'s disagreements with the baseline's `reference` and warns
/// loudly if there are any: the implementations must agree, or the
/// numbers beside them compare different work.
pub fn check_agreement(
    ctx: &Ctx,
    what: &str,
    impl_name: &str,
    got: &Answers,
    reference: &Answers,
) -> usize {
    let n = got.disagreements(reference);
    if n > 0 {
        ctx.note(&format!(
            "WARNING: {impl_name} disagrees with kernel on {n} lookups ({what}): \
             checksum {} vs {}",
            got.checksum, reference.checksum
        ));
    }
    n
}

/// The batch closure of a lookup loop over `addrs`: each call looks up the
/// next [`BATCH`] addresses with one [`LpmTable::sum_batch`], cycling over
/// the set, and returns [`BATCH`]. `addrs.len()` must be a multiple of
/// [`BATCH`]. For [`rate_samples`] or, with other tables' loops,
/// [`crate::measure::rate_samples_interleaved`].
pub fn lookup_batches<'a, F: Family, T: LpmTable<F>>(
    t: &'a T,
    addrs: &'a [F::Addr],
) -> impl FnMut() -> u64 + 'a {
    assert!(
        !addrs.is_empty() && addrs.len() % BATCH == 0,
        "lookup sets are whole batches"
    );
    let mut cursor = 0;
    move || {
        let batch = &addrs[cursor..cursor + BATCH];
        cursor = (cursor + BATCH) % addrs.len();
        black_box(t.sum_batch(batch));
        BATCH as u64
    }
}

/// Per-repetition lookup rates (lookups/s) over `addrs` in batches of
/// [`BATCH`], cycling; `addrs.len()` must be a multiple of [`BATCH`].
pub fn lookup_rates<F: Family, T: LpmTable<F>>(plan: Plan, t: &T, addrs: &[F::Addr]) -> Vec<f64> {
    rate_samples(plan, lookup_batches::<F, T>(t, addrs))
}

/// A built table of any implementation behind one type, so that a suite
/// can keep several alive side by side and time them in turns: its
/// lookup loop is the implementation's own monomorphic batch loop, boxed
/// (one dynamic call per batch); single writes go through a dynamic call.
pub trait AnyLpm<F: Family>: Sync {
    /// Implementation name in records ([`LpmTable::NAME`]).
    fn name(&self) -> &'static str;
    /// [`lookup_batches`] over `addrs`, boxed.
    fn lookups<'a>(&'a self, addrs: &'a [F::Addr]) -> Box<dyn FnMut() -> u64 + 'a>;
    /// [`LpmTable::sum_batch`].
    fn sum_batch(&self, addrs: &[F::Addr]) -> u64;
    /// [`LpmTable::insert`].
    fn insert(&mut self, p: &Prefix<F>, value: u32);
    /// [`LpmTable::remove`].
    fn remove(&mut self, p: &Prefix<F>) -> bool;
    /// [`Answers::of`] this table.
    fn answers(&self, addrs: &[F::Addr]) -> Answers;
    /// [`LpmTable::count`].
    fn count(&self) -> usize;
    /// [`LpmTable::reported`].
    fn reported(&self) -> Option<usize>;
    /// [`LpmTable::live`].
    fn live(&self) -> Option<usize>;
    /// [`LpmTable::shared`].
    fn shared(&self) -> Option<&dyn SharedLpm<F>>;
    /// [`LpmTable::walks`].
    fn walks(&self) -> Vec<Walk<'_>>;
}

impl<F: Family, T: LpmTable<F> + Sync> AnyLpm<F> for T {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn lookups<'a>(&'a self, addrs: &'a [F::Addr]) -> Box<dyn FnMut() -> u64 + 'a> {
        Box::new(lookup_batches::<F, T>(self, addrs))
    }
    fn sum_batch(&self, addrs: &[F::Addr]) -> u64 {
        LpmTable::sum_batch(self, addrs)
    }
    fn insert(&mut self, p: &Prefix<F>, value: u32) {
        LpmTable::insert(self, p, value);
    }
    fn remove(&mut self, p: &Prefix<F>) -> bool {
        LpmTable::remove(self, p)
    }
    fn answers(&self, addrs: &[F::Addr]) -> Answers {
        Answers::of::<F, T>(self, addrs)
    }
    fn count(&self) -> usize {
        LpmTable::count(self)
    }
    fn reported(&self) -> Option<usize> {
        LpmTable::reported(self)
    }
    fn live(&self) -> Option<usize> {
        LpmTable::live(self)
    }
    fn shared(&self) -> Option<&dyn SharedLpm<F>> {
        LpmTable::shared(self)
    }
    fn walks(&self) -> Vec<Walk<'_>> {
        LpmTable::walks(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefixes::{V4, V6, addrs_inside, addrs_random, generate};

    fn agree<F: Family>(prefixes: &[Prefix<F>], addrs: &[F::Addr]) {
        let kernel = build::<F, KernelLpmTrie>(prefixes).table;
        let reference = Answers::of::<F, _>(&kernel, addrs);
        assert!(reference.values.iter().any(|&v| v != 0));
        let ours = build::<F, LpmTrie>(prefixes);
        assert_eq!(
            Answers::of::<F, _>(&ours.table, addrs).disagreements(&reference),
            0
        );
        assert_eq!(LpmTable::<F>::count(&ours.table), prefixes.len());
        // Not `ours.held`: it is the building thread's net allocation,
        // and a pin on it may run other tests' deferred frees (a dropped
        // map's arena), which can take it to 0 when tests run side by
        // side.
        assert!(LpmTable::<F>::reported(&ours.table).is_some_and(|bytes| bytes > 0));
        let pt = build::<F, PrefixTrie<F>>(prefixes).table;
        assert_eq!(Answers::of::<F, _>(&pt, addrs).disagreements(&reference), 0);
        let ipn = build::<F, IpNetworkTable<u32>>(prefixes).table;
        assert_eq!(
            Answers::of::<F, _>(&ipn, addrs).disagreements(&reference),
            0
        );
        assert_eq!(LpmTable::<F>::count(&ipn), prefixes.len());
    }

    #[test]
    fn all_implementations_agree() {
        let v4 = generate::<V4>(3000, 0..=32, 1);
        let mut addrs = addrs_inside(&v4, 2048, 2);
        addrs.extend(addrs_random::<V4>(2048, 3));
        agree(&v4, &addrs);
        let v6 = generate::<V6>(2000, 3..=64, 4);
        let mut addrs = addrs_inside(&v6, 2048, 5);
        addrs.extend(addrs_random::<V6>(2048, 6));
        agree(&v6, &addrs);
    }

    #[test]
    fn removal_and_disagreement_counts() {
        let p = generate::<V4>(100, 8..=24, 7);
        let mut t = build::<V4, LpmTrie>(&p).table;
        let addrs = addrs_inside(&p, BATCH, 8);
        let before = Answers::of::<V4, _>(&t, &addrs);
        assert!(LpmTable::<V4>::remove(&mut t, &p[0]));
        assert!(!LpmTable::<V4>::remove(&mut t, &p[0]));
        let after = Answers::of::<V4, _>(&t, &addrs);
        assert!(after.disagreements(&before) > 0);
        let rates = lookup_rates::<V4, LpmTrie>(Plan::new(1, Duration::from_millis(2)), &t, &addrs);
        assert_eq!(rates.len(), 1);
    }

    #[test]
    fn lookup_loops_of_several_tables_time_in_turns() {
        let p = generate::<V4>(500, 8..=24, 9);
        let addrs = addrs_inside(&p, 2 * BATCH, 10);
        let tables: Vec<Box<dyn AnyLpm<V4>>> = vec![
            Box::new(build::<V4, KernelLpmTrie>(&p).table),
            Box::new(build::<V4, LpmTrie>(&p).table),
            Box::new(build::<V4, PrefixTrie<V4>>(&p).table),
        ];
        let names: Vec<_> = tables.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["kernel", "bpfmaps", "prefix-trie"]);
        let mut loops: Vec<_> = tables.iter().map(|t| t.lookups(&addrs)).collect();
        // Past the end of the set the cursor wraps around.
        for _ in 0..3 {
            assert_eq!(loops[0](), BATCH as u64);
        }
        let rates = crate::measure::rate_samples_interleaved(
            Plan::new(2, Duration::from_millis(2)),
            &mut loops,
        );
        assert_eq!(rates.len(), 3);
        assert!(
            rates
                .iter()
                .all(|r| r.len() == 2 && r.iter().all(|&x| x > 0.0))
        );
    }
}

//! [`WildcardMap`]'s lookups: a packet (or a key's bytes) through the
//! tables in order of their best priority, one at a time or a batch in
//! a pipeline, without a lock.

use super::*;

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
pub(super) struct Probes {
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
pub(super) fn probes_for(width: Width, fields: usize) -> Probes {
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

impl WildcardMap {
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
    pub(super) fn read_view<'g, T>(
        &self,
        guard: &'g Guard,
        mut read: impl FnMut(&'g View) -> T,
    ) -> T {
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
            // The key is the one field: its value, without a `Packet`
            // (docs/benchmarks.md, "Keys' bytes on the prefix engine").
            Some(index) => index.classify(be_value(key), guard),
            None => (self.probes.classify_key)(self, key, guard).map(|h| self.answer(h)),
        })
    }

    /// [`classify_as`](Self::classify_as) of a concrete key's bytes, as
    /// [`classify_key`](Self::classify_key) takes them: the best matching
    /// rule's value alone, as a `V` of the map's value size (`None` when
    /// no rule matches or `V` is another size).
    ///
    /// ```
    /// use bpfmaps::wildcard::{Field, Schema, WildcardMap};
    ///
    /// let geo = WildcardMap::new(Schema::new(vec![Field::prefix("addr", 4)])?, 2, 100)?;
    /// geo.insert(&geo.schema().parse_rule("addr 10.0.0.0/8", 24)?, b"DE", 0)?;
    /// let guard = bpfmaps::pin();
    /// assert_eq!(geo.classify_key_as::<[u8; 2]>(&[10, 9, 1, 1], &guard)?, Some(*b"DE"));
    /// assert_eq!(geo.classify_key_as::<[u8; 2]>(&[11, 9, 1, 1], &guard)?, None);
    /// assert!(geo.classify_key_as::<[u8; 2]>(&[10, 9, 1], &guard).is_err());
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    ///
    /// Why beside `classify_key`: as `classify_as`, a one-prefix schema's
    /// values of up to 4 bytes come from its trie of values, one cache
    /// line fewer (the byte contract's lookups take this way).
    #[inline(always)]
    pub fn classify_key_as<V: bytemuck::Pod>(
        &self,
        key: &[u8],
        guard: &Guard,
    ) -> Result<Option<V>> {
        check_len("key", key.len(), self.key_reader.key_size())?;
        if size_of::<V>() != self.value_size {
            return Ok(None);
        }
        Ok(match &self.index {
            Some(index) => index.classify_as(be_value(key), guard),
            None => (self.probes.classify_key)(self, key, guard)
                .map(|h| bytemuck::pod_read_unaligned(self.answer(h).1)),
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
    ///
    /// A one-prefix schema's batch goes through its trie's staged
    /// lookups, 32 at a time (geoIP in bursts of 32 keys: 2.5-2.9x less
    /// time a lookup on IPv4, 1.5-1.9x on IPv6; docs/benchmarks.md,
    /// "Keys' bytes on the prefix engine").
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
        if let Some(index) = &self.index {
            index.classify_many(packets, guard, out);
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
        if let Some(index) = &self.index {
            index.classify_many_keys(keys, guard, out);
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
}

impl TableProbe {
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

//! What `strmap-real` and `strmap-synthetic` share: building every string
//! map of [`crate::str_tables`] on one key set, recording its build time
//! and bytes per key and checking its answers ([`KeySetRun`]); timing the
//! lookups of all of them in turns ([`KeySetRun::time_lookups`]); and
//! reading those records back for summaries and plots ([`bases`],
//! [`memory`], [`plot_memory_and_lookups`]).

use crate::measure::{Plan, rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::record::{
    BUILD_NS_PER_KEY, LOOKUPS_PER_SEC, MEM_BYTES_PER_KEY, MEM_REPORTED_PER_KEY, NS_PER_LOOKUP,
    Record, STRMAP_DISAGREEMENTS, find,
};
use crate::stats::Stats;
use crate::str_tables::{AnyStr, StrStep, StrTable, build, each_str_table, str_table_names};
use crate::strings::Keys;
use crate::suite::Ctx;

/// One implementation, built and kept for the timed loops.
pub struct Kept {
    /// The structure.
    pub table: Box<dyn AnyStr>,
    /// Its records: build and memory first, lookups (and walks) appended.
    pub recs: Vec<Record>,
    /// Wrong answers per lookup set of [`KeySetRun::lookups`].
    pub wrong: Vec<usize>,
}

/// A lookup set: probes, what each must answer, and its name in cases
/// (`lookup=hit`).
pub struct LookupSet {
    /// `hit`, `miss`.
    pub kind: &'static str,
    /// The keys looked up, back to back, cycled through in batches.
    pub probes: Keys,
    /// The answer expected for each probe (`None`: a miss).
    pub expect: Vec<Option<u64>>,
}

/// One key set and what every implementation is measured on.
pub struct KeySetRun<'a> {
    /// The running suite.
    pub ctx: &'a Ctx,
    /// The set's case (`set=kallsyms,n=...`); lookups add `lookup=KIND`.
    pub base: String,
    /// The keys, in build order (key `i` gets value `i`).
    pub keys: Keys,
    /// The lookup sets, timed one after the other.
    pub lookups: Vec<LookupSet>,
    /// Timed builds per implementation (the last one is kept).
    pub builds: usize,
    /// Lookups checked per lookup set (the first ones).
    pub checked: usize,
    /// Why an implementation is left out of this set besides refusing its
    /// keys ([`StrTable::refuses`]), by name: `None` keeps it.
    pub leave_out: &'a dyn Fn(&'static str) -> Option<String>,
    /// Also record each lookup set's `lookups_per_sec` (one thread).
    pub lookups_per_sec: bool,
}

impl StrStep for KeySetRun<'_> {
    type Out = Option<Kept>;

    /// Builds `T` (`builds` times, keeping the last), records build time
    /// and memory, and checks its answers; `None` (with a note) if it
    /// refuses the keys or is left out.
    fn step<T: StrTable + 'static>(&mut self) -> Option<Kept> {
        let s = self.ctx.suite();
        if let Some(why) = T::refuses(&self.keys).or_else(|| (self.leave_out)(T::NAME)) {
            self.ctx.note(&format!(
                "{s}: {} left out of {}: {why}",
                T::NAME,
                self.base
            ));
            self.ctx.step();
            return None;
        }
        let mut times = Vec::new();
        let mut built = None;
        for _ in 0..self.builds.max(1) {
            drop(built.take());
            // A bpfmaps map dropped just before is freed on the reaper
            // thread: not while this build is timed.
            settle_reaper();
            let b = build::<T>(&self.keys);
            times.push(b.ns_per_key);
            built = Some(b);
        }
        let built = built.expect("at least one build");
        let t = built.table;
        let n = self.keys.len();
        assert_eq!(StrTable::len(&t), n, "{}: keys lost", T::NAME);
        let per_key = |bytes: usize| bytes as f64 / n as f64;
        let mut recs = vec![Record::stats(
            s,
            &self.base,
            T::NAME,
            &BUILD_NS_PER_KEY,
            Stats::from_samples(&times),
        )];
        if T::COUNTED {
            recs.push(Record::single(
                s,
                &self.base,
                T::NAME,
                &MEM_BYTES_PER_KEY,
                per_key(built.held),
            ));
        }
        if let Some(bytes) = t.reported() {
            recs.push(Record::single(
                s,
                &self.base,
                T::NAME,
                &MEM_REPORTED_PER_KEY,
                per_key(bytes),
            ));
        }
        let wrong: Vec<usize> = self
            .lookups
            .iter()
            .map(|l| {
                let n = self.checked.min(l.probes.len());
                t.wrong_answers(&l.probes, &l.expect[..n])
            })
            .collect();
        for (w, l) in wrong.iter().zip(&self.lookups) {
            if *w > 0 {
                self.ctx.note(&format!(
                    "WARNING: {} answered {w} {} lookups wrongly ({})",
                    T::NAME,
                    l.kind,
                    self.base
                ));
            }
        }
        self.ctx.step();
        self.ctx.print(&recs);
        Some(Kept {
            table: Box::new(t),
            recs,
            wrong,
        })
    }
}

impl KeySetRun<'_> {
    /// Builds every implementation that takes the keys, in report order.
    pub fn build_all(&mut self) -> Vec<Kept> {
        let kept = each_str_table(self).into_iter().flatten().collect();
        settle_reaper();
        kept
    }

    /// Times the lookups of every kept implementation in turns, one lookup
    /// set at a time, with `plan`; appends the records to each `Kept`.
    pub fn time_lookups(&self, kept: &mut [Kept], plan: Plan) {
        let s = self.ctx.suite();
        for (i, set) in self.lookups.iter().enumerate() {
            let c = format!("{},lookup={}", self.base, set.kind);
            let rates = {
                let mut loops: Vec<_> = kept.iter().map(|k| k.table.lookups(&set.probes)).collect();
                rate_samples_interleaved(plan, &mut loops)
            };
            let mut printed = Vec::new();
            for (k, samples) in kept.iter_mut().zip(rates) {
                let name = k.table.name();
                let mut recs = vec![Record::stats(
                    s,
                    &c,
                    name,
                    &NS_PER_LOOKUP,
                    Stats::inverse_of(&samples, 1e9),
                )];
                if self.lookups_per_sec {
                    recs.push(Record::stats(
                        s,
                        &c,
                        name,
                        &LOOKUPS_PER_SEC,
                        Stats::from_samples(&samples),
                    ));
                }
                recs.push(Record::single(
                    s,
                    &c,
                    name,
                    &STRMAP_DISAGREEMENTS,
                    k.wrong[i] as f64,
                ));
                k.recs.extend_from_slice(&recs);
                printed.extend(recs);
            }
            self.ctx.step();
            self.ctx.print(&printed);
        }
    }
}

/// The key sets' base cases, in run order (those with a build record).
pub fn bases(records: &[Record]) -> Vec<&str> {
    let mut bases: Vec<&str> = Vec::new();
    for r in records.iter().filter(|r| r.metric == BUILD_NS_PER_KEY.name) {
        if !bases.contains(&r.case.as_str()) {
            bases.push(&r.case);
        }
    }
    bases
}

/// An implementation's bytes per key: counted, or else its own account
/// (`true`).
pub fn memory<'a>(records: &'a [Record], base: &str, imp: &str) -> Option<(&'a Record, bool)> {
    find(records, base, imp, MEM_BYTES_PER_KEY.name)
        .map(|r| (r, false))
        .or_else(|| find(records, base, imp, MEM_REPORTED_PER_KEY.name).map(|r| (r, true)))
}

/// Adds every implementation's line to `mem` (bytes per key) and to `hit`
/// (ns per hit lookup): a point per case of `bases`, at `x(case)`; a case
/// without its record or its x gives none.
pub fn plot_memory_and_lookups(
    records: &[Record],
    bases: &[&str],
    x: impl Fn(&str) -> Option<f64>,
    mem: &mut LinePlot,
    hit: &mut LinePlot,
) {
    for imp in str_table_names() {
        let points = |value: &dyn Fn(&str) -> Option<f64>| -> Vec<(f64, f64)> {
            bases
                .iter()
                .filter_map(|b| Some((x(b)?, value(b)?)))
                .collect()
        };
        mem.add(imp, points(&|b| memory(records, b, imp).map(|m| m.0.value)));
        hit.add(
            imp,
            points(&|b| {
                find(records, &format!("{b},lookup=hit"), imp, NS_PER_LOOKUP.name).map(|r| r.value)
            }),
        );
    }
}

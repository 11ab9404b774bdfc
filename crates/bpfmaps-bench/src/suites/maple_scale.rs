//! `maple-scale`: range-map loads, free-range search and memory against
//! the number of ranges stored, 100 to 1M.
//!
//! Varies: the range count N, the insertion order (ascending, or
//! shuffled) and the implementation. Holds fixed: the layout (N disjoint
//! ranges of 1 to 8 indices, 8 to 15 free indices between neighbours and,
//! after one range in 1024, 4096 more: an address space's mappings and
//! holes, in miniature), the load indices (2^20 uniform over the layout's
//! span, so about a third land in a range), `u64` values, one thread.

use std::hint::black_box;
use std::time::Instant;

use clap::Args;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::alloc::MemProbe;
use crate::measure::{rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::range_tables::{RANGE_TABLES, RangeStep, RangeTable, each_range_table};
use crate::record::{
    BUILD_NS_PER_RANGE, MEM_BYTES_PER_RANGE, NS_PER_LOOKUP, NS_PER_OP, Record, case, case_param,
    case_value, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite, fmt_bytes};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct MapleScale;

/// `maple-scale` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Range counts [quick: 100,10000,100000; full: 100,10000,100000,1000000].
    #[arg(long, value_delimiter = ',')]
    ranges: Vec<usize>,
    /// Load indices per range count (rounded up to whole batches of 256).
    #[arg(long, default_value_t = 1 << 20)]
    loads: usize,
    /// Only the maple tree.
    #[arg(long)]
    no_peers: bool,
}

const SEED: u64 = 0x6d61_706c_6521;
/// Free-area sizes searched: one most gaps fit, one only the rare wide
/// gaps do.
const AREA_SIZES: [u64; 2] = [12, 2048];

/// `n` disjoint ranges, ascending.
pub(crate) fn layout(n: usize) -> Vec<(u64, u64)> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut at = 0x1000u64;
    (0..n)
        .map(|_| {
            let first = at;
            let last = first + rng.random_range(0..8);
            let wide = if rng.random_range(0..1024) == 0 {
                4096
            } else {
                0
            };
            at = last + 1 + rng.random_range(8..16) + wide;
            (first, last)
        })
        .collect()
}

/// One range count and order: the ranges in insertion order, and the
/// probes.
struct Scale<'a> {
    ctx: &'a Ctx,
    ranges: Vec<(u64, u64)>,
    loads: Vec<u64>,
    /// Where the free-area searches start (the size is the case's).
    area_mins: Vec<u64>,
}

/// One map, built and kept for the timings.
struct Kept {
    name: &'static str,
    table: Box<dyn Probe>,
    held: usize,
    build_ns: f64,
}

/// The timed operations of a kept map.
trait Probe {
    fn load_sum(&self, indices: &[u64]) -> u64;
    fn find_sum(&self, froms: &[u64]) -> u64;
    fn area_sum(&self, mins: &[u64], size: u64) -> u64;
}

impl<T: RangeTable> Probe for T {
    fn load_sum(&self, indices: &[u64]) -> u64 {
        RangeTable::load_sum(self, indices)
    }
    fn find_sum(&self, froms: &[u64]) -> u64 {
        RangeTable::find_sum(self, froms)
    }
    fn area_sum(&self, mins: &[u64], size: u64) -> u64 {
        mins.iter()
            .map(|&min| self.empty_area(min, size).unwrap_or(0))
            .fold(0, u64::wrapping_add)
    }
}

impl RangeStep for Scale<'_> {
    type Out = Kept;
    fn step<T: RangeTable>(&self) -> Kept {
        let probe = MemProbe::start();
        let began = Instant::now();
        let mut t = T::new();
        for (v, &(first, last)) in self.ranges.iter().enumerate() {
            t.insert(first, last, v as u64 + 1);
        }
        let build_ns = began.elapsed().as_nanos() as f64 / self.ranges.len() as f64;
        let held = probe.held();
        self.ctx.step();
        Kept {
            name: T::NAME,
            table: Box::new(t),
            held,
            build_ns,
        }
    }
}

impl Scale<'_> {
    fn measure(&self, kept: &[Kept], order: &str) -> Vec<Record> {
        let n = self.ranges.len();
        // Every map answers alike, or its timings mean nothing.
        for k in &kept[1..] {
            assert_eq!(
                k.table.load_sum(&self.loads),
                kept[0].table.load_sum(&self.loads),
                "{}: loads disagree with the maple tree's",
                k.name
            );
            assert_eq!(
                k.table.find_sum(&self.loads),
                kept[0].table.find_sum(&self.loads),
                "{}: finds disagree with the maple tree's",
                k.name
            );
            for size in AREA_SIZES {
                assert_eq!(
                    k.table.area_sum(&self.area_mins, size),
                    kept[0].table.area_sum(&self.area_mins, size),
                    "{}: free areas of {size} disagree with the maple tree's",
                    k.name
                );
            }
        }
        settle_reaper();
        let s = self.ctx.suite();
        let mut recs = Vec::new();
        // Each map's rate of `op` over the probes, in batches, in turns.
        let rates = |op: fn(&dyn Probe, &[u64]) -> u64| {
            let mut loops: Vec<_> = kept
                .iter()
                .map(|k| {
                    let mut at = 0;
                    move || {
                        let batch = &self.loads[at..at + BATCH];
                        at = (at + BATCH) % self.loads.len();
                        black_box(op(&*k.table, batch));
                        BATCH as u64
                    }
                })
                .collect();
            rate_samples_interleaved(self.ctx.plan(), &mut loops)
        };
        let load_rates = rates(|t, batch| t.load_sum(batch));
        let c = case(&[("n", &n), ("order", &order)]);
        for (k, samples) in kept.iter().zip(load_rates) {
            recs.push(Record::stats(
                s,
                &c,
                k.name,
                &NS_PER_LOOKUP,
                Stats::inverse_of(&samples, 1e9),
            ));
            recs.push(Record::single(
                s,
                &c,
                k.name,
                &MEM_BYTES_PER_RANGE,
                k.held as f64 / n as f64,
            ));
            recs.push(Record::single(
                s,
                &c,
                k.name,
                &BUILD_NS_PER_RANGE,
                k.build_ns,
            ));
        }
        self.ctx.step();
        // Finds and free-area searches: only once per N (the layout is the
        // same in both orders).
        if order == "ascending" {
            let c = case(&[("n", &n), ("op", &"find")]);
            for (k, samples) in kept.iter().zip(rates(|t, batch| t.find_sum(batch))) {
                recs.push(Record::stats(
                    s,
                    &c,
                    k.name,
                    &NS_PER_OP,
                    Stats::inverse_of(&samples, 1e9),
                ));
            }
            for size in AREA_SIZES {
                let per = 16usize;
                let rates = {
                    let mut loops: Vec<_> = kept
                        .iter()
                        .map(|k| {
                            let mut at = 0;
                            let mins = &self.area_mins;
                            move || {
                                let batch = &mins[at..at + per];
                                at = (at + per) % mins.len();
                                black_box(k.table.area_sum(batch, size));
                                per as u64
                            }
                        })
                        .collect();
                    rate_samples_interleaved(self.ctx.plan(), &mut loops)
                };
                let c = case(&[("n", &n), ("op", &"empty_area"), ("size", &size)]);
                for (k, samples) in kept.iter().zip(rates) {
                    recs.push(Record::stats(
                        s,
                        &c,
                        k.name,
                        &NS_PER_OP,
                        Stats::inverse_of(&samples, 1e9),
                    ));
                }
            }
        }
        self.ctx.print(&recs);
        recs
    }
}

impl Suite for MapleScale {
    type Opts = Opts;
    const NAME: &'static str = "maple-scale";
    const ABOUT: &'static str = "range-map load and find ns, free-area search ns and bytes per range vs ranges stored (100 to 1M)";
    const DESCRIBE: &'static str = "N disjoint ranges of 1 to 8 indices with 8 to 15 free indices \
         between neighbours and, after one range in 1024, 4096 more (a generated \
         layout, the same for every map: an address space's mappings and holes in \
         miniature), inserted in ascending order or shuffled, with distinct u64 \
         values. Loads: 2^20 indices drawn uniformly over the layout's span (about a \
         third land in a range), shared by every map, in batches of 256 (one guard \
         per batch for the maple tree); every map's summed answers must match the \
         maple tree's. `find` (`op=find`): the first range ending at or after each \
         of the same indices (`mt_find` to the end, the search of the kernel's \
         `find_vma`), in the same batches. `empty_area` (`op=empty_area`): the lowest free run of `size` \
         indices at or above a random index (4,096 of them), `size` 12 (most gaps \
         fit) or 2048 (only the wide ones); a `BTreeMap` or `rangemap` user walks the \
         ranges from there, the maple tree descends by its branches' largest-gap \
         records. Every map is built and kept, then timed in turns. Memory: bytes \
         the building thread holds afterwards (counting allocator) per range; the \
         maple tree's include its arena's unused tail. Build: one insert per range, \
         one timing.";
    const BASELINE: &'static str = "btreemap";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let mut counts = ctx.list_or(
            opts.ranges,
            &[100, 10_000, 100_000],
            &[100, 10_000, 100_000, 1_000_000],
        );
        counts.retain(|&n| n > 0);
        counts.sort_unstable();
        counts.dedup();
        let impls = if opts.no_peers { 1 } else { RANGE_TABLES.len() };
        ctx.set_steps((counts.len() * 2 * (impls + 1)) as u64);
        let loads = opts.loads.max(1).div_ceil(BATCH) * BATCH;
        let mut all = Vec::new();
        for &n in &counts {
            let ascending = layout(n);
            let span = ascending.last().map_or(1, |r| r.1 + 16);
            let mut rng = StdRng::seed_from_u64(SEED ^ n as u64);
            let probes: Vec<u64> = (0..loads).map(|_| rng.random_range(0..span)).collect();
            let area_mins: Vec<u64> = (0..4096).map(|_| rng.random_range(0..span)).collect();
            let mut shuffled = ascending.clone();
            shuffled.shuffle(&mut rng);
            for (order, ranges) in [("ascending", ascending.clone()), ("shuffled", shuffled)] {
                let scale = Scale {
                    ctx,
                    ranges,
                    loads: probes.clone(),
                    area_mins: area_mins.clone(),
                };
                let kept = each_range_table(&scale, !opts.no_peers);
                all.extend(scale.measure(&kept, order));
            }
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        // The cases of one operation (`None`: the loads), in record order.
        let cases_of = |op: Option<&str>| {
            let mut cases: Vec<&str> = records
                .iter()
                .map(|r| r.case.as_str())
                .filter(|c| case_param(c, "op") == op)
                .collect();
            cases.dedup();
            cases
        };
        let p = |c: &str, k: &str| case_value(c, k).to_string();
        // Each map's time in case `c` ...
        let times = |c: &str, metric: &str| -> Vec<String> {
            RANGE_TABLES
                .iter()
                .map(|i| find(records, c, i, metric))
                .map(|r| r.map_or("-".into(), |r| format!("{:.1}", r.value)))
                .collect()
        };
        // ... and the maple tree's speed against each peer.
        let speeds = |c: &str, metric: &str| -> Vec<String> {
            let ns = |imp: &str| find(records, c, imp, metric);
            RANGE_TABLES[1..]
                .iter()
                .map(|i| fmt_ratio(ratio(ns(i), ns("bpfmaps"))))
                .collect()
        };
        let speed_cols = RANGE_TABLES
            .iter()
            .map(|i| format!("{i} ns"))
            .chain(RANGE_TABLES[1..].iter().map(|i| format!("bpfmaps/{i}")));
        let mut cols: Vec<String> = vec!["ranges".into(), "order".into()];
        cols.extend(speed_cols.clone());
        cols.extend(RANGE_TABLES.iter().map(|i| format!("{i} B/range")));
        let mut loads = Table::new(
            "maple-scale: load ns, speed of the maple tree vs each peer, and bytes per range",
            &cols.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .with_note("Speed ratios (the peer's time / the maple tree's): above 1 means the maple tree is faster.");
        for c in cases_of(None) {
            let mut row = vec![p(c, "n"), p(c, "order")];
            row.extend(times(c, NS_PER_LOOKUP.name));
            row.extend(speeds(c, NS_PER_LOOKUP.name));
            row.extend(RANGE_TABLES.iter().map(|i| {
                find(records, c, i, MEM_BYTES_PER_RANGE.name)
                    .map_or("-".into(), |r| fmt_bytes(r.value))
            }));
            loads.push(row);
        }
        let mut cols: Vec<String> = vec!["ranges".into()];
        cols.extend(speed_cols);
        let mut finds = Table::new(
            "maple-scale: find ns (the first range ending at or after a random index), and the maple tree's speed vs each peer (ascending build)",
            &cols.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        for c in cases_of(Some("find")) {
            let mut row = vec![p(c, "n")];
            row.extend(times(c, NS_PER_OP.name));
            row.extend(speeds(c, NS_PER_OP.name));
            finds.push(row);
        }
        let mut cols: Vec<String> = vec!["ranges".into(), "size".into()];
        cols.extend(RANGE_TABLES.iter().map(|i| format!("{i} ns")));
        cols.push("bpfmaps area / load".into());
        let mut areas = Table::new(
            "maple-scale: empty_area ns, and the maple tree's against its own load (ascending build)",
            &cols.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        for c in cases_of(Some("empty_area")) {
            let mut row = vec![p(c, "n"), p(c, "size")];
            row.extend(times(c, NS_PER_OP.name));
            let area = find(records, c, "bpfmaps", NS_PER_OP.name);
            let load_case = case(&[("n", &p(c, "n")), ("order", &"ascending")]);
            let load = find(records, &load_case, "bpfmaps", NS_PER_LOOKUP.name);
            row.push(match (area, load) {
                (Some(a), Some(l)) => format!("{:.2}x", a.value / l.value),
                _ => "-".into(),
            });
            areas.push(row);
        }
        vec![loads, finds, areas]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut ns = LinePlot::new(
            "maple-scale-load",
            "Range-map load time vs ranges stored (shuffled build)",
            "ranges stored (log scale)",
            "ns per load",
        );
        ns.log_x = true;
        let mut mem = LinePlot::new(
            "maple-scale-memory",
            "Bytes per range vs ranges stored (shuffled build, counting allocator)",
            "ranges stored (log scale)",
            "bytes per range",
        );
        mem.log_x = true;
        for imp in RANGE_TABLES {
            let points = |metric: &str| -> Vec<(f64, f64)> {
                records
                    .iter()
                    .filter(|r| {
                        r.impl_name == imp
                            && r.metric == metric
                            && r.param("order") == Some("shuffled")
                    })
                    .filter_map(|r| Some((r.param("n")?.parse().ok()?, r.value)))
                    .collect()
            };
            ns.add(imp, points(NS_PER_LOOKUP.name));
            mem.add(imp, points(MEM_BYTES_PER_RANGE.name));
        }
        let mut plots = vec![ns, mem];
        plots.retain(|p| !p.is_empty());
        plots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run: every map agrees (the suite asserts it), and the tables
    /// and plots build from the records.
    #[test]
    fn runs_small() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let args = ["--ranges", "50,3000", "--loads", "512"];
        let records = crate::suites::run_quick("maple-scale", &args, no_data);
        let suite = crate::suites::by_name("maple-scale").unwrap();
        assert_eq!(suite.summaries(&records).len(), 3);
        assert!(!suite.plots(&records).is_empty());
        for imp in RANGE_TABLES {
            let ns = find(&records, "n=3000,order=shuffled", imp, NS_PER_LOOKUP.name);
            assert!(ns.is_some_and(|r| r.value > 0.0), "{imp}");
        }
    }

    #[test]
    fn the_layout_is_disjoint_with_gaps() {
        let ranges = layout(5000);
        assert!(ranges.windows(2).all(|w| w[0].1 + 8 < w[1].0));
        assert!(ranges.windows(2).any(|w| w[1].0 - w[0].1 > 4096));
    }
}

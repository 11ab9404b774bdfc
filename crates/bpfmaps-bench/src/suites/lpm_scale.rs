//! `lpm-scale`: lookup cost and memory per prefix against the number of
//! prefixes stored, from 1 to 1M.
//!
//! Varies: the entry count N and the implementation. Holds fixed: the
//! prefixes (the first N of the real IPv4 table in a fixed shuffled order,
//! topped up from the RIS peer's table past its 901,899; generated /8-/32
//! prefixes if the data is absent), the lookup addresses (2^20 random
//! addresses inside the N stored prefixes, drawn once per N and shared by
//! every implementation), u32 values, one thread. At each N every
//! implementation is built first and kept; their lookups are then timed in
//! turns (one repetition of each at a time).

use clap::Args;

use crate::lpm_tables::{
    Answers, AnyLpm, BATCH, LpmStep, LpmTable, build, check_agreement, each_lpm, lpm_names, roles,
};
use crate::measure::{rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::prefixes::{Prefix, V4, addrs_inside};
use crate::record::{
    LPM_DISAGREEMENTS, MEM_BYTES_PER_PREFIX, MEM_REPORTED_PER_PREFIX, NS_PER_LOOKUP, Record, case,
    find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite, fmt_bytes};
use crate::suites::lpm_data::{SEED, ipv4_prefixes};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct LpmScale;

/// `lpm-scale` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Entry counts [quick: 1,10000,1000000; full: 1,100,10000,100000,500000,1000000].
    #[arg(long, value_delimiter = ',')]
    entries: Vec<usize>,
    /// Lookup addresses per entry count (rounded up to whole batches of 256).
    #[arg(long, default_value_t = 1 << 20)]
    addrs: usize,
    /// Skip prefix-trie and ip_network_table.
    #[arg(long)]
    no_peers: bool,
}

fn case_of(n: usize) -> String {
    case(&[("n", &n)])
}

/// One entry count: the prefixes and the addresses probed.
struct Scale<'a> {
    ctx: &'a Ctx,
    n: usize,
    prefixes: &'a [Prefix<V4>],
    addrs: Vec<[u8; 4]>,
}

/// One implementation, built and kept for the lookup timing.
struct Kept {
    table: Box<dyn AnyLpm<V4>>,
    /// Bytes held after building.
    held: usize,
    /// `memory_usage()`, if the table keeps one.
    reported: Option<usize>,
    /// Disagreements with the kernel port.
    bad: usize,
}

impl LpmStep<V4> for Scale<'_> {
    type Out = Kept;
    type Reference = Answers;

    /// Builds `T` and compares its answers with `reference`.
    fn step<T: LpmTable<V4> + Sync + 'static>(
        &self,
        reference: Option<&Answers>,
    ) -> (Kept, Answers) {
        let built = build::<V4, T>(self.prefixes);
        let t = built.table;
        assert_eq!(t.count(), self.n, "{}: prefixes lost", T::NAME);
        let got = Answers::of::<V4, T>(&t, &self.addrs);
        let c = case_of(self.n);
        let bad = reference.map_or(0, |r| check_agreement(self.ctx, &c, T::NAME, &got, r));
        self.ctx.step();
        let kept = Kept {
            reported: t.reported(),
            table: Box::new(t),
            held: built.held,
            bad,
        };
        (kept, got)
    }
}

impl Scale<'_> {
    /// Times the lookups of every kept table interleaved; returns each
    /// one's records.
    fn measure(&self, kept: &[Kept]) -> Vec<Record> {
        // Tables dropped at the previous entry count may still be being
        // freed.
        settle_reaper();
        let rates = {
            let mut loops: Vec<_> = kept.iter().map(|k| k.table.lookups(&self.addrs)).collect();
            rate_samples_interleaved(self.ctx.plan(), &mut loops)
        };
        let c = case_of(self.n);
        let s = self.ctx.suite();
        let per = |bytes: usize| bytes as f64 / self.n as f64;
        let mut recs = Vec::new();
        for (k, samples) in kept.iter().zip(rates) {
            let name = k.table.name();
            recs.push(Record::stats(
                s,
                &c,
                name,
                &NS_PER_LOOKUP,
                Stats::inverse_of(&samples, 1e9),
            ));
            recs.push(Record::single(
                s,
                &c,
                name,
                &MEM_BYTES_PER_PREFIX,
                per(k.held),
            ));
            if let Some(rep) = k.reported {
                recs.push(Record::single(
                    s,
                    &c,
                    name,
                    &MEM_REPORTED_PER_PREFIX,
                    per(rep),
                ));
            }
            recs.push(Record::single(
                s,
                &c,
                name,
                &LPM_DISAGREEMENTS,
                k.bad as f64,
            ));
        }
        self.ctx.step();
        self.ctx.print(&recs);
        recs
    }
}

impl Suite for LpmScale {
    type Opts = Opts;
    const NAME: &'static str = "lpm-scale";
    const ABOUT: &'static str =
        "LPM lookup ns and bytes per prefix vs prefixes stored (1 to 1M real IPv4 prefixes)";

    const DESCRIBE: &'static str = "The first N prefixes of the real IPv4 table (`lpm/prefixes_ipv4.txt.gz`, \
         901,899 prefixes) in a fixed shuffled order; past 901,899 the set is \
         topped up with the prefixes of the RIS AS3333 table \
         (`lpm/ris/ris_as3333_initial_ipv4.txt.gz`) not already in it, and with \
         generated ones if that is absent too (generated /8-/32 prefixes stand \
         in for everything when the table is absent; the run says which). Each \
         table is built by inserting the N prefixes in that order with u32 \
         values. Lookups: 2^20 random addresses inside the stored prefixes \
         (a stored prefix picked uniformly, host bits random), drawn once per N \
         and shared by all implementations, looked up back to back (one guard \
         per 256 lookups for bpfmaps and the kernel port); the summed values \
         must match the kernel port's. At each N every implementation is built \
         first and kept; then their lookups are timed in turns (interleaved): \
         one repetition of each implementation at a time, the one going first \
         rotating, each turn after an untimed quarter-length warm-up of its \
         own, so that load drifting on the machine falls on all of them \
         alike. Memory: bytes the building thread holds \
         afterwards (counting allocator) per prefix; `reported` is \
         `memory_usage()` per prefix. At tiny N memory per prefix is the \
         structure's fixed cost (bpfmaps' first 4 KiB arena chunk and its route table), give or \
         take a few dozen bytes of the epoch collector's own bookkeeping.";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let mut entries = if !opts.entries.is_empty() {
            opts.entries
        } else if ctx.quick() {
            vec![1, 10_000, 1_000_000]
        } else {
            vec![1, 100, 10_000, 100_000, 500_000, 1_000_000]
        };
        entries.retain(|&n| n > 0);
        entries.sort_unstable();
        entries.dedup();
        let Some(&most) = entries.last() else {
            ctx.note("lpm-scale: no entry count; nothing to do");
            return Vec::new();
        };
        let set = ipv4_prefixes(ctx, most);
        ctx.note(&format!("lpm-scale: prefixes: {}", set.source));
        let addr_count = opts.addrs.max(1).div_ceil(BATCH) * BATCH;
        let roles = roles(!opts.no_peers);
        let impls = lpm_names(roles).len();
        // Per entry count: each implementation's build, then the lookups.
        ctx.set_steps((entries.len() * (impls + 1)) as u64);

        let mut all = Vec::new();
        for &n in &entries {
            let n = n.min(set.prefixes.len());
            let prefixes = &set.prefixes[..n];
            let scale = Scale {
                ctx,
                n,
                prefixes,
                addrs: addrs_inside(prefixes, addr_count, SEED + n as u64),
            };
            // Every implementation built and kept, then their lookups
            // timed in turns.
            let kept = each_lpm(&scale, roles, None);
            all.extend(scale.measure(&kept));
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        let n_of = |c: &str| crate::record::case_value(c, "n").to_string();

        let impls = lpm_names(roles(true));
        let others = impls.iter().filter(|&&i| i != "kernel");
        let mut speed_cols: Vec<String> = vec!["prefixes".into()];
        speed_cols.extend(impls.iter().map(|i| format!("{i} ns")));
        speed_cols.extend(others.clone().map(|i| format!("{i}/kernel")));
        speed_cols.push("bpfmaps/prefix-trie".into());
        let mut speed = Table::new(
            "lpm-scale: lookup ns and speed vs the kernel port",
            &speed_cols.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .with_note("Speed ratios (time of the denominator / time): above 1 means faster.");
        let mut mem_cols: Vec<&str> = vec!["prefixes"];
        mem_cols.extend(&impls);
        mem_cols.extend([
            "bpfmaps reported",
            "kernel reported",
            "bpfmaps/kernel",
            "bpfmaps/prefix-trie",
        ]);
        let mut mem = Table::new(
            "lpm-scale: bytes per prefix (counting allocator) and vs the kernel port",
            &mem_cols,
        )
        .with_note("Memory ratios: below 1 means smaller than the denominator.");
        for c in cases {
            let ns = |imp: &str| find(records, c, imp, NS_PER_LOOKUP.name);
            let ns_cell = |imp: &str| ns(imp).map_or("-".into(), |r| format!("{:.1}", r.value));
            let mut row = vec![n_of(c)];
            row.extend(impls.iter().map(|i| ns_cell(i)));
            row.extend(
                others
                    .clone()
                    .map(|i| fmt_ratio(ratio(ns("kernel"), ns(i)))),
            );
            row.push(fmt_ratio(ratio(ns("prefix-trie"), ns("bpfmaps"))));
            speed.push(row);
            let m = |imp: &str| find(records, c, imp, MEM_BYTES_PER_PREFIX.name);
            let cell = |r: Option<&Record>| r.map_or("-".into(), |r| fmt_bytes(r.value));
            let mut row = vec![n_of(c)];
            row.extend(impls.iter().map(|i| cell(m(i))));
            row.extend([
                cell(find(records, c, "bpfmaps", MEM_REPORTED_PER_PREFIX.name)),
                cell(find(records, c, "kernel", MEM_REPORTED_PER_PREFIX.name)),
                fmt_ratio(ratio(m("bpfmaps"), m("kernel"))),
                fmt_ratio(ratio(m("bpfmaps"), m("prefix-trie"))),
            ]);
            mem.push(row);
        }
        vec![speed, mem]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let points = |imp: &str, metric: &str| -> Vec<(f64, f64)> {
            records
                .iter()
                .filter(|r| r.impl_name == imp && r.metric == metric)
                .filter_map(|r| Some((r.param("n")?.parse().ok()?, r.value)))
                .collect()
        };
        let mut ns = LinePlot::new(
            "lpm-scale-lookup",
            "LPM lookup time vs prefixes stored (IPv4, addresses inside stored prefixes)",
            "prefixes stored (log scale)",
            "ns per lookup",
        );
        ns.log_x = true;
        // The kernel port's line dwarfs the others at 1M: the same chart
        // without it.
        let mut fast = LinePlot::new(
            "lpm-scale-lookup-fast",
            "LPM lookup time vs prefixes stored, without the kernel port",
            "prefixes stored (log scale)",
            "ns per lookup",
        );
        fast.log_x = true;
        let mut mem = LinePlot::new(
            "lpm-scale-memory",
            "Bytes per prefix vs prefixes stored (counting allocator)",
            "prefixes stored (log scale)",
            "bytes per prefix",
        );
        mem.log_x = true;
        for imp in lpm_names(roles(true)) {
            ns.add(imp, points(imp, NS_PER_LOOKUP.name));
            if imp != "kernel" {
                fast.add(imp, points(imp, NS_PER_LOOKUP.name));
            }
            // Tiny tables are dominated by fixed costs (a first arena
            // chunk): plot from 100 prefixes on.
            mem.add(
                imp,
                points(imp, MEM_BYTES_PER_PREFIX.name)
                    .into_iter()
                    .filter(|&(n, _)| n >= 100.0)
                    .collect(),
            );
        }
        let mut plots = vec![ns, fast, mem];
        plots.retain(|p| !p.is_empty());
        plots
    }
}

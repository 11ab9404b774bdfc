//! `lpm-real`: the full real IPv4 and IPv6 tables: build time, memory per
//! prefix, lookups per second and walks over the whole table (keys per
//! second), for bpfmaps, the kernel port and the peers `prefix-trie` and
//! `ip_network_table`.
//!
//! Varies: the family and the lookup addresses. Holds fixed: the table
//! (all of `lpm/prefixes_ipv4.txt.gz` or `lpm/prefixes_ipv6.txt.gz`,
//! inserted in file order with u32 values), two lookup sets of 2^20
//! addresses drawn once and shared by every implementation: `random`
//! (uniform over the IPv4 space; IPv6 inside 2000::/3) and `inside`
//! (inside a stored prefix picked uniformly). All implementations of a
//! family are built first and kept; their lookups are then timed in turns
//! (one repetition of each at a time), so that machine load drifting over
//! the run does not favour whichever ran in the quiet seconds. The walks
//! are timed the same way, one whole walk per batch.

use bpfmaps::lpm::{IpLpm, LpmTrie};
use clap::Args;

use crate::lpm_tables::{
    ALL_ROLES, Answers, AnyLpm, BATCH, LpmStep, LpmTable, MAX_ENTRIES, Role, Walk, build,
    check_agreement, each_lpm, lpm_names, roles, value_of,
};
use crate::measure::{rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::prefixes::{
    Family, IPV4_TABLE, IPV6_TABLE, Prefix, V4, V6, addrs_inside, addrs_random, generate,
};
use crate::record::{
    BUILD_MS, KEYS_PER_SEC, LOOKUPS_PER_SEC, LPM_DISAGREEMENTS, MEM_BYTES_PER_PREFIX,
    MEM_LIVE_PER_PREFIX, MEM_REPORTED_PER_PREFIX, Record, case, case_param, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::suites::lpm_churn;
use crate::suites::lpm_data::{SEED, generated_ipv4, load};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct LpmReal;

/// `lpm-real` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Lookup addresses per set (rounded up to whole batches of 256).
    #[arg(long, default_value_t = 1 << 20)]
    addrs: usize,
    /// Timed builds per implementation [quick: 1; full: 3].
    #[arg(long)]
    builds: Option<usize>,
    /// Families to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("ipv4"), String::from("ipv6")])]
    families: Vec<String>,
    /// Skip prefix-trie and ip_network_table.
    #[arg(long)]
    no_peers: bool,
    /// Rounds of removing and re-inserting a random fifth, for memory after
    /// churn [quick: 2; full: 5; 0: no memory measurements].
    #[arg(long)]
    churn_rounds: Option<usize>,
}

/// Lookup sets.
const SETS: [&str; 2] = ["random", "inside"];

/// One family's table and lookup sets.
struct Real<'a, F: Family> {
    ctx: &'a Ctx,
    prefixes: Vec<Prefix<F>>,
    base: String,
    sets: [Vec<F::Addr>; 2],
    builds: usize,
}

/// One implementation, built and kept for the lookup timing.
struct Kept<F: Family> {
    table: Box<dyn AnyLpm<F>>,
    /// Disagreements with the kernel port per lookup set.
    bad: [usize; 2],
    /// Its records: build and memory now, lookups appended per set.
    recs: Vec<Record>,
}

impl<F: Family> LpmStep<F> for Real<'_, F> {
    type Out = Kept<F>;
    type Reference = [Answers; 2];

    /// Builds `T` (`builds` times, keeping the last), records build time
    /// and memory, and compares its answers for both lookup sets with
    /// `reference`.
    fn step<T: LpmTable<F> + Sync + 'static>(
        &self,
        reference: Option<&[Answers; 2]>,
    ) -> (Kept<F>, [Answers; 2]) {
        let s = self.ctx.suite();
        let n = self.prefixes.len();
        let mut times = Vec::new();
        let mut built = None;
        for _ in 0..self.builds {
            drop(built.take());
            let b = build::<F, T>(&self.prefixes);
            times.push(b.time.as_secs_f64() * 1e3);
            built = Some(b);
        }
        let built = built.expect("at least one build");
        let t = built.table;
        assert_eq!(t.count(), n, "{}: prefixes lost", T::NAME);
        let per = |bytes: usize| bytes as f64 / n as f64;
        let mut recs = vec![
            Record::stats(
                s,
                &self.base,
                T::NAME,
                &BUILD_MS,
                Stats::from_samples(&times),
            ),
            Record::single(
                s,
                &self.base,
                T::NAME,
                &MEM_BYTES_PER_PREFIX,
                per(built.held),
            ),
        ];
        for (metric, bytes) in [
            (&MEM_REPORTED_PER_PREFIX, t.reported()),
            (&MEM_LIVE_PER_PREFIX, t.live()),
        ] {
            if let Some(bytes) = bytes {
                recs.push(Record::single(s, &self.base, T::NAME, metric, per(bytes)));
            }
        }
        let answers = [0, 1].map(|i| Answers::of::<F, T>(&t, &self.sets[i]));
        let bad = [0, 1].map(|i| {
            reference.map_or(0, |r| {
                let c = format!("{},addrs={}", self.base, SETS[i]);
                check_agreement(self.ctx, &c, T::NAME, &answers[i], &r[i])
            })
        });
        self.ctx.step();
        self.ctx.print(&recs);
        let kept = Kept {
            table: Box::new(t),
            bad,
            recs,
        };
        (kept, answers)
    }
}

impl<F: Family> Real<'_, F> {
    /// Builds every implementation in turn, keeping each, then times the
    /// lookups of all of them interleaved, one lookup set at a time.
    fn run(&self, peers: bool) -> Vec<Record> {
        let roles = if peers {
            ALL_ROLES
        } else {
            &[Role::Kernel, Role::Bpfmaps, Role::Api]
        };
        let mut kept = each_lpm(self, roles, None);
        // Earlier builds dropped by `build` may still be being freed.
        settle_reaper();
        let s = self.ctx.suite();
        for (i, set) in SETS.iter().enumerate() {
            let c = format!("{},addrs={set}", self.base);
            let rates = {
                let mut loops: Vec<_> = kept
                    .iter()
                    .map(|k| k.table.lookups(&self.sets[i]))
                    .collect();
                rate_samples_interleaved(self.ctx.plan(), &mut loops)
            };
            let mut printed = Vec::new();
            for (k, samples) in kept.iter_mut().zip(rates) {
                let name = k.table.name();
                let recs = [
                    Record::stats(s, &c, name, &LOOKUPS_PER_SEC, Stats::from_samples(&samples)),
                    Record::single(s, &c, name, &LPM_DISAGREEMENTS, k.bad[i] as f64),
                ];
                k.recs.extend_from_slice(&recs);
                printed.extend(recs);
            }
            self.ctx.step();
            self.ctx.print(&printed);
        }
        let walks = self.walks(&kept);
        // Per implementation, as the report lists them; then the walks.
        kept.into_iter().flat_map(|k| k.recs).chain(walks).collect()
    }

    /// Times every implementation's walks over the whole table (and the
    /// typed table's `iter`, built here) in turns, one whole walk per
    /// batch, after checking that each sees every prefix and that the
    /// `get_next_key` walks give the kernel port's keys in its order.
    fn walks(&self, kept: &[Kept<F>]) -> Vec<Record> {
        let s = self.ctx.suite();
        let n = self.prefixes.len() as u64;
        let typed = typed_table(&self.prefixes);
        let mut walks: Vec<(&str, Walk<'_>)> = kept
            .iter()
            .flat_map(|k| k.table.walks().into_iter().map(|w| (k.table.name(), w)))
            .collect();
        walks.push((
            <LpmTrie as LpmTable<F>>::NAME,
            Walk::new("iter", || {
                let (mut count, mut sum) = (0u64, 0u64);
                for (p, v) in typed.iter() {
                    count += 1;
                    sum += u64::from(v) + u64::from(prefix_trie::Prefix::prefix_len(&p) as u32);
                }
                (count, sum)
            }),
        ));
        let seen: Vec<_> = walks.iter_mut().map(|(_, w)| (w.run)()).collect();
        let kernel_keys = walks
            .iter()
            .zip(&seen)
            .find(|((name, w), _)| *name == "kernel" && w.api == CONTRACT)
            .map(|(_, &seen)| seen);
        let mut bad = vec![0; walks.len()];
        for (i, ((name, w), &(count, digest))) in walks.iter().zip(&seen).enumerate() {
            if count != n {
                self.ctx.note(&format!(
                    "WARNING: {name}'s {} walk saw {count} of {n} prefixes ({})",
                    w.api, self.base
                ));
                bad[i] = 1;
            }
            if w.api == CONTRACT && kernel_keys.is_some_and(|k| k != (count, digest)) {
                self.ctx.note(&format!(
                    "WARNING: {name}'s get_next_key walk differs from kernel's ({})",
                    self.base
                ));
                bad[i] = 1;
            }
        }
        let rates = {
            let mut loops: Vec<_> = walks
                .iter_mut()
                .map(|(_, w)| {
                    let run = &mut w.run;
                    move || run().0
                })
                .collect();
            rate_samples_interleaved(self.ctx.plan(), &mut loops)
        };
        let mut recs = Vec::new();
        for (((name, w), samples), bad) in walks.iter().zip(rates).zip(bad) {
            let c = format!("{},walk={}", self.base, w.api);
            recs.push(Record::stats(
                s,
                &c,
                name,
                &KEYS_PER_SEC,
                Stats::from_samples(&samples),
            ));
            if w.api == CONTRACT {
                recs.push(Record::single(s, &c, name, &LPM_DISAGREEMENTS, bad as f64));
            }
        }
        self.ctx.step();
        self.ctx.print(&recs);
        recs
    }
}

/// The walk through the byte contract, the one the kernel port has.
const CONTRACT: &str = "get_next_key";

/// The typed table (`IpLpm`) of the prefixes, for its `iter`.
fn typed_table<F: Family>(prefixes: &[Prefix<F>]) -> IpLpm<F::Net, u32> {
    let t = IpLpm::new(MAX_ENTRIES).expect("creating the typed table");
    for (i, p) in prefixes.iter().enumerate() {
        t.insert(F::net(p), value_of(i)).expect("insert");
    }
    t
}

/// Runs one family on its real table, or on `fallback()` with a note.
fn family<F: Family>(
    ctx: &Ctx,
    opts: &Opts,
    rel: &str,
    fallback: impl FnOnce() -> Vec<Prefix<F>>,
    fallback_desc: &str,
) -> Vec<Record> {
    let (prefixes, src) = match load::<F>(ctx, rel) {
        Some(v) => (v, "real"),
        None => {
            let v = fallback();
            ctx.note(&format!(
                "lpm-real: skipping the real {} table; running on {} {fallback_desc} instead",
                F::NAME,
                v.len()
            ));
            (v, "generated")
        }
    };
    let count = opts.addrs.max(1).div_ceil(BATCH) * BATCH;
    let real = Real {
        ctx,
        base: case(&[("family", &F::NAME), ("n", &prefixes.len()), ("src", &src)]),
        sets: [
            addrs_random::<F>(count, SEED + 1),
            addrs_inside(&prefixes, count, SEED + 2),
        ],
        prefixes,
        builds: opts
            .builds
            .unwrap_or(if ctx.quick() { 1 } else { 3 })
            .max(1),
    };
    let mut recs = real.run(!opts.no_peers);
    let rounds = opts
        .churn_rounds
        .unwrap_or(if ctx.quick() { 2 } else { lpm_churn::ROUNDS });
    if rounds > 0 {
        let table = format!("{}-{src}", F::NAME);
        let churn = lpm_churn::Churn::<F> {
            suite: ctx.suite(),
            trace: &table,
            initial: &real.prefixes,
            mutations: &[],
            rounds,
        };
        let churned: Vec<Record> = each_lpm(&churn, roles(!opts.no_peers), Some(())).concat();
        ctx.print(&churned);
        recs.extend(churned);
    }
    recs
}

impl Suite for LpmReal {
    type Opts = Opts;
    const NAME: &'static str = "lpm-real";
    const ABOUT: &'static str = "the full real IPv4/IPv6 tables: build ms, bytes per prefix, lookups/s (random and inside addresses), whole walks keys/s";

    const DESCRIBE: &'static str = "The whole real table, IPv4 (`lpm/prefixes_ipv4.txt.gz`, 901,899 \
         prefixes) and IPv6 (`lpm/prefixes_ipv6.txt.gz`, 160,147), each built \
         by inserting every prefix in file order (sorted by address) with u32 \
         values; if a file is absent the run says so and uses generated \
         prefixes (IPv4 /8-/32, IPv6 /16-/64 inside 2000::/3; `src=generated` \
         in the case). `build_ms` is the time of the inserts; memory is what \
         the building thread holds afterwards (counting allocator) per prefix. \
         Lookups: two sets of 2^20 addresses drawn once and shared by every \
         implementation: `random` (uniform over IPv4; IPv6 inside 2000::/3, so \
         many miss or stop at a short prefix) and `inside` (inside a stored \
         prefix picked uniformly, host bits random); looked up back to back, \
         one guard per 256 lookups for bpfmaps and the kernel port. \
         `bpfmaps` looks up with `get_as::<u32>` (the value copied out as a \
         u32, so the caller's match/miss test can be a conditional move); \
         `bpfmaps-get` is the same trie (built again) looked up with `get` \
         (the value as bytes: the caller branches on the match); \
         `bpfmaps-get_many_as` is the same trie looked up 256 addresses per \
         `get_many_as::<u32>` call, which overlaps their cache misses in \
         stages (what a dataplane handling packets in bursts would call); the \
         others look up one address per call. The summed \
         values must match the kernel port's. Every implementation of a family \
         is built first and kept; then, per lookup set, their lookups are \
         timed in turns (interleaved): one repetition of each implementation \
         at a time, the one going first rotating, each turn after an untimed \
         quarter-length warm-up of its own, so that load drifting on the \
         machine falls on all of them alike. \
         Walks (`walk=` cases, `keys_per_sec`): whole walks over the table, \
         one per batch, timed in turns in the same way: `get_next_key` walks \
         the byte contract from no key until `ENOENT` (`Map::get_next_key`, \
         as `bpftool map dump` does: bpfmaps and the kernel port, whose keys \
         and order must agree); `for_each` is `LpmTrie::for_each` under one \
         guard; `iter` is bpfmaps' typed `Ipv4Lpm`/`Ipv6Lpm::iter` (a table \
         built again through that API) and the peers' own iterators. Each \
         walk must see every prefix.";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let impls = lpm_names(if opts.no_peers {
            &ALL_ROLES[..3]
        } else {
            ALL_ROLES
        })
        .len();
        let run_v4 = opts.families.iter().any(|f| f == "ipv4");
        let run_v6 = opts.families.iter().any(|f| f == "ipv6");
        // Per family: each implementation's build, each lookup set, the
        // walks.
        let steps = (usize::from(run_v4) + usize::from(run_v6)) * (impls + SETS.len() + 1);
        ctx.set_steps(steps as u64);
        let mut all = Vec::new();
        if run_v4 {
            all.extend(family::<V4>(
                ctx,
                &opts,
                IPV4_TABLE,
                || generated_ipv4(900_000),
                "generated IPv4 prefixes (/8-/32)",
            ));
        }
        if run_v6 {
            all.extend(family::<V6>(
                ctx,
                &opts,
                IPV6_TABLE,
                || generate(160_000, 16..=64, SEED),
                "generated IPv6 prefixes (/16-/64 inside 2000::/3)",
            ));
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut bases: Vec<&str> = records
            .iter()
            .filter(|r| r.metric == BUILD_MS.name)
            .map(|r| r.case.as_str())
            .collect();
        bases.dedup();
        let mut tables = Vec::new();
        let mut vs_pt = Table::new(
            "lpm-real: bpfmaps vs prefix-trie",
            &[
                "table",
                "random get_as",
                "inside get_as",
                "random get",
                "inside get",
                "random get_many_as",
                "inside get_many_as",
                "build",
                "memory",
            ],
        )
        .with_note(
            "Speed ratios bpfmaps/prefix-trie (above 1: bpfmaps faster); memory \
             bpfmaps/prefix-trie (below 1: bpfmaps smaller).",
        );
        for base in bases {
            let get = |c: &str, imp: &str, m: &str| find(records, c, imp, m);
            let set = |s: &str| format!("{base},addrs={s}");
            let mut t = Table::new(
                format!("lpm-real {base}"),
                &[
                    "impl",
                    "build ms",
                    "bytes/prefix",
                    "live B/prefix",
                    "random M/s",
                    "inside M/s",
                    "build vs kernel",
                    "memory vs kernel",
                    "random vs kernel",
                    "inside vs kernel",
                ],
            )
            .with_note(
                "Lookups per second (millions); speed ratios above 1 mean faster \
                 than the kernel port, the memory ratio below 1 smaller.",
            );
            for imp in lpm_names(ALL_ROLES) {
                let build = get(base, imp, BUILD_MS.name);
                let mem = get(base, imp, MEM_BYTES_PER_PREFIX.name);
                if build.is_none() {
                    continue;
                }
                let look = |s: &str, i: &str| get(&set(s), i, LOOKUPS_PER_SEC.name);
                t.push(vec![
                    imp.to_string(),
                    build.map_or("-".into(), |r| format!("{:.0}", r.value)),
                    mem.map_or("-".into(), |r| format!("{:.1} B", r.value)),
                    get(base, imp, MEM_LIVE_PER_PREFIX.name)
                        .map_or("-".into(), |r| format!("{:.1} B", r.value)),
                    fmt_mops(look("random", imp).map(|r| r.value)),
                    fmt_mops(look("inside", imp).map(|r| r.value)),
                    fmt_ratio(ratio(get(base, "kernel", BUILD_MS.name), build)),
                    fmt_ratio(ratio(mem, get(base, "kernel", MEM_BYTES_PER_PREFIX.name))),
                    fmt_ratio(ratio(look("random", imp), look("random", "kernel"))),
                    fmt_ratio(ratio(look("inside", imp), look("inside", "kernel"))),
                ]);
            }
            tables.push(t);
            let walk = format!("{base},walk=");
            let kernel_walk = get(&format!("{walk}{CONTRACT}"), "kernel", KEYS_PER_SEC.name);
            let mut t = Table::new(
                format!("lpm-real {base}: walks"),
                &["impl", "walk", "keys M/s", "vs kernel get_next_key"],
            )
            .with_note(
                "Whole walks over the table: prefixes returned per second (millions); \
                 the ratio is against the kernel port's get_next_key walk (above 1: \
                 faster).",
            );
            for r in records
                .iter()
                .filter(|r| r.metric == KEYS_PER_SEC.name && r.case.starts_with(&walk))
            {
                t.push(vec![
                    r.impl_name.clone(),
                    case_param(&r.case, "walk").unwrap_or("-").to_string(),
                    fmt_mops(Some(r.value)),
                    fmt_ratio(ratio(Some(r), kernel_walk)),
                ]);
            }
            if !t.rows.is_empty() {
                tables.push(t);
            }
            let look = |s: &str, i: &str| get(&set(s), i, LOOKUPS_PER_SEC.name);
            if look("random", "prefix-trie").is_some() {
                let mut row = vec![base.to_string()];
                for imp in lpm_names(&[Role::Bpfmaps, Role::Api]) {
                    for s in SETS {
                        row.push(fmt_ratio(ratio(look(s, imp), look(s, "prefix-trie"))));
                    }
                }
                row.extend([
                    fmt_ratio(ratio(
                        get(base, "prefix-trie", BUILD_MS.name),
                        get(base, "bpfmaps", BUILD_MS.name),
                    )),
                    fmt_ratio(ratio(
                        get(base, "bpfmaps", MEM_BYTES_PER_PREFIX.name),
                        get(base, "prefix-trie", MEM_BYTES_PER_PREFIX.name),
                    )),
                ]);
                vs_pt.push(row);
            }
        }
        if !vs_pt.rows.is_empty() {
            tables.push(vs_pt);
        }
        tables.extend(lpm_churn::summary(
            Self::NAME,
            records,
            &lpm_names(roles(true)),
        ));
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        lpm_churn::plots(Self::NAME, records, &lpm_names(roles(true)))
    }
}

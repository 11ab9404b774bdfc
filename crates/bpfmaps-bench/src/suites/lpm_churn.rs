//! Memory after churn, for `lpm-updates`: what each implementation holds
//! after the day's replay and after rounds of removing a random fifth of
//! the initial table and inserting it again, each next to a fresh build of
//! the same set. A fresh build's figure is true of a table only until its
//! first churn: a router's table is never fresh.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::alloc::MemProbe;
use crate::lpm_tables::{LpmStep, LpmTable, build, flush_deferred};
use crate::plot::LinePlot;
use crate::prefixes::{Mutation, Prefix, V4};
use crate::record::{
    MEM_BYTES_PER_PREFIX, MEM_LIVE_PER_PREFIX, MEM_REPORTED_PER_PREFIX, Record, case, case_param,
    find,
};
use crate::suites::lpm_data::SEED;
use crate::table::{Table, fmt_ratio};

/// Rounds of remove-and-reinsert after the initial build.
pub const ROUNDS: usize = 5;

/// The churn of one trace, run on each implementation in turn.
pub struct Churn<'a> {
    pub suite: &'static str,
    pub trace: &'a str,
    pub initial: &'a [Prefix<V4>],
    pub mutations: &'a [Mutation<V4>],
    pub rounds: usize,
}

impl Churn<'_> {
    fn case(&self, churn: &str, round: usize, build: &str) -> String {
        case(&[
            ("trace", &self.trace),
            ("churn", &churn),
            ("round", &round),
            ("build", &build),
        ])
    }

    /// The prefixes stored after the replay.
    fn final_set(&self) -> Vec<Prefix<V4>> {
        let mut set: HashSet<Prefix<V4>> = self.initial.iter().copied().collect();
        for m in self.mutations {
            if m.announce {
                set.insert(m.prefix);
            } else {
                set.remove(&m.prefix);
            }
        }
        let mut out: Vec<_> = set.into_iter().collect();
        out.sort();
        out
    }
}

/// Lets deferred frees run until the table's own account of its memory
/// stops changing (bpfmaps gives a compaction's old chunks back after a
/// grace period), for at most two seconds.
fn settle<T: LpmTable<V4>>(t: &T) {
    flush_deferred();
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut last, mut same) = (t.reported(), 0);
    while t.reported().is_some() && same < 20 && Instant::now() < deadline {
        flush_deferred();
        std::thread::sleep(Duration::from_millis(1));
        let now = t.reported();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
}

/// The records of a table's memory per prefix: held (counting allocator,
/// since `probe` started), reported and live where it says.
fn memory<T: LpmTable<V4>>(suite: &str, case: &str, t: &T, probe: &MemProbe) -> Vec<Record> {
    settle(t);
    let n = t.count().max(1) as f64;
    let mut out = vec![Record::single(
        suite,
        case,
        T::NAME,
        &MEM_BYTES_PER_PREFIX,
        probe.held() as f64 / n,
    )];
    let own = [
        (&MEM_REPORTED_PER_PREFIX, t.reported()),
        (&MEM_LIVE_PER_PREFIX, t.live()),
    ];
    for (metric, bytes) in own {
        if let Some(b) = bytes {
            out.push(Record::single(suite, case, T::NAME, metric, b as f64 / n));
        }
    }
    out
}

impl LpmStep<V4> for Churn<'_> {
    type Out = Vec<Record>;
    type Reference = ();

    fn step<T: LpmTable<V4> + Sync + 'static>(&self, _: Option<&()>) -> (Vec<Record>, ()) {
        let s = self.suite;
        let mut recs = Vec::new();
        // The replay, and a fresh build of what it leaves.
        {
            let probe = MemProbe::start();
            let mut t = build::<V4, T>(self.initial).table;
            for m in self.mutations {
                if m.announce {
                    t.insert(&m.prefix, m.value);
                } else {
                    t.remove(&m.prefix);
                }
            }
            recs.extend(memory(s, &self.case("replay", 1, "churned"), &t, &probe));
        }
        {
            let probe = MemProbe::start();
            let t = build::<V4, T>(&self.final_set()).table;
            recs.extend(memory(s, &self.case("replay", 1, "fresh"), &t, &probe));
        }
        // Rounds of a random fifth out and back in (new values); round 0 is
        // the fresh build, of the same set as every round.
        // (The shuffled order is allocated first: not the table's memory.)
        let mut rng = StdRng::seed_from_u64(SEED + 11);
        let mut order: Vec<usize> = (0..self.initial.len()).collect();
        let probe = MemProbe::start();
        let mut t = build::<V4, T>(self.initial).table;
        recs.extend(memory(s, &self.case("fifths", 0, "fresh"), &t, &probe));
        for round in 1..=self.rounds {
            order.shuffle(&mut rng);
            let fifth = &order[..order.len() / 5];
            for &i in fifth {
                t.remove(&self.initial[i]);
            }
            for &i in fifth {
                t.insert(&self.initial[i], (round << 24) as u32 ^ i as u32);
            }
            recs.extend(memory(
                s,
                &self.case("fifths", round, "churned"),
                &t,
                &probe,
            ));
        }
        (recs, ())
    }
}

/// Held bytes per prefix after churn, and against a fresh build of the
/// same set (`impls`: the implementations, in column order).
pub fn summary(records: &[Record], impls: &[&str]) -> Option<Table> {
    let churned: Vec<&Record> = records
        .iter()
        .filter(|r| r.metric == MEM_BYTES_PER_PREFIX.name && r.param("build") == Some("churned"))
        .collect();
    if churned.is_empty() {
        return None;
    }
    let fresh_case = |c: &str| {
        let c = c.replace("build=churned", "build=fresh");
        if case_param(&c, "churn") == Some("fifths") {
            let round = format!("round={}", case_param(&c, "round").unwrap_or("0"));
            c.replace(&round, "round=0")
        } else {
            c
        }
    };
    let mut cols = vec!["churn".to_string(), "round".into()];
    cols.extend(impls.iter().map(|i| format!("{i} B/prefix")));
    cols.extend(impls.iter().map(|i| format!("{i} vs fresh")));
    cols.push("bpfmaps live B/prefix".into());
    let mut t = Table::new(
        "lpm-updates: memory after churn",
        &cols.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .with_note(
        "Bytes held per prefix (counting allocator) after the day's replay, and after \
         rounds of removing a random fifth of the initial table and inserting it \
         again; `vs fresh`: held over a fresh build's of the same set (the replay's \
         final set; for the rounds, the initial table), 1.00 is as fresh.",
    );
    let mut cases: Vec<&str> = Vec::new();
    for r in &churned {
        if !cases.contains(&r.case.as_str()) {
            cases.push(&r.case);
        }
    }
    for c in cases {
        let mem = |c: &str, imp: &str| find(records, c, imp, MEM_BYTES_PER_PREFIX.name);
        let mut row = vec![
            case_param(c, "churn").unwrap_or("?").to_string(),
            case_param(c, "round").unwrap_or("?").to_string(),
        ];
        row.extend(
            impls
                .iter()
                .map(|&i| mem(c, i).map_or("-".into(), |r| format!("{:.1}", r.value))),
        );
        let fc = fresh_case(c);
        row.extend(
            impls
                .iter()
                .map(|&i| fmt_ratio(mem(c, i).zip(mem(&fc, i)).map(|(a, b)| a.value / b.value))),
        );
        let live = find(records, c, "bpfmaps", MEM_LIVE_PER_PREFIX.name);
        row.push(live.map_or("-".into(), |r| format!("{:.1}", r.value)));
        t.push(row);
    }
    Some(t)
}

/// Held bytes per prefix after each round of churn, per implementation.
pub fn plot(records: &[Record], impls: &[&str]) -> Option<LinePlot> {
    let mut p = LinePlot::new(
        "lpm-updates-churn-memory",
        "Bytes held per prefix after rounds of removing and re-inserting a random fifth",
        "round (0: fresh build)",
        "bytes per prefix (counting allocator)",
    );
    for &imp in impls {
        let points = records
            .iter()
            .filter(|r| {
                r.impl_name == imp
                    && r.metric == MEM_BYTES_PER_PREFIX.name
                    && r.param("churn") == Some("fifths")
            })
            .filter_map(|r| Some((r.param("round")?.parse().ok()?, r.value)))
            .collect();
        p.add(imp, points);
    }
    (!p.is_empty()).then_some(p)
}

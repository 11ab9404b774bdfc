//! Memory after churn, for `lpm-updates` and `lpm-real`: what each
//! implementation holds after a replay of updates (`lpm-updates`' day of
//! BGP) and after rounds of removing a random fifth of the table and
//! inserting it again, each next to a fresh build of the same set. A
//! fresh build's figure is true of a table only until its first churn: a
//! router's table is never fresh.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::alloc::MemProbe;
use crate::lpm_tables::{LpmStep, LpmTable, build, flush_deferred};
use crate::plot::LinePlot;
use crate::prefixes::{Family, Mutation, Prefix};
use crate::record::{
    MEM_BYTES_PER_PREFIX, MEM_LIVE_PER_PREFIX, MEM_REPORTED_PER_PREFIX, Record, case, case_param,
    case_value, find,
};
use crate::suites::lpm_data::SEED;
use crate::table::{Table, fmt_ratio};

/// Rounds of remove-and-reinsert after the initial build.
pub const ROUNDS: usize = 5;

/// The churn of one table, run on each implementation in turn.
pub struct Churn<'a, F: Family> {
    /// The suite the records belong to.
    pub suite: &'static str,
    /// The table's name in the records (`trace=`).
    pub trace: &'a str,
    /// The table built first.
    pub initial: &'a [Prefix<F>],
    /// Updates replayed onto it (none: no replay).
    pub mutations: &'a [Mutation<F>],
    /// Rounds of a fifth out and back in.
    pub rounds: usize,
}

impl<F: Family> Churn<'_, F> {
    fn case(&self, churn: &str, round: usize, build: &str) -> String {
        case(&[
            ("trace", &self.trace),
            ("churn", &churn),
            ("round", &round),
            ("build", &build),
        ])
    }

    /// The prefixes stored after the replay.
    fn final_set(&self) -> Vec<Prefix<F>> {
        let mut set: HashSet<Prefix<F>> = self.initial.iter().copied().collect();
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
fn settle<F: Family, T: LpmTable<F>>(t: &T) {
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
fn memory<F: Family, T: LpmTable<F>>(
    suite: &str,
    case: &str,
    t: &T,
    probe: &MemProbe,
) -> Vec<Record> {
    settle::<F, T>(t);
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

impl<F: Family> LpmStep<F> for Churn<'_, F> {
    type Out = Vec<Record>;
    type Reference = ();

    fn step<T: LpmTable<F> + Sync + 'static>(&self, _: Option<&()>) -> (Vec<Record>, ()) {
        let s = self.suite;
        let mut recs = Vec::new();
        // The replay, and a fresh build of what it leaves.
        if !self.mutations.is_empty() {
            let probe = MemProbe::start();
            let mut t = build::<F, T>(self.initial).table;
            for m in self.mutations {
                if m.announce {
                    t.insert(&m.prefix, m.value);
                } else {
                    t.remove(&m.prefix);
                }
            }
            recs.extend(memory(s, &self.case("replay", 1, "churned"), &t, &probe));
            drop(t);
            let probe = MemProbe::start();
            let t = build::<F, T>(&self.final_set()).table;
            recs.extend(memory(s, &self.case("replay", 1, "fresh"), &t, &probe));
        }
        // Rounds of a random fifth out and back in (new values); round 0 is
        // the fresh build, of the same set as every round.
        // (The shuffled order is allocated first: not the table's memory.)
        let mut rng = StdRng::seed_from_u64(SEED + 11);
        let mut order: Vec<usize> = (0..self.initial.len()).collect();
        let probe = MemProbe::start();
        let mut t = build::<F, T>(self.initial).table;
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
pub fn summary(suite: &str, records: &[Record], impls: &[&str]) -> Option<Table> {
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
    let mut cols = vec!["table".to_string(), "churn".into(), "round".into()];
    cols.extend(impls.iter().map(|i| format!("{i} B/prefix")));
    cols.extend(impls.iter().map(|i| format!("{i} vs fresh")));
    cols.push("bpfmaps live B/prefix".into());
    let mut t = Table::new(
        format!("{suite}: memory after churn"),
        &cols.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .with_note(
        "Bytes held per prefix (counting allocator) after the replay of updates, and \
         after rounds of removing a random fifth of the table and inserting it \
         again; `vs fresh`: held over a fresh build's of the same set (the replay's \
         final set; for the rounds, the table itself), 1.00 is as fresh.",
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
            case_value(c, "trace").to_string(),
            case_value(c, "churn").to_string(),
            case_value(c, "round").to_string(),
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

/// Per table, held bytes per prefix after each round of churn, per
/// implementation.
pub fn plots(suite: &str, records: &[Record], impls: &[&str]) -> Vec<LinePlot> {
    let fifths =
        |r: &&Record| r.metric == MEM_BYTES_PER_PREFIX.name && r.param("churn") == Some("fifths");
    let mut tables: Vec<&str> = Vec::new();
    for r in records.iter().filter(fifths) {
        let t = case_value(&r.case, "trace");
        if !tables.contains(&t) {
            tables.push(t);
        }
    }
    tables
        .into_iter()
        .map(|table| {
            let mut p = LinePlot::new(
                format!("{suite}-churn-memory-{table}"),
                format!("{table}: bytes held per prefix after rounds of removing and re-inserting a random fifth"),
                "round (0: fresh build)",
                "bytes per prefix (counting allocator)",
            );
            for &imp in impls {
                let points = records
                    .iter()
                    .filter(fifths)
                    .filter(|r| r.impl_name == imp && r.param("trace") == Some(table))
                    .filter_map(|r| Some((r.param("round")?.parse().ok()?, r.value)))
                    .collect();
                p.add(imp, points);
            }
            p
        })
        .filter(|p| !p.is_empty())
        .collect()
}

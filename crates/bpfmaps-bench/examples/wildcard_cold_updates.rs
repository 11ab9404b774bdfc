//! Rule updates on a cold writer: what the `wildcard-classbench` suite's
//! first update pass measures (right after its lookups), without the
//! lookups. Per round: a sweep of 256 MiB (`--sweep-mib`) that evicts the
//! caches and the TLB (the map untouched), then PASSES passes of updates (every tenth
//! rule removed and inserted again); ns per update for each pass, the
//! median and range over the rounds. Pass 0 is the cold one.
//!
//! Why 256 MiB where the machine reports a 32 MiB L3: on this VM a
//! sweep of 64 MiB left the map cached on one of the two cores in one
//! window (its cold pass as fast as the warm one, 0.5 us an update
//! against 0.9 on the other core; docs/benchmarks.md, "Cold updates
//! with a sweep that evicts"): the host's cache behind a core is not
//! the one the VM reports.
//!
//! `cargo run --release -p bpfmaps-bench --example wildcard_cold_updates
//! -- RULE_FILE... [--rounds N] [--passes N] [--sweep-mib N]`, e.g. with
//! `../shared/data/classbench/ipc1_10k.gz` (docs/benchmarks.md, "Cold
//! updates").

use std::time::Instant;

use bpfmaps::wildcard::{WildcardMap, classbench};
use bpfmaps::{BPF_ANY, BPF_NOEXIST};
use bpfmaps_bench::suites::wildcard_classbench;

fn read_text(path: &str) -> String {
    wildcard_classbench::read_text(path.as_ref()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Writes a byte in every line of `mib` MiB: the caches (and the TLB)
/// then hold this buffer, not the map.
fn evict(mib: usize) {
    let mut sweep = vec![1u8; mib << 20];
    for i in (0..sweep.len()).step_by(64) {
        sweep[i] = sweep[i].wrapping_add(1);
    }
    std::hint::black_box(&sweep);
}

fn main() {
    let (mut files, mut rounds, mut passes, mut mib) = (Vec::new(), 15usize, 3usize, 256usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = || args.next().and_then(|n| n.parse().ok()).expect("a number");
        match a.as_str() {
            "--rounds" => rounds = number(),
            "--passes" => passes = number(),
            "--sweep-mib" => mib = number(),
            _ => files.push(a),
        }
    }
    let schema = classbench::schema();
    for path in &files {
        let rules = classbench::parse_rules(&schema, &read_text(path)).expect("a rule file");
        let map = WildcardMap::new(schema.clone(), 4, rules.len() as u32).expect("a map");
        map.load(
            rules.iter().map(|r| (r, r.priority.to_ne_bytes())),
            BPF_NOEXIST,
        )
        .expect("distinct rules");
        let moved: Vec<_> = rules.iter().step_by(10).collect();
        let mut ns = vec![Vec::new(); passes];
        for _ in 0..rounds {
            evict(mib);
            for pass in &mut ns {
                let started = Instant::now();
                for r in &moved {
                    map.remove(r).expect("a held rule");
                    map.insert(r, &r.priority.to_ne_bytes(), BPF_ANY)
                        .expect("room for a rule just removed");
                }
                pass.push(started.elapsed().as_nanos() as f64 / (2 * moved.len()) as f64);
            }
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        for (p, t) in ns.iter_mut().enumerate() {
            t.sort_by(f64::total_cmp);
            println!(
                "{name} pass {p}{}: {:.0} ns/update [{:.0}..{:.0}]",
                if p == 0 { " (cold)" } else { "" },
                t[t.len() / 2],
                t[0],
                t[t.len() - 1]
            );
        }
    }
}

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
//! `--idle-secs S` leaves the map's memory idle for S seconds after the
//! sweep, as the suite's lookups leave the writer's, and times each
//! update pair (a remove and the insert back, two clock reads more): per
//! pass it also prints the pairs that took over 50 us and the page
//! faults the thread took. On this VM the host stalls the first
//! touch of guest memory left idle for seconds, 0.1-0.2 ms a stall, with
//! no fault in the guest (docs/benchmarks.md, "Updates after idle
//! memory"); the suite's first pass after its lookups pays those.
//!
//! `cargo run --release -p bpfmaps-bench --example wildcard_cold_updates
//! -- RULE_FILE... [--rounds N] [--passes N] [--sweep-mib N]
//! [--idle-secs S]`, e.g. with `../shared/data/classbench/ipc1_10k.gz`
//! (docs/benchmarks.md, "Cold updates"); with `--features mimalloc`
//! before `--example`, over mimalloc instead of the system's allocator
//! (the first line of the output names it).

use std::time::Instant;

use bpfmaps::wildcard::{WildcardMap, classbench};
use bpfmaps::{BPF_ANY, BPF_NOEXIST};
use bpfmaps_bench::stats::Stats;
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

/// Page faults (minor and major) this thread has taken.
fn faults() -> i64 {
    // SAFETY: `getrusage` fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage
    };
    usage.ru_minflt + usage.ru_majflt
}

/// One pass's figures: ns an update, updates over 50 us, page faults.
#[derive(Default)]
struct Pass {
    ns: Vec<f64>,
    stalls: Vec<f64>,
    faults: Vec<f64>,
}

fn main() {
    let (mut files, mut rounds, mut passes, mut mib) = (Vec::new(), 15usize, 3usize, 256usize);
    let mut idle: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = || args.next().and_then(|n| n.parse().ok()).expect("a number");
        match a.as_str() {
            "--rounds" => rounds = number(),
            "--passes" => passes = number(),
            "--sweep-mib" => mib = number(),
            "--idle-secs" => idle = Some(number() as u64),
            _ => files.push(a),
        }
    }
    println!("allocator: {}", bpfmaps_bench::alloc::UNDER);
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
        let mut figures: Vec<Pass> = (0..passes).map(|_| Pass::default()).collect();
        for _ in 0..rounds {
            evict(mib);
            if let Some(secs) = idle {
                std::thread::sleep(std::time::Duration::from_secs(secs));
            }
            for pass in &mut figures {
                let faulted = faults();
                let started = Instant::now();
                let mut stalls = 0;
                for r in &moved {
                    // Each update pair timed only where stalls are counted.
                    let pair = idle.map(|_| Instant::now());
                    map.remove(r).expect("a held rule");
                    map.insert(r, &r.priority.to_ne_bytes(), BPF_ANY)
                        .expect("room for a rule just removed");
                    if pair.is_some_and(|t| t.elapsed().as_micros() > 50) {
                        stalls += 1;
                    }
                }
                let ns = started.elapsed().as_nanos() as f64 / (2 * moved.len()) as f64;
                pass.ns.push(ns);
                pass.stalls.push(stalls as f64);
                pass.faults.push((faults() - faulted) as f64);
            }
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        for (p, pass) in figures.iter().enumerate() {
            let ns = Stats::from_samples(&pass.ns);
            print!(
                "{name} pass {p}{}: {:.0} ns/update [{:.0}..{:.0}]",
                if p == 0 { " (cold)" } else { "" },
                ns.median,
                ns.min,
                ns.max
            );
            if idle.is_some() {
                let stalls = Stats::from_samples(&pass.stalls);
                let faults = Stats::from_samples(&pass.faults);
                print!(
                    ", update pairs over 50 us {:.0} [{:.0}..{:.0}] of {}, \
                     page faults {:.0} (at most {:.0})",
                    stalls.median,
                    stalls.min,
                    stalls.max,
                    moved.len(),
                    faults.median,
                    faults.max
                );
            }
            println!();
        }
    }
}

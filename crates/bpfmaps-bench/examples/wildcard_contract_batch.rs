//! A ClassBench rule set given to the wildcard map through the byte
//! contract, as a C or Python caller gives it: one `update` a rule, in
//! the file's order, against one `update_batch` of the whole set (which
//! goes in as a `WildcardMap::load`). Then each map's concrete-key
//! `lookup`, timed in turns on the same packets (20,000 drawn inside the
//! rules, classified in passes; the median and range of the passes).
//!
//! `cargo run --release -p bpfmaps-bench --example wildcard_contract_batch
//! -- ../shared/data/classbench/acl1_10k.gz [more sets]`

use std::time::Instant;

use bpfmaps::wildcard::{Rule, WildcardMap, classbench};
use bpfmaps::{BPF_NOEXIST, Map};
use bpfmaps_bench::stats::Stats;
use bpfmaps_bench::suites::wildcard_classbench::read_text;

/// Passes over the packets each map is timed for, in turns.
const PASSES: usize = 15;

fn rules_of(path: &str) -> Vec<Rule> {
    let text = read_text(path.as_ref()).unwrap_or_else(|e| panic!("{path}: {e}"));
    classbench::parse_rules(&classbench::schema(), &text).expect("a rule file")
}

/// ns per lookup of one pass of `keys` (concrete keys back to back):
/// the lookups' values folded, so that none is optimised away.
fn pass(map: &WildcardMap, keys: &[u8], stride: usize) -> f64 {
    let mut value = [0u8; 4];
    let mut acc = 0u8;
    let started = Instant::now();
    for key in keys.chunks_exact(stride) {
        acc ^= u8::from(map.lookup(key, &mut value).is_ok()) ^ value[0];
    }
    std::hint::black_box(acc);
    started.elapsed().as_nanos() as f64 / (keys.len() / stride) as f64
}

/// The median and range of `xs`, to `digits` decimals.
fn median_and_range(xs: &[f64], digits: usize) -> String {
    let Stats {
        median, min, max, ..
    } = Stats::from_samples(xs);
    format!("{median:.digits$} ({min:.digits$}-{max:.digits$})")
}

fn main() {
    let schema = classbench::schema();
    println!(
        "set | rules | tables one by one | tables batch | build ms one by one | build ms batch | lookup ns one by one | lookup ns batch | speed"
    );
    for path in std::env::args().skip(1) {
        let rules = rules_of(&path);
        let keys: Vec<Vec<u8>> = rules.iter().map(|r| schema.rule_key(r)).collect();
        let values: Vec<[u8; 4]> = rules.iter().map(|r| r.priority.to_ne_bytes()).collect();
        let new = || WildcardMap::new(schema.clone(), 4, rules.len() as u32).expect("a map");

        let (each, batch) = (new(), new());
        let started = Instant::now();
        for (k, v) in keys.iter().zip(&values) {
            each.update(k, v, BPF_NOEXIST).expect("distinct rules");
        }
        let each_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let done = batch.update_batch(&keys.concat(), &values.concat(), BPF_NOEXIST);
        let batch_ms = started.elapsed().as_secs_f64() * 1e3;
        assert_eq!(done, Ok(rules.len()), "{path}");

        let packets = classbench::generate_trace(&schema, &rules, 20_000, 1.0, 7);
        let stride = schema.rule_key_size();
        let lookups: Vec<u8> = packets.iter().flat_map(|p| schema.match_key(p)).collect();
        let answer = |m: &WildcardMap, key: &[u8]| {
            let mut value = [0u8; 4];
            m.lookup(key, &mut value).map(|()| value)
        };
        for key in lookups.chunks_exact(stride) {
            assert_eq!(
                answer(&each, key),
                answer(&batch, key),
                "{path}: the maps differ"
            );
        }

        let (mut t_each, mut t_batch) = (Vec::new(), Vec::new());
        for _ in 0..PASSES {
            t_each.push(pass(&each, &lookups, stride));
            t_batch.push(pass(&batch, &lookups, stride));
        }
        let ratios: Vec<f64> = t_each.iter().zip(&t_batch).map(|(e, b)| e / b).collect();
        let name = path.rsplit('/').next().unwrap_or(&path);
        println!(
            "{name} | {} | {} | {} | {each_ms:.1} | {batch_ms:.1} | {} | {} | {}x",
            rules.len(),
            each.tables(),
            batch.tables(),
            median_and_range(&t_each, 1),
            median_and_range(&t_batch, 1),
            median_and_range(&ratios, 2),
        );
    }
}

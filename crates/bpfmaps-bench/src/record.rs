//! The result record every suite emits, the stable metric names, and the
//! case naming convention.
//!
//! # JSON
//! `--json FILE` and `report` write an array of records:
//!
//! ```json
//! {"suite": "hash-sweep", "case": "n=100000,ks=64,fill=16/16",
//!  "impl": "bpfmaps(xxh3)", "metric": "lookups_per_sec",
//!  "value": 12345678.9, "unit": "ops/s", "min": 12012345.6, "max": 12456789.0}
//! ```
//!
//! `value` is the median over repetitions; `min` and `max` their spread,
//! `null` for single observations (memory, counts).
//!
//! # Cases
//! A case is a comma-separated list of `key=value` parameters, e.g.
//! `n=100000,ks=64,fill=16/16`; [`case`] builds one and [`case_param`]
//! reads one back, so summaries and plots can be rebuilt from JSON alone.
//!
//! # Metrics
//! The names in [`METRICS`] are stable: tools and later reports compare
//! them across commits. Add new names rather than changing old ones; each is
//! documented in `METRICS.md` (a test keeps the two in step).

use std::fmt::Display;

use serde::{Deserialize, Serialize};

use crate::stats::Stats;

/// A named quantity with a fixed unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Stable machine name, as written to JSON.
    pub name: &'static str,
    /// Unit, as written to JSON: `ops/s`, `ns`, `ms`, `bytes`, `count` or
    /// `ratio` (a fraction between 0 and 1).
    pub unit: &'static str,
    /// Short label for the human table.
    pub label: &'static str,
    /// Whether a larger value is better (decides the direction of speed
    /// ratios).
    pub higher_is_better: bool,
    /// One-line meaning.
    pub doc: &'static str,
}

/// Nanoseconds per hash call (throughput: independent calls back to back).
pub const NS_PER_HASH: Metric = Metric {
    name: "ns_per_hash",
    unit: "ns",
    label: "hash",
    higher_is_better: false,
    doc: "mean time per hash call, independent calls back to back",
};

/// Successful lookups per second (all threads together).
pub const LOOKUPS_PER_SEC: Metric = Metric {
    name: "lookups_per_sec",
    unit: "ops/s",
    label: "lookups",
    higher_is_better: true,
    doc: "lookups completed per second, summed over reader threads",
};

/// Lookups per second of the readers' own CPU time.
pub const LOOKUPS_PER_CPU_SEC: Metric = Metric {
    name: "lookups_per_cpu_sec",
    unit: "ops/s",
    label: "lookups/cpu-s",
    higher_is_better: true,
    doc: "lookups completed per second of reader CPU time, summed over reader threads: what a lookup costs, whatever share of the cores the scheduler gave the readers",
};

/// Writer operations per second (updates, deletes, inserts).
pub const WRITER_OPS_PER_SEC: Metric = Metric {
    name: "writer_ops_per_sec",
    unit: "ops/s",
    label: "writer",
    higher_is_better: true,
    doc: "update + delete + insert operations per second of the one writer",
};

/// Inserts and removes per second, summed over writer threads.
pub const WRITES_PER_SEC: Metric = Metric {
    name: "writes_per_sec",
    unit: "ops/s",
    label: "writes",
    higher_is_better: true,
    doc: "inserts and removes completed per second, summed over writer threads",
};

/// Bytes the building thread holds after building the structure.
pub const MEM_BYTES_HELD: Metric = Metric {
    name: "mem_bytes_held",
    unit: "bytes",
    label: "mem",
    higher_is_better: false,
    doc: "bytes allocated and not freed while building (counting allocator)",
};

/// The structure's own account of its memory (`Map::memory_usage`).
pub const MEM_REPORTED: Metric = Metric {
    name: "mem_reported",
    unit: "bytes",
    label: "reported",
    higher_is_better: false,
    doc: "what the map says it holds (`Map::memory_usage()`)",
};

/// Reads that returned a value not written for that key (must be 0).
pub const MISMATCHES: Metric = Metric {
    name: "mismatches",
    unit: "count",
    label: "mismatches",
    higher_is_better: false,
    doc: "reads that returned a value never written for that key; must be 0",
};

/// Reads that found no entry (a key between delete and reinsert).
pub const READ_MISSES: Metric = Metric {
    name: "read_misses",
    unit: "count",
    label: "misses",
    higher_is_better: false,
    doc: "reads that found no entry (the key was between delete and reinsert)",
};

/// Reads that found no entry for a key no writer touches (must be 0).
pub const LOST_READS: Metric = Metric {
    name: "lost_reads",
    unit: "count",
    label: "lost",
    higher_is_better: false,
    doc: "reads that found no entry for a key no writer touches; must be 0",
};

/// Absent keys a bloom filter called maybe-present, per absent key tested.
pub const FALSE_POSITIVE_RATE: Metric = Metric {
    name: "false_positive_rate",
    unit: "ratio",
    label: "fpp",
    higher_is_better: false,
    doc: "bloom filter: fraction of absent keys it called maybe-present, each then a map lookup that missed",
};

/// Stack map: `get_stackid` calls answering `EEXIST` per stack offered.
pub const COLLISION_RATE: Metric = Metric {
    name: "collision_rate",
    unit: "ratio",
    label: "collision rate",
    higher_is_better: false,
    doc: "stack map: get_stackid calls that answered EEXIST (a lost sample) per distinct stack offered",
};

/// Stack map: `get_stackid` calls answering `EEXIST` (`collisions()`).
pub const STACK_COLLISIONS: Metric = Metric {
    name: "stack_collisions",
    unit: "count",
    label: "EEXIST",
    higher_is_better: false,
    doc: "stack map: get_stackid calls that answered EEXIST (`StackTraceMap::collisions()`)",
};

/// Stack map: `get_stackid` calls per second for stacks already stored.
pub const STACKIDS_PER_SEC: Metric = Metric {
    name: "stackids_per_sec",
    unit: "ops/s",
    label: "get_stackid",
    higher_is_better: true,
    doc: "get_stackid calls per second re-offering stored stacks (hash, bucket load, frame compare)",
};

/// Operations of the kind named by the case's `op` per second.
pub const OPS_PER_SEC: Metric = Metric {
    name: "ops_per_sec",
    unit: "ops/s",
    label: "ops",
    higher_is_better: true,
    doc: "operations of the kind named by the case's `op` completed per second, one thread",
};

/// Nanoseconds per operation of the kind named by the case's `op`.
pub const NS_PER_OP: Metric = Metric {
    name: "ns_per_op",
    unit: "ns",
    label: "per op",
    higher_is_better: false,
    doc: "mean time per operation of the kind named by the case's `op`, one thread",
};

/// Nanoseconds per lookup (independent lookups back to back).
pub const NS_PER_LOOKUP: Metric = Metric {
    name: "ns_per_lookup",
    unit: "ns",
    label: "lookup",
    higher_is_better: false,
    doc: "mean time per lookup, independent lookups back to back on one thread",
};

/// Bytes held after building, divided by the prefixes stored.
pub const MEM_BYTES_PER_PREFIX: Metric = Metric {
    name: "mem_bytes_per_prefix",
    unit: "bytes",
    label: "mem/prefix",
    higher_is_better: false,
    doc: "bytes held by the building thread after building (counting allocator), per prefix stored",
};

/// The structure's own account of its memory, per prefix.
pub const MEM_REPORTED_PER_PREFIX: Metric = Metric {
    name: "mem_reported_per_prefix",
    unit: "bytes",
    label: "reported/prefix",
    higher_is_better: false,
    doc: "what the map says it holds (`memory_usage()`), per prefix stored",
};

/// The bytes of the structure in use, per prefix: without the free space it
/// holds (for bpfmaps' trie, `memory_live()`: free blocks and the not yet
/// carved end of its last chunk left out).
pub const MEM_LIVE_PER_PREFIX: Metric = Metric {
    name: "mem_live_per_prefix",
    unit: "bytes",
    label: "live/prefix",
    higher_is_better: false,
    doc: "bytes in use by the map (`memory_live()`: live blocks, no free space), per prefix stored",
};

/// Milliseconds to build a table by inserting its prefixes one by one.
pub const BUILD_MS: Metric = Metric {
    name: "build_ms",
    unit: "ms",
    label: "build",
    higher_is_better: false,
    doc: "milliseconds to build the table from empty, one insert per prefix",
};

/// Trace mutations (announce = insert, withdraw = remove) per second.
pub const UPDATES_PER_SEC: Metric = Metric {
    name: "updates_per_sec",
    unit: "ops/s",
    label: "updates",
    higher_is_better: true,
    doc: "BGP trace mutations (announce = insert or replace, withdraw = remove) applied per second by the one writer",
};

/// Milliseconds the freeing thread spends in `drop` or `clear()`.
pub const FREE_MS: Metric = Metric {
    name: "free_ms",
    unit: "ms",
    label: "free",
    higher_is_better: false,
    doc: "milliseconds the calling thread spends freeing a full map (`drop`, or `clear()` where the case says so)",
};

/// The longest gap a concurrent reader saw between two completed lookups.
pub const MAX_READER_STALL_MS: Metric = Metric {
    name: "max_reader_stall_ms",
    unit: "ms",
    label: "max stall",
    higher_is_better: false,
    doc: "longest gap between two consecutive completed lookups of a concurrent reader thread, in milliseconds",
};

/// [`MAX_READER_STALL_MS`] less the time the reader was off the CPU.
pub const MAX_READER_STALL_ON_CPU_MS: Metric = Metric {
    name: "max_reader_stall_on_cpu_ms",
    unit: "ms",
    label: "on-CPU stall",
    higher_is_better: false,
    doc: "the longest reader gap less the time the reader thread was off the CPU (preempted) in the same batch of lookups, in milliseconds",
};

/// Prefixes a walk over a whole table returns per second.
pub const KEYS_PER_SEC: Metric = Metric {
    name: "keys_per_sec",
    unit: "ops/s",
    label: "keys",
    higher_is_better: true,
    doc: "prefixes returned per second by whole walks over a table, one thread, through the API the case's `walk` names",
};

/// Lookups answered differently from the baseline on the same address.
pub const LPM_DISAGREEMENTS: Metric = Metric {
    name: "lpm_disagreements",
    unit: "count",
    label: "disagree",
    higher_is_better: false,
    doc: "lookups whose value differs from the baseline's (`kernel`) on the same address, or 1 if only the checksums differ (for a `get_next_key` walk: 1 if its keys or their order differ from the baseline's); must be 0",
};

/// Bytes held after building a string map, divided by the keys stored.
pub const MEM_BYTES_PER_KEY: Metric = Metric {
    name: "mem_bytes_per_key",
    unit: "bytes",
    label: "mem/key",
    higher_is_better: false,
    doc: "bytes held by the building thread after building (counting allocator, the structure's copies of the keys included), per key stored",
};

/// A native string map's own account of its memory, per key.
pub const MEM_REPORTED_PER_KEY: Metric = Metric {
    name: "mem_reported_per_key",
    unit: "bytes",
    label: "reported/key",
    higher_is_better: false,
    doc: "what a string map says it holds (keys included), per key stored: for a native peer whose allocations the counting allocator does not see",
};

/// Nanoseconds per insert when building a string map from empty.
pub const BUILD_NS_PER_KEY: Metric = Metric {
    name: "build_ns_per_key",
    unit: "ns",
    label: "build/key",
    higher_is_better: false,
    doc: "time to build a string map from empty, inserting every key once in random order, per key",
};

/// Nanoseconds per key of whole ordered walks.
pub const ITER_NS_PER_KEY: Metric = Metric {
    name: "iter_ns_per_key",
    unit: "ns",
    label: "iter/key",
    higher_is_better: false,
    doc: "time of whole walks over a string map in key order, one thread, per key returned",
};

/// String-map answers that differ from the expected ones.
pub const STRMAP_DISAGREEMENTS: Metric = Metric {
    name: "strmap_disagreements",
    unit: "count",
    label: "wrong",
    higher_is_better: false,
    doc: "string-map lookups that did not answer the key's value (hits) or nothing (misses), or 1 if an ordered walk's keys, values or order differ from BTreeMap's; must be 0",
};

/// Bytes held after building a range map, per range.
pub const MEM_BYTES_PER_RANGE: Metric = Metric {
    name: "mem_bytes_per_range",
    unit: "bytes",
    label: "mem/range",
    higher_is_better: false,
    doc: "bytes held by the building thread after building a range map (counting allocator), per range stored",
};

/// Nanoseconds per insert when building a range map from empty.
pub const BUILD_NS_PER_RANGE: Metric = Metric {
    name: "build_ns_per_range",
    unit: "ns",
    label: "build/range",
    higher_is_better: false,
    doc: "time to build a range map from empty, one insert per range in the case's order, per range",
};

/// Rules removed and inserted again per second.
pub const RULE_UPDATES_PER_SEC: Metric = Metric {
    name: "rule_updates_per_sec",
    unit: "ops/s",
    label: "rule updates",
    higher_is_better: true,
    doc: "classifier rules removed or inserted per second by the one writer",
};

/// Tables a classifier built.
pub const TABLES: Metric = Metric {
    name: "tables",
    unit: "count",
    label: "tables",
    higher_is_better: false,
    doc: "hash tables the classifier holds its rules in",
};

/// Tables probed per packet, on average.
pub const TABLES_PROBED: Metric = Metric {
    name: "tables_probed",
    unit: "count",
    label: "probed",
    higher_is_better: false,
    doc: "mean number of tables a classification probed before its early exit",
};

/// Packets classified unlike the brute force.
pub const WILDCARD_DISAGREEMENTS: Metric = Metric {
    name: "wildcard_disagreements",
    unit: "count",
    label: "wrong",
    higher_is_better: false,
    doc: "sampled packets a classifier gave another rule than the brute force",
};

/// Every metric a suite may emit.
pub const METRICS: &[Metric] = &[
    NS_PER_HASH,
    LOOKUPS_PER_SEC,
    LOOKUPS_PER_CPU_SEC,
    WRITER_OPS_PER_SEC,
    WRITES_PER_SEC,
    MEM_BYTES_HELD,
    MEM_REPORTED,
    MISMATCHES,
    READ_MISSES,
    LOST_READS,
    FALSE_POSITIVE_RATE,
    COLLISION_RATE,
    STACK_COLLISIONS,
    STACKIDS_PER_SEC,
    OPS_PER_SEC,
    NS_PER_OP,
    NS_PER_LOOKUP,
    MEM_BYTES_PER_PREFIX,
    MEM_REPORTED_PER_PREFIX,
    MEM_LIVE_PER_PREFIX,
    BUILD_MS,
    UPDATES_PER_SEC,
    FREE_MS,
    MAX_READER_STALL_MS,
    MAX_READER_STALL_ON_CPU_MS,
    LPM_DISAGREEMENTS,
    KEYS_PER_SEC,
    MEM_BYTES_PER_KEY,
    MEM_REPORTED_PER_KEY,
    BUILD_NS_PER_KEY,
    ITER_NS_PER_KEY,
    STRMAP_DISAGREEMENTS,
    MEM_BYTES_PER_RANGE,
    BUILD_NS_PER_RANGE,
    RULE_UPDATES_PER_SEC,
    TABLES,
    TABLES_PROBED,
    WILDCARD_DISAGREEMENTS,
];

/// Looks a metric up by name.
pub fn metric(name: &str) -> Option<&'static Metric> {
    METRICS.iter().find(|m| m.name == name)
}

/// One measured value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Suite name (`hashfn`, `hash-sweep`, ...).
    pub suite: String,
    /// Parameters, `key=value,...` (see [`case`]).
    pub case: String,
    /// Which implementation, e.g. `bpfmaps(xxh3)` or `std(jhash)`.
    #[serde(rename = "impl")]
    pub impl_name: String,
    /// Metric name from [`METRICS`].
    pub metric: String,
    /// Median over repetitions, or the single observation.
    pub value: f64,
    /// The metric's unit.
    pub unit: String,
    /// Smallest repetition; `None` for single observations.
    pub min: Option<f64>,
    /// Largest repetition; `None` for single observations.
    pub max: Option<f64>,
}

impl Record {
    /// A record of repeated measurements.
    pub fn stats(suite: &str, case: &str, impl_name: &str, metric: &Metric, s: Stats) -> Record {
        Record {
            suite: suite.into(),
            case: case.into(),
            impl_name: impl_name.into(),
            metric: metric.name.into(),
            value: s.median,
            unit: metric.unit.into(),
            min: Some(s.min),
            max: Some(s.max),
        }
    }

    /// A record of one observation (memory, a count).
    pub fn single(suite: &str, case: &str, impl_name: &str, metric: &Metric, value: f64) -> Record {
        Record {
            suite: suite.into(),
            case: case.into(),
            impl_name: impl_name.into(),
            metric: metric.name.into(),
            value,
            unit: metric.unit.into(),
            min: None,
            max: None,
        }
    }

    /// The parameter `key` of this record's case.
    pub fn param(&self, key: &str) -> Option<&str> {
        case_param(&self.case, key)
    }
}

/// Builds a case name from parameters: `case(&[("n", &100), ("ks", &8)])`
/// is `"n=100,ks=8"`.
pub fn case(params: &[(&str, &dyn Display)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads parameter `key` back from a case name.
pub fn case_param<'a>(case: &'a str, key: &str) -> Option<&'a str> {
    case.split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `key`'s value in `case` for a summary table's cell: `?` when the
/// case does not name it (a record from another version of the suite).
pub fn case_value<'a>(case: &'a str, key: &str) -> &'a str {
    case_param(case, key).unwrap_or("?")
}

/// The first record matching case, implementation and metric.
pub fn find<'a>(
    records: &'a [Record],
    case: &str,
    impl_name: &str,
    metric: &str,
) -> Option<&'a Record> {
    records
        .iter()
        .find(|r| r.case == case && r.impl_name == impl_name && r.metric == metric)
}

/// The cases of `records`, each once, in the order they first appear
/// (the rows of a summary table).
pub fn cases(records: &[Record]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in records {
        if !out.contains(&r.case.as_str()) {
            out.push(&r.case);
        }
    }
    out
}

/// A summary table's cell: the value of `metric` for `impl_name` in
/// `case` with `prec` decimals, or `-` where there is none.
pub fn cell(records: &[Record], case: &str, impl_name: &str, metric: &str, prec: usize) -> String {
    find(records, case, impl_name, metric).map_or("-".into(), |r| format!("{:.prec$}", r.value))
}

/// `num / den` of the values of two records, if both exist and `den > 0`.
pub fn ratio(num: Option<&Record>, den: Option<&Record>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d.value > 0.0 => Some(n.value / d.value),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_the_documented_one() {
        let r = Record::stats(
            "hash-sweep",
            "n=100,ks=8",
            "bpfmaps(xxh3)",
            &LOOKUPS_PER_SEC,
            Stats::from_samples(&[1.0, 3.0]),
        );
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        let obj = v.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "case", "impl", "max", "metric", "min", "suite", "unit", "value"
            ]
        );
        assert_eq!(obj["impl"], "bpfmaps(xxh3)");
        assert_eq!(obj["metric"], "lookups_per_sec");
        assert_eq!(obj["unit"], "ops/s");
        assert_eq!(
            (&obj["value"], &obj["min"], &obj["max"]),
            (&2.0.into(), &1.0.into(), &3.0.into())
        );

        let single = Record::single("s", "c", "i", &MEM_BYTES_HELD, 42.0);
        let v = serde_json::to_value(&single).unwrap();
        assert!(v["min"].is_null() && v["max"].is_null());
        assert_eq!(v["unit"], "bytes");

        let back: Vec<Record> =
            serde_json::from_str(&serde_json::to_string(std::slice::from_ref(&r)).unwrap())
                .unwrap();
        assert_eq!(back, [r]);
    }

    #[test]
    fn cases_round_trip() {
        let c = case(&[("n", &100_000), ("ks", &64), ("fill", &"16/16")]);
        assert_eq!(c, "n=100000,ks=64,fill=16/16");
        assert_eq!(case_param(&c, "ks"), Some("64"));
        assert_eq!(case_param(&c, "fill"), Some("16/16"));
        assert_eq!(case_param(&c, "k"), None);
        assert_eq!(case_value(&c, "ks"), "64");
        assert_eq!(case_value(&c, "k"), "?");
    }

    #[test]
    fn metric_names_are_unique_and_documented() {
        let doc = include_str!("../METRICS.md");
        for (i, m) in METRICS.iter().enumerate() {
            assert!(METRICS[..i].iter().all(|o| o.name != m.name), "{}", m.name);
            assert!(
                doc.contains(&format!("`{}`", m.name)),
                "METRICS.md lacks {}",
                m.name
            );
            assert_eq!(metric(m.name), Some(m));
        }
    }
}

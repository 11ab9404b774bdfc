//! ClassBench files: 5-tuple rule sets and packet traces, as the
//! classifier papers (TupleMerge, PartitionSort, CutSplit, NeuroCuts)
//! benchmark with; and traces for rule sets that come without one.
//!
//! A rule line is `@src/len dst/len sport_lo : sport_hi dport_lo :
//! dport_hi proto/mask [flags/mask]`; its line number (from 0) is its
//! priority, the first line winning. The flags field is read and ignored,
//! as the TupleMerge reference does. A trace line is `src dst sport dport
//! proto ...`, the addresses as 32-bit integers; a last column of the
//! rule a generator meant, which the files do not always agree with, is
//! not used.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::schema::{Field, Packet, Rule, Schema};
use crate::core::error::{Error, Result};

/// The 5-tuple schema: `src` and `dst` (4-byte prefixes), `sport` and
/// `dport` (2-byte ranges), `proto` (a 1-byte prefix: a mask of 0xff or
/// 0).
pub fn schema() -> Schema {
    Schema::new(vec![
        Field::prefix("src", 4),
        Field::prefix("dst", 4),
        Field::range("sport", 2),
        Field::range("dport", 2),
        Field::prefix("proto", 1),
    ])
    .expect("the 5-tuple schema")
}

/// The rules of a rule file's text, line `i` at priority `i`.
pub fn parse_rules(schema: &Schema, text: &str) -> Result<Vec<Rule>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            parse_rule(schema, line, i as u32)
                .map_err(|e| Error::invalid(format!("rule line {}: {e}", i + 1)))
        })
        .collect()
}

fn parse_rule(schema: &Schema, line: &str, priority: u32) -> Result<Rule> {
    let bad = || Error::invalid(format!("not a ClassBench rule: {line:?}"));
    let line = line.trim().strip_prefix('@').ok_or_else(bad)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    // src dst lo : hi lo : hi proto/mask [flags/mask]
    if words.len() < 9 || words[3] != ":" || words[6] != ":" {
        return Err(bad());
    }
    let prefix = |w: &str| -> Result<(u128, u32)> {
        let (a, len) = w.split_once('/').ok_or_else(bad)?;
        let a: std::net::Ipv4Addr = a.parse().map_err(|_| bad())?;
        Ok((u128::from(u32::from(a)), len.parse().map_err(|_| bad())?))
    };
    let number = |w: &str| -> Result<u128> {
        match w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
            Some(hex) => u128::from_str_radix(hex, 16).map_err(|_| bad()),
            None => w.parse().map_err(|_| bad()),
        }
    };
    let (src, src_len) = prefix(words[0])?;
    let (dst, dst_len) = prefix(words[1])?;
    let (proto, mask) = words[8].split_once('/').ok_or_else(bad)?;
    let mask = number(mask)?;
    let proto_len = match mask {
        0xff => 8,
        0 => 0,
        _ => {
            return Err(Error::invalid(format!(
                "protocol mask {mask:#x}: 0xff or 0"
            )));
        }
    };
    schema
        .rule(priority)
        .prefix("src", src, src_len)
        .prefix("dst", dst, dst_len)
        .range("sport", number(words[2])?, number(words[4])?)
        .range("dport", number(words[5])?, number(words[7])?)
        .prefix("proto", number(proto)?, proto_len)
        .build()
}

/// The packets of a trace file's text.
pub fn parse_trace(schema: &Schema, text: &str) -> Result<Vec<Packet>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let values: Vec<u128> = line
                .split_whitespace()
                .take(5)
                .map(|w| w.parse::<u128>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| Error::invalid(format!("trace line {}: {line:?}", i + 1)))?;
            schema
                .packet(&values)
                .map_err(|e| Error::invalid(format!("trace line {}: {e}", i + 1)))
        })
        .collect()
}

/// `n` packets for `rules` from `seed`: each field of a packet drawn
/// uniformly inside a random rule's interval (a share `inside` of them,
/// 0 to 1), the rest uniformly over the whole space.
pub fn generate_trace(
    schema: &Schema,
    rules: &[Rule],
    n: usize,
    inside: f64,
    seed: u64,
) -> Vec<Packet> {
    let mut rng = StdRng::seed_from_u64(seed);
    let maxes: Vec<u128> = schema.fields().iter().map(Field::max).collect();
    (0..n)
        .map(|_| {
            let mut p = Packet::default();
            let rule = (!rules.is_empty() && rng.random_bool(inside))
                .then(|| &rules[rng.random_range(0..rules.len())]);
            for (i, &max) in maxes.iter().enumerate() {
                let (lo, hi) = rule.map_or((0, max), |r| r.bounds()[i]);
                p.values[i] = lo + random_below(&mut rng, hi - lo);
            }
            p
        })
        .collect()
}

/// A uniform draw from `0..=max`.
fn random_below(rng: &mut StdRng, max: u128) -> u128 {
    if max == u128::MAX {
        rng.random()
    } else {
        rng.random_range(0..=max)
    }
}

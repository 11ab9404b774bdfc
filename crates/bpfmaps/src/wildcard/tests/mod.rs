//! The wildcard map's tests, by theme; the helpers they share.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;

use super::*;
use crate::core::error::Error;
use crate::wildcard::schema::{MAX_FIELD_SIZE, MAX_FIELDS};
use crate::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, pin};

fn five_tuple() -> Schema {
    classbench::schema()
}

fn v(x: u32) -> [u8; 4] {
    x.to_ne_bytes()
}

/// A schema of two exact fields, `id` and `port`, whose rule `i`
/// ([`id_port_rule`]) matches id `i` on port `i % 7`: as many rules of
/// one table as a test wants.
fn id_port() -> Schema {
    Schema::new(vec![Field::exact("id", 4), Field::exact("port", 2)]).unwrap()
}

/// Rule `i` of [`id_port`]'s schema.
fn id_port_rule(s: &Schema, i: u32) -> Rule {
    s.rule(1)
        .exact("id", u128::from(i))
        .exact("port", u128::from(i % 7))
        .build()
        .unwrap()
}

/// The packet rule `i` of [`id_port`]'s schema matches.
fn id_port_packet(s: &Schema, i: u32) -> Packet {
    s.packet(&[u128::from(i), u128::from(i % 7)]).unwrap()
}

/// The map's answer for `p`: the rule and its value.
fn answer(m: &WildcardMap, p: &Packet) -> Option<(Rule, Vec<u8>)> {
    let guard = pin();
    m.classify(p, &guard).map(|(r, v)| (r.clone(), v.to_vec()))
}

/// `m`'s structure checked after step `i` of `steps`: after every step
/// natively; under Miri after every fourth and the last, since the check
/// is safe code and was most of those tests' interpreted time.
fn check_after(m: &WildcardMap, i: usize, steps: usize) {
    if !cfg!(miri) || i % 4 == 3 || i + 1 == steps {
        m.check_structure();
    }
}

fn oracle_answer(o: &BruteForce, p: &Packet) -> Option<(Rule, Vec<u8>)> {
    o.classify(p).map(|(r, v)| (r.clone(), v.to_vec()))
}

/// `rules` loaded into `m` (each valued by its priority) and into an
/// oracle, which it returns; `m`'s structure checked.
fn load_both<'a>(m: &WildcardMap, rules: impl IntoIterator<Item = &'a Rule> + Clone) -> BruteForce {
    m.load(
        rules.clone().into_iter().map(|r| (r, v(r.priority))),
        BPF_NOEXIST,
    )
    .unwrap();
    m.check_structure();
    let mut o = BruteForce::new();
    for r in rules {
        o.insert(r.clone(), &v(r.priority));
    }
    o
}

/// Each rule's two corners (every field at its low bound, then its
/// high) classified by `m` as by the oracle `o`.
fn corners_as_the_oracle<'a>(
    m: &WildcardMap,
    o: &BruteForce,
    rules: impl IntoIterator<Item = &'a Rule>,
) {
    for r in rules {
        let (lo, hi): (Vec<u128>, Vec<u128>) = r.bounds().iter().copied().unzip();
        for values in [lo, hi] {
            let p = m.schema().packet(&values).unwrap();
            assert_eq!(answer(m, &p), oracle_answer(o, &p), "{values:?}");
        }
    }
}

/// A small random schema: 1 to 4 fields of every kind, narrow enough that
/// random rules overlap.
fn arb_schema() -> impl Strategy<Value = Schema> {
    let field = (0..4usize, prop::sample::select(vec![1usize, 2, 4, 8, 16]));
    prop::collection::vec(field, 1..=4).prop_map(|fs| {
        let fields = fs
            .into_iter()
            .enumerate()
            .map(|(i, (kind, size))| {
                let name = format!("f{i}");
                match kind {
                    0 => Field::prefix(&name, size),
                    1 => Field::range(&name, size.min(8)),
                    2 => Field::exact(&name, size),
                    _ => Field::wildcard(&name, size),
                }
            })
            .collect();
        Schema::new(fields).unwrap()
    })
}

/// A value of `field` near the few values rules and packets are drawn
/// around (so that they meet), as the top bits of the field.
fn near(field: &Field, seed: u64) -> u128 {
    let top = u128::from(seed % 4) << (field.bits() - 2);
    let low = u128::from(seed / 4 % 4);
    top | low
}

/// A rule of `schema` from random numbers.
fn rule_from(schema: &Schema, priority: u32, seeds: &[u64]) -> Rule {
    let mut b = schema.rule(priority);
    for (f, &seed) in schema.fields().iter().zip(seeds) {
        let value = near(f, seed);
        b = match (f.kind, seed % 5) {
            (FieldKind::Prefix, k) => {
                let len = [0, 1, 2, f.bits() - 1, f.bits()][k as usize];
                b.prefix(&f.name, value, len)
            }
            (FieldKind::Range, 0) => b.any(&f.name),
            (FieldKind::Range, k) => {
                let hi = value
                    .saturating_add(u128::from(k * (seed % 3)))
                    .min(f.max());
                b.range(&f.name, value, hi)
            }
            (FieldKind::WildcardMatch, 0) => b.exact(&f.name, 0),
            _ => b.exact(&f.name, value),
        };
    }
    b.build().unwrap()
}

mod concurrency;
mod contract;
mod oracle;
mod rules;
mod tables;

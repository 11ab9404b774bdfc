//! Prefix sets of the LPM suites, read from the data directory with a
//! generated fallback (and a note saying so) when a file is absent.

use crate::prefixes::{
    Family, IPV4_TABLE, Prefix, RIS_INITIAL_IPV4, V4, generate, load_prefixes, shuffled, top_up,
};
use crate::suite::Ctx;

/// Seed of every shuffled order and generated set of the LPM suites.
pub const SEED: u64 = 0x6c70_6d00;

/// A prefix set and where it came from.
pub struct PrefixSet<F: Family> {
    /// The prefixes, distinct.
    pub prefixes: Vec<Prefix<F>>,
    /// One line for notes and the report.
    pub source: String,
}

/// The prefixes of `rel` under the data directory, or `None` (with a note)
/// if the file is absent or unreadable.
pub fn load<F: Family>(ctx: &Ctx, rel: &str) -> Option<Vec<Prefix<F>>> {
    let Some(path) = ctx.data_file(rel) else {
        ctx.note(&format!(
            "{}: {} not found under {}",
            ctx.suite(),
            rel,
            ctx.data_dir().display()
        ));
        return None;
    };
    match load_prefixes(&path) {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => {
            ctx.note(&format!("{}: {} is empty", ctx.suite(), path.display()));
            None
        }
        Err(e) => {
            ctx.note(&format!("{}: reading {}: {e}", ctx.suite(), path.display()));
            None
        }
    }
}

/// Generated IPv4 prefixes: lengths /8 to /32, uniform.
pub fn generated_ipv4(count: usize) -> Vec<Prefix<V4>> {
    generate(count, 8..=32, SEED)
}

/// `want` distinct IPv4 prefixes: the real table in a fixed shuffled
/// order; past its 901,899 prefixes, those of the RIS peer's table not
/// already in it (also shuffled); then generated ones. Without the real
/// table, all generated.
pub fn ipv4_prefixes(ctx: &Ctx, want: usize) -> PrefixSet<V4> {
    let Some(table) = load::<V4>(ctx, IPV4_TABLE) else {
        ctx.note(&format!(
            "{}: using {want} generated prefixes (/8-/32) instead of the real IPv4 table",
            ctx.suite()
        ));
        return PrefixSet {
            prefixes: generated_ipv4(want),
            source: format!("{want} generated prefixes, lengths /8-/32 uniform"),
        };
    };
    let real = table.len();
    let mut prefixes = shuffled(&table, SEED);
    prefixes.truncate(want);
    let mut source = format!("the real IPv4 table ({real} prefixes) in a fixed shuffled order");
    if want > prefixes.len()
        && let Some(ris) = load::<V4>(ctx, RIS_INITIAL_IPV4)
    {
        top_up(&mut prefixes, &shuffled(&ris, SEED + 1), want);
        source += &format!(
            ", then {} more from the RIS AS3333 table",
            prefixes.len() - real
        );
    }
    if want > prefixes.len() {
        let before = prefixes.len();
        top_up(&mut prefixes, &generated_ipv4(want + want / 4), want);
        source += &format!(", then {} generated", prefixes.len() - before);
    }
    PrefixSet { prefixes, source }
}

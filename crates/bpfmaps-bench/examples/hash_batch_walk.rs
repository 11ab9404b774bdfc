//! The hash map's native batch walk alone: a `u32 -> u64` map of N
//! entries, stored from a shuffled order (as the `python` suite's table
//! is), read whole through `Map::lookup_batch` in batches of 4,096 (the
//! Python package's batch), R times; prints the median, fastest and
//! slowest walk in ns an entry.
//!
//! `cargo run --release -p bpfmaps-bench --example hash_batch_walk --
//! 100000 31` (docs/benchmarks.md, "The batch walk in windows").

use std::time::Instant;

use bpfmaps::{BPF_NOEXIST, MapSpec, MapType, create};
use rand::SeedableRng;
use rand::seq::SliceRandom;

const BATCH: usize = 4096;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let n = args.next().map_or(100_000, |a| a.expect("entries"));
    let reps = args.next().map_or(31, |a| a.expect("walks")).max(1);
    let map = create(&MapSpec::new(MapType::HASH, 4, 8, n as u32)).unwrap();
    let mut keys: Vec<u32> = (0..n as u32).collect();
    keys.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    for &k in &keys {
        map.update(
            &k.to_ne_bytes(),
            &(u64::from(k) * 3).to_ne_bytes(),
            BPF_NOEXIST,
        )
        .unwrap();
    }
    let (mut kbuf, mut vbuf) = (vec![0u8; BATCH * 4], vec![0u8; BATCH * 8]);
    let mut walks: Vec<f64> = (0..reps)
        .map(|_| {
            let began = Instant::now();
            let (mut after, mut total, mut sum) = (None::<[u8; 4]>, 0, 0u64);
            loop {
                let got = map
                    .lookup_batch(after.as_ref().map(|a| &a[..]), &mut kbuf, &mut vbuf)
                    .unwrap();
                total += got;
                sum = sum.wrapping_add(vbuf[..got * 8].chunks(8).map(|v| u64::from(v[0])).sum());
                if got < BATCH {
                    break;
                }
                after = Some(kbuf[(got - 1) * 4..][..4].try_into().unwrap());
            }
            assert_eq!(total, n, "every entry once");
            std::hint::black_box(sum);
            began.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    walks.sort_by(f64::total_cmp);
    println!(
        "{n} entries: {:.2} ns an entry (median of {reps} walks; {:.2}-{:.2})",
        walks[reps / 2],
        walks[0],
        walks[reps - 1]
    );
}

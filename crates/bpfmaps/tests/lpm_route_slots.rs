//! A test with a process of its own: it pins a guard for a long time,
//! which holds back every grace period in the process (epochs are global),
//! so beside the library's tests it would starve their writers.

use bpfmaps::lpm::LpmTrie;
use bpfmaps::{BPF_ANY, Error, Map, pin};

/// Values over 4 bytes live in route slots, and a replaced one is reused
/// only after its grace period: a reader pinned throughout holds them all
/// back, so replacing values eventually fails with EBUSY, leaving the map
/// as it was. Once the reader unpins, the writer reclaims them and goes on.
#[test]
fn route_slots_held_back_by_a_pinned_reader_give_ebusy_then_return() {
    let t = LpmTrie::new(4, 8, 16).unwrap();
    t.insert(&[10, 0, 0, 0], 8, &[0; 8], BPF_ANY).unwrap();
    let held = pin();
    let mut last = 0u8;
    let busy = (1..=10_000u32).find_map(|i| {
        let value = [i as u8; 8];
        match t.insert(&[10, 0, 0, 0], 8, &value, BPF_ANY) {
            Ok(()) => {
                last = i as u8;
                None
            }
            Err(e) => Some(e),
        }
    });
    assert_eq!(busy, Some(Error::Busy));
    assert_eq!(
        t.get(&[10, 1, 2, 3], &held).as_deref(),
        Some(&[last; 8][..])
    );
    drop(held);
    t.insert(&[10, 0, 0, 0], 8, &[7; 8], BPF_ANY).unwrap();
    assert_eq!(
        t.get(&[10, 1, 2, 3], &pin()).as_deref(),
        Some(&[7u8; 8][..])
    );
    assert_eq!(t.len(), 1);
}

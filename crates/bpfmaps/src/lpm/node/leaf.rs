//! What a lookup answers with (a leaf, or a hit), how blocks store it
//! (payload words and one-byte run codes), and how runs are coded.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{DataBlock, prefix_index};

/// What a lookup answers with: the matched prefix's length and its payload
/// (the value itself when values fit in 4 bytes, else a route slot id), so
/// a lookup ends at the leaf with no further load for small values. Blocks
/// store it in two halves (a run's payload and a one-byte code that gives
/// the length); the inherited default and the direct index store it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Leaf {
    pub payload: [u8; 4],
    pub prefixlen: u32,
}

impl Leaf {
    /// No prefix matches.
    pub const NONE: Leaf = Leaf {
        payload: [0; 4],
        prefixlen: u32::MAX,
    };

    #[inline(always)]
    pub fn is_none(&self) -> bool {
        self.prefixlen == u32::MAX
    }

    /// The leaf's bytes as one word.
    #[inline(always)]
    const fn to_word(self) -> u64 {
        let [p0, p1, p2, p3] = self.payload;
        let [l0, l1, l2, l3] = self.prefixlen.to_ne_bytes();
        u64::from_ne_bytes([p0, p1, p2, p3, l0, l1, l2, l3])
    }

    #[inline(always)]
    const fn from_word(word: u64) -> Leaf {
        let [p0, p1, p2, p3, l0, l1, l2, l3] = word.to_ne_bytes();
        Leaf {
            payload: [p0, p1, p2, p3],
            prefixlen: u32::from_ne_bytes([l0, l1, l2, l3]),
        }
    }
}

/// A whole leaf as one word, which readers load whole, so the writer can
/// give the prefix a new payload in place while lookups run: a block's
/// inherited default.
#[repr(transparent)]
pub(crate) struct LeafCell(AtomicU64);

impl LeafCell {
    pub const fn new(leaf: Leaf) -> Self {
        LeafCell(AtomicU64::new(leaf.to_word()))
    }

    /// Acquire: pairs with the writer's release store of a new payload,
    /// which may be the id of a route slot filled just before.
    #[inline(always)]
    pub fn load(&self) -> Leaf {
        Leaf::from_word(self.0.load(Ordering::Acquire))
    }

    /// Writer: the same prefix with a new payload.
    pub(super) fn set_payload(&self, payload: [u8; 4]) {
        let leaf = Leaf {
            payload,
            ..self.load()
        };
        self.0.store(leaf.to_word(), Ordering::Release);
    }
}

/// A payload as a block stores it (a run's, or a hidden prefix's): its
/// bytes as one word (`u32::from_ne_bytes`), which readers load whole and
/// the writer may overwrite in place.
pub(super) type PayloadCell = AtomicU32;

/// Acquire: a payload written in place may be the id of a route slot the
/// writer filled just before its release store (`store_payload`); the
/// reader then reads that slot. (A plain load on x86; a relaxed one would
/// let the slot's bytes be read before they are visible elsewhere.)
#[inline(always)]
pub(super) fn load_payload(cell: &PayloadCell) -> [u8; 4] {
    cell.load(Ordering::Acquire).to_ne_bytes()
}

/// Release: publishes a route slot filled before the store (pairs with
/// `load_payload`).
pub(super) fn store_payload(cell: &PayloadCell, payload: [u8; 4]) {
    cell.store(u32::from_ne_bytes(payload), Ordering::Release);
}

/// A run's code: `l + 1` for the node's prefix of `l` bits (0..=8) that
/// covers the run, else [`INHERITED`] or [`NO_MATCH`].
pub(super) fn code_of(l: u32) -> u8 {
    l as u8 + 1
}

/// Code of a run that inherits the node's default, a matching prefix.
pub(super) const INHERITED: u8 = 10;
/// Code of a run that matches nothing (the node's default is no match), so
/// whether a run matched is one compare of its code with 0.
pub(super) const NO_MATCH: u8 = 0;

/// The code of runs inheriting `default`.
pub(super) fn default_code(default: Leaf) -> u8 {
    if default.is_none() {
        NO_MATCH
    } else {
        INHERITED
    }
}

/// Bits inside the node of the prefix a run with `code` answers with, if
/// it is one of the node's own.
pub(super) fn own_bits(code: u8) -> Option<u32> {
    (code != NO_MATCH && code != INHERITED).then(|| u32::from(code) - 1)
}

/// The node's prefix a run with `code` starting at byte `start` answers
/// with, if it is one of the node's own (its index, see `prefix_index`).
pub(super) fn winner_of(code: u8, start: usize) -> Option<usize> {
    own_bits(code).map(|l| prefix_index(l, start as u8))
}

/// Whether runs with the same `code` starting at bytes `a` and `b` have
/// the same winner: the default, or one prefix of the node.
pub(super) fn same_winner(code: u8, a: usize, b: usize) -> bool {
    own_bits(code).is_none_or(|l| (a ^ b) >> (8 - l) == 0)
}

/// What a lookup reads from where it ends: a whole [`Leaf`] (value and
/// prefix length, for `longest_match`), or a [`Hit`] (value and whether
/// anything matched, for `get`), which takes fewer instructions, so more
/// lookups fit in the CPU's reorder window at once.
pub(crate) trait Answer: Copy {
    fn from_leaf(leaf: Leaf) -> Self;
    /// The answer of run `run` of `block` (`run < n_runs`).
    fn from_run(block: &DataBlock, run: usize) -> Self;
}

impl Answer for Leaf {
    #[inline(always)]
    fn from_leaf(leaf: Leaf) -> Self {
        leaf
    }
    #[inline(always)]
    fn from_run(block: &DataBlock, run: usize) -> Self {
        block.leaf_at(run)
    }
}

/// A lookup's answer without the prefix length, in one register (so a
/// caller's choice between answers is one conditional move): the payload
/// in the low 32 bits; from bit 34 up, something nonzero for a match and
/// zero for none (a run's code, or the direct index's packed length + 1,
/// which `Hit::from_bits` takes as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hit(u64);

impl Hit {
    /// No match.
    pub const NONE: Hit = Hit(0);

    /// A hit whose bits are laid out as above.
    #[inline(always)]
    pub fn from_bits(bits: u64) -> Self {
        Hit(bits)
    }

    #[inline(always)]
    fn new(payload: [u8; 4], matched: u64) -> Self {
        Hit(u64::from(u32::from_ne_bytes(payload)) | matched << 34)
    }

    #[inline(always)]
    pub fn payload(self) -> [u8; 4] {
        (self.0 as u32).to_ne_bytes()
    }

    #[inline(always)]
    pub fn is_none(self) -> bool {
        self.0 >> 34 == 0
    }
}

impl Answer for Hit {
    #[inline(always)]
    fn from_leaf(leaf: Leaf) -> Self {
        Hit::new(leaf.payload, u64::from(!leaf.is_none()))
    }
    #[inline(always)]
    fn from_run(block: &DataBlock, run: usize) -> Self {
        // Nonzero codes match.
        Hit::new(block.payload(run), u64::from(block.code(run)))
    }
}

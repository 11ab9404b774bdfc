//! libhat-trie (Debian's `libhat-trie-dev`), Daniel Jones's C HAT-trie: a
//! burst trie whose leaves are array hash tables (each slot one block of
//! length-prefixed keys with their values), mapping byte strings to one
//! word each.
//!
//! The declarations below are written by hand from `hat-trie/hat-trie.h`;
//! [`HatTrie`] owns one trie and frees it when dropped.
//!
//! Memory: the library calls `malloc`, `realloc` and `free` itself, with
//! no hook to replace them, so the counting allocator does not see its
//! blocks. [`HatTrie::memory`] is its own account instead
//! (`hattrie_sizeof`): the trie nodes, each table's slot and size arrays
//! and the bytes in its slots, which is what it asked `malloc` for (the
//! slots are grown by `realloc` to exactly the bytes they hold).
//!
//! Order: its iterator can sort each leaf table's keys as it reaches it
//! (`sorted = true`), which gives all keys in byte order.

use std::ffi::c_char;

/// `hattrie_t`, opaque.
#[repr(C)]
struct RawTrie {
    _opaque: [u8; 0],
}

/// `hattrie_iter_t`, opaque.
#[repr(C)]
struct RawIter {
    _opaque: [u8; 0],
}

/// `value_t` (`uintptr_t`).
type Value = usize;

// From hat-trie.h. `hattrie_tryget` takes a `hattrie_t*` but only reads:
// it finds the key's node and scans one slot, writing nothing.
unsafe extern "C" {
    fn hattrie_create() -> *mut RawTrie;
    fn hattrie_free(t: *mut RawTrie);
    fn hattrie_size(t: *const RawTrie) -> usize;
    fn hattrie_sizeof(t: *const RawTrie) -> usize;
    fn hattrie_get(t: *mut RawTrie, key: *const c_char, len: usize) -> *mut Value;
    fn hattrie_tryget(t: *mut RawTrie, key: *const c_char, len: usize) -> *mut Value;
    fn hattrie_iter_begin(t: *const RawTrie, sorted: bool) -> *mut RawIter;
    fn hattrie_iter_next(i: *mut RawIter);
    fn hattrie_iter_finished(i: *mut RawIter) -> bool;
    fn hattrie_iter_free(i: *mut RawIter);
    fn hattrie_iter_key(i: *mut RawIter, len: *mut usize) -> *const c_char;
    fn hattrie_iter_val(i: *mut RawIter) -> *mut Value;
}

/// The longest key a leaf table stores (`ahtable_get` exits the process
/// past it).
pub const MAX_KEY: usize = 32767;

/// A HAT-trie from non-empty byte strings to words.
pub struct HatTrie {
    /// Owned; never null.
    raw: *mut RawTrie,
}

// SAFETY: the trie is malloc'ed memory reached only through `raw`, which
// this value owns; the library keeps no per-thread state.
unsafe impl Send for HatTrie {}

// SAFETY: `&self` reaches only `hattrie_tryget`, `hattrie_size`,
// `hattrie_sizeof` and the iterator, which read the trie (an iterator's
// own state is its allocation); writes need `&mut self`.
unsafe impl Sync for HatTrie {}

impl Default for HatTrie {
    fn default() -> Self {
        Self::new()
    }
}

impl HatTrie {
    /// An empty trie.
    pub fn new() -> HatTrie {
        // SAFETY: no arguments; it aborts rather than return null
        // (`malloc_or_die`).
        let raw = unsafe { hattrie_create() };
        assert!(!raw.is_null(), "hattrie_create");
        HatTrie { raw }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        // SAFETY: `raw` is a live trie.
        unsafe { hattrie_size(self.raw) }
    }

    /// Whether it holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the trie allocated, by its own account (`hattrie_sizeof`).
    pub fn memory(&self) -> usize {
        // SAFETY: `raw` is a live trie; this walks it read-only.
        unsafe { hattrie_sizeof(self.raw) }
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<usize> {
        check(key);
        // SAFETY: `raw` is a live trie, which tryget only reads (see the
        // declarations); the key is `key.len()` readable bytes.
        let slot = unsafe { hattrie_tryget(self.raw, key.as_ptr().cast(), key.len()) };
        // SAFETY: a non-null slot points at the key's value inside the
        // trie, valid until the next change, which needs `&mut self`.
        (!slot.is_null()).then(|| unsafe { slot.read() })
    }

    /// Inserts `key` with `value`, or replaces its value; returns the old
    /// one.
    pub fn insert(&mut self, key: &[u8], value: usize) -> Option<usize> {
        check(key);
        let before = self.len();
        // SAFETY: `raw` is a live trie and `&mut self` makes this the only
        // access; the key is `key.len()` readable bytes, 1 to `MAX_KEY`
        // (checked above), which the library copies.
        let slot = unsafe { hattrie_get(self.raw, key.as_ptr().cast(), key.len()) };
        assert!(!slot.is_null(), "hattrie_get");
        // SAFETY: the key's value slot, valid until the next change;
        // `&mut self` is held.
        let old = unsafe { slot.replace(value) };
        // A new key counts one more (its value starts as 0).
        (self.len() == before).then_some(old)
    }

    /// Calls `f` with every key and value in byte order (each leaf table
    /// sorted as the walk reaches it).
    pub fn for_each_sorted(&self, mut f: impl FnMut(&[u8], usize)) {
        // SAFETY: `raw` is a live trie, unchanged while `&self` is held;
        // the iterator is freed below and used only in between.
        unsafe {
            let it = hattrie_iter_begin(self.raw, true);
            assert!(!it.is_null(), "hattrie_iter_begin");
            while !hattrie_iter_finished(it) {
                let mut len = 0usize;
                let key = hattrie_iter_key(it, &mut len);
                let value = *hattrie_iter_val(it);
                // The key is `len` bytes in the iterator's own buffer,
                // valid until the next step.
                f(std::slice::from_raw_parts(key.cast::<u8>(), len), value);
                hattrie_iter_next(it);
            }
            hattrie_iter_free(it);
        }
    }
}

/// Keys the library takes: not empty (its `tryget` answers the root's
/// slot for an empty key, stored or not) and at most [`MAX_KEY`] bytes.
#[inline(always)]
fn check(key: &[u8]) {
    assert!(
        !key.is_empty() && key.len() <= MAX_KEY,
        "hat-trie keys are 1..={MAX_KEY} bytes"
    );
}

impl Drop for HatTrie {
    fn drop(&mut self) {
        // SAFETY: `raw` is this trie, owned, and not used again.
        unsafe { hattrie_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_reads_and_walks_in_byte_order() {
        let mut t = HatTrie::new();
        assert!(t.is_empty());
        assert_eq!(t.get(b"absent"), None);
        // Enough keys sharing prefixes for leaf tables to burst into trie
        // nodes (a table bursts past 16,384 keys), keys that are prefixes
        // of others, NUL and 0xff bytes, and long keys.
        let mut keys: Vec<Vec<u8>> = vec![b"a".to_vec(), b"a\0".to_vec(), vec![0xff; 3]];
        for i in 0..40_000u32 {
            keys.push(format!("k{}", i * 7).into_bytes());
        }
        keys.push(vec![b'z'; 400]);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.insert(k, i), None, "{k:?}");
        }
        assert_eq!(t.insert(b"a", 99), Some(0));
        assert_eq!(t.len(), keys.len());
        assert_eq!(t.get(b"a"), Some(99));
        assert_eq!(t.get(b"a\0"), Some(1));
        assert_eq!(t.get(b"k1"), None);
        let mut seen = Vec::new();
        t.for_each_sorted(|k, _| seen.push(k.to_vec()));
        keys.sort();
        assert_eq!(seen, keys);
        let key_bytes: usize = keys.iter().map(Vec::len).sum();
        assert!(
            t.memory() >= key_bytes + 8 * keys.len(),
            "{} bytes for {key_bytes} bytes of keys",
            t.memory()
        );
    }

    #[test]
    #[should_panic(expected = "hat-trie keys")]
    fn refuses_an_empty_key() {
        HatTrie::new().get(b"");
    }
}

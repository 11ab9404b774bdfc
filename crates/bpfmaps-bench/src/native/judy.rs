//! JudyHS and JudySL, from libJudy (Debian's `libjudy-dev`): maps from
//! byte strings of any length ([`JudyHs`]) or from NUL-terminated strings
//! ([`JudySl`], ordered) to one machine word each.
//!
//! JudyHS takes no hasher. It first splits keys by length (a JudyL array
//! indexed by length); keys of up to one word (8 bytes) are then decoded
//! directly as a JudyL index, and longer ones are hashed with JudyHS's own
//! 32-bit `h * 31 + byte` into a JudyL array per length, collisions
//! resolved by decoding the key a word at a time in further JudyL arrays.
//!
//! JudySL decodes a string a word at a time down a tree of JudyL arrays,
//! the unique tail of a string kept in a leaf, so it walks its keys in
//! byte order (`JudySLFirst`/`JudySLNext`).
//!
//! The declarations below are written by hand from `Judy.h` (JudyHS and
//! JudySL sections); [`JudyHs`] and [`JudySl`] each own one array
//! (`Array`), freed when dropped, with a count of its keys, as Judy has
//! none.
//!
//! Memory: libJudy allocates through four functions a program may replace
//! (`JudyMalloc`, `JudyFree` and their `Virtual` twins, the "memory
//! interface to malloc()" of `Judy.h`). They are defined here over Rust's
//! global allocator, so the counting allocator sees a Judy array's memory
//! as it sees a Rust map's; `build.rs` exports them from the binary, so
//! that libJudy.so's calls reach them instead of its own.

use std::alloc::Layout;
use std::ffi::{c_int, c_ulong, c_void};
use std::ptr;

/// Judy's `Word_t` (`typedef unsigned long Word_t`).
type Word = c_ulong;

/// Judy's `JError_t`, only ever passed as a null `PJError_t` (`PJE0`):
/// errors then show as the `PJERR`/`JERR` return values.
#[repr(C)]
struct JError {
    _opaque: [u8; 0],
}

// From Judy.h:
//   extern PPvoid_t JudyHSGet(Pcvoid_t, void *, Word_t);
//   extern PPvoid_t JudyHSIns(PPvoid_t, void *, Word_t, P_JE);
//   extern int      JudyHSDel(PPvoid_t, void *, Word_t, P_JE);
//   extern Word_t   JudyHSFreeArray(PPvoid_t, P_JE);
// The `PPvoid_t` Get and Ins return points at the key's value word, so it
// is declared as `*mut Word`. The key is `void *` but only read.
unsafe extern "C" {
    fn JudyHSGet(array: *const c_void, key: *mut c_void, len: Word) -> *mut Word;
    fn JudyHSIns(
        array: *mut *mut c_void,
        key: *mut c_void,
        len: Word,
        err: *mut JError,
    ) -> *mut Word;
    fn JudyHSDel(array: *mut *mut c_void, key: *mut c_void, len: Word, err: *mut JError) -> c_int;
    fn JudyHSFreeArray(array: *mut *mut c_void, err: *mut JError) -> Word;
}

// From Judy.h:
//   extern PPvoid_t JudySLGet(Pcvoid_t, const uint8_t * Index, P_JE);
//   extern PPvoid_t JudySLIns(PPvoid_t, const uint8_t * Index, P_JE);
//   extern Word_t   JudySLFreeArray(PPvoid_t, P_JE);
//   extern PPvoid_t JudySLFirst(Pcvoid_t, uint8_t * Index, P_JE);
//   extern PPvoid_t JudySLNext(Pcvoid_t, uint8_t * Index, P_JE);
// `Index` is a NUL-terminated string; First and Next write the key they
// find into it, so it must have room for the longest key and its NUL.
unsafe extern "C" {
    fn JudySLGet(array: *const c_void, key: *const u8, err: *mut JError) -> *mut Word;
    fn JudySLIns(array: *mut *mut c_void, key: *const u8, err: *mut JError) -> *mut Word;
    fn JudySLFreeArray(array: *mut *mut c_void, err: *mut JError) -> Word;
    fn JudySLFirst(array: *const c_void, key: *mut u8, err: *mut JError) -> *mut Word;
    fn JudySLNext(array: *const c_void, key: *mut u8, err: *mut JError) -> *mut Word;
}

/// `PJERR`: `(PPvoid_t) ~0UL`, what Ins returns when malloc fails.
const PJERR: usize = usize::MAX;

/// The layout of a block of `words` words (at least one), word-aligned as
/// Judy needs (it keeps flags in a pointer's low 3 bits).
fn block(words: Word) -> Option<Layout> {
    let bytes = usize::try_from(words.max(1))
        .ok()?
        .checked_mul(size_of::<Word>())?;
    Layout::from_size_align(bytes, align_of::<Word>()).ok()
}

/// `Word_t JudyMalloc(Word_t Words)`: a block of `words` words, as an
/// address; 0 when out of memory.
#[unsafe(no_mangle)]
extern "C" fn JudyMalloc(words: Word) -> Word {
    match block(words) {
        // SAFETY: the layout's size is non-zero (at least one word).
        Some(layout) => unsafe { std::alloc::alloc(layout) }.expose_provenance() as Word,
        None => 0,
    }
}

/// `void JudyFree(void *PWord, Word_t Words)`.
///
/// # Safety
/// `p` is null or a block from [`JudyMalloc`] of `words` words, not
/// freed since: libJudy frees every block it allocated with the size it
/// asked for.
#[unsafe(no_mangle)]
unsafe extern "C" fn JudyFree(p: *mut c_void, words: Word) {
    if let (false, Some(layout)) = (p.is_null(), block(words)) {
        // SAFETY: `p` came from `JudyMalloc(words)`, which allocated it
        // with this same layout through the global allocator.
        unsafe { std::alloc::dealloc(p.cast(), layout) };
    }
}

/// `Word_t JudyMallocVirtual(Word_t Words)`: as [`JudyMalloc`].
#[unsafe(no_mangle)]
extern "C" fn JudyMallocVirtual(words: Word) -> Word {
    JudyMalloc(words)
}

/// `void JudyFreeVirtual(void *PWord, Word_t Words)`: as [`JudyFree`].
///
/// # Safety
/// As for [`JudyFree`].
#[unsafe(no_mangle)]
unsafe extern "C" fn JudyFreeVirtual(p: *mut c_void, words: Word) {
    // SAFETY: the caller's guarantee is JudyFree's.
    unsafe { JudyFree(p, words) }
}

/// A Judy array, owned: its root and the count of its keys.
struct Array {
    /// The root (`Pvoid_t`, null when empty).
    root: *mut c_void,
    /// Keys held.
    len: usize,
    /// The FreeArray of the array's kind (`JudyHSFreeArray`, ...).
    free: unsafe extern "C" fn(*mut *mut c_void, *mut JError) -> Word,
}

// SAFETY: the array is memory from malloc reached only through `root`,
// which this value owns; libJudy keeps no per-thread state, so the array
// may be used and freed from any thread.
unsafe impl Send for Array {}

impl Array {
    /// An empty array (allocates nothing) that `free` frees.
    fn new(free: unsafe extern "C" fn(*mut *mut c_void, *mut JError) -> Word) -> Array {
        Array {
            root: ptr::null_mut(),
            len: 0,
            free,
        }
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: the root is this array's, owned by us, built by the
        // calls of the kind `free` belongs to, and not used again:
        // FreeArray frees every node and sets it to null. An empty (null)
        // array is allowed.
        unsafe { (self.free)(&mut self.root, ptr::null_mut()) };
    }
}

/// A JudyHS array: byte-string keys, word values.
pub struct JudyHs {
    array: Array,
}

// SAFETY: `&self` only reaches `JudyHSGet`, which reads the array (walks
// JudyL arrays and compares keys) and writes nothing, so lookups from
// several threads at once are reads of unchanging memory. Writes need
// `&mut self`.
unsafe impl Sync for JudyHs {}

impl Default for JudyHs {
    fn default() -> Self {
        Self::new()
    }
}

impl JudyHs {
    /// An empty array (allocates nothing).
    pub fn new() -> JudyHs {
        JudyHs {
            array: Array::new(JudyHSFreeArray),
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.array.len
    }

    /// Whether it holds no keys.
    pub fn is_empty(&self) -> bool {
        self.array.len == 0
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<usize> {
        let slot = self.slot(key);
        // SAFETY: a non-null slot from `JudyHSGet` points at the key's
        // value word inside the array, valid until the next insert or
        // delete, which needs `&mut self` while this borrows `&self`.
        (!slot.is_null()).then(|| unsafe { slot.read() } as usize)
    }

    /// Inserts `key` with `value`, or replaces its value; returns the old
    /// one.
    pub fn insert(&mut self, key: &[u8], value: usize) -> Option<usize> {
        let slot = self.slot(key);
        if !slot.is_null() {
            // SAFETY: as in `get`, and `&mut self` makes this the only
            // access to the array.
            return Some(unsafe { slot.replace(value as Word) } as usize);
        }
        // SAFETY: `self.array.root` is this array's root (null or from
        // earlier calls), which Ins may move and updates through the
        // pointer; the key is `key.len()` readable bytes that JudyHS copies
        // and does not write; a null `PJError_t` is allowed (PJE0).
        let slot = unsafe {
            JudyHSIns(
                &mut self.array.root,
                key.as_ptr().cast_mut().cast(),
                key.len() as Word,
                ptr::null_mut(),
            )
        };
        assert!(
            !slot.is_null() && slot.addr() != PJERR,
            "JudyHSIns failed (out of memory)"
        );
        // SAFETY: Ins returned the new key's value word (initialised to
        // 0), valid until the next insert or delete; `&mut self` is held.
        unsafe { slot.write(value as Word) };
        self.array.len += 1;
        None
    }

    /// Removes `key`; returns its value if it was present.
    pub fn remove(&mut self, key: &[u8]) -> Option<usize> {
        let old = self.get(key)?;
        // SAFETY: as for `JudyHSIns` in `insert`: the array's root, a
        // readable key, PJE0.
        let rc = unsafe {
            JudyHSDel(
                &mut self.array.root,
                key.as_ptr().cast_mut().cast(),
                key.len() as Word,
                ptr::null_mut(),
            )
        };
        assert_eq!(rc, 1, "JudyHSDel of a present key");
        self.array.len -= 1;
        Some(old)
    }

    /// The key's value word, or null.
    #[inline(always)]
    fn slot(&self, key: &[u8]) -> *mut Word {
        // SAFETY: `self.array.root` is null (an empty array) or a root built
        // by JudyHSIns/Del; the key is `key.len()` readable bytes, which
        // JudyHSGet only reads (it is declared `void *` but not written).
        unsafe {
            JudyHSGet(
                self.array.root,
                key.as_ptr().cast_mut().cast(),
                key.len() as Word,
            )
        }
    }
}

/// A JudySL array: NUL-terminated string keys, word values, ordered.
///
/// Keys are passed with their terminating NUL (`b"key\0"`): a C string
/// as JudySL takes it, so a lookup copies nothing. The key is the bytes
/// before the first NUL, so a key cannot hold a NUL byte.
///
/// JudySLIns sets a new key's word to 0, so the array holds each value
/// plus one: a 0 word marks a key just inserted, and an insert is one
/// call. Values go up to `usize::MAX - 1`.
pub struct JudySl {
    array: Array,
    /// The longest key inserted, in bytes without the NUL: the room
    /// `JudySLFirst`/`JudySLNext` need to write a key.
    longest: usize,
}

// SAFETY: `&self` only reaches `JudySLGet`, `JudySLFirst` and `JudySLNext`,
// which read the array (the key buffer they write is the caller's own);
// writes need `&mut self`.
unsafe impl Sync for JudySl {}

impl Default for JudySl {
    fn default() -> Self {
        Self::new()
    }
}

/// The pointer to a NUL-terminated `key` (its bytes up to the first NUL),
/// checking that it ends in a NUL, so that C reads stay inside it.
#[inline(always)]
fn c_string(key: &[u8]) -> *const u8 {
    assert_eq!(key.last(), Some(&0), "JudySL keys end in a NUL");
    key.as_ptr()
}

impl JudySl {
    /// An empty array (allocates nothing).
    pub fn new() -> JudySl {
        JudySl {
            array: Array::new(JudySLFreeArray),
            longest: 0,
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.array.len
    }

    /// Whether it holds no keys.
    pub fn is_empty(&self) -> bool {
        self.array.len == 0
    }

    /// The value of the NUL-terminated `key`, if present.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<usize> {
        // SAFETY: `self.array.root` is null (empty) or a root built by
        // JudySLIns; `c_string` checked that the key's bytes end in a NUL,
        // so JudySLGet reads only inside `key`.
        let slot = unsafe { JudySLGet(self.array.root, c_string(key), ptr::null_mut()) };
        // SAFETY: a non-null slot points at the key's value word inside
        // the array, valid until the next insert, which needs `&mut self`.
        (!slot.is_null()).then(|| unsafe { slot.read() } as usize - 1)
    }

    /// Inserts the NUL-terminated `key` with `value` (below `usize::MAX`),
    /// or replaces its value; returns the old one.
    pub fn insert(&mut self, key: &[u8], value: usize) -> Option<usize> {
        assert!(value < usize::MAX, "JudySl values are below usize::MAX");
        // SAFETY: the array's root (JudySLIns may move it and updates it
        // through the pointer), a NUL-terminated key (checked by
        // `c_string`), which JudySL copies and does not write; PJE0.
        let slot = unsafe { JudySLIns(&mut self.array.root, c_string(key), ptr::null_mut()) };
        assert!(
            !slot.is_null() && slot.addr() != PJERR,
            "JudySLIns failed (out of memory)"
        );
        // SAFETY: Ins returned the key's value word (0 for a new key),
        // valid until the next insert; `&mut self` is held.
        let old = unsafe { slot.replace(value as Word + 1) } as usize;
        if old == 0 {
            self.array.len += 1;
            let chars = key.iter().position(|&b| b == 0).expect("a NUL");
            self.longest = self.longest.max(chars);
        }
        old.checked_sub(1)
    }

    /// Calls `f` with every key (without its NUL) and value, in byte order.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], usize)) {
        // Room for the longest key and its NUL; starts as "", so First
        // finds the smallest key.
        let mut key = vec![0u8; self.longest + 1];
        // SAFETY: the array's root; `key` holds a NUL-terminated string
        // and has room for any stored key and its NUL, which First writes.
        let mut slot = unsafe { JudySLFirst(self.array.root, key.as_mut_ptr(), ptr::null_mut()) };
        while !slot.is_null() {
            let chars = key.iter().position(|&b| b == 0).expect("a NUL");
            // SAFETY: the found key's value word, valid while `&self`
            // keeps the array unchanged.
            f(&key[..chars], unsafe { slot.read() } as usize - 1);
            // SAFETY: as for First; `key` now holds the key just found.
            slot = unsafe { JudySLNext(self.array.root, key.as_mut_ptr(), ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_reads_replaces_and_removes() {
        let mut m = JudyHs::new();
        assert!(m.is_empty());
        assert_eq!(m.get(b"absent"), None);
        assert_eq!(m.remove(b"absent"), None);
        // Lengths around one word, an empty key, NUL bytes, and long keys
        // that share prefixes (the JudyL tree under a hash bucket).
        let mut keys: Vec<Vec<u8>> = vec![Vec::new(), vec![0], vec![0, 0], b"a\0b".to_vec()];
        for len in [1, 7, 8, 9, 16, 17, 64, 300] {
            for i in 0..50u32 {
                let mut k = vec![0xab; len];
                let n = len.min(4);
                k[len - n..].copy_from_slice(&i.to_le_bytes()[..n]);
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.insert(k, i << 8), None, "{k:?}");
        }
        assert_eq!(m.len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), Some(i << 8), "{k:?}");
            assert_eq!(m.insert(k, i), Some(i << 8));
        }
        assert_eq!(m.len(), keys.len());
        assert_eq!(m.get(&[0xab; 65]), None);
        for (i, k) in keys.iter().enumerate().step_by(2) {
            assert_eq!(m.remove(k), Some(i));
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), (i % 2 == 1).then_some(i), "{k:?}");
        }
        assert_eq!(m.len(), keys.len() / 2);
    }

    /// Judy's blocks come from the global allocator, so the counting
    /// allocator sees them (the exported allocation functions are the
    /// ones libJudy calls), and all go back when the array is dropped.
    #[test]
    fn its_memory_is_counted() {
        let probe = crate::alloc::MemProbe::start();
        let mut m = JudyHs::new();
        for i in 0..10_000u64 {
            let mut key = [0u8; 64];
            key[..8].copy_from_slice(&i.to_le_bytes());
            m.insert(&key, 1);
        }
        let held = probe.held();
        assert!(
            held >= 10_000 * 64,
            "JudyHS holds {held} bytes for 640 KB of keys"
        );
        drop(m);
        assert!(
            probe.held() < 1024,
            "{} bytes left after the drop",
            probe.held()
        );
    }

    #[test]
    fn reads_from_several_threads() {
        let mut m = JudyHs::new();
        for i in 0..1000usize {
            m.insert(&i.to_le_bytes(), i);
        }
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for i in 0..1000usize {
                        assert_eq!(m.get(&i.to_le_bytes()), Some(i));
                    }
                });
            }
        });
    }

    /// With their NUL, as JudySL takes them.
    fn c(key: &[u8]) -> Vec<u8> {
        let mut k = key.to_vec();
        k.push(0);
        k
    }

    #[test]
    fn judysl_keeps_strings_in_byte_order() {
        let mut m = JudySl::new();
        assert!(m.is_empty());
        assert_eq!(m.get(&c(b"absent")), None);
        let mut keys: Vec<Vec<u8>> = ["b", "a", "ab", "abc", "abd", "\u{ff}", "a\u{1}"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        keys.push(vec![b'x'; 300]);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.insert(&c(k), i), None, "{k:?}");
        }
        assert_eq!(m.insert(&c(b"ab"), 99), Some(2));
        assert_eq!(m.insert(&c(b"b"), 7), Some(0), "a stored 0 is a value");
        assert_eq!(m.insert(&c(b"b"), 0), Some(7));
        assert_eq!(m.len(), keys.len());
        assert_eq!(m.get(&c(b"ab")), Some(99));
        assert_eq!(m.get(&c(b"abcd")), None);
        let mut seen = Vec::new();
        m.for_each(|k, _| seen.push(k.to_vec()));
        keys.sort();
        assert_eq!(seen, keys);
    }

    #[test]
    #[should_panic(expected = "end in a NUL")]
    fn judysl_refuses_a_key_without_its_nul() {
        JudySl::new().get(b"key");
    }

    /// JudySL's blocks come through the same hooks as JudyHS's.
    #[test]
    fn judysl_memory_is_counted() {
        let probe = crate::alloc::MemProbe::start();
        let mut m = JudySl::new();
        for i in 0..10_000u32 {
            m.insert(&c(format!("key-{i:08}-with-a-long-tail").as_bytes()), 1);
        }
        assert!(probe.held() >= 10_000 * 8, "JudySL holds {}", probe.held());
        drop(m);
        assert!(probe.held() < 1024, "{} left after the drop", probe.held());
    }
}

//! bpfmaps from C: libbpf's map calls (`bpf_map_create`,
//! `bpf_map_lookup_elem`, ... the batches, `bpf_map_get_info_by_fd`) with
//! a `bpfmaps_` prefix, the same signatures and the same semantics, over
//! every family of the registry.
//!
//! - A map is a small non-negative handle, a real file descriptor (a
//!   memfd named after the map) that only these calls understand; close
//!   it with [`bpfmaps_map_close`].
//! - Every call returns 0 (or the handle) on success and a negative errno
//!   on failure, and then also sets `errno`, as libbpf does. A NULL
//!   pointer where one is needed is `EFAULT`, as the kernel answers; an
//!   unknown handle `EBADF`; a panic inside bpfmaps (a bug) `EIO`, never
//!   an unwind into C.
//! - Keys and values are the map's `key_size` and `value_size` bytes.
//!   For a map with variable-length keys (the qp-trie map) a key is laid
//!   out as the kernel lays out an LPM key: a native-endian `u32` length,
//!   then that many bytes (a buffer of `4 + key_size` bytes holds any).
//! - Lookups run lock-free: a call announces itself and finds its map,
//!   and a close frees the map only after the calls that found it return.
//!
//! `include/bpfmaps.h` is this file's header (cbindgen; a test keeps it
//! current), `include/bpfmaps/libbpf_compat.h` maps libbpf's names onto
//! these, and `docs/c-api.md` has the details. From Rust:
//!
//! ```
//! use bpfmaps_capi::*;
//! use std::ptr::{null, null_mut};
//!
//! unsafe {
//!     let fd = bpfmaps_map_create(BPFMAPS_MAP_TYPE_HASH, c"flows".as_ptr(), 4, 8, 1024, null());
//!     assert!(fd >= 0);
//!     let (key, value) = (7u32, 42u64);
//!     assert_eq!(bpfmaps_map_update_elem(fd, (&raw const key).cast(), (&raw const value).cast(), 0), 0);
//!     let mut out = 0u64;
//!     assert_eq!(bpfmaps_map_lookup_elem(fd, (&raw const key).cast(), (&raw mut out).cast()), 0);
//!     assert_eq!(out, 42);
//!     let missing = 8u32;
//!     assert_eq!(bpfmaps_map_lookup_elem(fd, (&raw const missing).cast(), (&raw mut out).cast()), -2);
//!     assert_eq!(bpfmaps_map_close(fd), 0);
//!     assert_eq!(bpfmaps_map_close(fd), -9); // EBADF
//! }
//! ```

#![allow(non_camel_case_types)]

mod handles;
mod opts;

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_int, c_ulonglong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};

use bpfmaps::{BatchError, BatchKeys, Caps, Error, MapSpec, MapType};

pub use opts::{bpfmaps_map_batch_opts, bpfmaps_map_create_opts, bpfmaps_map_info};

use handles::{Cursors, Open};

/// A positive errno value.
type Errno = c_int;

/// `BPF_MAP_TYPE_HASH`.
pub const BPFMAPS_MAP_TYPE_HASH: u32 = 1;
/// `BPF_MAP_TYPE_STACK_TRACE`.
pub const BPFMAPS_MAP_TYPE_STACK_TRACE: u32 = 7;
/// `BPF_MAP_TYPE_LRU_HASH`.
pub const BPFMAPS_MAP_TYPE_LRU_HASH: u32 = 9;
/// `BPF_MAP_TYPE_LPM_TRIE`.
pub const BPFMAPS_MAP_TYPE_LPM_TRIE: u32 = 11;
/// `BPF_MAP_TYPE_BLOOM_FILTER`.
pub const BPFMAPS_MAP_TYPE_BLOOM_FILTER: u32 = 30;
/// First number of bpfmaps' own types, which the kernel does not have.
pub const BPFMAPS_MAP_TYPE_PRIVATE: u32 = 0x1000;
/// The kernel's LPM trie, ported (`kernel/bpf/lpm_trie.c`): the baseline.
pub const BPFMAPS_MAP_TYPE_KERNEL_LPM_TRIE: u32 = 0x1000;
/// The qp-trie map for byte-string keys of 1 to `key_size` bytes.
pub const BPFMAPS_MAP_TYPE_QP_TRIE: u32 = 0x1001;
/// The ternary-search-tree map (the 2022 proposal): a baseline.
pub const BPFMAPS_MAP_TYPE_TST: u32 = 0x1002;
/// The maple tree: keys `{u64 first, u64 last}`.
pub const BPFMAPS_MAP_TYPE_MAPLE_TREE: u32 = 0x1003;
/// The wildcard map: the schema in `map_extra`.
pub const BPFMAPS_MAP_TYPE_WILDCARD: u32 = 0x1004;

/// Every map type above, with the registry's name for it (a test checks
/// the two lists are the same).
pub const MAP_TYPES: &[(u32, &str)] = &[
    (BPFMAPS_MAP_TYPE_HASH, "hash"),
    (BPFMAPS_MAP_TYPE_STACK_TRACE, "stack_trace"),
    (BPFMAPS_MAP_TYPE_LRU_HASH, "lru_hash"),
    (BPFMAPS_MAP_TYPE_LPM_TRIE, "lpm_trie"),
    (BPFMAPS_MAP_TYPE_BLOOM_FILTER, "bloom_filter"),
    (BPFMAPS_MAP_TYPE_KERNEL_LPM_TRIE, "kernel_lpm_trie"),
    (BPFMAPS_MAP_TYPE_QP_TRIE, "qp_trie"),
    (BPFMAPS_MAP_TYPE_TST, "tst"),
    (BPFMAPS_MAP_TYPE_MAPLE_TREE, "maple_tree"),
    (BPFMAPS_MAP_TYPE_WILDCARD, "wildcard"),
];

/// Runs a call: its errno, if any, returned negative and set in `errno`;
/// a panic is `EIO`.
#[inline(always)]
fn call(f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => fail(e),
        Err(_) => fail(libc::EIO),
    }
}

/// Runs a call on the map behind `fd` (`EBADF` if none), as [`call`].
#[inline(always)]
fn on_map(fd: c_int, f: impl FnOnce(&Open) -> Result<c_int, Errno>) -> c_int {
    call(|| handles::with(fd, f))
}

/// The `_flags` forms take no flag bpfmaps' maps can honour: `EINVAL`
/// for any (after `EBADF` for a bad handle, as the kernel checks).
fn no_flags(fd: c_int, flags: c_ulonglong) -> Option<c_int> {
    (flags != 0).then(|| on_map(fd, |_| Err(libc::EINVAL)))
}

#[cold]
#[inline(never)]
fn fail(e: Errno) -> c_int {
    errno::set_errno(errno::Errno(e));
    -e
}

/// A map error's errno (out of line: the calls' common path is success).
#[cold]
#[inline(never)]
fn errno_of(e: Error) -> Errno {
    e.errno()
}

/// A batch error's errno, with how far it got written to `count`.
fn batch_errno(e: BatchError, count: &mut u32) -> Errno {
    *count = e.processed as u32;
    e.error.errno()
}

/// The `len` bytes at `ptr`; `EFAULT` for NULL with `len` > 0.
///
/// # Safety
/// `ptr` is NULL or points to `len` readable bytes that outlive `'a`.
unsafe fn bytes<'a>(ptr: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast(), len) })
}

/// As [`bytes`], writable.
///
/// # Safety
/// `ptr` is NULL or points to `len` writable bytes that outlive `'a`.
unsafe fn bytes_mut<'a>(ptr: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) })
}

/// Whether the `a_len` bytes at `a` and the `b_len` bytes at `b` share
/// any. C callers may pass one buffer as a key and an output
/// (`bpf_map_get_next_key(fd, &k, &k)`), which the kernel allows, since
/// it copies the key in first; here a shared and a mutable slice of the
/// same bytes would alias (Miri found it), so such a key is copied first
/// ([`owned`]); two outputs that overlap are refused.
#[inline(always)]
fn overlaps(a: *const c_void, a_len: usize, b: *const c_void, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b.wrapping_add(b_len) && b < a.wrapping_add(a_len)
}

/// `op` on the key at `key` and the value buffer at `value`: the calls
/// that read a key and write a value (lookup, lookup-and-delete). A key
/// that overlaps the buffer goes through a copy ([`through_copy`]).
///
/// # Safety
/// `key` is NULL or a key of the map; `value` NULL or room for a value.
#[inline(always)]
unsafe fn key_to_value(
    m: &Open,
    key: *const c_void,
    value: *mut c_void,
    op: impl FnOnce(&[u8], &mut [u8]) -> bpfmaps::Result<()>,
) -> Result<c_int, Errno> {
    // The common case in as few instructions as it takes (a lookup's
    // cache misses overlap the next lookup's only as far as the
    // processor sees ahead): a fixed-size key and a buffer, apart.
    let (key_len, value_len) = (m.fixed_key, m.value_size);
    if key_len != 0
        && !key.is_null()
        && !value.is_null()
        && !overlaps(key, key_len, value, value_len)
    {
        // SAFETY: the caller's promise, for pointers that are not NULL.
        let (key, value) = unsafe {
            (
                std::slice::from_raw_parts(key.cast(), key_len),
                std::slice::from_raw_parts_mut(value.cast(), value_len),
            )
        };
        return match op(key, value) {
            Ok(()) => Ok(0),
            Err(e) => Err(errno_of(e)),
        };
    }
    // SAFETY: the caller's promise.
    unsafe { key_to_value_checked(m, key, value, op) }
}

/// [`key_to_value`] for every other case: a key-less map, variable-length
/// keys, a NULL pointer, a key that overlaps its buffer.
///
/// # Safety
/// As [`key_to_value`].
#[cold]
#[inline(never)]
unsafe fn key_to_value_checked(
    m: &Open,
    key: *const c_void,
    value: *mut c_void,
    op: impl FnOnce(&[u8], &mut [u8]) -> bpfmaps::Result<()>,
) -> Result<c_int, Errno> {
    // SAFETY: the caller's promise.
    let key = unsafe { m.key(key)? };
    if overlaps(key.as_ptr().cast(), key.len(), value, m.value_size) {
        let key = owned(key);
        // SAFETY: as above.
        return unsafe { through_copy(key, value, m.value_size, op) };
    }
    // SAFETY: as above.
    let value = unsafe { bytes_mut(value, m.value_size)? };
    op(key, value).map_err(errno_of)?;
    Ok(0)
}

/// A copy of a key that overlaps a call's output: the rare case, kept
/// out of the lookup's path.
#[cold]
#[inline(never)]
fn owned(key: &[u8]) -> Vec<u8> {
    key.to_vec()
}

/// `op` on `key`, a copy of a key that overlapped the `len` bytes at
/// `out` (see [`overlaps`]), and those bytes; out of line, so that the
/// common path carries no copy. The key comes owned: a borrowed one, an
/// argument, would stay protected for the whole call while `out` is
/// written (Miri caught that form).
///
/// # Safety
/// `out` is NULL or points to `len` writable bytes.
#[cold]
#[inline(never)]
unsafe fn through_copy(
    key: Vec<u8>,
    out: *mut c_void,
    len: usize,
    op: impl FnOnce(&[u8], &mut [u8]) -> bpfmaps::Result<()>,
) -> Result<c_int, Errno> {
    // SAFETY: the caller's promise; nothing borrows from `out` now.
    let out = unsafe { bytes_mut(out, len)? };
    op(&key, out).map_err(errno_of)?;
    Ok(0)
}

impl Open {
    /// The key at `ptr`. A map without keys (the bloom filter) takes
    /// NULL, and refuses anything else with `EINVAL`, as the kernel does.
    ///
    /// # Safety
    /// `ptr` is NULL or points to a key of this map.
    unsafe fn key<'a>(&self, ptr: *const c_void) -> Result<&'a [u8], Errno> {
        if self.key_stride == 0 {
            return if ptr.is_null() {
                Ok(&[])
            } else {
                Err(libc::EINVAL)
            };
        }
        if !self.var_keys {
            // SAFETY: the caller's promise.
            return unsafe { bytes(ptr, self.key_stride) };
        }
        // SAFETY: the caller's promise: a length, then that many bytes.
        let len = unsafe { bytes(ptr, 4)? };
        let len = u32::from_ne_bytes(len.try_into().expect("4 bytes")) as usize;
        if !(1..=self.key_stride - 4).contains(&len) {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        Ok(unsafe { &bytes(ptr, 4 + len)?[4..] })
    }

    fn layout(&self) -> BatchKeys {
        BatchKeys::of(&*self.map)
    }
}

/// Runs `f` on the map behind handle `fd`, from Rust (the bench, and
/// bindings that share handles with C code); `None` if `fd` holds no map.
/// The map stays alive while `f` runs, even if another thread closes the
/// handle.
pub fn with_map<R>(fd: c_int, f: impl FnOnce(&dyn bpfmaps::Map) -> R) -> Option<R> {
    handles::with(fd, |m| Ok(f(&*m.map))).ok()
}

/// Creates a map, as `bpf_map_create`: the handle, or a negative errno.
/// `map_type` is an `enum bpf_map_type` number or one of bpfmaps' own
/// (`BPFMAPS_MAP_TYPE_*`); `map_name` may be NULL, is cut to 15 bytes as
/// libbpf cuts it, and takes letters, digits, `_` and `.` (`EINVAL`
/// otherwise, as the kernel); `opts` may be NULL.
///
/// # Safety
/// `map_name` is NULL or a NUL-terminated string; `opts` is NULL or
/// points to an options struct whose `sz` is its size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_create(
    map_type: u32,
    map_name: *const c_char,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    opts: *const bpfmaps_map_create_opts,
) -> c_int {
    call(|| {
        // SAFETY: the caller's promise.
        let o = unsafe { opts::read(opts)? };
        let unsupported = o.btf_fd
            | o.btf_key_type_id
            | o.btf_value_type_id
            | o.btf_vmlinux_value_type_id
            | o.inner_map_fd
            | o.map_ifindex
            | o.value_type_btf_obj_fd as u32
            | o.token_fd;
        if unsupported != 0 {
            return Err(libc::EINVAL);
        }
        let mut name = [0u8; 16];
        if !map_name.is_null() {
            // SAFETY: the caller's promise.
            let given = unsafe { CStr::from_ptr(map_name) }.to_bytes();
            let given = &given[..given.len().min(15)];
            if !given
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
            {
                return Err(libc::EINVAL);
            }
            name[..given.len()].copy_from_slice(given);
        }
        let spec = MapSpec::new(MapType(map_type), key_size, value_size, max_entries)
            .flags(o.map_flags)
            .extra(o.map_extra);
        let map = bpfmaps::create(&spec).map_err(errno_of)?;
        static IDS: AtomicU32 = AtomicU32::new(1);
        let var_keys = map.caps().contains(Caps::VAR_KEYS);
        let key_stride = BatchKeys::of(&*map).stride();
        let open = Open {
            key_stride,
            fixed_key: if var_keys { 0 } else { key_stride },
            var_keys,
            value_size: value_size as usize,
            name,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            cursors: Default::default(),
            map,
        };
        handles::open(open)
    })
}

/// Closes a map handle; `EBADF` if it holds no map. The map is freed
/// once the calls using it have returned.
#[unsafe(no_mangle)]
pub extern "C" fn bpfmaps_map_close(fd: c_int) -> c_int {
    call(|| handles::close(fd).map(|()| 0))
}

/// Stores `value` under `key`, as `bpf_map_update_elem`: `flags` is
/// `BPF_ANY`, `BPF_NOEXIST` or `BPF_EXIST`.
///
/// # Safety
/// `key` and `value` point to a key and a value of the map (`key` NULL
/// for a map without keys).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_update_elem(
    fd: c_int,
    key: *const c_void,
    value: *const c_void,
    flags: c_ulonglong,
) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let (key, value) = unsafe { (m.key(key)?, bytes(value, m.value_size)?) };
        m.map.update(key, value, flags).map_err(errno_of)?;
        Ok(0)
    })
}

/// Copies the value of `key` into `value`, as `bpf_map_lookup_elem`;
/// `ENOENT` if absent. For an LPM trie, the value of the longest prefix
/// holding the key; for a bloom filter (`key` NULL), whether `value` may
/// be in it.
///
/// # Safety
/// `key` points to a key of the map (NULL for a map without keys);
/// `value` to room for a value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_elem(
    fd: c_int,
    key: *const c_void,
    value: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promise.
    on_map(fd, |m| unsafe {
        key_to_value(m, key, value, |k, v| m.map.lookup(k, v))
    })
}

/// [`bpfmaps_map_lookup_elem`] with flags, as
/// `bpf_map_lookup_elem_flags`: 0 is the only one (`BPF_F_LOCK` needs a
/// spin lock in the value, which bpfmaps' maps do not have: `EINVAL`).
///
/// # Safety
/// As [`bpfmaps_map_lookup_elem`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_elem_flags(
    fd: c_int,
    key: *const c_void,
    value: *mut c_void,
    flags: c_ulonglong,
) -> c_int {
    if let Some(err) = no_flags(fd, flags) {
        return err;
    }
    // SAFETY: the caller's promise.
    unsafe { bpfmaps_map_lookup_elem(fd, key, value) }
}

/// Removes `key`, as `bpf_map_delete_elem`; `ENOENT` if absent.
///
/// # Safety
/// `key` points to a key of the map.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_delete_elem(fd: c_int, key: *const c_void) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let key = unsafe { m.key(key)? };
        m.map.delete(key).map_err(errno_of)?;
        Ok(0)
    })
}

/// [`bpfmaps_map_delete_elem`] with flags (0 only), as
/// `bpf_map_delete_elem_flags`.
///
/// # Safety
/// As [`bpfmaps_map_delete_elem`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_delete_elem_flags(
    fd: c_int,
    key: *const c_void,
    flags: c_ulonglong,
) -> c_int {
    if let Some(err) = no_flags(fd, flags) {
        return err;
    }
    // SAFETY: the caller's promise.
    unsafe { bpfmaps_map_delete_elem(fd, key) }
}

/// Copies the value of `key` out and removes it, as
/// `bpf_map_lookup_and_delete_elem`.
///
/// # Safety
/// `key` points to a key of the map, `value` to room for a value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_and_delete_elem(
    fd: c_int,
    key: *const c_void,
    value: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promise.
    on_map(fd, |m| unsafe {
        key_to_value(m, key, value, |k, v| m.map.lookup_and_delete(k, v))
    })
}

/// [`bpfmaps_map_lookup_and_delete_elem`] with flags (0 only), as
/// `bpf_map_lookup_and_delete_elem_flags`.
///
/// # Safety
/// As [`bpfmaps_map_lookup_and_delete_elem`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_and_delete_elem_flags(
    fd: c_int,
    key: *const c_void,
    value: *mut c_void,
    flags: c_ulonglong,
) -> c_int {
    if let Some(err) = no_flags(fd, flags) {
        return err;
    }
    // SAFETY: the caller's promise.
    unsafe { bpfmaps_map_lookup_and_delete_elem(fd, key, value) }
}

/// Writes the key after `key` into `next_key`, as
/// `bpf_map_get_next_key`: `key` NULL gives the first; the last key
/// gives `ENOENT`. A key no longer in the map: the hash maps restart from
/// the first key, as the kernel's do; the ordered maps (LPM, qp-trie,
/// maple, wildcard) go on from where it would be.
///
/// # Safety
/// `key` is NULL or points to a key of the map; `next_key` to room for
/// one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_get_next_key(
    fd: c_int,
    key: *const c_void,
    next_key: *mut c_void,
) -> c_int {
    on_map(fd, |m| {
        let key = if key.is_null() {
            None
        } else {
            // SAFETY: the caller's promise.
            let key = unsafe { m.key(key)? };
            Some(
                if overlaps(key.as_ptr().cast(), key.len(), next_key, m.key_stride) {
                    Cow::Owned(owned(key))
                } else {
                    Cow::Borrowed(key)
                },
            )
        };
        // SAFETY: the caller's promise.
        let out = unsafe { bytes_mut(next_key, m.key_stride)? };
        if m.key_stride == 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let (head, rest) = out.split_at_mut(if m.var_keys { 4 } else { 0 });
        let len = m.map.get_next_key(key.as_deref(), rest).map_err(errno_of)?;
        if m.var_keys {
            rest[len..].fill(0);
            head.copy_from_slice(&(len as u32).to_ne_bytes());
        }
        Ok(0)
    })
}

/// The key `in_batch` holds a token for: the batch walk goes on after
/// it; NULL starts from the first key.
///
/// # Safety
/// `in_batch` is NULL or points to a 4-byte token.
unsafe fn resume(cursors: &Cursors, in_batch: *const c_void) -> Result<Option<Box<[u8]>>, Errno> {
    if in_batch.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    let token = unsafe { in_batch.cast::<u32>().read_unaligned() };
    cursors.find(token).map(Some).ok_or(libc::EINVAL)
}

/// The batch-call preamble: options valid with the element flags the
/// call allows, and `count`.
///
/// # Safety
/// `opts` NULL or valid; `count` NULL or valid.
unsafe fn batch_start<'a>(
    opts: *const bpfmaps_map_batch_opts,
    count: *mut u32,
    elem_flags_ok: bool,
) -> Result<(u64, &'a mut u32), Errno> {
    // SAFETY: the caller's promise.
    let o = unsafe { opts::read(opts)? };
    if o.flags != 0 || (o.elem_flags != 0 && !elem_flags_ok) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    let count = unsafe { count.as_mut() }.ok_or(libc::EFAULT)?;
    Ok((o.elem_flags, count))
}

/// The lookup batches: `delete` moves the entries out.
///
/// # Safety
/// As [`bpfmaps_map_lookup_batch`].
#[allow(clippy::too_many_arguments)]
unsafe fn lookup_batch(
    fd: c_int,
    in_batch: *mut c_void,
    out_batch: *mut c_void,
    keys: *mut c_void,
    values: *mut c_void,
    count: *mut u32,
    opts: *const bpfmaps_map_batch_opts,
    delete: bool,
) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let (_, count) = unsafe { batch_start(opts, count, false)? };
        let n = *count as usize;
        if n == 0 {
            return Ok(0);
        }
        let after = {
            let cursors = m.cursors.lock();
            // SAFETY: the caller's promise.
            unsafe { resume(&cursors, in_batch)? }
        };
        if out_batch.is_null() {
            return Err(libc::EFAULT);
        }
        let layout = m.layout();
        let (klen, vlen) = (n * layout.stride(), n * m.value_size);
        // Two buffers the call writes: overlapping, they would alias.
        if overlaps(keys, klen, values, vlen) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's promise: room for `count` of each.
        let (keys, values) = unsafe { (bytes_mut(keys, klen)?, bytes_mut(values, vlen)?) };
        let done = if delete {
            m.map.lookup_and_delete_batch(keys, values)
        } else {
            m.map.lookup_batch(after.as_deref(), keys, values)
        };
        let copied = done.map_err(|e| batch_errno(e, count))?;
        *count = copied as u32;
        if copied > 0 {
            let last = layout.key(keys, copied - 1).map_err(errno_of)?;
            let token = m.cursors.lock().issue(last);
            // SAFETY: the caller's promise: 4 writable bytes.
            unsafe { out_batch.cast::<u32>().write_unaligned(token) };
        }
        if copied < n {
            return Err(libc::ENOENT);
        }
        Ok(0)
    })
}

/// Copies up to `*count` entries into `keys` and `values`, as
/// `bpf_map_lookup_batch`, starting after where the call that wrote
/// `in_batch` stopped (NULL: from the first key). On return `*count` is
/// how many were copied and `out_batch` holds a 4-byte token for the
/// next call's `in_batch` (the kernel's hash maps use a 4-byte bucket
/// number the same way; a map keeps its last 64 tokens, an older one is
/// `EINVAL`). `ENOENT` once the walk has reached the end, with the last
/// entries copied. `opts` may be NULL; its `elem_flags` and `flags` must
/// be 0.
///
/// # Safety
/// `in_batch` NULL or a token this map gave; `out_batch` 4 writable
/// bytes; `keys` and `values` room for `*count` keys and values;
/// `opts` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_batch(
    fd: c_int,
    in_batch: *mut c_void,
    out_batch: *mut c_void,
    keys: *mut c_void,
    values: *mut c_void,
    count: *mut u32,
    opts: *const bpfmaps_map_batch_opts,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { lookup_batch(fd, in_batch, out_batch, keys, values, count, opts, false) }
}

/// Moves up to `*count` entries out into `keys` and `values`, as
/// `bpf_map_lookup_and_delete_batch`: as [`bpfmaps_map_lookup_batch`],
/// each entry deleted once copied (`in_batch` is checked, and the walk
/// starts from the first entry left).
///
/// # Safety
/// As [`bpfmaps_map_lookup_batch`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_lookup_and_delete_batch(
    fd: c_int,
    in_batch: *mut c_void,
    out_batch: *mut c_void,
    keys: *mut c_void,
    values: *mut c_void,
    count: *mut u32,
    opts: *const bpfmaps_map_batch_opts,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { lookup_batch(fd, in_batch, out_batch, keys, values, count, opts, true) }
}

/// Stores `*count` keys and values in order, as `bpf_map_update_batch`,
/// each with `opts->elem_flags` (`BPF_ANY`, `BPF_NOEXIST`, `BPF_EXIST`).
/// On failure `*count` is how many were stored before the one that
/// failed.
///
/// # Safety
/// `keys` and `values` hold `*count` keys and values; `opts` NULL or
/// valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_update_batch(
    fd: c_int,
    keys: *const c_void,
    values: *const c_void,
    count: *mut u32,
    opts: *const bpfmaps_map_batch_opts,
) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let (elem_flags, count) = unsafe { batch_start(opts, count, true)? };
        let n = *count as usize;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the caller's promise.
        let (keys, values) = unsafe {
            (
                bytes(keys, n * m.layout().stride())?,
                bytes(values, n * m.value_size)?,
            )
        };
        let done = m.map.update_batch(keys, values, elem_flags);
        *count = done.map_err(|e| batch_errno(e, count))? as u32;
        Ok(0)
    })
}

/// Deletes `*count` keys in order, as `bpf_map_delete_batch`: a missing
/// key stops it with `ENOENT`, `*count` then saying how many were
/// deleted.
///
/// # Safety
/// `keys` holds `*count` keys; `opts` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_delete_batch(
    fd: c_int,
    keys: *const c_void,
    count: *mut u32,
    opts: *const bpfmaps_map_batch_opts,
) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let (_, count) = unsafe { batch_start(opts, count, false)? };
        let n = *count as usize;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the caller's promise.
        let keys = unsafe { bytes(keys, n * m.layout().stride())? };
        *count = m
            .map
            .delete_batch(keys)
            .map_err(|e| batch_errno(e, count))? as u32;
        Ok(0)
    })
}

/// Fills `info` with the map's type, sizes, capacity, flags, name, id
/// and extra, as `bpf_map_get_info_by_fd`: `*info_len` is the room
/// given, and on return the bytes written (a longer buffer must be zero
/// past `sizeof(struct bpfmaps_map_info)`: `E2BIG`, as the kernel).
///
/// # Safety
/// `info` points to `*info_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_map_get_info_by_fd(
    fd: c_int,
    info: *mut bpfmaps_map_info,
    info_len: *mut u32,
) -> c_int {
    on_map(fd, |m| {
        // SAFETY: the caller's promise.
        let len = unsafe { info_len.as_mut() }.ok_or(libc::EFAULT)?;
        // SAFETY: the caller's promise.
        let out = unsafe { bytes_mut(info.cast(), *len as usize)? };
        let ours = size_of::<bpfmaps_map_info>();
        if out.len() > ours && out[ours..].iter().any(|&b| b != 0) {
            return Err(libc::E2BIG);
        }
        let i = m.map.info();
        let full = bpfmaps_map_info {
            r#type: i.map_type.0,
            id: m.id,
            key_size: i.key_size,
            value_size: i.value_size,
            max_entries: i.max_entries,
            map_flags: i.map_flags,
            name: m.name.map(|b| b as c_char),
            map_extra: i.map_extra,
            ..Default::default()
        };
        let n = out.len().min(ours);
        // SAFETY: `full` is `ours` initialized bytes (its padding
        // field is a named zero); `n` of them fit in `out`.
        let src = unsafe { std::slice::from_raw_parts((&raw const full).cast::<u8>(), n) };
        out[..n].copy_from_slice(src);
        *len = n as u32;
        Ok(0)
    })
}

/// [`bpfmaps_map_get_info_by_fd`] under libbpf's older, generic name
/// `bpf_obj_get_info_by_fd` (a map handle only).
///
/// # Safety
/// As [`bpfmaps_map_get_info_by_fd`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bpfmaps_obj_get_info_by_fd(
    fd: c_int,
    info: *mut c_void,
    info_len: *mut u32,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { bpfmaps_map_get_info_by_fd(fd, info.cast(), info_len) }
}

#[cfg(test)]
mod tests;

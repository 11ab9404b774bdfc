//! Map handles: real file descriptors, each a `memfd` that names its map
//! (`/proc/self/fd/N -> /memfd:bpfmaps-map:NAME`), so a handle never
//! shares its number with a file of the program's and lives under the
//! same `RLIMIT_NOFILE` as a kernel map's fd.
//!
//! The maps sit in a table indexed by fd number: a static array for fds
//! below 1024, then chunks of 1024 slots, each allocated on first use and
//! never freed (up to fd 1,048,575). A call loads its slot in a read
//! section (`bpfmaps::core::read_section`: one plain store in its
//! thread's record, no pin), so it never takes a lock; `close` empties the
//! slot and frees the map after every call that may have loaded it has
//! returned. A call racing a close either finishes on the map or gets
//! `EBADF`, never a freed map.

use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use bpfmaps::Map;
use parking_lot::Mutex;

use bpfmaps::core::read_section;

use crate::Errno;

const CHUNK: usize = 1024;
const CHUNKS: usize = 1024;

/// The slots of fds 0 to 1023, the ones most programs use: one load
/// from the fd to its map (a chunk's costs another: 1-2 ns a call).
static LOW: [AtomicPtr<Open>; CHUNK] = [const { AtomicPtr::new(null_mut()) }; CHUNK];

/// The slots of higher fds, a chunk of 1024 made on first use (chunk 0
/// unused).
type Chunk = Box<[AtomicPtr<Open>]>;
static TABLE: [OnceLock<Chunk>; CHUNKS] = [const { OnceLock::new() }; CHUNKS];

/// A map as a handle holds it.
pub(crate) struct Open {
    pub map: Box<dyn Map>,
    /// The name given at creation (up to 15 bytes, NUL-padded).
    pub name: [u8; 16],
    /// A number no other map of this process gets (`bpf_map_info.id`).
    pub id: u32,
    /// Bytes per key in calls: the key size, or 4 more for maps with
    /// variable-length keys (a `u32` length, then the key).
    pub key_stride: usize,
    /// The key size for a map of fixed-size keys; 0 for a map of
    /// variable-length keys or of none (the calls' common case, tested
    /// in one compare).
    pub fixed_key: usize,
    pub var_keys: bool,
    pub value_size: usize,
    /// Where recent batch lookups stopped, by token.
    pub cursors: Mutex<Cursors>,
}

/// The keys batch lookups stopped at, each under the 4-byte token the
/// caller got in `out_batch` (what the kernel's hash maps hand out: a
/// bucket number). The last [`CURSORS_KEPT`] are kept, so a walk that
/// is abandoned costs nothing lasting.
#[derive(Default)]
pub(crate) struct Cursors {
    issued: u32,
    recent: std::collections::VecDeque<(u32, Box<[u8]>)>,
}

/// Batch walks a map can have going at once (tokens older than the last
/// this many are `EINVAL`).
pub(crate) const CURSORS_KEPT: usize = 64;

impl Cursors {
    /// A token for `key`.
    pub fn issue(&mut self, key: &[u8]) -> u32 {
        // Never 0, so that a zeroed token is never a valid one.
        self.issued = self.issued.wrapping_add(1).max(1);
        if self.recent.len() == CURSORS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((self.issued, key.into()));
        self.issued
    }

    /// The key `token` was issued for.
    pub fn find(&self, token: u32) -> Option<Box<[u8]>> {
        self.recent
            .iter()
            .rev()
            .find(|(t, _)| *t == token)
            .map(|(_, k)| k.clone())
    }
}

fn slot(fd: libc::c_int, make: bool) -> Option<&'static AtomicPtr<Open>> {
    let fd = usize::try_from(fd).ok()?;
    if fd < CHUNK {
        return Some(&LOW[fd]);
    }
    let chunk = TABLE.get(fd / CHUNK)?;
    let chunk = if make {
        chunk.get_or_init(|| (0..CHUNK).map(|_| AtomicPtr::new(null_mut())).collect())
    } else {
        chunk.get()?
    };
    Some(&chunk[fd % CHUNK])
}

/// Runs `f` on the map of `fd`; `EBADF` if `fd` holds none.
#[inline]
pub(crate) fn with<R>(
    fd: libc::c_int,
    f: impl FnOnce(&Open) -> Result<R, Errno>,
) -> Result<R, Errno> {
    let slot = slot(fd, false).ok_or(libc::EBADF)?;
    // Sections nest: a call from a `with_map` closure announces nothing.
    read_section::run(|| {
        // SAFETY: a map leaves its slot before it is freed, and is freed
        // only after the read sections open then have closed.
        match unsafe { slot.load(Ordering::Acquire).as_ref() } {
            Some(open) => f(open),
            None => Err(libc::EBADF),
        }
    })
}

/// A new handle for `open`.
pub(crate) fn open(open: Open) -> Result<libc::c_int, Errno> {
    let fd = new_fd(&open.name)?;
    let Some(slot) = slot(fd, true) else {
        close_fd(fd);
        return Err(libc::EMFILE);
    };
    read_section::init();
    let stale = slot.swap(Box::into_raw(Box::new(open)), Ordering::AcqRel);
    if !stale.is_null() {
        // The program closed an earlier handle with close(2), not
        // bpfmaps_map_close, and the number came back: that map goes now.
        // SAFETY: out of its slot, so no new call finds it; the ones in
        // flight are waited for.
        read_section::free_after_in_background(unsafe { Box::from_raw(stale) });
    }
    Ok(fd)
}

/// Closes `fd`: its map is freed once no call is using it.
pub(crate) fn close(fd: libc::c_int) -> Result<(), Errno> {
    let slot = slot(fd, false).ok_or(libc::EBADF)?;
    let old = slot.swap(null_mut(), Ordering::AcqRel);
    if old.is_null() {
        return Err(libc::EBADF);
    }
    // SAFETY: out of its slot: no new call finds it, and the calls that
    // did are waited for.
    read_section::free_after_in_background(unsafe { Box::from_raw(old) });
    // The number is free for the system to reuse only now, after the
    // slot is empty.
    close_fd(fd);
    Ok(())
}

/// A new fd number for a map named `name`: a memfd with that name.
#[cfg(not(miri))]
fn new_fd(name: &[u8; 16]) -> Result<libc::c_int, Errno> {
    let mut full = *b"bpfmaps-map:\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    let len = name.iter().position(|&b| b == 0).unwrap_or(16);
    full[12..12 + len].copy_from_slice(&name[..len]);
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(full.as_ptr().cast(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno::errno().0);
    }
    Ok(fd)
}

/// Closes a number [`new_fd`] made.
#[cfg(not(miri))]
fn close_fd(fd: libc::c_int) {
    // SAFETY: the memfd this handle made, no longer handed out.
    unsafe { libc::close(fd) };
}

/// Under Miri, which has no `memfd_create`: numbers from a counter, so
/// that everything else (the slots, the pins, the calls' pointers) runs
/// as it does for real.
#[cfg(miri)]
fn new_fd(_name: &[u8; 16]) -> Result<libc::c_int, Errno> {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(3);
    Ok(NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(miri)]
fn close_fd(_fd: libc::c_int) {}

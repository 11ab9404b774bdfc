//! `Pairs`: the iterator `items_lookup_batch()` hands out, a native
//! batch in its buffers at a time (so no list of every pair is ever
//! alive), each batch going on after the last key of the one before, as
//! `lookup_batch` does.
//!
//! Its type is made with the C API's `PyType_FromSpec`, not `#[pyclass]`:
//! a `for k, v in ...` loop calls `tp_iternext` once a pair, and pyo3's
//! method trampoline (its GIL count, the borrow flag, the conversion of
//! the result) cost more than making the pair does. The pair is a tuple
//! filled again in place when nothing else holds it, as CPython's `zip`
//! reuses its tuple, so a loop that unpacks each pair makes no tuple a
//! step: the pair costs its two ints (docs/benchmarks.md, "Native pairs,
//! and the string maps' batches"). Its items are written straight into
//! the tuple, where they were found at import, and its reference counts
//! changed in line, as CPython's own `zip` and the limited API of 3.9 do
//! (docs/benchmarks.md, "A pair's items written in place"). A pair from
//! a batch already read is made outside the unwind guard, by converters
//! chosen when the walk starts (`next_buffered`); reading a batch goes
//! through the guard.
//!
//! From CPython 3.14 on, a tuple keeps its hash once computed, and only
//! CPython's own code can forget it: a pair filled again after someone
//! hashed it (`filter(allowed.__contains__, pairs)` drops each pair it
//! hashed) would hash as the pair before. There, every pair is a new
//! tuple ([`REUSE_PAIRS`]).

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bpfmaps::BatchKeys;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::{RawMap, batch_err, py_err};

/// The walk's state, behind the object's pointer.
pub(crate) struct Walk {
    /// Let go in `drop` (with the GIL, which `dealloc` holds): pyo3's own
    /// drop would put it off when called outside pyo3's calls.
    map: ManuallyDrop<Py<RawMap>>,
    layout: BatchKeys,
    value_size: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
    /// Entries a native batch asks for.
    count: usize,
    /// Pairs in the buffers, and the next to hand out.
    len: usize,
    next: usize,
    /// Whether the map may hold more: the last batch came back full.
    more: bool,
    /// Makes a key's object from its slot; `None` for keys of varying
    /// length (`bytes` of the length in the slot, made by `var_key`).
    key_of: Option<Convert>,
    value_of: Convert,
    /// The pair handed out last (a strong reference), or null: always
    /// null where pairs are not filled again ([`REUSE_PAIRS`]).
    pair: *mut ffi::PyObject,
    /// Whether a pair nothing else holds is filled again
    /// ([`REUSE_PAIRS`] when the walk started).
    reuse: bool,
    /// Where a pair's items sit, in bytes from its address, or 0 to set
    /// them through `PyTuple_SetItem` ([`ITEMS_AT`] when the walk
    /// started).
    items_at: usize,
}

impl Walk {
    pub(crate) fn new(
        map: Py<RawMap>,
        count: usize,
        key_ints: Option<bool>,
        value_ints: Option<bool>,
    ) -> PyResult<Self> {
        if count == 0 {
            return Err(PyValueError::new_err("a batch of 0 entries"));
        }
        let raw = map.get();
        let (layout, value_size) = (raw.layout(), raw.value_size);
        if key_ints.is_some() && (raw.var_keys || !matches!(raw.key_size, 1 | 2 | 4 | 8)) {
            return Err(PyTypeError::new_err(
                "int keys need a fixed size of 1, 2, 4 or 8 bytes",
            ));
        }
        let no_int = |n| PyTypeError::new_err(format!("no int of {n} bytes"));
        let value_of = converter(value_ints, value_size).ok_or_else(|| no_int(value_size))?;
        // Keys of varying length come as `bytes` of their length (`var_key`).
        let key_of = match raw.var_keys {
            true => None,
            false => Some(converter(key_ints, raw.key_size).ok_or_else(|| no_int(raw.key_size))?),
        };
        Ok(Walk {
            keys: vec![0u8; count * layout.stride()],
            values: vec![0u8; count * value_size],
            map: ManuallyDrop::new(map),
            layout,
            value_size,
            count,
            len: 0,
            next: 0,
            more: true,
            key_of,
            value_of,
            pair: ptr::null_mut(),
            reuse: REUSE_PAIRS.load(Ordering::Relaxed),
            items_at: ITEMS_AT.load(Ordering::Relaxed),
        })
    }

    /// Reads the next batch after the last key of this one; false when
    /// the walk is over.
    fn refill(&mut self, py: Python<'_>) -> PyResult<bool> {
        if !self.more {
            return Ok(false);
        }
        let map = self.map.get();
        let after = match self.len.checked_sub(1) {
            Some(last) => Some(self.layout.key(&self.keys, last).map_err(py_err)?.to_vec()),
            None => None,
        };
        let (keys, values) = (&mut self.keys, &mut self.values);
        let n = py
            .allow_threads(|| map.map.lookup_batch(after.as_deref(), keys, values))
            .map_err(|e| batch_err(py, e))?;
        self.more = n == self.count;
        (self.len, self.next) = (n, 0);
        Ok(n > 0)
    }

    /// Entry `i`'s key and value as new references, or `None` with
    /// Python's error set (and neither made).
    ///
    /// # Safety
    /// `i < len`: the entry is in the buffers.
    #[inline(always)]
    unsafe fn objects(
        &self,
        py: Python<'_>,
        i: usize,
    ) -> Option<(*mut ffi::PyObject, *mut ffi::PyObject)> {
        let (ks, vs) = (self.layout.stride(), self.value_size);
        // SAFETY: the buffers hold `count >= len > i` slots of `ks` and
        // `vs` bytes; a converter reads one slot.
        unsafe {
            let k = match self.key_of {
                Some(key_of) => key_of(self.keys.as_ptr().add(i * ks), ks),
                None => self.var_key(py, i),
            };
            if k.is_null() {
                return None;
            }
            let v = (self.value_of)(self.values.as_ptr().add(i * vs), vs);
            if v.is_null() {
                ffi::Py_DECREF(k);
                return None;
            }
            Some((k, v))
        }
    }

    /// Key `i` of a map of keys of varying length, as `bytes` (a new
    /// reference), or null with Python's error set; never a panic (it
    /// runs outside the unwind guard, `next_buffered`).
    #[cold]
    fn var_key(&self, py: Python<'_>, i: usize) -> *mut ffi::PyObject {
        match self.layout.key(&self.keys, i) {
            // SAFETY: the key's bytes.
            Ok(key) => unsafe { bytes_at(key.as_ptr(), key.len()) },
            Err(e) => {
                py_err(e).restore(py);
                ptr::null_mut()
            }
        }
    }

    /// The next pair when it is in the buffers (a new reference): the
    /// last pair filled again when nothing else holds it, else a new
    /// tuple (`new_pair`); `None` when a batch is to be read first
    /// (`next_pair`), null with Python's error set on a failure.
    ///
    /// Nothing in it can panic, so `iternext` calls it outside its
    /// `catch_unwind`, before anything else: a `for k, v` loop's pair
    /// costs its two ints and 59 instructions of this code, where the
    /// call through the unwind guard, with each int's kind chosen and
    /// each slot's bounds checked, took about 130 (callgrind, 100K
    /// pairs; docs/benchmarks.md, "The pairs' own instructions").
    #[inline(always)]
    fn next_buffered(&mut self, py: Python<'_>) -> Option<*mut ffi::PyObject> {
        if self.next >= self.len {
            return None;
        }
        let i = self.next;
        self.next += 1;
        // SAFETY: `i < len`.
        let Some((k, v)) = (unsafe { self.objects(py, i) }) else {
            return Some(ptr::null_mut());
        };
        // SAFETY: `pair`, when set, is a live tuple we hold. With no other
        // reference, no one sees it change; it takes `k`'s and `v`'s
        // references and drops the old items'.
        unsafe {
            if self.pair.is_null() || ffi::Py_REFCNT(self.pair) != 1 {
                return Some(self.new_pair(k, v));
            }
            let old = self.set_items(self.pair, k, v);
            incref(self.pair);
            old.into_iter()
                .filter(|o| !o.is_null())
                .for_each(|o| decref(o));
        }
        Some(self.pair)
    }

    /// A new pair of `k` and `v` (taking their references), kept to be
    /// filled again if pairs are ([`REUSE_PAIRS`]): a new reference, or
    /// null with Python's error set.
    #[inline(never)]
    fn new_pair(&mut self, k: *mut ffi::PyObject, v: *mut ffi::PyObject) -> *mut ffi::PyObject {
        // SAFETY: a new tuple has one reference (handed out) and takes
        // `k`'s and `v`'s. The pair it replaces is ours to let go; we
        // keep one more reference to the new one.
        unsafe {
            let pair = ffi::PyTuple_New(2);
            if pair.is_null() {
                ffi::Py_DECREF(k);
                ffi::Py_DECREF(v);
                return pair;
            }
            // A new tuple's items are null: nothing to let go.
            let _ = self.set_items(pair, k, v);
            // Ints and bytes hold no references, so the pair can be in
            // no cycle: off the collector's lists, as CPython's own
            // collector leaves such tuples.
            ffi::PyObject_GC_UnTrack(pair.cast());
            if self.reuse {
                if !self.pair.is_null() {
                    ffi::Py_DECREF(self.pair);
                }
                ffi::Py_INCREF(pair);
                self.pair = pair;
            }
            pair
        }
    }

    /// Puts `k` and `v` into the 2-tuple `pair` (taking their
    /// references) and returns the items it held, for the caller to let
    /// go once the pair is whole (null for a new tuple's, or where
    /// `PyTuple_SetItem` let go of them).
    ///
    /// Written straight into the tuple's item slots where they were found
    /// at import ([`ITEMS_AT`]): `PyTuple_SetItem`, the only way the
    /// stable ABI gives, checks the type, the index and the reference
    /// count and lets go of the old item, 22 instructions a call
    /// (docs/benchmarks.md, "A pair's items written in place").
    ///
    /// # Safety
    /// `pair` is a 2-tuple only we hold, `k` and `v` new references.
    #[inline(always)]
    unsafe fn set_items(
        &self,
        pair: *mut ffi::PyObject,
        k: *mut ffi::PyObject,
        v: *mut ffi::PyObject,
    ) -> [*mut ffi::PyObject; 2] {
        // SAFETY: the caller's tuple; `items_at`, when set, is where this
        // CPython's 2-tuples keep their two item pointers.
        unsafe {
            if self.items_at == 0 {
                // It lets go of the old items itself.
                ffi::PyTuple_SetItem(pair, 0, k);
                ffi::PyTuple_SetItem(pair, 1, v);
                return [ptr::null_mut(); 2];
            }
            let items = pair.byte_add(self.items_at).cast::<*mut ffi::PyObject>();
            let old = [items.read(), items.add(1).read()];
            items.write(k);
            items.add(1).write(v);
            old
        }
    }

    /// The next pair (a new reference), or `None` at the end, reading a
    /// batch when the last is handed out.
    fn next_pair(&mut self, py: Python<'_>) -> PyResult<Option<*mut ffi::PyObject>> {
        if self.next == self.len && !self.refill(py)? {
            return Ok(None);
        }
        match self.next_buffered(py) {
            Some(pair) if pair.is_null() => Err(PyErr::fetch(py)),
            pair => Ok(pair),
        }
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        // SAFETY: dropped with the GIL held (`dealloc`, or `batch_items`
        // before it made an object); our references, let go once.
        unsafe {
            if !self.pair.is_null() {
                ffi::Py_DECREF(self.pair);
            }
            ffi::Py_DECREF(self.map.as_ptr());
        }
    }
}

/// `Py_INCREF` as the limited API of CPython 3.9 (this build's, abi3)
/// has it, in line: pyo3 calls `Py_IncRef` there. CPython keeps taking
/// such increments (PEP 683: an immortal object's count stays immortal
/// under them).
///
/// # Safety
/// `o` is a live object; the GIL is held.
#[inline(always)]
unsafe fn incref(o: *mut ffi::PyObject) {
    // SAFETY: the caller's.
    unsafe { (*o).ob_refcnt += 1 }
}

/// `Py_DECREF` in line, as [`incref`]: the count taken down where
/// another reference stays, `Py_DecRef` (which frees) for the last.
///
/// # Safety
/// `o` is a live object we hold a reference to; the GIL is held.
#[inline(always)]
unsafe fn decref(o: *mut ffi::PyObject) {
    // SAFETY: the caller's.
    unsafe {
        match (*o).ob_refcnt {
            n if n > 1 => (*o).ob_refcnt = n - 1,
            _ => ffi::Py_DecRef(o),
        }
    }
}

/// Makes the Python object of a key's or value's bytes: a new
/// reference, or null with Python's error set. Chosen when the walk
/// starts (`converter`), so that a pair makes no choice.
///
/// # Safety
/// `at` points to `len` readable bytes, the size the converter was
/// chosen for.
type Convert = unsafe fn(at: *const u8, len: usize) -> *mut ffi::PyObject;

/// The converter of `size` bytes: `bytes`, or an int of their size in
/// native order, signed if `ints` is `Some(true)`; `None` for an int of
/// another size.
fn converter(ints: Option<bool>, size: usize) -> Option<Convert> {
    Some(match (ints, size) {
        (None, _) => bytes_at,
        (Some(false), 1) => u8_at,
        (Some(false), 2) => u16_at,
        (Some(false), 4) => u32_at,
        (Some(false), 8) => u64_at,
        (Some(true), 1) => i8_at,
        (Some(true), 2) => i16_at,
        (Some(true), 4) => i32_at,
        (Some(true), 8) => i64_at,
        (Some(_), _) => return None,
    })
}

/// `bytes` of the `len` bytes at `at`.
unsafe fn bytes_at(at: *const u8, len: usize) -> *mut ffi::PyObject {
    // SAFETY: the caller's `len` bytes; a length that fits (a slot).
    unsafe { ffi::PyBytes_FromStringAndSize(at.cast(), len as ffi::Py_ssize_t) }
}

/// Converters to ints: the slot read as `$t`, made by `$make` from it
/// widened to `$wide`.
macro_rules! int_at {
    ($($name:ident: $t:ty => $make:ident($wide:ty);)*) => {$(
        unsafe fn $name(at: *const u8, _: usize) -> *mut ffi::PyObject {
            // SAFETY: the caller's slot of `size_of::<$t>()` bytes; the
            // C API's int constructor.
            unsafe { ffi::$make(<$wide>::from(at.cast::<$t>().read_unaligned())) }
        }
    )*};
}

int_at! {
    u8_at: u8 => PyLong_FromLong(std::ffi::c_long);
    u16_at: u16 => PyLong_FromLong(std::ffi::c_long);
    i8_at: i8 => PyLong_FromLong(std::ffi::c_long);
    i16_at: i16 => PyLong_FromLong(std::ffi::c_long);
    i32_at: i32 => PyLong_FromLong(std::ffi::c_long);
    i64_at: i64 => PyLong_FromLongLong(std::ffi::c_longlong);
}

/// Converters to ints of 4- and 8-byte unsigned slots (a `u32` need not
/// fit `c_long`, as on Windows): a value of one of CPython's 30-bit
/// digits goes to the signed constructor, whose path for such ints is
/// the shorter (it skips counting digits: 75 instructions an int against
/// 87 in CPython 3.11, docs/benchmarks.md, "Ints by the signed
/// constructor"); a wider one to the unsigned constructor, shorter for
/// those.
macro_rules! unsigned_int_at {
    ($($name:ident: $t:ty => $make:ident($wide:ty);)*) => {$(
        unsafe fn $name(at: *const u8, _: usize) -> *mut ffi::PyObject {
            // SAFETY: the caller's slot of `size_of::<$t>()` bytes; the
            // C API's int constructors, each given a value it takes.
            unsafe {
                let v = at.cast::<$t>().read_unaligned();
                match v < 1 << 30 {
                    true => ffi::PyLong_FromLongLong(v as std::ffi::c_longlong),
                    false => ffi::$make(<$wide>::from(v)),
                }
            }
        }
    )*};
}

unsigned_int_at! {
    u32_at: u32 => PyLong_FromUnsignedLong(std::ffi::c_ulong);
    u64_at: u64 => PyLong_FromUnsignedLongLong(std::ffi::c_ulonglong);
}

/// The object: Python's header, then the walk (null for an object made
/// from Python by calling the type, which walks nothing) and whether a
/// call is running (the GIL is let go while a batch is read, so another
/// thread may call in meanwhile).
#[repr(C)]
struct PairsObject {
    ob_base: ffi::PyObject,
    walk: *mut Walk,
    busy: bool,
}

/// The type, made once at import.
static TYPE: OnceLock<usize> = OnceLock::new();

/// Whether a pair nothing else holds may be filled again: on CPython
/// before 3.14, whose tuples cache no hash (set at import).
static REUSE_PAIRS: AtomicBool = AtomicBool::new(false);

/// Where this CPython's 2-tuples keep their items, in bytes from the
/// object's address, found at import (`find_items_at`); 0 where they were
/// not found, and pairs are filled through `PyTuple_SetItem`.
static ITEMS_FOUND: OnceLock<usize> = OnceLock::new();

/// [`ITEMS_FOUND`], or 0 while the tests have pairs filled through
/// `PyTuple_SetItem` (`_items_in_place`).
static ITEMS_AT: AtomicUsize = AtomicUsize::new(0);

/// Finds where a 2-tuple's item pointers sit: makes a tuple of two new
/// objects and looks for their addresses side by side in its memory,
/// within the size it says it has. The stable ABI leaves the layout out
/// (3.14 added a cached hash to it), so it is found here, not assumed;
/// 0 if it is not there.
fn find_items_at(py: Python<'_>) -> PyResult<usize> {
    let (a, b) = (PyList::empty(py), PyList::empty(py));
    let pair = PyTuple::new(py, [&a, &b])?;
    let size: usize = pair.call_method0("__sizeof__")?.extract()?;
    let word = size_of::<*mut ffi::PyObject>();
    let base = pair.as_ptr().cast::<u8>();
    let last = size.saturating_sub(2 * word);
    Ok((size_of::<ffi::PyObject>()..=last)
        .step_by(word)
        // SAFETY: two words inside the tuple's `size` bytes, read as plain
        // words (aligned: a tuple is word-aligned).
        .find(|&at| unsafe {
            let items = base.add(at).cast::<*mut ffi::PyObject>();
            items.read() == a.as_ptr() && items.add(1).read() == b.as_ptr()
        })
        .unwrap_or(0))
}

/// `_items_in_place(on)`: whether walks started from now on write a
/// pair's items in place (where they were found at import) or through
/// `PyTuple_SetItem`; returns the setting before. For the tests, which
/// walk both ways.
#[pyfunction]
fn _items_in_place(on: bool) -> bool {
    let at = if on {
        ITEMS_FOUND.get().copied().unwrap_or(0)
    } else {
        0
    };
    ITEMS_AT.swap(at, Ordering::Relaxed) != 0
}

/// `_reuse_pairs(on)`: whether walks started from now on fill a pair
/// again; returns the setting before. For the tests, which walk both
/// ways on any CPython; filling pairs again where tuples cache their
/// hash gives wrong hashes.
#[pyfunction]
fn _reuse_pairs(on: bool) -> bool {
    REUSE_PAIRS.swap(on, Ordering::Relaxed)
}

/// Makes the `Pairs` type and adds it to `module`, with the tests' hooks
/// (`_reuse_pairs`, `_items_in_place`).
pub(crate) fn add_type(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    REUSE_PAIRS.store(py.version_info() < (3, 14), Ordering::Relaxed);
    ITEMS_AT.store(
        *ITEMS_FOUND.get_or_init(|| find_items_at(py).unwrap_or(0)),
        Ordering::Relaxed,
    );
    let mut slots = [
        slot(ffi::Py_tp_iter, ffi::PyObject_SelfIter as *mut c_void),
        slot(ffi::Py_tp_iternext, iternext as *mut c_void),
        slot(ffi::Py_tp_dealloc, dealloc as *mut c_void),
        slot(
            ffi::Py_tp_doc,
            c"A map's (key, value) pairs, read in native batches.".as_ptr() as *mut c_void,
        ),
        slot(0, ptr::null_mut()),
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"bpfmaps_rs._native.Pairs".as_ptr(),
        basicsize: size_of::<PairsObject>() as c_int,
        itemsize: 0,
        flags: ffi::Py_TPFLAGS_DEFAULT as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: a spec of valid slots; CPython copies what it keeps.
    let ty = unsafe { ffi::PyType_FromSpec(&mut spec) };
    if ty.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference to the type, kept for good by `TYPE` and
    // given to the module as one more.
    let ty = unsafe { Bound::from_owned_ptr(py, ty) };
    TYPE.get_or_init(|| ty.clone().into_ptr() as usize);
    module.add_function(wrap_pyfunction!(_reuse_pairs, module)?)?;
    module.add_function(wrap_pyfunction!(_items_in_place, module)?)?;
    module.add("Pairs", ty)
}

fn slot(slot: c_int, pfunc: *mut c_void) -> ffi::PyType_Slot {
    ffi::PyType_Slot { slot, pfunc }
}

/// A new `Pairs` object over `walk`.
pub(crate) fn new(py: Python<'_>, walk: Walk) -> PyResult<Bound<'_, PyAny>> {
    let ty = *TYPE
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("the Pairs type was not made"))?
        as *mut ffi::PyTypeObject;
    // SAFETY: the type made by `add_type`; `PyType_GenericAlloc` zeroes
    // the object, so `walk` is null and `busy` false until set here.
    unsafe {
        let obj = ffi::PyType_GenericAlloc(ty, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        (*obj.cast::<PairsObject>()).walk = Box::into_raw(Box::new(walk));
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// `tp_iternext`: the next pair, or null with no error set at the end
/// (or with one set on a failure). No panic unwinds out of it.
unsafe extern "C" fn iternext(slf: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this with the GIL held, on a `PairsObject`.
    let obj = unsafe { &mut *slf.cast::<PairsObject>() };
    if !obj.busy
        // SAFETY: the object owns its walk (when set). A call running
        // elsewhere with the GIL let go (`busy`: a batch being read)
        // keeps this one out of it; the fast path never lets it go.
        && let Some(walk) = unsafe { obj.walk.as_mut() }
        // SAFETY: the GIL is held.
        && let Some(pair) = walk.next_buffered(unsafe { Python::assume_gil_acquired() })
    {
        return pair;
    }
    // SAFETY: as above.
    unsafe { iternext_slow(slf) }
}

/// `iternext` when `next_buffered` has no pair: a batch to read (or the
/// end), or another thread's call reading one.
#[cold]
#[inline(never)]
unsafe fn iternext_slow(slf: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this with the GIL held, on a `PairsObject`.
    let (py, obj) = unsafe {
        (
            Python::assume_gil_acquired(),
            &mut *slf.cast::<PairsObject>(),
        )
    };
    if obj.walk.is_null() {
        return ptr::null_mut();
    }
    if obj.busy {
        // As a generator running in another thread says it.
        PyValueError::new_err("the pairs are already being read by another thread").restore(py);
        return ptr::null_mut();
    }
    obj.busy = true;
    let walk = obj.walk;
    // SAFETY: `busy` keeps any other thread's call out of the walk while
    // this one runs, GIL or not; the object owns the walk.
    let got = catch_unwind(AssertUnwindSafe(|| unsafe { &mut *walk }.next_pair(py)));
    // SAFETY: as above; the object is alive while CPython calls into it.
    unsafe { (*slf.cast::<PairsObject>()).busy = false };
    match got {
        Ok(Ok(Some(pair))) => pair,
        Ok(Ok(None)) => ptr::null_mut(),
        Ok(Err(e)) => {
            e.restore(py);
            ptr::null_mut()
        }
        Err(_) => {
            PyRuntimeError::new_err("bpfmaps: a panic while reading the pairs").restore(py);
            ptr::null_mut()
        }
    }
}

/// `tp_dealloc`: drops the walk (its map and pair references) and frees
/// the object, then lets go of the type, as heap types' objects do.
unsafe extern "C" fn dealloc(slf: *mut ffi::PyObject) {
    // SAFETY: CPython calls this once, with the GIL held, when the last
    // reference goes; the walk was boxed by `new`.
    unsafe {
        let walk = (*slf.cast::<PairsObject>()).walk;
        if !walk.is_null() {
            drop(Box::from_raw(walk));
        }
        let ty = ffi::Py_TYPE(slf);
        let free: ffi::freefunc = std::mem::transmute(ffi::PyType_GetSlot(ty, ffi::Py_tp_free));
        free(slf.cast());
        ffi::Py_DECREF(ty.cast());
    }
}

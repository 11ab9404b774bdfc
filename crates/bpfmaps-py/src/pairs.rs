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
//! and the string maps' batches").

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::OnceLock;

use bpfmaps::BatchKeys;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
    /// Keys as ints (signed if `Some(true)`), or `bytes` when `None`.
    key_ints: Option<bool>,
    value_ints: Option<bool>,
    /// The pair handed out last (a strong reference), or null.
    pair: *mut ffi::PyObject,
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
        if value_ints.is_some() && !matches!(value_size, 1 | 2 | 4 | 8) {
            return Err(PyTypeError::new_err(format!(
                "no int of {value_size} bytes"
            )));
        }
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
            key_ints,
            value_ints,
            pair: ptr::null_mut(),
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

    /// The next pair (a new reference), or `None` at the end.
    fn next_pair(&mut self, py: Python<'_>) -> PyResult<Option<*mut ffi::PyObject>> {
        if self.next == self.len && !self.refill(py)? {
            return Ok(None);
        }
        let i = self.next;
        self.next += 1;
        let k = if self.key_ints.is_some() {
            // Fixed-size int keys: the slot is the key.
            let ks = self.layout.stride();
            object(py, &self.keys[i * ks..][..ks], self.key_ints)?
        } else {
            let key = self.layout.key(&self.keys, i).map_err(py_err)?;
            object(py, key, None)?
        };
        let value = &self.values[i * self.value_size..][..self.value_size];
        let v = match object(py, value, self.value_ints) {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: `k` is a new reference no one else has.
                unsafe { ffi::Py_DECREF(k) };
                return Err(e);
            }
        };
        // SAFETY: `pair`, when set, is a live 2-tuple `self` holds a
        // reference to; with no other reference no one sees it change,
        // and `PyTuple_SetItem` takes `k`'s and `v`'s references and
        // drops the old items'. A new tuple has one reference (ours)
        // and takes its items the same way.
        unsafe {
            if !self.pair.is_null() && ffi::Py_REFCNT(self.pair) == 1 {
                ffi::PyTuple_SetItem(self.pair, 0, k);
                ffi::PyTuple_SetItem(self.pair, 1, v);
            } else {
                let pair = ffi::PyTuple_New(2);
                if pair.is_null() {
                    ffi::Py_DECREF(k);
                    ffi::Py_DECREF(v);
                    return Err(PyErr::fetch(py));
                }
                ffi::PyTuple_SetItem(pair, 0, k);
                ffi::PyTuple_SetItem(pair, 1, v);
                // Ints and bytes hold no references, so the pair can be
                // in no cycle: off the collector's lists, as CPython's
                // own collector leaves such tuples.
                ffi::PyObject_GC_UnTrack(pair.cast());
                if !self.pair.is_null() {
                    ffi::Py_DECREF(self.pair);
                }
                self.pair = pair;
            }
            ffi::Py_INCREF(self.pair);
        }
        Ok(Some(self.pair))
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

/// Bytes as Python sees them: `bytes`, or an int of their size in native
/// order, signed if `ints` is `Some(true)` (sizes checked in `Walk::new`).
/// A new reference.
#[inline(always)]
fn object(py: Python<'_>, b: &[u8], ints: Option<bool>) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: the C API's int constructors (every arm); a null return
    // leaves Python's error set, which `fetch` takes.
    let int = unsafe {
        match (ints, b.len()) {
            (None, _) => return Ok(PyBytes::new(py, b).into_ptr()),
            (Some(false), 1) => ffi::PyLong_FromUnsignedLong(b[0].into()),
            (Some(false), 2) => {
                ffi::PyLong_FromUnsignedLong(u16::from_ne_bytes([b[0], b[1]]).into())
            }
            (Some(false), 4) => ffi::PyLong_FromUnsignedLong(u32::from_ne_bytes(word(b)).into()),
            (Some(false), 8) => ffi::PyLong_FromUnsignedLongLong(u64::from_ne_bytes(word(b))),
            (Some(true), 1) => ffi::PyLong_FromLong((b[0] as i8).into()),
            (Some(true), 2) => ffi::PyLong_FromLong(i16::from_ne_bytes([b[0], b[1]]).into()),
            (Some(true), 4) => ffi::PyLong_FromLong(i32::from_ne_bytes(word(b)).into()),
            (Some(true), 8) => ffi::PyLong_FromLongLong(i64::from_ne_bytes(word(b))),
            (Some(_), n) => return Err(PyTypeError::new_err(format!("no int of {n} bytes"))),
        }
    };
    if int.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(int)
}

/// `b` as an array of its own size (the caller matched the size; a
/// mismatch would panic, which `iternext` turns into an error, rather
/// than hand out a wrong int).
fn word<const N: usize>(b: &[u8]) -> [u8; N] {
    b.try_into().expect("an int of the size matched")
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

/// Makes the `Pairs` type and adds it to `module`.
pub(crate) fn add_type(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
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

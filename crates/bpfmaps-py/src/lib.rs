//! `bpfmaps_rs._native`: the Rust side of the Python package. Its
//! classes, kept small; the Python side (`python/bpfmaps_rs/`) gives them
//! BCC's table shape and the typed helpers.
//!
//! - `RawMap`: any family of the registry through the byte contract
//!   (`bpfmaps::create`): keys and values as `bytes`, batches as packed
//!   buffers, numpy batches with the GIL released.
//! - `Lpm`: an IPv4 or IPv6 LPM table with integer values, taking
//!   addresses and prefixes as strings, ints, bytes or `ipaddress`
//!   objects, parsed here (a Python-side parse would cost more than the
//!   lookup); `lookup_many` over a numpy array without a Python loop.
//!
//! - `Pairs` (`pairs.rs`): the iterator `items_lookup_batch()` returns,
//!   made with the C API so that a loop pays no trampoline a pair.
//!
//! - `StrMap`, `MapleTree`, `Wildcard`: the qp-trie, the maple tree and
//!   the wildcard map through their typed APIs (ordered and prefix
//!   walks, ranges and free areas, rules written as text).
//!
//! Errors: `ENOENT` is `KeyError`, a wrong size `ValueError`, any other
//! errno `OSError(errno, message)`.

mod pairs;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use bpfmaps::lpm::{Ipv4Lpm, Ipv6Lpm};
use bpfmaps::{BatchError, BatchKeys, Caps, Error, Map, MapSpec, MapType};
use ipnet::{Ipv4Net, Ipv6Net};
use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::{PyKeyError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};

/// Keys and values as numpy rows of bytes.
type Rows<'py> = (Bound<'py, PyArray2<u8>>, Bound<'py, PyArray2<u8>>);

/// What a numpy lookup returns: the values and a found mask.
type Found<'py, A> = (Bound<'py, A>, Bound<'py, PyArray1<bool>>);

/// A map error as Python sees it.
fn py_err(e: Error) -> PyErr {
    match e {
        Error::NotFound => PyKeyError::new_err("no such key"),
        e => PyOSError::new_err((e.errno(), e.to_string())),
    }
}

/// A batch error: `OSError(errno, message)` with `processed`, how many
/// elements were done before it.
fn batch_err(py: Python<'_>, e: BatchError) -> PyErr {
    let err = match e.error {
        Error::NotFound => {
            PyKeyError::new_err(format!("no such key (after {} elements)", e.processed))
        }
        ref other => PyOSError::new_err((other.errno(), e.to_string())),
    };
    // Best effort: the attribute only adds detail.
    let _ = err.value(py).setattr("processed", e.processed);
    err
}

fn check_size(what: &str, got: usize, want: usize) -> PyResult<()> {
    if got == want {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!(
            "{what} is {got} bytes, the map takes {want}"
        )))
    }
}

/// Any map of the registry, through the byte contract.
#[pyclass(frozen, module = "bpfmaps_rs._native")]
struct RawMap {
    map: Box<dyn Map>,
    key_size: usize,
    value_size: usize,
    var_keys: bool,
}

impl RawMap {
    fn check_key(&self, key: &[u8]) -> PyResult<()> {
        if self.var_keys {
            if (1..=self.key_size).contains(&key.len()) {
                return Ok(());
            }
            return Err(PyValueError::new_err(format!(
                "key is {} bytes, the map takes 1 to {}",
                key.len(),
                self.key_size
            )));
        }
        check_size("key", key.len(), self.key_size)
    }

    fn layout(&self) -> BatchKeys {
        BatchKeys::of(&*self.map)
    }
}

#[pymethods]
impl RawMap {
    #[new]
    #[pyo3(signature = (map_type, key_size, value_size, max_entries, flags=0, extra=0))]
    fn new(
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
        extra: u64,
    ) -> PyResult<Self> {
        let spec = MapSpec::new(MapType(map_type), key_size, value_size, max_entries)
            .flags(flags)
            .extra(extra);
        let map = bpfmaps::create(&spec).map_err(py_err)?;
        Ok(RawMap {
            var_keys: map.caps().contains(Caps::VAR_KEYS),
            key_size: key_size as usize,
            value_size: value_size as usize,
            map,
        })
    }

    /// (type, key_size, value_size, max_entries, flags, extra).
    fn info(&self) -> (u32, u32, u32, u32, u32, u64) {
        let i = self.map.info();
        (
            i.map_type.0,
            i.key_size,
            i.value_size,
            i.max_entries,
            i.map_flags,
            i.map_extra,
        )
    }

    /// Whether keys are 1 to `key_size` bytes rather than exactly that.
    #[getter]
    fn var_keys(&self) -> bool {
        self.var_keys
    }

    /// Bytes per key in a packed batch buffer.
    #[getter]
    fn batch_stride(&self) -> usize {
        self.layout().stride()
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    fn memory_usage(&self) -> usize {
        self.map.memory_usage()
    }

    /// The value of `key` (`KeyError` if absent). A key-less map (bloom
    /// filter) takes `b""` and `value` to test.
    #[pyo3(signature = (key, value=None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if self.key_size == 0 {
            let mut probe = value.unwrap_or_default().to_vec();
            check_size("value", probe.len(), self.value_size)?;
            check_size("key", key.len(), 0)?;
            self.map.lookup(key, &mut probe).map_err(py_err)?;
            return Ok(PyBytes::new(py, &probe));
        }
        self.check_key(key)?;
        PyBytes::new_with(py, self.value_size, |out| {
            self.map.lookup(key, out).map_err(py_err)
        })
    }

    fn update(&self, key: &[u8], value: &[u8], flags: u64) -> PyResult<()> {
        if self.key_size > 0 {
            self.check_key(key)?;
        }
        check_size("value", value.len(), self.value_size)?;
        self.map.update(key, value, flags).map_err(py_err)
    }

    fn delete(&self, key: &[u8]) -> PyResult<()> {
        self.check_key(key)?;
        self.map.delete(key).map_err(py_err)
    }

    fn lookup_and_delete<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        self.check_key(key)?;
        PyBytes::new_with(py, self.value_size, |out| {
            self.map.lookup_and_delete(key, out).map_err(py_err)
        })
    }

    /// The key after `key` (`None`: the first), or `None` at the end.
    #[pyo3(signature = (key=None))]
    fn get_next_key<'py>(
        &self,
        py: Python<'py>,
        key: Option<&[u8]>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        if let Some(k) = key {
            self.check_key(k)?;
        }
        let mut next = vec![0u8; self.key_size];
        match self.map.get_next_key(key, &mut next) {
            Ok(len) => Ok(Some(PyBytes::new(py, &next[..len]))),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(py_err(e)),
        }
    }

    /// Up to `count` entries after key `after` (`None`: from the first),
    /// as packed buffers: (keys, values, copied). Fewer than `count`
    /// copied means the walk is complete.
    #[pyo3(signature = (after, count))]
    fn lookup_batch<'py>(
        &self,
        py: Python<'py>,
        after: Option<&[u8]>,
        count: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, usize)> {
        if let Some(k) = after {
            self.check_key(k)?;
        }
        let mut keys = vec![0u8; count * self.layout().stride()];
        let mut values = vec![0u8; count * self.value_size];
        let n = py
            .allow_threads(|| self.map.lookup_batch(after, &mut keys, &mut values))
            .map_err(|e| batch_err(py, e))?;
        keys.truncate(n * self.layout().stride());
        values.truncate(n * self.value_size);
        Ok((PyBytes::new(py, &keys), PyBytes::new(py, &values), n))
    }

    /// Every (key, value) pair, read `count` entries a native batch and
    /// handed out one pair at a time (BCC's `items_lookup_batch()`
    /// generator; `pairs.rs`). Keys come as ints of their size in native
    /// byte order where `key_ints` says signed (`True`) or unsigned
    /// (`False`), else as `bytes` (without their length for keys that
    /// vary in length); values likewise with `value_ints`.
    #[pyo3(signature = (count, key_ints=None, value_ints=None))]
    fn batch_items<'py>(
        slf: Bound<'py, Self>,
        count: usize,
        key_ints: Option<bool>,
        value_ints: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        pairs::new(
            py,
            pairs::Walk::new(slf.unbind(), count, key_ints, value_ints)?,
        )
    }

    /// Moves up to `count` entries out: (keys, values, moved).
    fn lookup_and_delete_batch<'py>(
        &self,
        py: Python<'py>,
        count: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, usize)> {
        let mut keys = vec![0u8; count * self.layout().stride()];
        let mut values = vec![0u8; count * self.value_size];
        let n = py
            .allow_threads(|| self.map.lookup_and_delete_batch(&mut keys, &mut values))
            .map_err(|e| batch_err(py, e))?;
        keys.truncate(n * self.layout().stride());
        values.truncate(n * self.value_size);
        Ok((PyBytes::new(py, &keys), PyBytes::new(py, &values), n))
    }

    /// Stores packed keys and values in order; how many were stored.
    fn update_batch(
        &self,
        py: Python<'_>,
        keys: &[u8],
        values: &[u8],
        flags: u64,
    ) -> PyResult<usize> {
        let (ks, vs) = (self.layout().stride(), self.value_size);
        if ks == 0
            || !keys.len().is_multiple_of(ks)
            || !values.len().is_multiple_of(vs)
            || keys.len() / ks != values.len() / vs
        {
            return Err(PyValueError::new_err(format!(
                "{} key bytes and {} value bytes are not as many {ks}-byte keys as {vs}-byte values",
                keys.len(),
                values.len()
            )));
        }
        py.allow_threads(|| self.map.update_batch(keys, values, flags))
            .map_err(|e| batch_err(py, e))
    }

    /// Deletes packed keys in order; how many were deleted.
    fn delete_batch(&self, py: Python<'_>, keys: &[u8]) -> PyResult<usize> {
        let ks = self.layout().stride();
        if ks == 0 || !keys.len().is_multiple_of(ks) {
            return Err(PyValueError::new_err(format!(
                "{} key bytes are not a whole number of {ks}-byte keys",
                keys.len()
            )));
        }
        py.allow_threads(|| self.map.delete_batch(keys))
            .map_err(|e| batch_err(py, e))
    }

    /// Looks up each row of `keys` (`uint8`, shape (n, key_size)) with
    /// the GIL released: (values (n, value_size) `uint8`, found (n,)
    /// `bool`); a missing key's row is zeros.
    fn lookup_many<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray2<'py, u8>,
    ) -> PyResult<Found<'py, PyArray2<u8>>> {
        let shape = keys.shape();
        let (n, ks) = (shape[0], shape[1]);
        if self.var_keys || self.key_size == 0 {
            return Err(PyTypeError::new_err("lookup_many takes fixed-size keys"));
        }
        check_size("a key row", ks, self.key_size)?;
        let keys = keys
            .as_slice()
            .map_err(|_| PyValueError::new_err("keys must be C-contiguous"))?;
        let vs = self.value_size;
        let mut values = vec![0u8; n * vs];
        let mut found = vec![false; n];
        let failed = py.allow_threads(|| {
            for (i, key) in keys.chunks_exact(ks).enumerate() {
                match self.map.lookup(key, &mut values[i * vs..(i + 1) * vs]) {
                    Ok(()) => found[i] = true,
                    Err(Error::NotFound) => {}
                    Err(e) => return Some(e),
                }
            }
            None
        });
        if let Some(e) = failed {
            return Err(py_err(e));
        }
        let values = PyArray1::from_vec(py, values).reshape([n, vs])?;
        Ok((values, PyArray1::from_vec(py, found)))
    }

    /// Every entry, in `get_next_key` order, read in batches of `chunk`
    /// with the GIL released: (keys (n, key_size) `uint8`, values (n,
    /// value_size) `uint8`).
    #[pyo3(signature = (chunk=4096))]
    fn items_many<'py>(&self, py: Python<'py>, chunk: usize) -> PyResult<Rows<'py>> {
        if self.var_keys || self.key_size == 0 {
            return Err(PyTypeError::new_err("items_many takes fixed-size keys"));
        }
        let (ks, vs, chunk) = (self.key_size, self.value_size, chunk.max(1));
        let (keys, values) = py
            .allow_threads(|| {
                let room = self.map.len() + chunk;
                let (mut keys, mut values) =
                    (Vec::with_capacity(room * ks), Vec::with_capacity(room * vs));
                loop {
                    let (k0, v0) = (keys.len(), values.len());
                    keys.resize(k0 + chunk * ks, 0);
                    values.resize(v0 + chunk * vs, 0);
                    let after = (k0 > 0).then(|| keys[k0 - ks..k0].to_vec());
                    let (kb, vb) = (&mut keys[k0..], &mut values[v0..]);
                    let n = self.map.lookup_batch(after.as_deref(), kb, vb)?;
                    keys.truncate(k0 + n * ks);
                    values.truncate(v0 + n * vs);
                    if n < chunk {
                        return Ok((keys, values));
                    }
                }
            })
            .map_err(|e| batch_err(py, e))?;
        let n = keys.len() / ks;
        Ok((
            PyArray1::from_vec(py, keys).reshape([n, ks])?,
            PyArray1::from_vec(py, values).reshape([n, vs])?,
        ))
    }

    /// Stores each row of `keys` with the row of `values`, in order, the
    /// GIL released; how many were stored (an error says how far it got
    /// in `processed`).
    fn update_many(
        &self,
        py: Python<'_>,
        keys: PyReadonlyArray2<'_, u8>,
        values: PyReadonlyArray2<'_, u8>,
        flags: u64,
    ) -> PyResult<usize> {
        if self.var_keys || self.key_size == 0 {
            return Err(PyTypeError::new_err("update_many takes fixed-size keys"));
        }
        let (ks, vs) = (keys.shape()[1], values.shape()[1]);
        check_size("a key row", ks, self.key_size)?;
        check_size("a value row", vs, self.value_size)?;
        if keys.shape()[0] != values.shape()[0] {
            return Err(PyValueError::new_err(
                "keys and values have different row counts",
            ));
        }
        let contiguous = |_| PyValueError::new_err("keys and values must be C-contiguous");
        let (keys, values) = (
            keys.as_slice().map_err(contiguous)?,
            values.as_slice().map_err(contiguous)?,
        );
        py.allow_threads(|| self.map.update_batch(keys, values, flags))
            .map_err(|e| batch_err(py, e))
    }
}

/// An IPv4 or IPv6 table of one family.
enum Table {
    V4(Ipv4Lpm<u64>),
    V6(Ipv6Lpm<u64>),
}

/// An LPM table of IP prefixes with unsigned integer values (up to 64
/// bits), for the Python `Lpm` helper.
#[pyclass(frozen, module = "bpfmaps_rs._native", name = "Lpm")]
struct Lpm {
    table: Table,
    /// The Python table's list of values once it holds handles (see
    /// `_ObjectValues`): `value` gives `objects[stored]`.
    objects: OnceLock<Py<PyList>>,
}

/// An address given as a string, an int, packed bytes or an `ipaddress`
/// address.
fn address<const N: usize>(obj: &Bound<'_, PyAny>) -> PyResult<[u8; N]> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return address_str(&s.to_cow()?);
    }
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return b
            .as_bytes()
            .try_into()
            .map_err(|_| PyValueError::new_err(format!("a packed address is {N} bytes")));
    }
    if let Ok(n) = obj.extract::<u128>() {
        let max = if N == 4 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        if n > max {
            return Err(PyValueError::new_err(format!(
                "{n} is past the IPv{} space",
                if N == 4 { 4 } else { 6 }
            )));
        }
        let be = n.to_be_bytes();
        return Ok(be[16 - N..].try_into().expect("N bytes"));
    }
    if let Ok(packed) = obj.getattr("packed") {
        return address::<N>(&packed);
    }
    Err(PyTypeError::new_err(
        "an address: str, int, bytes or ipaddress object",
    ))
}

/// An address written as text ("10.1.2.3", "2001:db8::1").
fn address_str<const N: usize>(s: &str) -> PyResult<[u8; N]> {
    let bytes: Option<Vec<u8>> = if N == 4 {
        s.parse::<Ipv4Addr>().ok().map(|a| a.octets().to_vec())
    } else {
        s.parse::<Ipv6Addr>().ok().map(|a| a.octets().to_vec())
    };
    bytes.and_then(|b| b.try_into().ok()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{s:?} is not an IPv{} address",
            if N == 4 { 4 } else { 6 }
        ))
    })
}

/// `(addr, len)` once `len` is checked against the address's bits.
fn checked_prefix<const N: usize>(addr: [u8; N], len: u64) -> PyResult<([u8; N], u8)> {
    let bits = (N * 8) as u64;
    if len > bits {
        return Err(PyValueError::new_err(format!(
            "prefix length {len} is past {bits}"
        )));
    }
    Ok((addr, len as u8))
}

/// A prefix written as text: "addr/len", or a bare address (a
/// full-length prefix).
fn prefix_str<const N: usize>(s: &str) -> PyResult<([u8; N], u8)> {
    match s.split_once('/') {
        Some((a, l)) => {
            let len: u64 = l
                .parse()
                .map_err(|_| PyValueError::new_err(format!("{s:?}: bad prefix length")))?;
            checked_prefix(address_str(a)?, len)
        }
        None => checked_prefix(address_str(s)?, (N * 8) as u64),
    }
}

/// A prefix given as "addr/len" (or a bare address: a full-length
/// prefix), an `ipaddress` network, or an (address, length) pair.
fn prefix<const N: usize>(obj: &Bound<'_, PyAny>) -> PyResult<([u8; N], u8)> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return prefix_str(&s.to_cow()?);
    }
    if let Ok((a, l)) = obj.extract::<(Bound<'_, PyAny>, u64)>() {
        return checked_prefix(address::<N>(&a)?, l);
    }
    if let (Ok(a), Ok(l)) = (obj.getattr("network_address"), obj.getattr("prefixlen")) {
        return checked_prefix(address::<N>(&a)?, l.extract()?);
    }
    Err(PyTypeError::new_err(
        "a prefix: \"addr/len\", an ipaddress network or (addr, len)",
    ))
}

/// What `Lpm`'s readers are given: an address, or a prefix ("addr/len",
/// an (addr, len) pair, an `ipaddress` network).
enum LpmKey<const N: usize> {
    Address([u8; N]),
    Prefix(([u8; N], u8)),
}

impl<const N: usize> LpmKey<N> {
    fn of(key: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(s) = key.downcast::<PyString>() {
            // One conversion of the text: the per-address path.
            let s = s.to_cow()?;
            return Ok(if s.contains('/') {
                LpmKey::Prefix(prefix_str(&s)?)
            } else {
                LpmKey::Address(address_str(&s)?)
            });
        }
        let plain = key.is_instance_of::<PyInt>() || key.is_instance_of::<PyBytes>();
        if !plain && (key.is_instance_of::<PyTuple>() || key.hasattr("prefixlen")?) {
            return Ok(LpmKey::Prefix(prefix(key)?));
        }
        Ok(LpmKey::Address(address(key)?))
    }
}

fn v4net((a, l): ([u8; 4], u8)) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::from(a), l)
        .expect("length checked")
        .trunc()
}

fn v6net((a, l): ([u8; 16], u8)) -> Ipv6Net {
    Ipv6Net::new(Ipv6Addr::from(a), l)
        .expect("length checked")
        .trunc()
}

#[pymethods]
impl Lpm {
    #[new]
    #[pyo3(signature = (version=4, max_entries=1 << 22))]
    fn new(version: u8, max_entries: u32) -> PyResult<Self> {
        let table = match version {
            4 => Table::V4(Ipv4Lpm::new(max_entries).map_err(py_err)?),
            6 => Table::V6(Ipv6Lpm::new(max_entries).map_err(py_err)?),
            _ => return Err(PyValueError::new_err("version is 4 or 6")),
        };
        Ok(Lpm {
            table,
            objects: OnceLock::new(),
        })
    }

    #[getter]
    fn version(&self) -> u8 {
        match self.table {
            Table::V4(_) => 4,
            Table::V6(_) => 6,
        }
    }

    fn __len__(&self) -> usize {
        match &self.table {
            Table::V4(t) => t.len(),
            Table::V6(t) => t.len(),
        }
    }

    /// Stores `value` under `prefix` (host bits ignored).
    fn insert(&self, prefix: &Bound<'_, PyAny>, value: u64) -> PyResult<()> {
        match &self.table {
            Table::V4(t) => t.insert(v4net(self::prefix::<4>(prefix)?), value),
            Table::V6(t) => t.insert(v6net(self::prefix::<16>(prefix)?), value),
        }
        .map_err(py_err)
    }

    /// Removes `prefix` and returns its value (`KeyError` if absent).
    fn remove(&self, prefix: &Bound<'_, PyAny>) -> PyResult<u64> {
        match &self.table {
            Table::V4(t) => t.remove(v4net(self::prefix::<4>(prefix)?)),
            Table::V6(t) => t.remove(v6net(self::prefix::<16>(prefix)?)),
        }
        .map_err(py_err)
    }

    /// The Python table's `get` in one call: the value of the longest
    /// stored prefix holding `key` (an address or a prefix, as `LpmKey`
    /// tells), read through the list of values once `use_objects` gave
    /// one, or `default`.
    #[pyo3(signature = (key, default=None))]
    fn value<'py>(
        &self,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = key.py();
        let guard = bpfmaps::pin();
        let stored = match &self.table {
            Table::V4(t) => match LpmKey::<4>::of(key)? {
                LpmKey::Address(a) => t.get(Ipv4Addr::from(a), &guard),
                LpmKey::Prefix(p) => t.covering(v4net(p)).pop().map(|(_, v)| v),
            },
            Table::V6(t) => match LpmKey::<16>::of(key)? {
                LpmKey::Address(a) => t.get(Ipv6Addr::from(a), &guard),
                LpmKey::Prefix(p) => t.covering(v6net(p)).pop().map(|(_, v)| v),
            },
        };
        let Some(stored) = stored else {
            return Ok(default);
        };
        Ok(Some(match self.objects.get() {
            Some(objects) => objects.bind(py).get_item(stored as usize)?,
            None => stored.into_bound_py_any(py)?,
        }))
    }

    /// From now on `value` reads values through `objects` (the table
    /// turned to handles, once).
    fn use_objects(&self, objects: Bound<'_, PyList>) -> PyResult<()> {
        self.objects
            .set(objects.unbind())
            .map_err(|_| PyValueError::new_err("the table holds handles already"))
    }

    /// The longest stored prefix holding `key` (an address or a prefix,
    /// as `LpmKey` tells) as "addr/len", with its value.
    fn longest_match(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<(String, u64)>> {
        Ok(match &self.table {
            Table::V4(t) => match LpmKey::<4>::of(key)? {
                LpmKey::Address(a) => t.longest_match(Ipv4Addr::from(a)),
                LpmKey::Prefix(p) => t.covering(v4net(p)).pop(),
            }
            .map(|(p, v)| (p.to_string(), v)),
            Table::V6(t) => match LpmKey::<16>::of(key)? {
                LpmKey::Address(a) => t.longest_match(Ipv6Addr::from(a)),
                LpmKey::Prefix(p) => t.covering(v6net(p)).pop(),
            }
            .map(|(p, v)| (p.to_string(), v)),
        })
    }

    /// The value stored under exactly `prefix`, or `None`.
    fn exact(&self, prefix: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(match &self.table {
            Table::V4(t) => t.exact(v4net(self::prefix::<4>(prefix)?)),
            Table::V6(t) => t.exact(v6net(self::prefix::<16>(prefix)?)),
        })
    }

    /// The stored prefixes that hold `prefix` (it included), shortest
    /// first, with their values.
    fn covering(&self, prefix: &Bound<'_, PyAny>) -> PyResult<Vec<(String, u64)>> {
        Ok(match &self.table {
            Table::V4(t) => t
                .covering(v4net(self::prefix::<4>(prefix)?))
                .into_iter()
                .map(|(p, v)| (p.to_string(), v))
                .collect(),
            Table::V6(t) => t
                .covering(v6net(self::prefix::<16>(prefix)?))
                .into_iter()
                .map(|(p, v)| (p.to_string(), v))
                .collect(),
        })
    }

    /// The stored prefixes inside `prefix` (it included), in order.
    fn covered(&self, prefix: &Bound<'_, PyAny>) -> PyResult<Vec<(String, u64)>> {
        Ok(match &self.table {
            Table::V4(t) => t
                .covered(v4net(self::prefix::<4>(prefix)?))
                .into_iter()
                .map(|(p, v)| (p.to_string(), v))
                .collect(),
            Table::V6(t) => t
                .covered(v6net(self::prefix::<16>(prefix)?))
                .into_iter()
                .map(|(p, v)| (p.to_string(), v))
                .collect(),
        })
    }

    /// Every prefix and value, in order.
    fn items(&self) -> Vec<(String, u64)> {
        match &self.table {
            Table::V4(t) => t.iter().map(|(p, v)| (p.to_string(), v)).collect(),
            Table::V6(t) => t.iter().map(|(p, v)| (p.to_string(), v)).collect(),
        }
    }

    /// Looks up each address of a sequence (strings, ints, packed bytes
    /// or `ipaddress` objects, as `get` takes them): each parsed here,
    /// then all looked up with the GIL released. (values, found).
    fn lookup_many_any<'py>(
        &self,
        py: Python<'py>,
        addrs: &Bound<'py, PyAny>,
    ) -> PyResult<Found<'py, PyArray1<u64>>> {
        fn parsed<const N: usize>(addrs: &Bound<'_, PyAny>) -> PyResult<Vec<[u8; N]>> {
            let mut out = Vec::with_capacity(addrs.len().unwrap_or(0));
            for a in addrs.try_iter()? {
                out.push(address::<N>(&a?)?);
            }
            Ok(out)
        }
        let (values, found) = match &self.table {
            Table::V4(t) => {
                let packed = parsed::<4>(addrs)?;
                py.allow_threads(|| many(t.as_trie(), &packed))
            }
            Table::V6(t) => {
                let packed = parsed::<16>(addrs)?;
                py.allow_threads(|| many(t.as_trie(), &packed))
            }
        };
        Ok((
            PyArray1::from_vec(py, values),
            PyArray1::from_vec(py, found),
        ))
    }

    /// Looks up IPv4 addresses given as a `uint32` array (host-order
    /// integers, as `int(ipaddress.IPv4Address(...))`), with the GIL
    /// released: (values `uint64`, found `bool`); a miss's value is 0.
    fn lookup_many_v4<'py>(
        &self,
        py: Python<'py>,
        addrs: PyReadonlyArray1<'py, u32>,
    ) -> PyResult<Found<'py, PyArray1<u64>>> {
        let Table::V4(t) = &self.table else {
            return Err(PyTypeError::new_err(
                "an IPv6 table takes (n, 16) uint8 addresses",
            ));
        };
        let addrs = addrs
            .as_slice()
            .map_err(|_| PyValueError::new_err("addresses must be contiguous"))?;
        let (values, found) = py.allow_threads(|| {
            let packed: Vec<[u8; 4]> = addrs.iter().map(|a| a.to_be_bytes()).collect();
            many(t.as_trie(), &packed)
        });
        Ok((
            PyArray1::from_vec(py, values),
            PyArray1::from_vec(py, found),
        ))
    }

    /// As `lookup_many_v4` for IPv6 addresses, rows of 16 `uint8` in
    /// network order (shape (n, 16)).
    fn lookup_many_v6<'py>(
        &self,
        py: Python<'py>,
        addrs: PyReadonlyArray2<'py, u8>,
    ) -> PyResult<Found<'py, PyArray1<u64>>> {
        let Table::V6(t) = &self.table else {
            return Err(PyTypeError::new_err("an IPv4 table takes a uint32 array"));
        };
        check_size("an address row", addrs.shape()[1], 16)?;
        let addrs = addrs
            .as_slice()
            .map_err(|_| PyValueError::new_err("addresses must be C-contiguous"))?;
        let (values, found) = py.allow_threads(|| {
            let packed: Vec<[u8; 16]> = addrs
                .chunks_exact(16)
                .map(|c| c.try_into().expect("16 bytes"))
                .collect();
            many(t.as_trie(), &packed)
        });
        Ok((
            PyArray1::from_vec(py, values),
            PyArray1::from_vec(py, found),
        ))
    }
}

/// Keys a batched lookup takes under one guard.
const CHUNK: usize = 256;

/// Batched LPM lookups through `get_many_as` ([`chunked`]).
fn many<A: AsRef<[u8]>>(trie: &bpfmaps::lpm::LpmTrie, addrs: &[A]) -> (Vec<u64>, Vec<bool>) {
    chunked(addrs, |chunk, guard, out| {
        trie.get_many_as(chunk, guard, out)
            .expect("room for every address")
    })
}

/// Lookups of `keys` in chunks of [`CHUNK`] under one guard each,
/// `lookup` answering a chunk into `out`: (values, found), a miss's
/// value 0.
fn chunked<K>(
    keys: &[K],
    mut lookup: impl FnMut(&[K], &bpfmaps::Guard, &mut [Option<u64>]),
) -> (Vec<u64>, Vec<bool>) {
    let mut values = vec![0u64; keys.len()];
    let mut found = vec![false; keys.len()];
    let mut out = [None::<u64>; CHUNK];
    for (i, chunk) in keys.chunks(CHUNK).enumerate() {
        let guard = bpfmaps::pin();
        lookup(chunk, &guard, &mut out[..chunk.len()]);
        for (j, v) in out[..chunk.len()].iter().enumerate() {
            if let Some(v) = v {
                values[i * CHUNK + j] = *v;
                found[i * CHUNK + j] = true;
            }
        }
    }
    (values, found)
}

/// A key given as `str` (UTF-8) or bytes.
fn key_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    push_key(obj, &mut out)?;
    Ok(out)
}

/// Appends the bytes of a key given as `str` (UTF-8) or bytes.
fn push_key(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    if let Ok(s) = obj.downcast::<PyString>() {
        out.extend_from_slice(s.to_cow()?.as_bytes());
    } else if let Ok(b) = obj.downcast::<PyBytes>() {
        out.extend_from_slice(b.as_bytes());
    } else {
        return Err(PyTypeError::new_err("a key: str or bytes"));
    }
    Ok(())
}

/// A string map (the qp-trie) with integer values, for the Python
/// `StrMap` helper: ordered, `prefix` and `range` walks,
/// `longest_prefix_of`.
#[pyclass(frozen, module = "bpfmaps_rs._native", name = "StrMap")]
struct StrMap {
    map: bpfmaps::strmap::QpTrieMap,
    max_key: usize,
}

impl StrMap {
    fn checked(&self, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
        let k = key_bytes(obj)?;
        self.check_len(k.len())?;
        Ok(k)
    }

    fn check_len(&self, len: usize) -> PyResult<()> {
        if (1..=self.max_key).contains(&len) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "key is {len} bytes, the map takes 1 to {}",
                self.max_key
            )))
        }
    }
}

fn u64_of(v: &[u8]) -> u64 {
    u64::from_ne_bytes(v.try_into().expect("8-byte values"))
}

#[pymethods]
impl StrMap {
    #[new]
    #[pyo3(signature = (max_key_size=255, max_entries=1 << 22))]
    fn new(max_key_size: usize, max_entries: u32) -> PyResult<Self> {
        Ok(StrMap {
            map: bpfmaps::strmap::QpTrieMap::new(max_key_size, 8, max_entries).map_err(py_err)?,
            max_key: max_key_size,
        })
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    fn memory_usage(&self) -> usize {
        self.map.memory_usage()
    }

    #[pyo3(signature = (key, value, flags=0))]
    fn insert(&self, key: &Bound<'_, PyAny>, value: u64, flags: u64) -> PyResult<()> {
        self.map
            .insert(&self.checked(key)?, &value.to_ne_bytes(), flags)
            .map_err(py_err)
    }

    /// Looks up each key of a sequence (`str` or bytes): the keys read
    /// here, then looked up with the GIL released. (values, found).
    fn lookup_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Found<'py, PyArray1<u64>>> {
        // The keys back to back in one buffer (no allocation a key).
        let (mut bytes, mut ends) = (Vec::new(), Vec::with_capacity(keys.len().unwrap_or(0)));
        for k in keys.try_iter()? {
            let start = bytes.len();
            push_key(&k?, &mut bytes)?;
            self.check_len(bytes.len() - start)?;
            ends.push(bytes.len());
        }
        let owned: Vec<&[u8]> = ends
            .iter()
            .scan(0, |start, &end| {
                let k = &bytes[*start..end];
                *start = end;
                Some(k)
            })
            .collect();
        let (values, found) = py.allow_threads(|| {
            chunked(&owned, |chunk, guard, out| {
                let mut answers = [None; CHUNK];
                let answers = &mut answers[..chunk.len()];
                self.map
                    .get_many(chunk, guard, answers)
                    .expect("room for every key");
                for (o, a) in out.iter_mut().zip(answers) {
                    *o = a.map(u64_of);
                }
            })
        });
        Ok((
            PyArray1::from_vec(py, values),
            PyArray1::from_vec(py, found),
        ))
    }

    fn get(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let k = self.checked(key)?;
        let guard = bpfmaps::pin();
        Ok(self.map.get(&k, &guard).map(u64_of))
    }

    fn remove(&self, key: &Bound<'_, PyAny>) -> PyResult<u64> {
        let mut out = [0u8; 8];
        self.map
            .remove(&self.checked(key)?, Some(&mut out))
            .map_err(py_err)?;
        Ok(u64::from_ne_bytes(out))
    }

    /// The longest stored key that is a prefix of `key`, with its value.
    fn longest_prefix_of(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<(Vec<u8>, u64)>> {
        let k = key_bytes(key)?;
        let guard = bpfmaps::pin();
        Ok(self
            .map
            .longest_prefix_of(&k, &guard)
            .map(|(p, v)| (p.to_vec(), u64_of(v))))
    }

    /// The keys starting with `prefix`, in order, with their values.
    fn prefix(&self, prefix: &Bound<'_, PyAny>) -> PyResult<Vec<(Vec<u8>, u64)>> {
        let p = key_bytes(prefix)?;
        let guard = bpfmaps::pin();
        Ok(self
            .map
            .prefix(&p, &guard)
            .map(|(k, v)| (k, u64_of(v)))
            .collect())
    }

    /// The keys from `lower` to `upper` (None: unbounded), in order:
    /// `lower` included unless `lower_open`, `upper` excluded unless
    /// `upper_closed`.
    #[pyo3(signature = (lower=None, upper=None, lower_open=false, upper_closed=false))]
    fn range(
        &self,
        lower: Option<&Bound<'_, PyAny>>,
        upper: Option<&Bound<'_, PyAny>>,
        lower_open: bool,
        upper_closed: bool,
    ) -> PyResult<Vec<(Vec<u8>, u64)>> {
        use std::ops::Bound as B;
        let lo = match lower {
            None => B::Unbounded,
            Some(k) if lower_open => B::Excluded(key_bytes(k)?),
            Some(k) => B::Included(key_bytes(k)?),
        };
        let hi = match upper {
            None => B::Unbounded,
            Some(k) if upper_closed => B::Included(key_bytes(k)?),
            Some(k) => B::Excluded(key_bytes(k)?),
        };
        let guard = bpfmaps::pin();
        Ok(self
            .map
            .range::<Vec<u8>>((lo, hi), &guard)
            .map(|(k, v)| (k, u64_of(v)))
            .collect())
    }
}

/// Values of the maple tree: any Python object, shared (the tree copies
/// nodes, and with them their values, on writes).
type Obj = std::sync::Arc<Py<PyAny>>;

/// A maple tree of `u64` ranges to Python objects, for the Python
/// `MapleTree` helper.
#[pyclass(frozen, module = "bpfmaps_rs._native", name = "MapleTree")]
struct Maple {
    tree: bpfmaps::maple::MapleTree<Obj>,
}

type Found3 = Option<(u64, u64, Py<PyAny>)>;

fn entry(py: Python<'_>, e: bpfmaps::maple::Entry<'_, Obj>) -> (u64, u64, Py<PyAny>) {
    (e.first, e.last, e.value.clone_ref(py))
}

#[pymethods]
impl Maple {
    #[new]
    fn new() -> Self {
        Maple {
            tree: bpfmaps::maple::MapleTree::new(),
        }
    }

    fn __len__(&self) -> usize {
        self.tree.len()
    }

    /// Stores `value` over `[first, last]`, overwriting what it covers.
    fn store_range(&self, first: u64, last: u64, value: Py<PyAny>) -> PyResult<()> {
        self.tree
            .store_range(first, last, Obj::new(value))
            .map_err(py_err)
    }

    /// Stores `value` over `[first, last]`; `OSError(EEXIST)` if any of
    /// it is taken.
    fn insert_range(&self, first: u64, last: u64, value: Py<PyAny>) -> PyResult<()> {
        self.tree
            .insert_range(first, last, Obj::new(value))
            .map_err(py_err)
    }

    /// `(first, last, value)` of the range holding `index`, or None.
    fn load(&self, py: Python<'_>, index: u64) -> Found3 {
        let guard = bpfmaps::pin();
        self.tree.load(index, &guard).map(|e| entry(py, e))
    }

    /// Removes the range holding `index` and returns it (`KeyError` if
    /// none does).
    fn erase(&self, py: Python<'_>, index: u64) -> PyResult<(u64, u64, Py<PyAny>)> {
        let (r, v) = self
            .tree
            .erase(index)
            .ok_or_else(|| PyKeyError::new_err(index))?;
        Ok((*r.start(), *r.end(), v.clone_ref(py)))
    }

    /// The first range holding an index in `[start, max]`, or None
    /// (also when `start > max`).
    fn find(&self, py: Python<'_>, start: u64, max: u64) -> Found3 {
        let guard = bpfmaps::pin();
        self.tree.find(start, max, &guard).map(|e| entry(py, e))
    }

    /// The lowest start of `size` free indices in `[min, max]`.
    fn empty_area(&self, min: u64, max: u64, size: u64) -> PyResult<u64> {
        let guard = bpfmaps::pin();
        self.tree.empty_area(min, max, size, &guard).map_err(py_err)
    }

    /// The highest start of `size` free indices in `[min, max]`.
    fn empty_area_rev(&self, min: u64, max: u64, size: u64) -> PyResult<u64> {
        let guard = bpfmaps::pin();
        self.tree
            .empty_area_rev(min, max, size, &guard)
            .map_err(py_err)
    }

    /// Stores `value` over the lowest free `size` indices in `[min, max]`
    /// and returns their start.
    fn alloc_range(&self, size: u64, value: Py<PyAny>, min: u64, max: u64) -> PyResult<u64> {
        self.tree
            .alloc_range(size, Obj::new(value), min, max)
            .map_err(py_err)
    }

    /// Every range in `[lower, upper]` as `(first, last, value)`, in order.
    #[pyo3(signature = (lower=0, upper=u64::MAX))]
    fn items(&self, py: Python<'_>, lower: u64, upper: u64) -> Vec<(u64, u64, Py<PyAny>)> {
        let guard = bpfmaps::pin();
        self.tree
            .range(lower..=upper, &guard)
            .map(|e| entry(py, e))
            .collect()
    }

    fn clear(&self) {
        self.tree.clear();
    }
}

/// A wildcard map with integer values, for the Python `Wildcard` helper:
/// a schema of named fields, rules written as text.
#[pyclass(frozen, module = "bpfmaps_rs._native", name = "Wildcard")]
struct Wildcard {
    map: bpfmaps::wildcard::WildcardMap,
}

#[pymethods]
impl Wildcard {
    /// `fields`: (name, kind, bytes) with kind "prefix", "range",
    /// "exact" or "wildcard".
    #[new]
    #[pyo3(signature = (fields, max_entries=1 << 20))]
    fn new(fields: Vec<(String, String, usize)>, max_entries: u32) -> PyResult<Self> {
        use bpfmaps::wildcard::{Field, Schema};
        let fields = fields
            .iter()
            .map(|(name, kind, size)| {
                Ok(match kind.as_str() {
                    "prefix" => Field::prefix(name, *size),
                    "range" => Field::range(name, *size),
                    "exact" => Field::exact(name, *size),
                    "wildcard" => Field::wildcard(name, *size),
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "field kind {other:?}: prefix, range, exact or wildcard"
                        )));
                    }
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let schema = Schema::new(fields).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Wildcard {
            map: bpfmaps::wildcard::WildcardMap::new(schema, 8, max_entries).map_err(py_err)?,
        })
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    /// Adds the rule written `text` (`"src 10.0.0.0/8, dport 1-1024"`;
    /// fields left out match anything) at `priority` (lower wins).
    #[pyo3(signature = (text, priority, value, flags=0))]
    fn insert(&self, text: &str, priority: u32, value: u64, flags: u64) -> PyResult<()> {
        let rule = self.rule(text, priority)?;
        self.map
            .insert(&rule, &value.to_ne_bytes(), flags)
            .map_err(py_err)
    }

    /// Adds every `(text, priority, value)` of `rules` at once, as a
    /// rule set is loaded: all or nothing, with the GIL released while
    /// the map is built. Tables shaped after the whole set, not its
    /// first rules: fewer of them, and fewer probed a packet, than
    /// inserts in turn make (`WildcardMap::load`).
    #[pyo3(signature = (rules, flags=0))]
    fn load(&self, py: Python<'_>, rules: Vec<(String, u32, u64)>, flags: u64) -> PyResult<()> {
        let parsed = rules
            .iter()
            .map(|(text, priority, value)| Ok((self.rule(text, *priority)?, value.to_ne_bytes())))
            .collect::<PyResult<Vec<_>>>()?;
        py.allow_threads(|| self.map.load(parsed, flags))
            .map_err(py_err)
    }

    /// Removes the rule written `text` at `priority`; its value.
    fn remove(&self, text: &str, priority: u32) -> PyResult<u64> {
        let rule = self.rule(text, priority)?;
        self.map.take(&rule).map(|v| u64_of(&v)).map_err(py_err)
    }

    /// The best rule matching the packet written `text` (`"src 10.1.2.3,
    /// dport 22"`, every field given): `(priority, value)`, or None.
    fn classify(&self, text: &str) -> PyResult<Option<(u32, u64)>> {
        let packet = self
            .map
            .schema()
            .parse_packet(text)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let guard = bpfmaps::pin();
        Ok(self
            .map
            .classify(&packet, &guard)
            .map(|(r, v)| (r.priority, u64_of(v))))
    }

    /// `classify` for packets given as integer field values, one row per
    /// packet (`uint64`, one column per field, fields up to 8 bytes),
    /// with the GIL released: (priorities `uint32`, values `uint64`,
    /// found `bool`). ValueError for a value wider than its field.
    ///
    /// The rows go through in chunks of [`CLASSIFY_CHUNK`] packets, so
    /// ten million rows need no ten million `Packet`s (144 bytes each)
    /// at once.
    fn classify_many<'py>(
        &self,
        py: Python<'py>,
        packets: PyReadonlyArray2<'py, u64>,
    ) -> PyResult<ManyAnswers<'py>> {
        let fields = self.map.schema().fields().len();
        if packets.shape()[1] != fields {
            return Err(PyValueError::new_err(format!(
                "packet rows have {} columns, the schema {fields} fields",
                packets.shape()[1]
            )));
        }
        let rows = packets
            .as_slice()
            .map_err(|_| PyValueError::new_err("packets must be C-contiguous"))?;
        let answers = py.allow_threads(|| {
            let schema = self.map.schema();
            let guard = bpfmaps::pin();
            let mut out = Answers::new(rows.len() / fields);
            let mut chunk = Vec::with_capacity(CLASSIFY_CHUNK);
            let mut answers = vec![None; CLASSIFY_CHUNK];
            for (c, part) in rows.chunks(fields * CLASSIFY_CHUNK).enumerate() {
                chunk.clear();
                for row in part.chunks_exact(fields) {
                    let mut wide = [0u128; bpfmaps::wildcard::schema::MAX_FIELDS];
                    for (w, &v) in wide.iter_mut().zip(row) {
                        *w = u128::from(v);
                    }
                    chunk.push(schema.packet(&wide[..fields])?);
                }
                // In bursts, where the map asks for their buckets ahead.
                self.map.classify_many(&chunk, &guard, &mut answers)?;
                out.fill(c * CLASSIFY_CHUNK, &answers[..chunk.len()]);
            }
            Ok(out)
        });
        answers
            .map_err(|e: Error| PyValueError::new_err(e.to_string()))
            .map(|a| a.into_arrays(py))
    }

    /// The bytes of one concrete key for `classify_many_keys`: every
    /// field's bytes back to back.
    #[getter]
    fn key_size(&self) -> usize {
        self.map.schema().key_size()
    }

    /// `classify_many` for keys as a capture holds them: `key_size`
    /// bytes each, back to back, each field in network order, in a
    /// `bytes` object or a C-contiguous numpy `uint8` array of any shape
    /// (no per-packet conversion). ValueError for a length that is not
    /// a whole number of keys.
    fn classify_many_keys<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<ManyAnswers<'py>> {
        let array;
        let bytes: &[u8] = match keys.downcast::<PyBytes>() {
            Ok(b) => b.as_bytes(),
            Err(_) => {
                array = keys
                    .extract::<PyReadonlyArrayDyn<'py, u8>>()
                    .map_err(|_| PyTypeError::new_err("keys: bytes or a numpy uint8 array"))?;
                array
                    .as_slice()
                    .map_err(|_| PyValueError::new_err("keys must be C-contiguous"))?
            }
        };
        let size = self.map.schema().key_size();
        if !bytes.len().is_multiple_of(size) {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not whole keys of {size} bytes",
                bytes.len()
            )));
        }
        let answers = py.allow_threads(|| {
            let guard = bpfmaps::pin();
            let mut out = Answers::new(bytes.len() / size);
            let mut answers = vec![None; CLASSIFY_CHUNK];
            for (c, part) in bytes.chunks(size * CLASSIFY_CHUNK).enumerate() {
                self.map.classify_many_keys(part, &guard, &mut answers)?;
                out.fill(c * CLASSIFY_CHUNK, &answers[..part.len() / size]);
            }
            Ok(out)
        });
        answers
            .map_err(|e: Error| PyValueError::new_err(e.to_string()))
            .map(|a| a.into_arrays(py))
    }
}

impl Wildcard {
    /// The rule written `text` at `priority`; ValueError naming the text.
    fn rule(&self, text: &str, priority: u32) -> PyResult<bpfmaps::wildcard::Rule> {
        self.map
            .schema()
            .parse_rule(text, priority)
            .map_err(|e| PyValueError::new_err(format!("{text:?}: {e}")))
    }
}

/// What `Wildcard.classify_many` and `classify_many_keys` return:
/// priorities, values and whether a rule matched, one of each a packet.
type ManyAnswers<'py> = (
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<bool>>,
);

/// The columns of [`ManyAnswers`], filled a chunk at a time without the
/// GIL.
struct Answers {
    prios: Vec<u32>,
    values: Vec<u64>,
    found: Vec<bool>,
}

impl Answers {
    fn new(n: usize) -> Answers {
        Answers {
            prios: vec![0; n],
            values: vec![0; n],
            found: vec![false; n],
        }
    }

    /// A chunk's answers, from packet `at` on.
    fn fill(&mut self, at: usize, answers: &[Option<(&bpfmaps::wildcard::Rule, &[u8])>]) {
        for (i, answer) in answers.iter().enumerate() {
            if let Some((r, v)) = answer {
                self.prios[at + i] = r.priority;
                self.values[at + i] = u64_of(v);
                self.found[at + i] = true;
            }
        }
    }

    fn into_arrays(self, py: Python<'_>) -> ManyAnswers<'_> {
        (
            PyArray1::from_vec(py, self.prios),
            PyArray1::from_vec(py, self.values),
            PyArray1::from_vec(py, self.found),
        )
    }
}

/// Packets `Wildcard.classify_many` converts and classifies at a time
/// (and keys `classify_many_keys` classifies at a time).
const CLASSIFY_CHUNK: usize = 256;

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawMap>()?;
    pairs::add_type(m)?;
    m.add_class::<Lpm>()?;
    m.add_class::<StrMap>()?;
    m.add_class::<Maple>()?;
    m.add_class::<Wildcard>()?;
    for f in bpfmaps::registry::FAMILIES {
        m.add(
            &*format!("MAP_TYPE_{}", f.name.to_uppercase()),
            f.map_type.0,
        )?;
    }
    m.add("BPF_ANY", bpfmaps::BPF_ANY)?;
    m.add("BPF_NOEXIST", bpfmaps::BPF_NOEXIST)?;
    m.add("BPF_EXIST", bpfmaps::BPF_EXIST)?;
    m.add("BPF_F_NO_PREALLOC", bpfmaps::BPF_F_NO_PREALLOC)?;
    m.add("BPF_F_ZERO_SEED", bpfmaps::BPF_F_ZERO_SEED)?;
    Ok(())
}

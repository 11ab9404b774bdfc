"""bpfmaps from Python: the kernel's BPF maps in userspace, in Rust.

Distribution ``bpfmaps-rs`` (``bpfmaps`` on PyPI is another project),
imported as ``bpfmaps_rs``.

- :class:`Table`: any map family with the shape of BCC's tables: a
  ``MutableMapping`` over keys and values given as ``bytes``, ctypes
  objects (BCC's ``Key``/``Leaf``) or ints, with the kernel's update flags
  and batch calls, and numpy batches (``lookup_many``/``update_many``)
  that run without a Python loop and with the GIL released.
- :class:`Lpm`: an IPv4/IPv6 longest-prefix-match table in pytricia's
  shape (``t["10.0.0.0/8"] = 1``, ``t.get("10.1.2.3")``,
  ``t.get_key(...)``), with ``covering``/``covered`` and a numpy
  ``lookup_many``.

Errors: a missing key is ``KeyError``; a wrong size ``ValueError``; any
other failure ``OSError`` with the kernel's errno (``EEXIST``, ``E2BIG``,
``EINVAL``, ...). Lookups never block: the maps' readers are lock-free.

>>> import ctypes, bpfmaps_rs
>>> t = bpfmaps_rs.Table(bpfmaps_rs.MAP_TYPE_HASH, ctypes.c_uint32, ctypes.c_uint64, 1024)
>>> t[7] = 42
>>> t[7].value
42
>>> routes = bpfmaps_rs.Lpm()
>>> routes["10.0.0.0/8"] = 1
>>> routes.get("10.1.2.3"), routes.get_key("10.1.2.3")
(1, '10.0.0.0/8')
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import sys
from collections.abc import ItemsView, MutableMapping, ValuesView
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from . import _native
from ._native import (  # noqa: F401  (re-exported)
    BPF_ANY,
    BPF_EXIST,
    BPF_F_NO_PREALLOC,
    BPF_F_ZERO_SEED,
    BPF_NOEXIST,
)

# MAP_TYPE_HASH, MAP_TYPE_LPM_TRIE, ...: the family registry's types.
MAP_TYPES = {
    name[len("MAP_TYPE_") :].lower(): getattr(_native, name)
    for name in dir(_native)
    if name.startswith("MAP_TYPE_")
}
globals().update({"MAP_TYPE_" + n.upper(): v for n, v in MAP_TYPES.items()})

__all__ = ["Table", "Lpm", "MAP_TYPES", "BPF_ANY", "BPF_NOEXIST", "BPF_EXIST"]

_BATCH = 4096

# A default no value can be: tells a miss from a stored None.
_MISSING = object()


def _ctype(spec: Any, what: str) -> type:
    """The ctypes type for a key or value given as a size or a type."""
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"{what} size {spec} is negative")
        return ctypes.c_ubyte * spec
    if isinstance(spec, type) and issubclass(
        spec, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)
    ):
        return spec
    raise TypeError(f"{what}: a size in bytes or a ctypes type, not {spec!r}")


def _is_int_type(ctype: type) -> bool:
    return issubclass(ctype, ctypes._SimpleCData) and ctype._type_ in "bBhHiIlLqQ"


def _byteorder(ctype: type) -> str:
    """The byte order an int takes as a value of ``ctype``: that of a
    byte-swapped ctypes integer type (``c_uint16.__ctype_be__`` on a
    little-endian machine), else the machine's."""
    if _is_int_type(ctype):
        if getattr(ctype, "__ctype_be__", None) is ctype:
            return "big"
        if getattr(ctype, "__ctype_le__", None) is ctype:
            return "little"
    return sys.byteorder


def _packer(ctype: type) -> Any:
    """``struct``'s packing of one value of a ctypes integer type, in its
    size and byte order; None for any other type."""
    if not _is_int_type(ctype):
        return None
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[ctypes.sizeof(ctype)]
    order = ">" if _byteorder(ctype) == "big" else "<"
    return struct.Struct(order + (code.upper() if ctype._type_.isupper() else code)).pack


def _int_kind(ctype: type) -> Optional[bool]:
    """For a ctypes integer type in the machine's byte order, whether it
    is signed; None for any other type (a byte-swapped one goes through
    ctypes, which swaps)."""
    if _is_int_type(ctype) and _byteorder(ctype) == sys.byteorder:
        return ctype._type_ in "bhilq"
    return None


class Table(MutableMapping):
    """A map of any family, shaped as BCC's tables.

    ``key`` and ``leaf`` are sizes in bytes or ctypes types (exposed as
    ``Key`` and ``Leaf``, as in BCC). Keys and values may be given as
    ``bytes``, instances of those types, or ints when the size is 1, 2, 4
    or 8 bytes (in the type's byte order: the machine's, or a
    byte-swapped ctypes type's such as ``c_uint16.__ctype_be__``). Values
    come back as ``Leaf`` instances and keys as ``Key`` instances
    (``bytes`` for maps whose keys vary in length, the qp-trie and TST
    maps).

    Iteration follows ``get_next_key``: key order for the ordered maps,
    table order for the hash maps.
    """

    def __init__(
        self,
        map_type: int,
        key: Any,
        leaf: Any,
        max_entries: int,
        flags: int = 0,
        extra: int = 0,
    ) -> None:
        self.Key = _ctype(key, "key")
        self.Leaf = _ctype(leaf, "leaf")
        self.key_size = ctypes.sizeof(self.Key)
        self.value_size = ctypes.sizeof(self.Leaf)
        self._map = _native.RawMap(
            map_type, self.key_size, self.value_size, max_entries, flags, extra
        )
        self.var_keys = self._map.var_keys
        # Ints of integer types packed by struct: a tenth of the general
        # conversion's time, which is most of a single lookup's.
        self._pack_key = None if self.var_keys else _packer(self.Key)
        self._pack_value = _packer(self.Leaf)
        self._key_order, self._value_order = _byteorder(self.Key), _byteorder(self.Leaf)
        # Batches hand out ints for integer types (True: signed) and bytes
        # for variable-length keys; those pairs the native side builds.
        self._key_ints = None if self.var_keys else _int_kind(self.Key)
        self._value_ints = _int_kind(self.Leaf)
        self._native_pairs = (self.var_keys or self._key_ints is not None) and (
            self._value_ints is not None
        )
        self.map_type, _, _, self.max_entries, self.flags, self.extra = self._map.info()

    # -- conversions ---------------------------------------------------

    @staticmethod
    def _bytes(obj: Any, size: int, what: str, exact: bool = True, order: str = sys.byteorder) -> bytes:
        if isinstance(obj, (bytes, bytearray, memoryview)):
            b = bytes(obj)
        elif isinstance(obj, str):
            b = obj.encode()
        elif isinstance(obj, bool):
            raise TypeError(f"{what}: bytes, a ctypes object or an int, not a bool")
        elif isinstance(obj, int):
            if size not in (1, 2, 4, 8):
                raise TypeError(f"{what}: an int only for sizes 1, 2, 4 and 8, not {size}")
            try:
                b = obj.to_bytes(size, order, signed=obj < 0)
            except OverflowError:
                raise ValueError(f"{what} {obj} does not fit in {size} bytes") from None
        elif isinstance(obj, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
            b = bytes(memoryview(obj).cast("B"))
        else:
            raise TypeError(f"{what}: bytes, a ctypes object or an int, not {type(obj).__name__}")
        if exact and len(b) != size:
            raise ValueError(f"{what} is {len(b)} bytes, the map takes {size}")
        return b

    def _key(self, key: Any) -> bytes:
        if type(key) is int and self._pack_key is not None:
            try:
                return self._pack_key(key)
            except struct.error:
                pass  # negative or too large: the general path says which
        elif type(key) is self.Key:
            return bytes(key)  # what iteration gives back
        return self._bytes(key, self.key_size, "key", not self.var_keys, self._key_order)

    def _value(self, value: Any) -> bytes:
        if type(value) is int and self._pack_value is not None:
            try:
                return self._pack_value(value)
            except struct.error:
                pass
        return self._bytes(value, self.value_size, "value", True, self._value_order)

    def _key_out(self, b: bytes) -> Any:
        return b if self.var_keys else self.Key.from_buffer_copy(b)

    def _leaf_out(self, b: bytes) -> Any:
        return self.Leaf.from_buffer_copy(b)

    # -- the mapping ---------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        return self._leaf_out(self._map.lookup(self._key(key)))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._map.update(self._key(key), self._value(value), BPF_ANY)

    def __delitem__(self, key: Any) -> None:
        self._map.delete(self._key(key))

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[Any]:
        key = self._map.get_next_key(None)
        while key is not None:
            yield self._key_out(key)
            key = self._map.get_next_key(key)

    def __contains__(self, key: Any) -> bool:
        try:
            self._map.lookup(self._key(key))
        except KeyError:
            return False
        return True

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """``update(key, value, flags=BPF_ANY)`` as BCC's (flags
        ``BPF_NOEXIST``: ``OSError(EEXIST)`` if present; ``BPF_EXIST``:
        ``KeyError`` if absent), or ``dict.update``'s forms."""
        if len(args) in (2, 3) and not kwargs:
            key, value = args[0], args[1]
            flags = args[2] if len(args) == 3 else BPF_ANY
            self._map.update(self._key(key), self._value(value), flags)
            return
        if len(args) == 2 and set(kwargs) == {"flags"}:
            self._map.update(self._key(args[0]), self._value(args[1]), kwargs["flags"])
            return
        super().update(*args, **kwargs)

    def clear(self) -> None:
        """Deletes every entry (batches of lookup-and-delete where the
        family has them, else one key at a time)."""
        try:
            while self._map.lookup_and_delete_batch(_BATCH)[2] == _BATCH:
                pass
        except OSError:
            for key in list(self):
                self.pop(key, None)

    def push(self, value: Any, flags: int = BPF_ANY) -> None:
        """Adds ``value`` to a map without keys (the bloom filter), as
        ``bpf_map_push_elem``."""
        self._require_keyless()
        self._map.update(b"", self._value(value), flags)

    def peek(self, value: Any) -> bool:
        """For the bloom filter: whether ``value`` may have been pushed
        (False means certainly not), as ``bpf_map_peek_elem``."""
        self._require_keyless()
        try:
            self._map.lookup(b"", self._value(value))
        except KeyError:
            return False
        return True

    def _require_keyless(self) -> None:
        if self.key_size != 0:
            raise TypeError("push and peek are for maps without keys (key size 0)")

    def lookup_and_delete(self, key: Any) -> Any:
        return self._leaf_out(self._map.lookup_and_delete(self._key(key)))

    def memory_usage(self) -> int:
        return self._map.memory_usage()

    # -- BCC's batch calls ---------------------------------------------

    def _unpack(self, keys: bytes, values: bytes, n: int) -> list:
        """Packed batch buffers as (key, value) pairs: items of ctypes
        arrays of ``Key`` and ``Leaf``, as BCC's batch calls give them
        (plain ints for simple ctypes types), made in one copy each."""
        if n == 0:
            return []
        leaves = self._column(self.Leaf, values, n)
        if not self.var_keys:
            return list(zip(self._column(self.Key, keys, n), leaves))
        stride = self._map.batch_stride
        out = []
        for i in range(n):
            k = keys[i * stride : (i + 1) * stride]
            length = int.from_bytes(k[:4], sys.byteorder)
            out.append((k[4 : 4 + length], leaves[i]))
        return out

    @staticmethod
    def _column(ctype: type, packed: bytes, n: int) -> list:
        """The items of a ctypes array of ``ctype`` over ``packed``: ints
        (or floats) for integer (or float) types, read by numpy in one
        pass (a ctypes array's items cost 4x more); ctypes objects for
        structures and arrays."""
        if issubclass(ctype, ctypes._SimpleCData) and ctype._type_ in "bBhHiIlLqQfd":
            return np.frombuffer(packed, dtype=np.dtype(ctype), count=n).tolist()
        return list((ctype * n).from_buffer_copy(packed))

    def _pack_keys(self, keys: Iterable[Any]) -> bytes:
        if not self.var_keys:
            return b"".join(self._key(k) for k in keys)
        out = []
        for k in keys:
            b = self._key(k)
            if not 1 <= len(b) <= self.key_size:
                raise ValueError(f"key is {len(b)} bytes, the map takes 1 to {self.key_size}")
            out.append(len(b).to_bytes(4, sys.byteorder) + b.ljust(self.key_size, b"\0"))
        return b"".join(out)

    def items_lookup_batch(self) -> Iterator[tuple[Any, Any]]:
        """Every (key, value), read in batches (the kernel's
        ``BPF_MAP_LOOKUP_BATCH``) and yielded one pair at a time, as BCC's
        generator yields them; keys and values as BCC gives them, the
        items of ctypes arrays of ``Key`` and ``Leaf`` (ints for simple
        types such as ``c_uint32``). ``list(...)`` for a list.

        Each native batch goes on after the last key of the one before,
        as ``for k in table`` goes on after each key: a loop that deletes
        that key makes a hash map start over from its first key (the
        kernel's ``get_next_key`` rule), so take ``list(...)`` first to
        change the map while reading it."""
        if self._native_pairs:
            # Int or bytes keys, int values: the pairs made natively, with
            # no Python frame a pair.
            return self._map.batch_items(_BATCH, self._key_ints, self._value_ints)
        return self._batch_items()

    def _raw_batches(self) -> Iterator[tuple[bytes, bytes, int]]:
        """The map's native batches, ``(keys, values, count)``, each going
        on after the last key of the one before."""
        after = None
        while True:
            keys, values, n = self._map.lookup_batch(after, _BATCH)
            yield keys, values, n
            if n < _BATCH:
                return
            stride = self._map.batch_stride
            last = keys[(n - 1) * stride : n * stride]
            if self.var_keys:
                last = last[4 : 4 + int.from_bytes(last[:4], sys.byteorder)]
            after = last

    def _batch_items(self) -> Iterator[tuple[Any, Any]]:
        for batch in self._raw_batches():
            yield from self._unpack(*batch)

    def _objects(self, ctype: type, packed: bytes, n: int, size: int) -> Iterator[Any]:
        """``n`` objects of ``ctype`` copied out of ``packed``, ``size``
        bytes each, as a lookup gives them (``map``: no Python frame an
        object)."""
        return map(ctype.from_buffer_copy, itertools.repeat(packed, n), range(0, n * size, size))

    def _leaf_batches(self) -> Iterator[Any]:
        """Every value as a ``Leaf``, read in native batches."""
        for _, values, n in self._raw_batches():
            yield from self._objects(self.Leaf, values, n, self.value_size)

    def _object_batches(self) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) as iteration and lookups give them (``Key``
        or ``bytes``, ``Leaf``), read in native batches."""
        for keys, values, n in self._raw_batches():
            leaves = self._objects(self.Leaf, values, n, self.value_size)
            if self.var_keys:
                yield from zip((k for k, _ in self._unpack(keys, values, n)), leaves)
            else:
                yield from zip(self._objects(self.Key, keys, n, self.key_size), leaves)

    def items(self) -> ItemsView:
        """The (key, value) pairs a lookup of each key would give, read
        in native batches (no lookup a key: about a quarter of the time)."""
        return _BatchedItems(self)

    def values(self) -> ValuesView:
        """The values a lookup of each key would give, read in native
        batches."""
        return _BatchedValues(self)

    def items_update_batch(self, keys: Iterable[Any], values: Iterable[Any], flags: int = BPF_ANY) -> int:
        """Stores each key with its value, in order; how many were stored.
        A failure part way raises with ``processed`` set."""
        keys, values = list(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys and {len(values)} values")
        return self._map.update_batch(
            self._pack_keys(keys), b"".join(self._value(v) for v in values), flags
        )

    def items_delete_batch(self, keys: Optional[Iterable[Any]] = None) -> int:
        """Deletes the given keys (``KeyError`` at the first missing one,
        with ``processed``), or every entry if ``keys`` is None."""
        if keys is None:
            n = len(self)
            self.clear()
            return n
        return self._map.delete_batch(self._pack_keys(keys))

    def items_lookup_and_delete_batch(self) -> list:
        """Moves every (key, value) out; the map is left empty."""
        out = []
        while True:
            keys, values, n = self._map.lookup_and_delete_batch(_BATCH)
            out.extend(self._unpack(keys, values, n))
            if n < _BATCH:
                return out

    # -- numpy -----------------------------------------------------------

    def _rows(self, arr: Any, size: int, what: str) -> np.ndarray:
        a = np.ascontiguousarray(arr)
        if a.ndim == 0:
            raise ValueError(f"{what}: an array of {size}-byte items")
        n = a.shape[0]
        rows = a.view(np.uint8).reshape(n, -1) if a.dtype != np.uint8 or a.ndim == 1 else a
        if rows.ndim != 2 or rows.shape[1] != size:
            raise ValueError(
                f"{what}: items of {a.itemsize * int(np.prod(a.shape[1:], dtype=int))} bytes "
                f"(dtype {a.dtype}, shape {a.shape}), the map takes {size}"
            )
        return rows

    def lookup_many(self, keys: Any) -> tuple:
        """Looks up every key of a numpy array (any dtype whose items are
        ``key_size`` bytes, or ``uint8`` rows) without a Python loop, the
        GIL released: ``(values, found)``; a missing key's value is 0.
        Values come as the ``Leaf`` dtype, or ``uint8`` rows for a byte
        array ``Leaf``."""
        raw, found = self._map.lookup_many(self._rows(keys, self.key_size, "keys"))
        return self._as_dtype(raw, self.Leaf), found

    def items_many(self) -> tuple:
        """Every entry as two numpy arrays, ``(keys, values)``, in
        ``get_next_key`` order, read natively in batches with the GIL
        released (no Python object per entry): the numpy form of
        :meth:`items_lookup_batch`. Keys and values come as the ``Key``
        and ``Leaf`` dtypes, or ``uint8`` rows for byte-array types."""
        keys, values = self._map.items_many()
        return self._as_dtype(keys, self.Key), self._as_dtype(values, self.Leaf)

    @staticmethod
    def _as_dtype(rows: np.ndarray, ctype: type) -> np.ndarray:
        if issubclass(ctype, ctypes.Array):
            return rows
        return rows.view(np.dtype(ctype)).reshape(rows.shape[0])

    def update_many(self, keys: Any, values: Any, flags: int = BPF_ANY) -> int:
        """Stores every key of a numpy array with its value, in order, the
        GIL released; how many were stored."""
        return self._map.update_many(
            self._rows(keys, self.key_size, "keys"),
            self._rows(values, self.value_size, "values"),
            flags,
        )


class _BatchedItems(ItemsView):
    """``Table.items()``: a mapping's items view whose walk reads the map
    in native batches."""

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping._object_batches()


class _BatchedValues(ValuesView):
    """``Table.values()``, walked in native batches."""

    def __iter__(self) -> Iterator[Any]:
        return self._mapping._leaf_batches()


class _ObjectValues:
    """Values of any kind for a native table that holds ``u64`` values.

    While every value stored is an int from 0 to 2**64-1, the table holds
    it as it is, and numpy lookups return ``uint64``. The first value of
    any other kind (a ``str``, a tuple, a negative int, ``True``) turns
    the table to handles, once: each value goes into a list, the table
    holds its index, reads give the objects back, and numpy lookups
    return an ``object`` array. A replaced or deleted value's handle is
    reused.
    """

    def _init_values(self) -> None:
        self._objs: Optional[list] = None
        self._free: list = []
        self._array: Optional[np.ndarray] = None

    def _raw_items(self) -> list:
        """Every (key, stored u64), keys as the native insert takes them."""
        raise NotImplementedError

    def _raw_store(self, key: Any, stored: int) -> None:
        raise NotImplementedError

    def _use_objects(self, objs: list) -> None:
        """Called once, when the table turns to handles: ``objs`` is the
        list of values from then on."""

    def _put(self, value: Any) -> int:
        """The ``u64`` to store for ``value``: itself, or a new handle."""
        if self._objs is None:
            if type(value) is int and 0 <= value < 1 << 64:
                return value
            objs = []
            for key, v in self._raw_items():
                objs.append(v)
                self._raw_store(key, len(objs) - 1)
            self._objs = objs
            self._use_objects(objs)
        self._array = None
        if self._free:
            handle = self._free.pop()
            self._objs[handle] = value
            return handle
        self._objs.append(value)
        return len(self._objs) - 1

    def _drop(self, stored: Optional[int]) -> None:
        """Frees the handle of a value replaced or deleted."""
        if self._objs is not None and stored is not None:
            self._objs[stored] = None
            self._free.append(stored)
            self._array = None

    def _obj(self, stored: Any) -> Any:
        return stored if self._objs is None or stored is None else self._objs[stored]

    def _pairs(self, pairs: list) -> list:
        if self._objs is None:
            return pairs
        return [(k, self._objs[v]) for k, v in pairs]

    def _store(self, key: Any, value: Any, insert: Any, old: Any) -> None:
        """Stores ``value`` with ``insert(key, u64)``; in handle mode
        frees the handle ``old(key)`` held before, or the new one if the
        insert fails."""
        stored = self._put(value)
        if self._objs is None:
            insert(key, stored)
            return
        try:
            before = old(key)
            insert(key, stored)
        except BaseException:
            self._drop(stored)
            raise
        self._drop(before)

    def _values_out(self, raw: np.ndarray, found: np.ndarray) -> tuple:
        """A numpy lookup's ``(values, found)``: objects (None for a
        miss) in handle mode."""
        if self._objs is None:
            return raw, found
        if self._array is None:
            n = len(self._objs)
            self._array = np.empty(n + 1, dtype=object)  # the last: None
            for i, o in enumerate(self._objs):
                self._array[i] = o
        return self._array[np.where(found, raw, len(self._objs))], found


class Lpm(_ObjectValues):
    """An IPv4 or IPv6 longest-prefix-match table, shaped as pytricia's.
    Values may be any objects (held natively while they are unsigned
    64-bit ints, see ``_ObjectValues``).

    Addresses and prefixes may be strings (``"10.1.2.3"``,
    ``"10.0.0.0/8"``), ``ipaddress`` objects, ints, or packed bytes; a
    prefix may also be an ``(address, length)`` pair.

    >>> t = Lpm()
    >>> t["10.0.0.0/8"] = 1; t["10.1.0.0/16"] = 2
    >>> t["10.1.2.3"], t.get("11.0.0.0"), "10.9.9.9" in t
    (2, None, True)
    >>> t.covering("10.1.2.0/24")
    [('10.0.0.0/8', 1), ('10.1.0.0/16', 2)]
    >>> geo = Lpm(); geo["192.0.2.0/24"] = "ZZ"; geo.get("192.0.2.7")
    'ZZ'
    """

    def __init__(self, version: int = 4, max_entries: int = 1 << 22) -> None:
        self._t = _native.Lpm(version, max_entries)
        self.version = version
        self._init_values()

    def _raw_items(self) -> list:
        return self._t.items()

    def _raw_store(self, key: Any, stored: int) -> None:
        self._t.insert(key, stored)

    def __setitem__(self, prefix: Any, value: Any) -> None:
        self._store(prefix, value, self._t.insert, self._t.exact)

    insert = __setitem__

    def _use_objects(self, objs: list) -> None:
        self._t.use_objects(objs)

    def __getitem__(self, key: Any) -> Any:
        """The value of the longest prefix holding ``key`` (an address or
        a prefix); ``KeyError`` if none does."""
        value = self._t.value(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of the longest prefix holding ``key`` (an address or
        a prefix), or ``default``: one native call, values read through
        the handles natively."""
        return self._t.value(key, default)

    def get_key(self, key: Any) -> Optional[str]:
        """The longest stored prefix holding ``key``, as ``"addr/len"``."""
        m = self._t.longest_match(key)
        return None if m is None else m[0]

    def __contains__(self, key: Any) -> bool:
        return self._t.value(key, _MISSING) is not _MISSING

    def has_key(self, prefix: Any) -> bool:
        """Whether exactly ``prefix`` is stored."""
        return self._t.exact(prefix) is not None

    def exact(self, prefix: Any) -> Any:
        """The value stored under exactly ``prefix``, or None."""
        return self._obj(self._t.exact(prefix))

    def __delitem__(self, prefix: Any) -> None:
        self._drop(self._t.remove(prefix))

    def delete(self, prefix: Any) -> None:
        del self[prefix]

    def __len__(self) -> int:
        return len(self._t)

    def __iter__(self) -> Iterator[str]:
        return (p for p, _ in self._t.items())

    def keys(self) -> list:
        return [p for p, _ in self._t.items()]

    def items(self) -> list:
        return self._pairs(self._t.items())

    def covering(self, prefix: Any) -> list:
        """The stored prefixes holding ``prefix`` (itself included),
        shortest first, with their values."""
        return self._pairs(self._t.covering(prefix))

    def covered(self, prefix: Any) -> list:
        """The stored prefixes inside ``prefix`` (itself included), in
        order, with their values."""
        return self._pairs(self._t.covered(prefix))

    def lookup_many(self, addrs: Any) -> tuple:
        """Looks up many addresses without a Python loop, the GIL
        released: ``(values uint64, found bool)``, a miss's value 0 (for
        a table of other values, an ``object`` array, None for a miss).
        IPv4: an array of ``uint32`` (integers, as
        ``int(IPv4Address(...))``); IPv6: ``uint8`` rows of 16 bytes in
        network order. Other integer arrays are converted first; a list
        or array of strings (``"10.1.2.3"``), or of anything ``get``
        takes, is parsed natively, item by item, then looked up."""
        if isinstance(addrs, (list, tuple)) and not (addrs and isinstance(addrs[0], (int, np.integer))):
            return self._values_out(*self._t.lookup_many_any(addrs))
        a = np.asarray(addrs)
        if a.dtype.kind in "UO":  # str or objects (bytes arrays lose NULs)
            return self._values_out(*self._t.lookup_many_any(a))
        if self.version == 4:
            if a.dtype != np.uint32:
                if a.dtype.kind in "iu":
                    if a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF):
                        raise ValueError("IPv4 addresses are 0 to 2**32-1")
                    a = a.astype(np.uint32)
                else:
                    raise TypeError(f"IPv4 addresses: a uint32 array, not {a.dtype}")
            return self._values_out(*self._t.lookup_many_v4(np.ascontiguousarray(a.reshape(-1))))
        a = np.ascontiguousarray(addrs)
        if a.dtype != np.uint8 or a.ndim != 2 or a.shape[1] != 16:
            raise TypeError(f"IPv6 addresses: uint8 rows of 16 bytes, not {a.dtype} {a.shape}")
        return self._values_out(*self._t.lookup_many_v6(a))


class StrMap(_ObjectValues, MutableMapping):
    """A string-keyed map (the qp-trie map: keys stored once, in byte
    order). Values may be any objects (held natively while they are
    unsigned 64-bit ints, see ``_ObjectValues``).

    Keys are ``str`` (UTF-8) or ``bytes`` of 1 to ``max_key_size`` bytes;
    with ``text=True`` (the default) keys come back as ``str`` when they
    are valid UTF-8, else as ``bytes``.

    >>> syms = StrMap()
    >>> syms["vfs_read"] = 1; syms["vfs_write"] = 2; syms["tcp_sendmsg"] = 3
    >>> [k for k, _ in syms.prefix("vfs_")]
    ['vfs_read', 'vfs_write']
    >>> syms.longest_prefix_of("vfs_readv")
    ('vfs_read', 1)
    """

    def __init__(self, max_key_size: int = 255, max_entries: int = 1 << 22, text: bool = True) -> None:
        self._m = _native.StrMap(max_key_size, max_entries)
        self.text = text
        self._init_values()

    def _raw_items(self) -> list:
        return self._m.range(None, None, False, False)

    def _raw_store(self, key: Any, stored: int) -> None:
        self._m.insert(key, stored)

    def _out(self, key: bytes) -> Any:
        if self.text:
            try:
                return key.decode()
            except UnicodeDecodeError:
                return key
        return key

    def __getitem__(self, key: Any) -> Any:
        stored = self._m.get(key)
        if stored is None:
            raise KeyError(key)
        objs = self._objs
        return stored if objs is None else objs[stored]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._store(key, value, self._m.insert, self._m.get)

    def insert(self, key: Any, value: Any, flags: int = BPF_ANY) -> None:
        """Stores ``value`` under ``key`` with the kernel's update flags."""
        self._store(key, value, lambda k, v: self._m.insert(k, v, flags), self._m.get)

    def __delitem__(self, key: Any) -> None:
        self._drop(self._m.remove(key))

    def __len__(self) -> int:
        return len(self._m)

    def __iter__(self) -> Iterator[Any]:
        return (k for k, _ in self.range())

    def memory_usage(self) -> int:
        return self._m.memory_usage()

    def lookup_many(self, keys: Iterable[Any]) -> tuple:
        """Looks up every key of a sequence (``str`` or ``bytes``, a list
        or a numpy array of them) in one call, the lookups with the GIL
        released: ``(values uint64, found bool)``, a miss's value 0 (for
        a map of other values, an ``object`` array, None for a miss)."""
        return self._values_out(*self._m.lookup_many(keys))

    def prefix(self, prefix: Any) -> list:
        """The (key, value) pairs whose key starts with ``prefix``, in
        order."""
        return [(self._out(k), self._obj(v)) for k, v in self._m.prefix(prefix)]

    def range(self, lower: Any = None, upper: Any = None, *, lower_open: bool = False, upper_closed: bool = False) -> list:
        """The (key, value) pairs from ``lower`` (included unless
        ``lower_open``) to ``upper`` (excluded unless ``upper_closed``), in
        order; None is unbounded."""
        return [
            (self._out(k), self._obj(v)) for k, v in self._m.range(lower, upper, lower_open, upper_closed)
        ]

    def longest_prefix_of(self, key: Any) -> Optional[tuple]:
        """The longest stored key that is a prefix of ``key`` (or ``key``
        itself), with its value; None if none is."""
        m = self._m.longest_prefix_of(key)
        return None if m is None else (self._out(m[0]), self._obj(m[1]))


MapleTree = _native.MapleTree
MapleTree.__doc__ = """Non-overlapping ``u64`` ranges to Python objects (the
kernel's maple tree): ``store_range``, ``insert_range``, ``load``,
``erase``, ``find``, ``empty_area``/``empty_area_rev``, ``alloc_range``,
``items``. Readers never block a writer.

>>> vmas = MapleTree()
>>> vmas.store_range(0x1000, 0x1fff, "text")
>>> vmas.load(0x1800)
(4096, 8191, 'text')
>>> hex(vmas.empty_area(0, 0xffff, 0x1000))
'0x0'
"""

Wildcard = _native.Wildcard
Wildcard.__doc__ = """Multi-field rules with priorities (lower wins), one lookup
per packet (TupleMerge): a schema of (name, kind, bytes) fields, kind
``prefix``, ``range``, ``exact`` or ``wildcard``; rules and packets
written as text; ``classify_many`` over a numpy ``uint64`` array, one
column per field; ``classify_many_keys`` over headers' bytes, each
field in network order, ``key_size`` bytes a key.

>>> fw = Wildcard([("src", "prefix", 4), ("dport", "range", 2), ("proto", "wildcard", 1)])
>>> fw.insert("src 10.0.0.0/8, dport 22, proto 6", 1, 100)
>>> fw.insert("dport 0-1023", 5, 200)
>>> fw.classify("src 10.9.9.9, dport 22, proto 6"), fw.classify("src 1.2.3.4, dport 80, proto 17")
((1, 100), (5, 200))
>>> import numpy as np
>>> header = np.dtype([("src", ">u4"), ("dport", ">u2"), ("proto", "u1")])
>>> keys = np.array([(0x0A090909, 22, 6), (0x01020304, 80, 17), (1, 5000, 6)], dtype=header)
>>> prios, values, found = fw.classify_many_keys(keys.view(np.uint8))
>>> prios.tolist(), values.tolist(), found.tolist()
([1, 5, 0], [100, 200, 0], [True, True, False])
"""

__all__ += ["StrMap", "MapleTree", "Wildcard"]

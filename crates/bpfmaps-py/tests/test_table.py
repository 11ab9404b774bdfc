"""Table: BCC's table shape over the hash maps, against a dict."""

import ctypes
import errno
import sys
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpfmaps_rs as b
from bpfmaps_rs import _native


class Flow(ctypes.Structure):
    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class Counters(ctypes.Structure):
    _fields_ = [("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


def table(max_entries=64, key=ctypes.c_uint32, leaf=ctypes.c_uint64, kind=None):
    return b.Table(kind or b.MAP_TYPE_HASH, key, leaf, max_entries)


def test_get_set_delete_len_iter():
    t = table()
    t[1] = 10
    t[ctypes.c_uint32(2)] = ctypes.c_uint64(20)
    t[(3).to_bytes(4, "little")] = (30).to_bytes(8, "little")
    assert len(t) == 3
    assert t[1].value == 10 and t[2].value == 20 and t[3].value == 30
    assert isinstance(t[1], t.Leaf)
    assert sorted(k.value for k in t) == [1, 2, 3]
    assert sorted((k.value, v.value) for k, v in t.items()) == [(1, 10), (2, 20), (3, 30)]
    assert 2 in t and 4 not in t
    del t[2]
    with pytest.raises(KeyError):
        t[2]
    with pytest.raises(KeyError):
        del t[2]
    assert t.get(2) is None
    assert t.lookup_and_delete(3).value == 30
    assert len(t) == 1
    t.clear()
    assert len(t) == 0 and list(t) == []


def test_update_flags_and_full_map():
    t = table(max_entries=2)
    t.update(1, 5, b.BPF_NOEXIST)
    with pytest.raises(OSError) as e:
        t.update(1, 6, b.BPF_NOEXIST)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(KeyError):
        t.update(9, 6, flags=b.BPF_EXIST)
    t.update(1, 7, b.BPF_EXIST)
    assert t[1].value == 7
    t.update({2: 8})  # dict.update's form still works
    assert t[2].value == 8
    with pytest.raises(OSError) as e:
        t[3] = 1
    assert e.value.errno == errno.E2BIG
    with pytest.raises(OSError) as e:
        t.update(1, 1, 7)
    assert e.value.errno == errno.EINVAL
    assert len(t) == 2 and t[1].value == 7  # unchanged


def test_bad_sizes_and_types_are_value_and_type_errors():
    t = table()
    with pytest.raises(ValueError):
        t[b"abc"] = 1
    with pytest.raises(ValueError):
        t[1] = b"short"
    with pytest.raises(ValueError):
        t[2**40] = 1
    with pytest.raises(ValueError):
        t[1] = 2**64
    with pytest.raises(TypeError):
        t[1.5] = 1
    assert len(t) == 0
    t[-1] = -2  # ints as their two's complement bytes, as before
    assert t[0xFFFFFFFF].value == 2**64 - 2 and t[-1].value == 2**64 - 2
    del t[-1]
    with pytest.raises(TypeError):
        b.Table(b.MAP_TYPE_HASH, "four", 8, 10)
    with pytest.raises(OSError) as e:
        b.Table(12345, 4, 8, 10)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError):
        b.Table(b.MAP_TYPE_HASH, 4, 8, 0)
    assert len(t) == 0


def test_structures_as_keys_and_leaves():
    t = b.Table(b.MAP_TYPE_HASH, Flow, Counters, 100)
    k = Flow(0x0A000001, 0x0A000002, 443, 6, 0)
    t[k] = Counters(3, 4500)
    got = t[Flow(0x0A000001, 0x0A000002, 443, 6, 0)]
    assert (got.packets, got.bytes) == (3, 4500)
    ((key, leaf),) = t.items_lookup_batch()
    assert (key.port, key.proto, leaf.bytes) == (443, 6, 4500)


def test_batches_partial_progress_and_emptying():
    t = table(max_entries=10_000)
    n = t.items_update_batch(range(5000), range(0, 50_000, 10))
    assert n == 5000 and len(t) == 5000
    with pytest.raises(OSError) as e:
        t.items_update_batch([6000, 6001, 1, 6002], [1, 2, 3, 4], b.BPF_NOEXIST)
    assert e.value.errno == errno.EEXIST and e.value.processed == 2
    assert 6001 in t and 6002 not in t
    items = list(t.items_lookup_batch())
    assert len(items) == 5002
    assert dict(items) == {k.value: v.value for k, v in t.items()}
    with pytest.raises(KeyError) as e:
        t.items_delete_batch([6000, 42424, 6001])
    assert e.value.processed == 1
    assert t.items_delete_batch([6001]) == 1
    moved = t.items_lookup_and_delete_batch()
    assert len(moved) == 5000 and len(t) == 0
    assert all(v == 10 * k for k, v in moved)
    t.items_update_batch([1, 2], [3, 4])
    assert t.items_delete_batch() == 2 and len(t) == 0


@pytest.mark.parametrize("kind", ["ints", "bytes keys"])
def test_batch_items_are_an_iterator_whose_pairs_stay_as_handed_out(kind):
    # Int keys and bytes keys (the native iterator fills its pair again
    # when nothing else holds it).
    if kind == "ints":
        t, key = table(max_entries=20_000), lambda i: i
    else:
        t, key = b.Table(b.MAP_TYPE_QP_TRIE, 8, ctypes.c_uint64, 20_000), lambda i: b"k%d" % i
    model = {key(i): 7 * i for i in range(9000)}  # three native batches
    t.items_update_batch(model.keys(), model.values())
    it = t.items_lookup_batch()
    assert iter(it) is it
    walked = {}
    for k, v in it:  # unpacked: the iterator may fill its pair again
        walked[k] = v
    assert walked == model
    assert next(it, None) is None and next(it, None) is None
    held = list(t.items_lookup_batch())  # held: every pair its own
    assert len({id(p) for p in held}) == len(held) == 9000
    walk = [k if isinstance(k, bytes) else k.value for k in t]
    assert dict(held) == model and [k for k, _ in held] == walk
    it = t.items_lookup_batch()
    first = next(it)
    second = next(it)
    assert first != second and {first[0], second[0]} <= model.keys()
    assert first[1] == model[first[0]] and second[1] == model[second[0]]
    empty = b.Table(b.MAP_TYPE_QP_TRIE, 8, 8, 4) if kind != "ints" else table(max_entries=4)
    assert list(empty.items_lookup_batch()) == []


@pytest.mark.parametrize("kind", ["ints", "bytes keys"])
def test_batch_items_beside_a_writer_thread(kind):
    # The GIL is let go while a native batch is read, so a writer thread
    # runs between and beside the batches. Each pair must be one that was
    # written (the value names its key: nothing torn), of a key the map
    # holds; the walk ends.
    n, scale = 12_000, 1 << 20
    if kind == "ints":
        t, key, ident = table(max_entries=n), lambda i: i, lambda k: k
    else:
        t = b.Table(b.MAP_TYPE_QP_TRIE, 8, ctypes.c_uint64, n)
        key, ident = lambda i: b"k%d" % i, lambda k: int(k[1:])
    t.items_update_batch([key(i) for i in range(n)], [i * scale for i in range(n)])
    stop = threading.Event()

    def writer():
        version = 1
        while not stop.is_set():
            ks = range(version % 5, n, 5)
            t.items_update_batch([key(i) for i in ks], [i * scale + version for i in ks])
            version = version % (scale - 1) + 1

    w = threading.Thread(target=writer)
    w.start()
    try:
        for _ in range(4):
            seen = 0
            for k, v in t.items_lookup_batch():
                assert v // scale == ident(k) < n
                seen += 1
            assert seen > 0
    finally:
        stop.set()
        w.join()
    assert len(t) == n


def test_batch_items_shared_by_two_threads_hand_out_each_pair_once():
    # The GIL is let go while a batch is read; a second thread's call
    # meanwhile is refused (ValueError, as a generator running elsewhere
    # says), never let into the walk. Small batches: many such windows.
    n = 20_000
    t = table(max_entries=n)
    t.items_update_batch(range(n), [3 * i for i in range(n)])
    it = t._map.batch_items(16, False, False)
    got, refused = [[], []], [0, 0]

    def reader(me):
        while True:
            try:
                pair = next(it)
            except StopIteration:
                return
            except ValueError:
                refused[me] += 1
                continue
            got[me].append(pair)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    pairs = got[0] + got[1]
    assert sorted(pairs) == [(i, 3 * i) for i in range(n)]
    assert next(it, None) is None
    assert list(type(it)()) == []  # one made from Python walks nothing
    with pytest.raises(ValueError):
        t._map.batch_items(0, False, False)
    with pytest.raises(TypeError):
        b.Table(b.MAP_TYPE_HASH, 3, 8, 4)._map.batch_items(16, False, False)  # no 3-byte int


@pytest.mark.parametrize("bits", [8, 16, 32, 64])
@pytest.mark.parametrize("signed", [False, True])
def test_batch_items_give_every_int_size_its_extremes(bits, signed):
    ctype = getattr(ctypes, f"c_{'' if signed else 'u'}int{bits}")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    model = {lo: hi, hi: lo, 0: 1, 1: 0}
    t = b.Table(b.MAP_TYPE_HASH, ctype, ctype, 8)
    t.items_update_batch(model.keys(), model.values())
    assert dict(t.items_lookup_batch()) == model
    assert [k for k, _ in t.items_lookup_batch()] == [k.value for k in t]


def test_byte_swapped_int_types_read_back_what_was_written():
    # Ints given for a byte-swapped type (big-endian on this machine)
    # take that type's order, as ctypes makes them, on every path.
    other = "__ctype_be__" if sys.byteorder == "little" else "__ctype_le__"
    key, leaf = getattr(ctypes.c_uint16, other), getattr(ctypes.c_int64, other)
    t = b.Table(b.MAP_TYPE_HASH, key, leaf, 64)
    t[258] = -3
    t.items_update_batch([1, 2], [3, -4])
    model = {258: -3, 1: 3, 2: -4}
    assert t._map.lookup(bytes(key(258))) == bytes(leaf(-3))
    assert {k: t[k].value for k in model} == model
    assert dict(t.items_lookup_batch()) == model
    assert sorted(k.value for k in t) == sorted(model)
    keys, values = t.items_many()
    assert dict(zip(keys.tolist(), values.tolist())) == model
    values, found = t.lookup_many(np.array([258, 7], dtype=keys.dtype))
    assert found.tolist() == [True, False] and values[0] == -3
    with pytest.raises(ValueError):
        t[70_000] = 1


def test_numpy_batches_match_single_lookups():
    t = table(max_entries=100_000)
    keys = np.arange(0, 20_000, 2, dtype=np.uint32)
    assert t.update_many(keys, keys.astype(np.uint64) * 3) == len(keys)
    probe = np.arange(0, 1000, dtype=np.uint32)
    values, found = t.lookup_many(probe)
    assert values.dtype == np.uint64
    assert list(found) == [k % 2 == 0 for k in range(1000)]
    assert list(values) == [3 * k if k % 2 == 0 else 0 for k in range(1000)]
    with pytest.raises(ValueError):
        t.lookup_many(np.zeros(4, dtype=np.uint64))  # 8-byte keys
    with pytest.raises(ValueError):
        t.update_many(keys[:2], np.zeros(3, dtype=np.uint64))
    raw = t.lookup_many(keys.view(np.uint8).reshape(-1, 4))[0]
    assert (raw == keys.astype(np.uint64) * 3).all()


INT_TYPES = [
    ctypes.c_uint8, ctypes.c_int8, ctypes.c_uint16, ctypes.c_int16,
    ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64,
]


@pytest.mark.parametrize("key", INT_TYPES, ids=lambda t: t.__name__)
@pytest.mark.parametrize("leaf", INT_TYPES, ids=lambda t: t.__name__)
def test_every_int_kind_reads_back_through_the_unpacking_loop(key, leaf):
    # `for k, v in ...` fills one pair again in place (the converters'
    # path a pair takes once the first is made); each kind's extremes,
    # and the edges of CPython's digits (15 or 30 bits), where the
    # unsigned converters change constructor.
    def extremes(t):
        bits = 8 * ctypes.sizeof(t)
        if t(-1).value == -1:  # signed
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        else:
            lo, hi = 0, (1 << bits) - 1
        edges = [s * ((1 << e) + d) for e in (15, 30, 31, 60, 63) for d in (-1, 0) for s in (1, -1)]
        return [lo, lo + 1, 0, 1, hi - 1, hi] + [x for x in edges if lo <= x <= hi]

    keys = sorted(set(extremes(key)) | set(range(0, 100, 7)))
    values = (extremes(leaf) * len(keys))[: len(keys)]
    t = b.Table(b.MAP_TYPE_HASH, key, leaf, 256)
    model = dict(zip(keys, values))
    t.items_update_batch(model.keys(), model.values())
    got = {}
    for k, v in t.items_lookup_batch():
        assert type(k) is int and type(v) is int
        got[k] = v
    assert got == model


@pytest.mark.parametrize("in_place", [True, False], ids=["items_in_place", "set_item"])
@pytest.mark.parametrize("reuse", [True, False], ids=["filled_again", "new_tuples"])
def test_pairs_dropped_after_hashing_hash_as_their_items(reuse, in_place):
    # `map` and `filter` hash each pair and drop it before asking for the
    # next, which a pair filled again in place would then be. CPython
    # 3.14's tuples keep their hash once computed, so there every pair is
    # a new tuple, and the hash checks below are what would catch a pair
    # filled again; before 3.14 no tuple caches its hash, and they pass
    # either way. Both ways are walked on any CPython for the pairs'
    # values and reference counts (a pair or an item held twice, or
    # leaked), with the items written in place and through
    # `PyTuple_SetItem`.
    if reuse and sys.version_info >= (3, 14):
        pytest.skip("tuples cache their hash here: pairs are never filled again")
    t = b.Table(b.MAP_TYPE_HASH, ctypes.c_uint32, ctypes.c_uint64, 4096)
    model = {k: k * 7 + 1000 for k in range(3000)}
    t.items_update_batch(model.keys(), model.values())
    default = _native._reuse_pairs(reuse)
    found = _native._items_in_place(in_place)
    try:
        held = list(t.items_lookup_batch())
        # Each pair held by the list alone (and here by `p` and the call),
        # each value by its pair alone (and the call).
        assert dict(held) == model and all(sys.getrefcount(p) == 3 for p in held)
        assert all(sys.getrefcount(p[1]) == 2 for p in held)
        assert list(map(hash, t.items_lookup_batch())) == [hash(p) for p in held]
        wanted = set(held[::3])
        assert list(filter(wanted.__contains__, t.items_lookup_batch())) == held[::3]
        got = {}
        for k, v in t.items_lookup_batch():
            got[k] = v
        assert got == model
        # A loop that drops each pair's items keeps no int: the items a
        # pair held before it was filled again are let go.
        tracemalloc.start()
        try:
            for _ in range(2):
                for k, v in t.items_lookup_batch():
                    pass
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(5):
                for k, v in t.items_lookup_batch():
                    pass
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 64 * 1024, f"{grown} bytes kept by 5 walks of 3,000 pairs"
    finally:
        _native._reuse_pairs(default)
        _native._items_in_place(found)
    assert default == (sys.version_info < (3, 14))
    assert found, "a 2-tuple's items not found in its memory at import"


def test_signed_batches_and_numpy_dumps_match_the_walk():
    t = b.Table(b.MAP_TYPE_HASH, ctypes.c_int16, ctypes.c_int64, 10_000)
    model = {k: -(k * 1_000_003) for k in range(-3000, 3000, 3)}
    t.items_update_batch(model.keys(), model.values())
    items = list(t.items_lookup_batch())  # more than one native batch
    assert len(items) == len(model) and dict(items) == model
    assert [k for k, _ in items] == [k.value for k in t]  # get_next_key order
    keys, values = t.items_many()
    assert (keys.dtype, values.dtype) == (np.int16, np.int64)
    assert list(zip(keys.tolist(), values.tolist())) == items
    raw = b.Table(b.MAP_TYPE_HASH, 3, 5, 16)
    raw[b"abc"] = b"vwxyz"
    keys, values = raw.items_many()
    assert keys.tolist() == [list(b"abc")] and values.tolist() == [list(b"vwxyz")]
    assert b.Table(b.MAP_TYPE_HASH, 4, 8, 4).items_many()[0].shape == (0, 4)
    with pytest.raises(TypeError):
        b.Table(b.MAP_TYPE_QP_TRIE, 16, 8, 16).items_many()


def test_an_lru_map_evicts():
    t = table(max_entries=8, kind=b.MAP_TYPE_LRU_HASH)
    for i in range(100):
        t[i] = i
    assert len(t) <= 8 and 99 in t


keys = st.integers(0, 40)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2])),
        st.tuples(st.just("del"), keys),
        st.tuples(st.just("get"), keys),
        st.tuples(st.just("batch_del"), st.lists(keys, max_size=4)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_matches_a_dict(ops):
    t = table(max_entries=16)
    model = {}
    for op in ops:
        if op[0] == "set":
            _, k, v, flags = op
            want = None
            if flags == 1 and k in model:
                want = OSError
            elif flags == 2 and k not in model:
                want = KeyError
            elif k not in model and len(model) >= 16:
                want = OSError
            if want is None:
                t.update(k, v, flags)
                model[k] = v
            else:
                with pytest.raises(want):
                    t.update(k, v, flags)
        elif op[0] == "del":
            if op[1] in model:
                del t[op[1]]
                del model[op[1]]
            else:
                with pytest.raises(KeyError):
                    del t[op[1]]
        elif op[0] == "get":
            got = t.get(op[1])
            assert (got.value if got is not None else None) == model.get(op[1])
        else:
            ks = op[1]
            stop = next((i for i, k in enumerate(ks) if k not in model or k in ks[:i]), None)
            if stop is None:
                assert t.items_delete_batch(ks) == len(ks)
            else:
                with pytest.raises(KeyError) as e:
                    t.items_delete_batch(ks)
                assert e.value.processed == stop
            for k in ks[: len(ks) if stop is None else stop]:
                del model[k]
        assert len(t) == len(model)
    assert dict(t.items_lookup_batch()) == model

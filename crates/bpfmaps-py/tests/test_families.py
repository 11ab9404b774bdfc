"""Every family of the registry through Table, and a leak check."""

import ctypes
import errno
import os

import pytest

import bpfmaps_rs as b


def test_every_registry_family_is_exposed():
    assert {"hash", "lru_hash", "lpm_trie", "bloom_filter", "stack_trace", "kernel_lpm_trie", "qp_trie", "tst", "maple_tree", "wildcard"} <= set(b.MAP_TYPES)
    assert b.MAP_TYPE_HASH == 1 and b.MAP_TYPE_LPM_TRIE == 11


class LpmKey(ctypes.Structure):
    _fields_ = [("prefixlen", ctypes.c_uint32), ("addr", ctypes.c_uint8 * 4)]


@pytest.mark.parametrize("kind", ["lpm_trie", "kernel_lpm_trie"])
def test_lpm_tries_through_the_byte_contract(kind):
    t = b.Table(b.MAP_TYPES[kind], LpmKey, ctypes.c_uint32, 100, flags=b.BPF_F_NO_PREALLOC)
    t[LpmKey(8, (10, 0, 0, 0))] = 1
    t[LpmKey(16, (10, 1, 0, 0))] = 2
    assert t[LpmKey(32, (10, 1, 2, 3))].value == 2
    assert t[LpmKey(32, (10, 9, 2, 3))].value == 1
    assert [k.prefixlen for k in t] in ([8, 16], [16, 8])
    with pytest.raises(OSError) as e:
        t[LpmKey(33, (10, 0, 0, 0))] = 1
    assert e.value.errno == errno.EINVAL


class Counts(ctypes.Structure):
    _fields_ = [("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint32)]


def as_bytes(obj):
    return obj if isinstance(obj, bytes) else bytes(obj)


@pytest.mark.parametrize("kind", ["hash", "lru_hash", "qp_trie", "lpm_trie", "hash of structures"])
def test_items_and_values_read_in_batches_as_lookups_give_them(kind):
    n = 5000  # two native batches
    if kind == "qp_trie":
        t, key = b.Table(b.MAP_TYPE_QP_TRIE, 8, ctypes.c_uint64, n), lambda i: b"k%d" % i
    elif kind == "lpm_trie":
        t = b.Table(b.MAP_TYPE_LPM_TRIE, LpmKey, ctypes.c_uint64, n, flags=b.BPF_F_NO_PREALLOC)
        key = lambda i: LpmKey(24, (10, i >> 8, i & 255, 0))  # noqa: E731
    elif kind == "hash of structures":
        t = b.Table(b.MAP_TYPE_HASH, LpmKey, Counts, n)
        key = lambda i: LpmKey(i, (1, 2, 3, 4))  # noqa: E731
    else:
        t, key = b.Table(b.MAP_TYPES[kind], ctypes.c_uint32, ctypes.c_uint64, n), lambda i: i
    for i in range(n):
        t[key(i)] = Counts(i, 7 * i) if kind == "hash of structures" else 3 * i
    # What a walk with a lookup of each key gives (the view's old way),
    # compared as bytes, in the same order, each as its own type.
    want = [(as_bytes(k), bytes(t[k])) for k in t]
    items = list(t.items())
    assert [(as_bytes(k), bytes(v)) for k, v in items] == want
    assert all(type(v) is t.Leaf for _, v in items)
    assert all(type(k) is (bytes if kind == "qp_trie" else t.Key) for k, _ in items)
    assert [bytes(v) for v in t.values()] == [v for _, v in want]
    assert len(t.items()) == len(t.values()) == len(t) == len(want)


def test_variable_length_keys_in_order():
    t = b.Table(b.MAP_TYPE_QP_TRIE, 16, ctypes.c_uint32, 100)
    for k, v in [(b"abc", 1), (b"ab\0", 2), (b"ab", 3), ("vfs_read", 4)]:
        t[k] = v
    assert list(t) == [b"ab", b"ab\0", b"abc", b"vfs_read"]
    assert t[b"ab\0"].value == 2
    assert list(t.items_lookup_batch()) == [(b"ab", 3), (b"ab\0", 2), (b"abc", 1), (b"vfs_read", 4)]
    assert t.items_update_batch([b"x", b"yy"], [7, 8]) == 2
    with pytest.raises(ValueError):
        t[b""] = 1
    with pytest.raises(ValueError):
        t[b"x" * 17] = 1


class Range(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("last", ctypes.c_uint64)]


def test_ranges():
    t = b.Table(b.MAP_TYPE_MAPLE_TREE, Range, ctypes.c_uint64, 100, flags=b.BPF_F_NO_PREALLOC)
    t[Range(0x1000, 0x1FFF)] = 5
    assert t[Range(0x1800, 0x1800)].value == 5
    with pytest.raises(KeyError):
        t[Range(0x2000, 0x2000)]
    with pytest.raises(OSError):
        t[Range(9, 3)] = 1


def test_bloom_filter_through_table_push_and_peek():
    t = b.Table(b.MAP_TYPE_BLOOM_FILTER, 0, ctypes.c_uint32, 1000, extra=3)
    t.push(77)
    assert t.peek(77)
    assert sum(not t.peek(v) for v in range(1000, 1100)) > 90
    with pytest.raises(ValueError):
        t.push(b"toolong!")
    h = b.Table(b.MAP_TYPE_HASH, 4, 4, 10)
    with pytest.raises(TypeError):
        h.push(1)


def test_bloom_filter_without_keys():
    m = b._native.RawMap(b.MAP_TYPE_BLOOM_FILTER, 0, 4, 1000, 0, 3)
    m.update(b"", (77).to_bytes(4, "little"), 0)
    assert m.lookup(b"", (77).to_bytes(4, "little"))
    misses = 0
    for v in range(1000, 1100):
        try:
            m.lookup(b"", v.to_bytes(4, "little"))
        except KeyError:
            misses += 1
    assert misses > 90


def rss_kib():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_create_fill_close_loop_holds_rss_flat():
    def cycle():
        t = b.Table(b.MAP_TYPE_HASH, ctypes.c_uint32, ctypes.c_uint64, 20_000)
        t.items_update_batch(range(20_000), range(20_000))
        for k, v in t.items_lookup_batch():  # int keys, the pair filled again
            pass
        # 5,000: two native batches, and pairs enough that a reference
        # leaked a pair would pass the bound below.
        s = b.Table(b.MAP_TYPE_QP_TRIE, 8, ctypes.c_uint64, 5000)
        s.items_update_batch([b"k%d" % i for i in range(5000)], range(5000))
        for k, v in s.items_lookup_batch():  # bytes keys, likewise
            pass
        held = list(s.items_lookup_batch())  # a pair each
        next(s.items_lookup_batch())  # left part way
        lpm = b.Lpm()
        for i in range(2000):
            lpm[(i << 12, 20)] = i
        lpm["0.0.0.0/0"] = "default"  # handles, read natively
        assert lpm.get("255.1.2.3") == "default" and lpm["0.0.16.1"] == 1
        del t, s, held, lpm

    for _ in range(20):  # warm-up: allocator and epoch garbage settle
        cycle()
    before = rss_kib()
    for _ in range(100):
        cycle()
    grown = rss_kib() - before
    # 100 cycles of ~1 MiB maps each: a leak of one cycle's maps would
    # add ~100 MiB.
    assert grown < 16 * 1024, f"RSS grew {grown} KiB over 100 create/fill/close cycles"

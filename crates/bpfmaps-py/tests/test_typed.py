"""StrMap, MapleTree and Wildcard: the typed helpers, against models."""

import errno
import ipaddress

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpfmaps_rs as b


def test_strmap_ordered_prefix_range_and_longest_prefix():
    m = b.StrMap(max_key_size=32)
    for i, k in enumerate(["vfs_read", "vfs_write", "vfs", "tcp_sendmsg", "ab\0"]):
        m[k] = i
    m[b"\xff\xfe"] = 9
    assert list(m) == ["ab\0", "tcp_sendmsg", "vfs", "vfs_read", "vfs_write", b"\xff\xfe"]
    assert m.prefix("vfs_") == [("vfs_read", 0), ("vfs_write", 1)]
    assert m.range("tcp", "vfs_read") == [("tcp_sendmsg", 3), ("vfs", 2)]
    assert m.range("vfs", "vfs_read", lower_open=True, upper_closed=True) == [("vfs_read", 0)]
    assert m.longest_prefix_of("vfs_readv") == ("vfs_read", 0)
    assert m.longest_prefix_of("xyz") is None
    with pytest.raises(OSError) as e:
        m.insert("vfs", 5, b.BPF_NOEXIST)
    assert e.value.errno == errno.EEXIST
    del m["vfs"]
    with pytest.raises(KeyError):
        m["vfs"]
    with pytest.raises(ValueError):
        m["x" * 33] = 1
    with pytest.raises(ValueError):
        m[""] = 1
    with pytest.raises(TypeError):
        m[5] = 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.integers(0, 2**64 - 1)), max_size=50),
       st.binary(max_size=3), st.binary(min_size=1, max_size=6), st.binary(min_size=1, max_size=6))
def test_strmap_matches_a_sorted_dict(items, prefix, lo, hi):
    m = b.StrMap(max_key_size=6, text=False)
    model = {}
    for k, v in items:
        m[k] = v
        model[k] = v
    keys = sorted(model)
    assert list(m) == keys
    assert [k for k, _ in m.prefix(prefix)] == [k for k in keys if k.startswith(prefix)]
    assert m.range(lo, hi) == [(k, model[k]) for k in keys if lo <= k < hi]
    probe = lo + hi
    best = max((k for k in keys if probe.startswith(k)), key=len, default=None)
    assert m.longest_prefix_of(probe) == (None if best is None else (best, model[best]))


def test_maple_tree_ranges_gaps_and_allocation():
    t = b.MapleTree()
    t.store_range(0x1000, 0x1FFF, "text")
    t.store_range(0x3000, 0x3FFF, {"heap": True})
    assert t.load(0x1800) == (0x1000, 0x1FFF, "text")
    assert t.load(0x2000) is None
    with pytest.raises(OSError) as e:
        t.insert_range(0x1800, 0x2800, "x")
    assert e.value.errno == errno.EEXIST
    assert t.empty_area(0, 0xFFFF, 0x1000) == 0
    assert t.empty_area(0x1000, 0xFFFF, 0x1000) == 0x2000
    assert t.empty_area_rev(0, 0xFFFF, 0x1000) == 0xF000
    start = t.alloc_range(0x800, "anon", 0x1000, 0xFFFF)
    assert start == 0x2000 and t.load(0x2400)[2] == "anon"
    t.store_range(0x1800, 0x18FF, "split")  # splits "text" at both edges
    assert [(f, l) for f, l, _ in t.items(0, 0x1FFF)] == [(0x1000, 0x17FF), (0x1800, 0x18FF), (0x1900, 0x1FFF)]
    assert t.find(0x1900, 0xFFFF)[0] == 0x1900
    assert t.erase(0x1850) == (0x1800, 0x18FF, "split")
    with pytest.raises(KeyError):
        t.erase(0x1850)
    with pytest.raises(OSError):
        t.store_range(9, 3, "bad")
    assert len(t) == 4
    t.clear()
    assert len(t) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20), st.integers()), max_size=30))
def test_maple_tree_matches_a_model(stores):
    t = b.MapleTree()
    model = [None] * 230
    for first, width, v in stores:
        t.store_range(first, first + width, v)
        for i in range(first, first + width + 1):
            model[i] = v
    for i in range(230):
        got = t.load(i)
        assert (None if got is None else got[2]) == model[i]


def test_wildcard_rules_and_batches():
    fw = b.Wildcard([("src", "prefix", 4), ("dport", "range", 2), ("proto", "wildcard", 1)], 100)
    fw.insert("src 10.0.0.0/8, dport 22, proto 6", 1, 100)
    fw.insert("dport 0-1023", 5, 200)
    assert len(fw) == 2
    assert fw.classify("src 10.9.9.9, dport 22, proto 6") == (1, 100)
    assert fw.classify("src 11.0.0.1, dport 22, proto 6") == (5, 200)
    assert fw.classify("src 11.0.0.1, dport 8080, proto 6") is None
    packets = np.array([[0x0A090909, 22, 6], [0x0B000001, 80, 17], [1, 5000, 6]], dtype=np.uint64)
    prios, values, found = fw.classify_many(packets)
    assert list(found) == [True, True, False] and list(values[:2]) == [100, 200] and list(prios[:2]) == [1, 5]
    # 1,200 rows: chunks of 256 and a part, each row answered in its place.
    many = np.tile(packets, (400, 1))
    prios2, values2, found2 = fw.classify_many(many)
    assert list(found2) == list(found) * 400 and list(values2) == list(values) * 400
    assert list(prios2) == list(prios) * 400
    with pytest.raises(ValueError):
        fw.classify_many(np.array([[1, 70000, 6]], dtype=np.uint64))
    with pytest.raises(OSError) as e:
        fw.insert("dport 0-1023", 5, 1, b.BPF_NOEXIST)
    assert e.value.errno == errno.EEXIST
    assert fw.remove("dport 0-1023", 5) == 200
    with pytest.raises(KeyError):
        fw.remove("dport 0-1023", 5)
    for bad in ["dport 9-1", "src 10.0.0.0/33", "colour red", "dport 70000"]:
        with pytest.raises(ValueError):
            fw.insert(bad, 1, 1)
    with pytest.raises(ValueError):
        b.Wildcard([("src", "fuzzy", 4)])
    with pytest.raises(ValueError):
        fw.classify_many(np.zeros((2, 2), dtype=np.uint64))
    assert len(fw) == 1


def test_wildcard_load_adds_a_rule_set_all_or_nothing():
    fields = [("src", "prefix", 4), ("dport", "range", 2), ("proto", "wildcard", 1)]
    rules = [("src 10.0.0.0/8, dport 22, proto 6", 1, 100), ("dport 0-1023", 5, 200),
             ("src 10.1.0.0/16", 3, 300)]
    loaded, inserted = b.Wildcard(fields, 10), b.Wildcard(fields, 10)
    loaded.load(rules)
    for text, prio, value in rules:
        inserted.insert(text, prio, value)
    assert len(loaded) == 3
    for p in ["src 10.1.2.3, dport 22, proto 6", "src 10.1.2.3, dport 80, proto 17",
              "src 11.0.0.1, dport 80, proto 6", "src 11.0.0.1, dport 8080, proto 6"]:
        assert loaded.classify(p) == inserted.classify(p), p
    # A bad rule, a rule held (BPF_NOEXIST) or too many: the map unchanged.
    with pytest.raises(ValueError):
        loaded.load([("dport 2000-3000", 2, 1), ("dport 9-1", 2, 1)])
    with pytest.raises(OSError) as e:
        loaded.load([("dport 2000-3000", 2, 1), rules[1]], b.BPF_NOEXIST)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(OSError) as e:
        loaded.load([(f"dport {p}", 9, p) for p in range(2000, 2008)])
    assert e.value.errno == errno.E2BIG
    assert len(loaded) == 3 and loaded.classify("src 11.0.0.1, dport 2500, proto 6") is None
    loaded.load([("dport 2000-3000", 2, 7)], b.BPF_NOEXIST)
    assert loaded.classify("src 11.0.0.1, dport 2500, proto 6") == (2, 7)


def test_wildcard_classify_many_keys_answers_as_classify_many():
    fw = b.Wildcard([("src", "prefix", 4), ("dport", "range", 2), ("proto", "wildcard", 1)])
    fw.insert("src 10.0.0.0/8, dport 22, proto 6", 1, 100)
    fw.insert("dport 0-1023", 5, 200)
    assert fw.key_size == 7
    packets = np.array([[0x0A090909, 22, 6], [0x0B000001, 80, 17], [1, 5000, 6]], dtype=np.uint64)
    # The fields back to back in network order, as a header holds them.
    header = np.dtype([("src", ">u4"), ("dport", ">u2"), ("proto", "u1")])
    keys = np.array([tuple(int(v) for v in p) for p in packets], dtype=header)
    want = [list(a) for a in fw.classify_many(packets)]
    for form in (keys.tobytes(), keys.view(np.uint8), keys.view(np.uint8).reshape(3, 7)):
        assert [list(a) for a in fw.classify_many_keys(form)] == want
    # 1,200 keys: chunks of 256 and a part, each answered in its place.
    many = [list(a) for a in fw.classify_many_keys(np.tile(keys, 400).tobytes())]
    assert many == [col * 400 for col in want]
    assert [len(a) for a in fw.classify_many_keys(b"")] == [0, 0, 0]
    with pytest.raises(ValueError):
        fw.classify_many_keys(keys.tobytes()[:-1])  # a partial key
    with pytest.raises(ValueError):
        fw.classify_many_keys(keys.view(np.uint8).reshape(3, 7)[:, :6])  # not contiguous
    with pytest.raises(TypeError):
        fw.classify_many_keys(keys)  # a structured array, not its bytes
    with pytest.raises(TypeError):
        fw.classify_many_keys([1, 2, 3])
    assert len(fw) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 8), st.integers(0, 65535), st.integers(0, 65535), st.integers(0, 50)), min_size=1, max_size=25),
       st.lists(st.tuples(st.integers(0, 255), st.integers(0, 65535)), min_size=1, max_size=25))
def test_wildcard_matches_a_brute_force_classifier(rules, packets):
    fw = b.Wildcard([("net", "prefix", 1), ("port", "range", 2)], 100)
    held = {}
    for net, length, a, c, prio in rules:
        lo, hi = min(a, c), max(a, c)
        base = net & ((0xFF << (8 - length)) & 0xFF)
        text = f"net {base}/{length}, port {lo}-{hi}"
        fw.insert(text, prio, prio * 1000 + len(held))
        held[(base, length, lo, hi, prio)] = prio * 1000 + len(held)
    for net, port in packets:
        matching = [(p, (base, length, lo, hi)) for (base, length, lo, hi, p) in held
                    if (net >> (8 - length) if length else 0) == (base >> (8 - length) if length else 0) and lo <= port <= hi]
        got = fw.classify(f"net {net}, port {port}")
        if not matching:
            assert got is None
        else:
            assert got is not None and got[0] == min(p for p, _ in matching)


def test_the_native_classes_docstring_examples():
    """Doctest skips classes defined in the extension module: run their
    examples here."""
    import doctest

    for cls in (b.MapleTree, b.Wildcard):
        test = doctest.DocTestParser().get_doctest(cls.__doc__, {cls.__name__: cls}, cls.__name__, None, 0)
        assert test.examples, cls
        runner = doctest.DocTestRunner()
        runner.run(test)
        assert runner.failures == 0, cls


def test_strmap_holds_any_values():
    m = b.StrMap()
    m["vfs_read"] = 1
    m["vfs_write"] = {"calls": 3}
    assert m["vfs_read"] == 1 and m["vfs_write"] == {"calls": 3}
    assert m.prefix("vfs_") == [("vfs_read", 1), ("vfs_write", {"calls": 3})]
    with pytest.raises(OSError):
        m.insert("vfs_read", "again", b.BPF_NOEXIST)
    m.insert("vfs_read", "now a str", b.BPF_EXIST)
    assert m.longest_prefix_of("vfs_readv") == ("vfs_read", "now a str")
    del m["vfs_write"]
    assert list(m) == ["vfs_read"] and len(m._objs) - len(m._free) == 1


def test_strmap_lookup_many():
    m = b.StrMap(max_key_size=8)
    m["vfs_read"] = 1
    m[b"ab\0"] = 2
    values, found = m.lookup_many(["vfs_read", b"ab\0", "ab", "zz"])
    assert list(values) == [1, 2, 0, 0] and list(found) == [True, True, False, False]
    values, found = m.lookup_many(np.array(["vfs_read", "x"]))
    assert list(values) == [1, 0] and list(found) == [True, False]
    with pytest.raises(ValueError):
        m.lookup_many(["vfs_read", "much_too_long"])
    m["tcp"] = "an object"
    values, found = m.lookup_many(["tcp", "vfs_read", "no"])
    assert list(values) == ["an object", 1, None] and list(found) == [True, True, False]

"""Lpm: pytricia's shape, checked against a brute-force prefix search."""

import ipaddress

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpfmaps_rs as b


def test_pytricia_shape():
    t = b.Lpm()
    t["10.0.0.0/8"] = 1
    t[ipaddress.ip_network("10.1.0.0/16")] = 2
    t[("192.168.0.0", 24)] = 3
    assert len(t) == 3
    assert t["10.1.2.3"] == 2 and t["10.2.0.0"] == 1
    assert t[ipaddress.ip_address("192.168.0.77")] == 3
    assert t[0x0A010203] == 2 and t[bytes([10, 1, 2, 3])] == 2
    assert t["10.1.0.0/24"] == 2  # a prefix: its longest covering one
    assert t[("10.1.0.0", 24)] == 2 and t[ipaddress.ip_network("10.1.0.0/24")] == 2
    assert t.get("10.0.0.0/7") is None and "10.0.0.0/7" not in t and "10.0.0.0/9" in t
    assert t.get("11.0.0.1") is None and t.get("11.0.0.1", 7) == 7
    with pytest.raises(KeyError):
        t["11.0.0.1"]
    assert t.get_key("10.1.2.3") == "10.1.0.0/16" and t.get_key("11.0.0.0") is None
    assert t.get_key("10.1.2.0/24") == "10.1.0.0/16" and t.get_key(("10.0.0.0", 9)) == "10.0.0.0/8"
    assert t.get_key("10.0.0.0/7") is None
    assert "10.200.0.1" in t and "11.0.0.0" not in t
    assert t.has_key("10.0.0.0/8") and not t.has_key("10.0.0.0/9")
    assert t.covering("10.1.2.0/24") == [("10.0.0.0/8", 1), ("10.1.0.0/16", 2)]
    assert t.covered("10.0.0.0/8") == [("10.0.0.0/8", 1), ("10.1.0.0/16", 2)]
    assert list(t) == ["10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/24"]
    del t["10.1.0.0/16"]
    assert t["10.1.2.3"] == 1
    with pytest.raises(KeyError):
        del t["10.1.0.0/16"]
    t["10.1.2.99/16"] = 5  # host bits ignored
    assert t.exact("10.1.0.0/16") == 5


def test_ipv6():
    t = b.Lpm(6)
    t["2001:db8::/32"] = 1
    t["2001:db8:1::/48"] = 2
    assert t["2001:db8:1::5"] == 2 and t["2001:db8:2::"] == 1
    assert t.get("2001:db9::") is None
    addrs = np.array([list(ipaddress.ip_address(a).packed) for a in ["2001:db8:1::5", "::1"]], dtype=np.uint8)
    values, found = t.lookup_many(addrs)
    assert list(values) == [2, 0] and list(found) == [True, False]


def test_bad_input_is_a_clear_error_and_the_table_unchanged():
    t = b.Lpm()
    t["10.0.0.0/8"] = 1
    for bad in ["10.0.0.0/33", "10.0.0/8", "hello", "10.0.0.0/x", "::1/8"]:
        with pytest.raises(ValueError):
            t[bad] = 2
    for bad in ["1.2.3", "300.0.0.1", "2001:db8::1"]:
        with pytest.raises(ValueError):
            t.get(bad)
    with pytest.raises(TypeError):
        t.get(1.5)
    with pytest.raises(ValueError):
        t.get(2**32)
    with pytest.raises(ValueError):
        b.Lpm(5)
    with pytest.raises(TypeError):
        t.lookup_many(np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        t.lookup_many(np.array([-1], dtype=np.int64))
    assert t.items() == [("10.0.0.0/8", 1)]


def test_a_full_table_is_e2big():
    t = b.Lpm(max_entries=2)
    t["10.0.0.0/8"] = 1
    t["11.0.0.0/8"] = 1
    with pytest.raises(OSError):
        t["12.0.0.0/8"] = 1
    t["10.0.0.0/8"] = 9  # a stored prefix still updates
    assert t["10.0.0.1"] == 9


prefixes = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32), st.integers(0, 2**64 - 1)),
    max_size=40,
)


def brute(stored, addr):
    """The value of the longest stored prefix holding addr, or None."""
    return brute_found(stored, addr)[1]


@settings(max_examples=150, deadline=None)
@given(prefixes, st.lists(st.integers(0, 2**32 - 1), max_size=30))
def test_matches_a_brute_force_search(entries, probes):
    t = b.Lpm()
    stored = {}
    for addr, length, value in entries:
        mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        t[(addr, length)] = value
        stored[(addr & mask, length)] = value
    assert len(t) == len(stored)
    # Probes near the stored prefixes as well as anywhere.
    probes = probes + [net | 1 for net, _ in stored] + [net for net, _ in stored]
    for p in probes:
        assert t.get(p) == brute(stored, p)
    values, found = t.lookup_many(np.array(probes, dtype=np.uint32))
    for p, v, f in zip(probes, values, found):
        want = brute(stored, p)
        assert bool(f) == (want is not None) and int(v) == (want or 0)


values = st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=3), st.tuples(st.integers(-5, 5)), st.none(), st.booleans())


def brute_found(stored, addr):
    """(whether a stored prefix holds addr, the longest one's value)."""
    best = None
    for (net, length), value in stored.items():
        mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        if addr & mask == net and (best is None or length > best[0]):
            best = (length, value)
    return (False, None) if best is None else (True, best[1])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32), values, st.booleans()), max_size=40),
       st.lists(st.integers(0, 2**32 - 1), max_size=20))
def test_any_values_as_pytricia_holds_them(ops, probes):
    """Ints natively until another value comes; then objects, each one
    given back as stored (None, True and tuples included, never 1 for
    True), through every read, with handles of replaced and deleted
    values reused."""
    t = b.Lpm()
    stored = {}
    for addr, length, value, delete in ops:
        mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        key = (addr & mask, length)
        if delete and key in stored:
            del t[key]
            del stored[key]
        else:
            t[key] = value
            stored[key] = value
    assert len(t) == len(stored)
    same = lambda a, b: type(a) is type(b) and a == b  # noqa: E731
    probes = probes + [net | 1 for net, _ in stored]
    miss = object()
    for p in probes:
        found, want = brute_found(stored, p)
        got = t.get(p, miss)
        assert (got is miss) if not found else same(got, want)
        # The same answer for the address as text, and for its
        # full-length prefix in each form a reader takes.
        text = str(ipaddress.IPv4Address(p))
        for key in (text, text + "/32", (p, 32), ipaddress.ip_network(text)):
            assert same(t.get(key, miss), got)
        assert (p in t) == found and (text in t) == found
        if found:
            assert same(t[text], want)
        else:
            with pytest.raises(KeyError):
                t[(text, 32)]
    listed = {(int(ipaddress.ip_network(k).network_address), ipaddress.ip_network(k).prefixlen): v for k, v in t.items()}
    assert listed.keys() == stored.keys() and all(same(listed[k], stored[k]) for k in stored)
    vals, found = t.lookup_many(np.array(probes, dtype=np.uint32))
    for p, v, f in zip(probes, vals, found):
        hit, want = brute_found(stored, p)
        assert bool(f) == hit
        if hit:
            assert same(v, want) if vals.dtype == object else int(v) == want
    if t._objs is not None:
        assert len(t._objs) - len(t._free) == len(stored)


def test_geoip_with_strings_and_numpy():
    geo = b.Lpm()
    geo["10.0.0.0/8"] = 7
    assert geo.lookup_many(np.array([0x0A000001], dtype=np.uint32))[0].dtype == np.uint64
    geo["192.0.2.0/24"] = "ZZ"  # turns the table to objects, 7 kept
    geo["198.51.100.0/24"] = ("XX", 64496)
    assert geo["10.1.1.1"] == 7 and geo.get("192.0.2.9") == "ZZ"
    assert geo.covering("198.51.100.0/25") == [("198.51.100.0/24", ("XX", 64496))]
    vals, found = geo.lookup_many(np.array([0x0A000001, 0xC0000201, 0x01010101], dtype=np.uint32))
    assert vals.dtype == object and list(vals) == [7, "ZZ", None] and list(found) == [True, True, False]
    geo["192.0.2.0/24"] = "YY"  # the old handle freed and reused
    assert geo.get("192.0.2.9") == "YY" and geo.exact("192.0.2.0/24") == "YY"
    del geo["198.51.100.0/24"]
    assert geo.get("198.51.100.1") is None and len(geo._objs) - len(geo._free) == 2
    with pytest.raises(ValueError):
        geo["300.0.0.0/8"] = "bad"
    assert len(geo._objs) - len(geo._free) == 2  # no handle leaked by the failure


def test_lookup_many_of_strings_and_objects():
    t = b.Lpm()
    t["10.0.0.0/8"] = 1
    t["10.1.0.0/16"] = 2
    addrs = ["10.1.2.3", "10.9.9.9", "11.0.0.1", ipaddress.IPv4Address("10.1.0.1"), 0x0A000001]
    values, found = t.lookup_many(addrs)
    assert list(values) == [2, 1, 0, 2, 1] and list(found) == [True, True, False, True, True]
    values, found = t.lookup_many(np.array(["10.1.2.3", "12.0.0.0"]))
    assert list(values) == [2, 0] and list(found) == [True, False]
    with pytest.raises(ValueError):
        t.lookup_many(["10.1.2.3", "10.1.2.300"])
    values, found = t.lookup_many([])
    assert len(values) == 0 and len(found) == 0
    v6 = b.Lpm(version=6)
    v6["2001:db8::/32"] = "doc"
    values, found = v6.lookup_many(["2001:db8::1", "2001:db9::1"])
    assert list(values) == ["doc", None] and list(found) == [True, False]

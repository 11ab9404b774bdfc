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
    assert t.get("11.0.0.1") is None and t.get("11.0.0.1", 7) == 7
    with pytest.raises(KeyError):
        t["11.0.0.1"]
    assert t.get_key("10.1.2.3") == "10.1.0.0/16" and t.get_key("11.0.0.0") is None
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
    best = None
    for (net, length), value in stored.items():
        mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        if addr & mask == net and (best is None or length > best[0]):
            best = (length, value)
    return None if best is None else best[1]


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

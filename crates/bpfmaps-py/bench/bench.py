"""The Python front end against Python's own peers, on the same data in
the same run (the `python` suite of bpfmaps-bench runs this and reads
its JSON; it also runs alone):

    python crates/bpfmaps-py/bench/bench.py --data ../shared/data [--quick] [--json OUT]

- LPM, the real IPv4 table (lpm/prefixes_ipv4.txt.gz, else generated
  prefixes): lookups one address at a time from Python (`get` of a
  dotted-quad string, as pytricia and py-radix users write them) in
  bpfmaps_rs.Lpm, pytricia and py-radix, and bpfmaps_rs.Lpm.lookup_many
  over a numpy array and over the list of strings; addresses as lpm-real draws them: uniform over the
  IPv4 space, and inside a stored prefix picked uniformly.
- Hash map, 100K u32 keys: `t[k]` on a bpfmaps_rs.Table against a dict,
  and lookup_many; the whole table read with items_lookup_batch and
  items_many against a `for k in table` walk, with and without a lookup
  of each key.

Each figure is the median of --reps repetitions, timed in turns.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import ipaddress
import json
import os
import random
import statistics
import sys
import time

import numpy as np

import bpfmaps_rs as b

try:
    import pytricia
except ImportError:  # the suite says so
    pytricia = None
try:
    import radix
except ImportError:
    radix = None

SEED = 0x6C706D00


def load_prefixes(data: str | None) -> tuple[list[tuple[int, int]], str]:
    path = data and os.path.join(data, "lpm/prefixes_ipv4.txt.gz")
    if path and os.path.exists(path):
        out = []
        with gzip.open(path, "rt") as f:
            for line in f:
                net = ipaddress.IPv4Network(line.strip(), strict=False)
                out.append((int(net.network_address), net.prefixlen))
        return out, f"real IPv4 table ({len(out)} prefixes)"
    rng = random.Random(SEED)
    out = {}
    while len(out) < 200_000:
        length = rng.randint(8, 32)
        addr = rng.getrandbits(32) & ((0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF)
        out[(addr, length)] = None
    return list(out), "200000 generated prefixes (/8-/32)"


def draw(prefixes, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    uniform = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    picks = rng.integers(0, len(prefixes), size=n)
    inside = np.empty(n, dtype=np.uint32)
    hosts = rng.integers(0, 2**32, size=n, dtype=np.uint64)
    for i, p in enumerate(picks):
        addr, length = prefixes[p]
        host_mask = (1 << (32 - length)) - 1
        inside[i] = addr | (int(hosts[i]) & host_mask)
    return {"random": uniform, "inside": inside}


def timed(fn, ops: int) -> float:
    """Seconds per op of one run of fn."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) / ops


def in_turns(cases: dict, ops: int, reps: int) -> dict[str, dict]:
    """Median and spread (ns per op) of each case, timed in turns."""
    samples = {name: [] for name in cases}
    names = list(cases)
    for r in range(reps):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            samples[name].append(timed(cases[name], ops) * 1e9)
    return {
        name: {"ns": statistics.median(s), "min": min(s), "max": max(s)}
        for name, s in samples.items()
    }


def lpm(prefixes, n: int, reps: int) -> list[dict]:
    t = b.Lpm(4, max_entries=len(prefixes) + 1)
    peers = {}
    if pytricia:
        peers["pytricia"] = pytricia.PyTricia(32)
    if radix:
        peers["py-radix"] = radix.Radix()
    for i, (addr, length) in enumerate(prefixes):
        t[(addr, length)] = i
        text = f"{ipaddress.IPv4Address(addr)}/{length}"
        if "pytricia" in peers:
            peers["pytricia"][text] = i
        if "py-radix" in peers:
            peers["py-radix"].add(text).data["v"] = i
    rows = []
    for kind, addrs in draw(prefixes, n).items():
        texts = [str(ipaddress.IPv4Address(int(a))) for a in addrs]
        # Every table gives the same answers before any is timed.
        want, found = t.lookup_many(addrs)
        sample = range(0, n, max(1, n // 2000))
        for i in sample:
            got = t.get(texts[i])
            assert got == (int(want[i]) if found[i] else None), (kind, texts[i])
            if "pytricia" in peers:
                assert peers["pytricia"].get(texts[i]) == got, ("pytricia", texts[i])
            if "py-radix" in peers:
                node = peers["py-radix"].search_best(texts[i])
                assert (node.data["v"] if node else None) == got, ("py-radix", texts[i])

        def one_by_one(get):
            def run():
                for a in texts:
                    get(a)

            return run

        assert (t.lookup_many(texts[:2000])[0] == want[:2000]).all()
        cases = {
            "bpfmaps_rs.Lpm.get": one_by_one(t.get),
            "bpfmaps_rs.Lpm.lookup_many": lambda: t.lookup_many(addrs),
            "bpfmaps_rs.Lpm.lookup_many(str)": lambda: t.lookup_many(texts),
        }
        if "pytricia" in peers:
            cases["pytricia.get"] = one_by_one(peers["pytricia"].get)
        if "py-radix" in peers:
            cases["py-radix.search_best"] = one_by_one(peers["py-radix"].search_best)
        for name, r in in_turns(cases, n, reps).items():
            rows.append({"case": f"lpm,addrs={kind}", "impl": name, **r})
    return rows


def hash_map(n: int, reps: int) -> list[dict]:
    t = b.Table(b.MAP_TYPE_HASH, ctypes.c_uint32, ctypes.c_uint64, n)
    keys = np.random.default_rng(SEED).permutation(n).astype(np.uint32)
    t.update_many(keys, keys.astype(np.uint64) * 3)
    d = {int(k): int(k) * 3 for k in keys}
    probe = [int(k) for k in keys]
    got = t.lookup_many(keys)[0]
    assert all(int(got[i]) == d[probe[i]] for i in range(0, n, 97))

    def table_gets():
        for k in probe:
            t[k]

    def dict_gets():
        for k in probe:
            d[k]

    rows = []
    cases = {"bpfmaps_rs.Table[k]": table_gets, "dict[k]": dict_gets, "bpfmaps_rs.Table.lookup_many": lambda: t.lookup_many(keys)}
    for name, r in in_turns(cases, n, reps).items():
        rows.append({"case": "hash,op=lookup", "impl": name, **r})

    assert sorted(t.items_lookup_batch()) == sorted(d.items())
    assert sorted(zip(*(a.tolist() for a in t.items_many()))) == sorted(d.items())

    def walk():
        for k in t:
            pass

    def batch_walk():
        # What BCC's users write: its items_lookup_batch() is a generator.
        for k, v in t.items_lookup_batch():
            pass

    def walk_items():
        # What BCC's items() does: the walk, and a lookup of each key.
        for k in t:
            t[k]

    def items():
        # The same pairs (Key and Leaf objects), read in native batches.
        for k, v in t.items():
            pass

    cases = {
        "for k, v in table.items_lookup_batch()": batch_walk,
        "list(table.items_lookup_batch())": lambda: list(t.items_lookup_batch()),
        "bpfmaps_rs.Table.items_many": t.items_many,
        "for k in table": walk,
        "for k in table: table[k]": walk_items,
        "for k, v in table.items()": items,
    }
    for name, r in in_turns(cases, n, reps).items():
        rows.append({"case": "hash,op=read_all", "impl": name, **r})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    n = 20_000 if args.quick else 200_000
    prefixes, source = load_prefixes(args.data)
    missing = [p for p, m in (("pytricia", pytricia), ("py-radix", radix)) if m is None]
    rows = lpm(prefixes, n, reps) + hash_map(20_000 if args.quick else 100_000, reps)
    out = {"source": source, "missing_peers": missing, "python": sys.version.split()[0], "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    for r in rows:
        print(f"{r['case']:<22} {r['impl']:<38} {r['ns']:9.1f} ns  [{r['min']:.1f}..{r['max']:.1f}]")


if __name__ == "__main__":
    main()

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
- Wildcard map, ClassBench's acl1_10k (classbench/acl1_10k.gz, else
  10K generated 5-tuple rules) loaded as one rule set: packets drawn inside random rules,
  classified one at a time from text (`classify`), as numpy rows of
  field values (`classify_many`) and as headers' bytes
  (`classify_many_keys`).

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


def load_rules(data: str | None) -> tuple[list[tuple], str]:
    """5-tuple rules in priority order: (src, src_len, dst, dst_len,
    sport_lo, sport_hi, dport_lo, dport_hi, proto, proto_len)."""
    path = data and os.path.join(data, "classbench/acl1_10k.gz")
    if path and os.path.exists(path):
        out = []
        with gzip.open(path, "rt") as f:
            for line in f:
                src, dst, slo, _, shi, dlo, _, dhi, proto = line[1:].split()[:9]
                (s, sl), (d, dl) = (n.split("/") for n in (src, dst))
                value, mask = (int(x, 16) for x in proto.split("/"))
                out.append((int(ipaddress.IPv4Address(s)), int(sl), int(ipaddress.IPv4Address(d)), int(dl),
                            int(slo), int(shi), int(dlo), int(dhi), value, 8 if mask else 0))
        return out, f"ClassBench acl1_10k ({len(out)} rules)"
    rng = random.Random(SEED)
    out = []
    for _ in range(10_000):
        sl, dl = rng.choice([8, 16, 24, 32]), rng.choice([16, 24, 32])
        lo = rng.randrange(65536)
        out.append((rng.getrandbits(32) >> (32 - sl) << (32 - sl), sl, rng.getrandbits(32) >> (32 - dl) << (32 - dl), dl,
                    0, 65535, lo, min(65535, lo + rng.choice([0, 0, 15, 1023])), rng.choice([6, 17]), 8))
    return out, "10,000 generated 5-tuple rules"


def wildcard(data: str | None, n: int, reps: int) -> tuple[list[dict], str]:
    rules, source = load_rules(data)
    fw = b.Wildcard([("src", "prefix", 4), ("dst", "prefix", 4), ("sport", "range", 2), ("dport", "range", 2),
                     ("proto", "prefix", 1)], len(rules))
    ip = ipaddress.IPv4Address
    # Loaded as one rule set (`load`), as a firewall loads its policy.
    fw.load([(f"src {ip(s)}/{sl}, dst {ip(d)}/{dl}, sport {slo}-{shi}, dport {dlo}-{dhi}, proto {p}/{pl}", prio, prio)
             for prio, (s, sl, d, dl, slo, shi, dlo, dhi, p, pl) in enumerate(rules)])
    rng = random.Random(SEED)
    rows = []
    for _ in range(n):
        s, sl, d, dl, slo, shi, dlo, dhi, p, pl = rules[rng.randrange(len(rules))]
        inside = lambda base, length: base | (rng.getrandbits(32) & ((1 << (32 - length)) - 1))
        rows.append((inside(s, sl), inside(d, dl), rng.randint(slo, shi), rng.randint(dlo, dhi),
                     p if pl else rng.choice([6, 17, 1])))
    packets = np.array(rows, dtype=np.uint64)
    header = np.dtype([("src", ">u4"), ("dst", ">u4"), ("sport", ">u2"), ("dport", ">u2"), ("proto", "u1")])
    keys = np.array(rows, dtype=header).tobytes()
    texts = [f"src {ip(r[0])}, dst {ip(r[1])}, sport {r[2]}, dport {r[3]}, proto {r[4]}" for r in rows]
    # The three forms give the same answers before any is timed.
    prios, values, found = fw.classify_many(packets)
    assert [a.tolist() for a in fw.classify_many_keys(keys)] == [prios.tolist(), values.tolist(), found.tolist()]
    for i in range(0, n, max(1, n // 2000)):
        assert fw.classify(texts[i]) == ((int(prios[i]), int(values[i])) if found[i] else None), texts[i]

    def one_by_one():
        for t in texts:
            fw.classify(t)

    cases = {
        "Wildcard.classify(text)": one_by_one,
        "Wildcard.classify_many": lambda: fw.classify_many(packets),
        "Wildcard.classify_many_keys": lambda: fw.classify_many_keys(keys),
    }
    out = [{"case": "wildcard,op=classify", "impl": name, **r} for name, r in in_turns(cases, n, reps).items()]
    return out, source


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
    wildcard_rows, rules = wildcard(args.data, 20_000 if args.quick else 100_000, reps)
    rows += wildcard_rows
    source += f"; {rules}"
    out = {"source": source, "missing_peers": missing, "python": sys.version.split()[0], "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    for r in rows:
        print(f"{r['case']:<22} {r['impl']:<38} {r['ns']:9.1f} ns  [{r['min']:.1f}..{r['max']:.1f}]")


if __name__ == "__main__":
    main()

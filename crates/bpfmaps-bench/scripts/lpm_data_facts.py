#!/usr/bin/env python3
"""Facts about the LPM data sets that docs/benchmarks.md quotes.

Usage: python3 crates/bpfmaps-bench/scripts/lpm_data_facts.py [DATA_DIR]
(DATA_DIR defaults to ../shared/data.)

- How much of the IPv4 address space the real table covers (the union of
  its prefixes' address ranges): the rest is what uniformly random
  addresses miss.
- How the RIS trace's mutations split, replayed over its initial table:
  announcements of prefixes already stored (a new value), announcements of
  new prefixes, withdrawals of stored prefixes, withdrawals of absent ones.
- How many prefixes of each real table are hidden in `LpmTrie`'s data
  blocks: a prefix of length L lives in the node of key byte (L - 1) // 8
  and is hidden when longer prefixes of that same byte cover it all, so it
  wins no byte of the node and its payload is listed apart.
"""

import gzip
import ipaddress
import sys
from pathlib import Path

data = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data") / "lpm"

ranges = []
with gzip.open(data / "prefixes_ipv4.txt.gz", "rt") as f:
    for line in f:
        net = ipaddress.ip_network(line.strip(), strict=False)
        ranges.append((int(net.network_address), int(net.broadcast_address) + 1))
ranges.sort()
covered, (start, end) = 0, ranges[0]
for lo, hi in ranges[1:]:
    if lo > end:
        covered += end - start
        start, end = lo, hi
    else:
        end = max(end, hi)
covered += end - start
print(f"IPv4 table: {len(ranges)} prefixes cover {100 * covered / 2**32:.1f}% of the address space")

def canon(text):
    return ipaddress.ip_network(text.strip(), strict=False)

with gzip.open(data / "ris" / "ris_as3333_initial_ipv4.txt.gz", "rt") as f:
    table = {canon(line) for line in f}
counts = {"announce stored": 0, "announce new": 0, "withdraw stored": 0, "withdraw absent": 0}
with gzip.open(data / "ris" / "ris_as3333_mutations_ipv4.txt.gz", "rt") as f:
    for line in f:
        net = canon(line[2:])
        stored = net in table
        if line.startswith("A"):
            counts["announce stored" if stored else "announce new"] += 1
            table.add(net)
        else:
            counts["withdraw stored" if stored else "withdraw absent"] += 1
            table.discard(net)
total = sum(counts.values())
print(f"RIS trace: {total} mutations: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def hidden_prefixes(name, bits):
    prefixes = set()
    with gzip.open(data / name, "rt") as f:
        for line in f:
            net = ipaddress.ip_network(line.strip(), strict=False)
            prefixes.add((int(net.network_address), net.prefixlen))

    def covered(addr, length, end):
        """Whether prefixes longer than `length`, up to `end`, cover it."""
        if length >= end:
            return False
        halves = (addr, addr | 1 << (bits - length - 1))
        return all((h, length + 1) in prefixes or covered(h, length + 1, end) for h in halves)

    hidden = sum(
        1 for addr, length in prefixes if length > 0 and covered(addr, length, (length - 1) // 8 * 8 + 8)
    )
    print(f"{name}: {hidden} of {len(prefixes)} prefixes hidden ({100 * hidden / len(prefixes):.1f}%)")


hidden_prefixes("prefixes_ipv4.txt.gz", 32)
hidden_prefixes("prefixes_ipv6.txt.gz", 128)

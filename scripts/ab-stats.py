#!/usr/bin/env python3
"""Summarises the output of scripts/ab-tracking.sh: per build, the median tracking overhead
(cached and pool paths, percent and ns), the median untracked time, and in how many rounds
each build measured lower than the first build named.

    scripts/ab-stats.py ab.txt
"""
import collections
import statistics as st
import sys

rows = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) != 7:
        continue
    if f[0] not in order:
        order.append(f[0])
    rows[f[0]].append(tuple(float(x) for x in f[1:]))
base = order[0]
n = min(len(v) for v in rows.values())
for b in order:
    v = rows[b][:n]
    cached = [x[0] for x in v]
    pool = [x[3] for x in v]
    cached_ns = [(x[1] - x[2]) * 1e3 for x in v]
    pool_ns = [(x[4] - x[5]) * 1e3 for x in v]
    s = (f"{b:6s} cached {st.median(cached):+.2f}% ({st.median(cached_ns):.2f} ns) "
         f"base {st.median([x[2] for x in v]) * 1e3:.1f} ns | "
         f"pool {st.median(pool):+.2f}% ({st.median(pool_ns):.1f} ns) "
         f"base {st.median([x[5] for x in v]):.3f} us")
    if b != base:
        lc = sum(1 for i in range(n) if v[i][0] < rows[base][i][0])
        lp = sum(1 for i in range(n) if v[i][3] < rows[base][i][3])
        s += f" | lower than {base} in {lc}/{n} cached, {lp}/{n} pool"
    print(s)

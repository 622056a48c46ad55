#!/usr/bin/env python3
"""Sets the rows two raft-bench builds share side by side (scripts/bench-turns.sh's output):
for each row, ours' median per round, the median over rounds for before and after, and after /
before. A row matches by its case text and the text of what it measures."""
import json, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])

def rows(side, i):
    data = json.load(open(f"{out}/{side}-{i}.json"))
    got = {}
    for r in data["rows"]:
        got[(r["case"], r["ours"])] = r["ours_stat"]["median_ns"]
    return got

before = [rows("before", i) for i in range(1, rounds + 1)]
after = [rows("after", i) for i in range(1, rounds + 1)]
common = [k for k in before[0] if all(k in b for b in before) and all(k in a for a in after)]
print("| row | measures | before (median of rounds) | after | after / before | rounds before | rounds after |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for k in common:
    b = [x[k] for x in before]
    a = [x[k] for x in after]
    mb, ma = statistics.median(b), statistics.median(a)
    fmt = lambda v: f"{v / 1e3:.2f} µs" if v >= 1e3 else f"{v:.1f} ns"
    print(f"| {k[0]} | {k[1]} | {fmt(mb)} | {fmt(ma)} | {ma / mb:.3f} | {', '.join(fmt(v) for v in b)} | {', '.join(fmt(v) for v in a)} |")
only_before = [k for k in before[0] if k not in common]
only_after = [k for k in after[0] if k not in common]
print(f"\n{len(common)} rows in both; {len(only_before)} only before, {len(only_after)} only after (renamed or new).")

#!/usr/bin/env python3
"""Medians over rounds of each round's own ratio, for raft-bench's JSON files of one side of a
turns run (scripts/bench-turns.sh): every row whose case contains PATTERN, ours against each of
its baselines. A round's ratio compares ours and the baseline measured in the same process, so
the host's speed from round to round cancels.

    scripts/bench-ratios.py PATTERN OUT_DIR/after-*.json
"""
import json
import statistics as st
import sys

pattern, files = sys.argv[1], sys.argv[2:]
rows = {}
for f in files:
    for r in json.load(open(f))["rows"]:
        if pattern not in r["case"] or "ours_stat" not in r:
            continue
        rows.setdefault(r["case"], []).append(
            (r["ours_stat"]["median_ns"], [(b[0], b[1]["median_ns"]) for b in r["baselines"]]))
for case, rounds in rows.items():
    ours = st.median(x[0] for x in rounds)
    names = [b[0] for b in rounds[0][1]]
    ratios = [st.median(x[0] / x[1][j][1] for x in rounds) for j in range(len(names))]
    cells = " | ".join(f"{names[j][:40]}: {ratios[j]:.2f}x" for j in range(len(names)))
    print(f"| {case} | {ours:.0f} ns | {cells} |")

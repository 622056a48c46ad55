#!/usr/bin/env python3
"""Sets the rows two raft-bench builds share side by side (scripts/bench-turns.sh's output).
A row matches by its case text with any parenthesised remark left out ("(in turns)", …), or
through RENAMED. For each: ours' median per round, the median over the rounds for before and
after and after / before; and each side's ratio to its own baseline of the same turns (median
over rounds), which a drift of the machine between rounds does not move."""
import json, re, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])

# The before build's case text -> this build's, where a row was renamed.
RENAMED = {
    "job round trip (no-op job), same wait: spin, then park":
        "job round trip (no-op job) against the spin round trip (issue 30's goal, in turns)",
}

def key(case):
    case = RENAMED.get(case, case)
    return re.sub(r"\s*\([^()]*\)", "", case).strip()

def rows(side, i):
    got = {}
    for r in json.load(open(f"{out}/{side}-{i}.json"))["rows"]:
        k = key(r["case"])
        # Two rows that differ only in a remark (the arena's floor "(the row above's turns)" and
        # "(in turns)") are both kept, the later one numbered, in the order the bench printed them.
        n = 2
        while k in got:
            k = f"{key(r['case'])} #{n}"
            n += 1
        got[k] = (r["ours_stat"]["median_ns"], r.get("ratio"), r.get("against", ""))
    return got

before = [rows("before", i) for i in range(1, rounds + 1)]
after = [rows("after", i) for i in range(1, rounds + 1)]
common = [k for k in before[0] if all(k in b for b in before) and all(k in a for a in after)]
fmt = lambda v: f"{v / 1e3:.2f} µs" if v >= 1e3 else f"{v:.1f} ns"
print(f"{rounds} rounds each, alternately (before, after, before, …)\n")
print("| row | before (median of rounds) | after | after / before | ratio to its baseline: before | after | baseline | rounds before | rounds after |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for k in common:
    b = [x[k][0] for x in before]
    a = [x[k][0] for x in after]
    mb, ma = statistics.median(b), statistics.median(a)
    rb = [x[k][1] for x in before if x[k][1] is not None]
    ra = [x[k][1] for x in after if x[k][1] is not None]
    rb_s = f"{statistics.median(rb):.2f}x" if rb else "—"
    ra_s = f"{statistics.median(ra):.2f}x" if ra else "—"
    print(f"| {k} | {fmt(mb)} | {fmt(ma)} | {ma / mb:.3f} | {rb_s} | {ra_s} | {after[0][k][2][:60] or '—'} | "
          f"{', '.join(fmt(v) for v in b)} | {', '.join(fmt(v) for v in a)} |")
only_before = [k for k in before[0] if k not in common]
only_after = [k for k in after[0] if k not in common]
print(f"\n{len(common)} rows in both. Only before: {only_before}. Only after: {len(only_after)} (new rows).")

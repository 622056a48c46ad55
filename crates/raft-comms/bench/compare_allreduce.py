#!/usr/bin/env python3
"""Compares allreduce bus bandwidth of raft-comms (`comms-bench`) and torch.distributed
(`torch_allreduce.py`) from their JSON lines, in turns: each argument is one file of one run, the
implementation read from its lines. Prints one row per size: the median busbw of each side over
its runs, each side's spread (min-max), and ours / torch's medians; then the smallest ratio at
1 MiB and above (issue 32's goal on the socket transport: >= 0.95x).

    compare_allreduce.py ours-1.jsonl torch-1.jsonl ours-2.jsonl torch-2.jsonl
"""
import json
import statistics
import sys


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    runs = {}  # impl -> bytes -> [busbw]
    for path in sys.argv[1:]:
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if row.get("bench") != "allreduce":
                continue
            runs.setdefault(row["impl"], {}).setdefault(row["bytes"], []).append(row["busbw_GBps"])
    ours, torch = runs.get("raft-comms", {}), runs.get("torch.distributed", {})
    if not ours or not torch:
        print(f"compare_allreduce: need both implementations, found {sorted(runs)}", file=sys.stderr)
        return 2
    print("| bytes | raft-comms busbw GB/s (median, min-max) | torch busbw GB/s (median, min-max) | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    worst = None
    for size in sorted(set(ours) & set(torch)):
        o, t = ours[size], torch[size]
        mo, mt = statistics.median(o), statistics.median(t)
        ratio = mo / mt if mt > 0 else float("nan")
        print(f"| {size} | {mo:.2f} ({min(o):.2f}-{max(o):.2f}) | {mt:.2f} ({min(t):.2f}-{max(t):.2f}) | {ratio:.3f}x |")
        if size >= 1 << 20 and (worst is None or ratio < worst[1]):
            worst = (size, ratio)
    if worst is not None:
        print(f"smallest ratio at 1 MiB and above: {worst[1]:.3f}x at {worst[0]} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

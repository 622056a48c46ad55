#!/usr/bin/env bash
# The async-pool hazard on the driver API alone (no RMM, RAFT or this library): every mode of
# `scenarios raw-pool-streams` under scripts/hang-probe.sh, outputs under $OUT (default ./gpu-out).
# GPU run 42: inline 4/4 crashed, ctxsync 0/4, inline-ctxsync 4/4 crashed, streamsync-ctxsync
# 0/4, handoff 0/3, handoff with reused streams 0/3. From the repository root, bundle built.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/gpu-out}; mkdir -p "$OUT"
cuda_libs=${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
export LD_LIBRARY_PATH="$root/gpu-bundle/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
S="$root/gpu-bundle/bin/scenarios"; P="$root/scripts/hang-probe.sh"
SCENARIO_MODE=pool-limit timeout 60 "$S" raw-pool-streams > "$OUT/raw-pool-limit.txt" 2>&1; grep RESULT "$OUT/raw-pool-limit.txt"
for m in inline ctxsync inline-ctxsync streamsync-ctxsync; do
  SCENARIO_MODE=$m PROBE_NO_STACKS=1 timeout 100 "$P" "$S" raw-pool-streams 4 15 "$OUT/raw-$m.txt"; tail -1 "$OUT/raw-$m.txt"
done
SCENARIO_MODE=handoff PROBE_NO_STACKS=1 timeout 60 "$P" "$S" raw-pool-streams 3 15 "$OUT/raw-handoff.txt"; tail -1 "$OUT/raw-handoff.txt"
SCENARIO_MODE=handoff SCENARIO_REUSE=1 PROBE_NO_STACKS=1 timeout 60 "$P" "$S" raw-pool-streams 3 15 "$OUT/raw-handoff-reuse.txt"; tail -1 "$OUT/raw-handoff-reuse.txt"

#!/usr/bin/env bash
# Issue 29's "benchmark rows within 5% of before, measured in turns in one run": two raft-bench
# builds (each with its own shim) run alternately, ROUNDS times each, in one session on one GPU;
# then scripts/bench-compare.py sets their common rows side by side (median of the rounds' medians).
#   scripts/bench-turns.sh BEFORE_DIR AFTER_DIR OUT_DIR [ROUNDS]
# Each DIR holds bin/raft-bench and lib/libraftrs_shim.so; the bundle's lib/ gives the rest.
# PIN (a taskset CPU list, e.g. 0-7) runs both on the same cores: run 119 saw both builds move
# between two speeds (1x and ~1.8x) from round to round, as the processes landed.
set -u
pin=()
if [ -n "${PIN:-}" ] && command -v taskset >/dev/null; then pin=(taskset -c "$PIN"); fi
before=$1; after=$2; out=$3; rounds=${4:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_libs=${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
mkdir -p "$out"
status=0
for i in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    LD_LIBRARY_PATH="$dir/lib:$root/gpu-bundle/lib:$cuda_libs" RAFT_RS_SHIM="$dir/lib/libraftrs_shim.so" \
      "${pin[@]}" "$dir/bin/raft-bench" "$out/$side-$i.json" > "$out/$side-$i.md" 2> "$out/$side-$i.err"
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "$side round $i rc=$rc ($(date +%T))"
  done
done
python3 "$root/scripts/bench-compare.py" "$out" "$rounds" > "$out/compare.md" || status=1
exit $status

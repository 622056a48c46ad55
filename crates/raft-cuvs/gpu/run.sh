#!/usr/bin/env bash
# The cuVS GPU run, on the GPU machine: reassembles what pack.sh split, then runs raft-cuvs's tests
# under RAFT_REQUIRE_GPU=1 RAFT_REQUIRE_CUVS=1, the knn example and the bench (`run.sh DIR memcheck`:
# the NaN-row CAGRA tests under memcheck instead); logs go to $OUT
# (the device call's output folder) or to DIR/logs.
#
#   crates/raft-cuvs/gpu/run.sh DIR [memcheck]    (DIR holds part-aa, part-ab, ... from pack.sh)
set -uo pipefail
dir=$1
logs=${OUT:-$dir/logs}; mkdir -p "$logs"
export PATH="$dir/tools:$PATH"   # pack.sh's zstd: the GPU image has none
if [ ! -d "$dir/bundle" ]; then
  cat "$dir"/part-* | zstd -d -q | tar -xf - -C "$dir" || { echo "the parts do not reassemble: $(ls "$dir")"; exit 1; }
fi
b=$(cd "$dir/bundle" && pwd)
site=${RAFT_IMAGE_SITE:-/opt/torch/.venv/lib/python3.12/site-packages}
# cuVS's nvJitLink 13.3 first: the shim (cuSOLVER, cuSPARSE) and cuVS then share it.
export LD_LIBRARY_PATH="$b/cuvs:$b/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
export RAFT_CUVS_LIB="$b/cuvs/libcuvs_c.so"
export RAFT_REQUIRE_GPU=1 RAFT_REQUIRE_CUVS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/gpu.txt" 2>&1
failed=0
# `run.sh DIR memcheck`: only cuVS's own accesses over data with NaN and infinite rows (the
# seventeenth audit's question): the two CAGRA tests whose names hold "nan", under
# compute-sanitizer memcheck, in a device call of their own (a build under memcheck is slow).
if [ "${2:-all}" = memcheck ]; then
  if command -v compute-sanitizer >/dev/null; then
    timeout -k 10 540 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$b/tests/cuvs" nan --test-threads=1 >"$logs/memcheck-nan.log" 2>&1
    rc=$?; echo "memcheck cuvs nan: rc=$rc $(grep -E 'ERROR SUMMARY|^test result:' "$logs/memcheck-nan.log" | tr '\n' ' ')"
    grep -E "CAGRA" "$logs/memcheck-nan.log" | head -8
    exit $rc
  fi
  echo "memcheck cuvs nan: FAILED, no compute-sanitizer on PATH"; exit 1
fi
for t in "$b"/tests/*; do
  name=$(basename "$t")
  timeout -k 10 "${RAFT_TEST_TIMEOUT:-400}" "$t" --test-threads=4 >"$logs/test-$name.log" 2>&1
  rc=$?
  echo "test $name: rc=$rc $(grep -E '^test result:' "$logs/test-$name.log" | tail -n 1)"
  grep -E "SKIP|CAGRA|brute force:|panicked" "$logs/test-$name.log" | head -20
  [ $rc -eq 0 ] || failed=1
done
"$b/bin/cuvs-knn" >"$logs/knn.log" 2>&1; rc=$?; echo "example knn: rc=$rc"; cat "$logs/knn.log"; [ $rc -eq 0 ] || failed=1
"$b/bin/cuvs-bench" >"$logs/bench.log" 2>&1; rc=$?; echo "bench: rc=$rc"; cat "$logs/bench.log"; [ $rc -eq 0 ] || failed=1
exit $failed

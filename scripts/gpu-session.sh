#!/usr/bin/env bash
# One GPU-machine session over the bundle: runs the named steps, writes each step's output under
# $OUT (or ./gpu-out), prints a summary. Steps: tests soak examples bench doctor sanitizer torture.
#   scripts/gpu-session.sh tests bench          (from the repository root, bundle built)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
b="$root/gpu-bundle"
out=${OUT:-$root/gpu-out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$b/lib:${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}:${LD_LIBRARY_PATH:-}"
export RAFT_REQUIRE_GPU=1 RAFT_SCENARIOS_EXE="$b/bin/scenarios"
status=0
for step in "$@"; do
  case $step in
    tests) "$b/run.sh" tests /tmp/raft-logs > "$out/tests.txt" 2>&1; rc=$?
           tar czf "$out/logs.tgz" -C /tmp raft-logs ;;
    soak) RAFT_SOAK_SECS=${SOAK_SECS:-60} "$b/tests/soak" --nocapture > "$out/soak.txt" 2>&1; rc=$? ;;
    soak1) RAFT_RELEASE_THREADS=1 RAFT_SOAK_SECS=${SOAK_SECS:-60} "$b/tests/soak" --nocapture > "$out/soak1.txt" 2>&1; rc=$? ;;
    examples) rc=0; : > "$out/examples.txt"
      for e in resources devices memory_resource errors exit_while_jobs_run version_abi; do
        echo "== $e" >> "$out/examples.txt"; RUST_LOG=raft=debug "$b/bin/$e" >> "$out/examples.txt" 2>&1 || { rc=1; echo "FAILED $e" >> "$out/examples.txt"; }
      done ;;
    bench) "$b/bin/raft-bench" "$out/bench.json" > "$out/bench.md" 2> "$out/bench.err"; rc=$? ;;
    bench2) "$b/bin/raft-bench" "$out/bench2.json" > "$out/bench2.md" 2> "$out/bench2.err"; rc=$? ;;
    doctor) { "$b/bin/raft-doctor"; echo "doctor rc=$?"; } > "$out/doctor.txt" 2>&1; "$b/bin/raft-doctor" --json > "$out/doctor.json" 2>/dev/null; rc=$? ;;
    sanitizer) rc=0; : > "$out/sanitizer.txt"
      for t in resources arrays errors memory; do
        for tool in memcheck; do
          echo "== $tool $t" >> "$out/sanitizer.txt"
          # errors provokes out-of-memory on purpose: its API errors are the point of the test.
          api=explicit; [ "$t" = errors ] && api=no
          timeout 240 compute-sanitizer --tool $tool --report-api-errors $api --error-exitcode 99 --target-processes all "$b/tests/$t" --test-threads=4 >> "$out/sanitizer.txt" 2>&1
          r=$?; echo "rc=$r" >> "$out/sanitizer.txt"; [ $r -eq 0 ] || rc=1
        done
      done
      echo "== racecheck arrays" >> "$out/sanitizer.txt"
      timeout 240 compute-sanitizer --tool racecheck --error-exitcode 99 "$b/tests/arrays" --test-threads=1 >> "$out/sanitizer.txt" 2>&1
      r=$?; echo "rc=$r" >> "$out/sanitizer.txt"; [ $r -eq 0 ] || rc=1 ;;
    latency) rc=0; : > "$out/latency.txt"
      # Exit latency: the child's end (taken here, right after it exits) against the moment
      # main returned, or the job ended, as the child printed it.
      for case in "no-jobs main_end_ms" "idle-resources main_end_ms" "job-then-return job_end_ms"; do
        set -- $case; name=$1; mark=$2; vals=""
        for i in $(seq 1 20); do
          o=$(SCENARIO_GPU=1 SCENARIO_WAIT=10 SCENARIO_JOB_SECS=0.5 RUST_LOG=off "$b/bin/scenarios" "$name"); r=$?
          end=$(date +%s%3N); [ $r -eq 0 ] || rc=1
          at=$(echo "$o" | tr ' ' '\n' | grep "^$mark=" | cut -d= -f2)
          vals="$vals $((end - at))"
        done
        echo "$name ($mark -> process end, ms, 20 runs): $(echo $vals | tr ' ' '\n' | sort -n | tr '\n' ' ')" >> "$out/latency.txt"
      done ;;
    torture) "$b/run.sh" torture "${TORTURE_N:-1000}" > "$out/torture.txt" 2>&1; rc=$? ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  echo "step $step: rc=$rc"
  [ $rc -eq 0 ] || status=1
done
exit $status

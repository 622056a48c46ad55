#!/usr/bin/env bash
# Runs one scenario N times under a watchdog: a run still alive after LIMIT seconds gets every
# thread's stack printed (cuda-gdb attached to it), then is killed. For hangs that a test can
# only report as "hung past its limit".
#   scripts/hang-probe.sh EXE SCENARIO N LIMIT OUTFILE     (extra variables from the caller)
set -u
exe=$1; name=$2; n=$3; limit=$4; out=$5
gdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -n 1)
[ -n "${PROBE_NO_STACKS:-}" ] && gdb=""
hangs=0; fails=0
for i in $(seq 1 "$n"); do
  start=$(date +%s%3N)
  SCENARIO_GPU=1 RUST_LOG=${RUST_LOG:-raft=debug} "$exe" "$name" > /tmp/probe.out 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null && [ $(( $(date +%s%3N) - start )) -lt $((limit * 1000)) ]; do sleep 0.2; done
  if kill -0 $pid 2>/dev/null; then
    hangs=$((hangs + 1)); echo "== run $i: alive after ${limit}s" >> "$out"
    tail -n 20 /tmp/probe.out >> "$out"
    if [ -n "$gdb" ]; then timeout 120 "$gdb" -p $pid -batch -ex "thread apply all bt 30" >> "$out" 2>&1; else echo "no cuda-gdb" >> "$out"; fi
    kill -9 $pid; wait $pid 2>/dev/null
  else
    wait $pid; rc=$?
    echo "run $i: rc=$rc $(( $(date +%s%3N) - start )) ms $(grep RESULT /tmp/probe.out | tail -n 1)" >> "$out"
    [ $rc -eq 0 ] || { fails=$((fails + 1)); tail -n 30 /tmp/probe.out >> "$out"; }
  fi
done
echo "probe $exe $name: $n runs, $hangs hung, $fails failed" >> "$out"

#!/usr/bin/env bash
# Packs raft-comms for a GPU machine with no Rust toolchain and no network: its test harnesses,
# raft-run, comms-bench, the allreduce_sum example, both shims (libraftrs_shim.so,
# libraftcomms_shim.so), librmm / librapids_logger / libcudart, the torch baseline and a run
# script, in one self-contained folder (about 15 MiB: carry it on its own).
#
#   crates/raft-comms/scripts/comms-bundle.sh [OUT]      (default: target/comms-bundle)
#
# On the GPU machine: OUT/comms.sh tests|example|bench|all [LOGDIR]. libnccl is not carried
# (328 MiB): the run script points RAFT_COMMS_NCCL_LIB at the torch virtualenv's (the NCCL
# torch uses); the system's /usr/lib/x86_64-linux-gnu/libnccl.so.2 serves when it is unset.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
out=${1:-$root/target/comms-bundle}
cargo xtask deps --nccl >/dev/null
prefix=$(cargo xtask deps 2>/dev/null | sed -n 's/^native stack ready in //p')
json=$(mktemp)
cargo test --release -p raft-comms --no-run --message-format=json-render-diagnostics >"$json"
cargo build --release -p raft-comms --bins --examples --message-format=json-render-diagnostics >>"$json"
rm -rf "$out"
mkdir -p "$out/tests" "$out/bin" "$out/lib" "$out/bench"
python3 - "$json" "$out" <<'PY'
import json, os, shutil, sys
out = sys.argv[2]
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed":
        for name in ("libraftrs_shim.so", "libraftcomms_shim.so"):
            f = os.path.join(m.get("out_dir", ""), name)
            if os.path.isfile(f):
                shutil.copy(f, os.path.join(out, "lib", name))
    exe = m.get("executable")
    if not exe or "raft-comms" not in m.get("package_id", "") and "raft_comms" not in m.get("package_id", ""):
        continue
    kinds = m["target"]["kind"]
    if m["profile"]["test"]:
        if "bin" in kinds:
            continue  # a bin's own harness has the bin's name
        name = os.path.basename(exe).rsplit("-", 1)[0]
        shutil.copy(exe, os.path.join(out, "tests", name))
    else:
        shutil.copy(exe, os.path.join(out, "bin", os.path.basename(exe)))
PY
rm -f "$json"
for lib in librmm/lib64/librmm.so rapids_logger/lib64/librapids_logger.so nvidia/cu13/lib/libcudart.so.13; do
  cp "$prefix/$lib" "$out/lib/"
done
cp crates/raft-comms/bench/torch_allreduce.py crates/raft-comms/bench/compare_allreduce.py "$out/bench/"
find "$out/tests" "$out/bin" -type f -exec strip --strip-debug {} \;
for f in lib/libraftrs_shim.so lib/libraftcomms_shim.so bin/raft-run bin/comms-bench bin/allreduce_sum tests/comms_clique tests/comms_splits tests/comms_processes; do
  [ -e "$out/$f" ] || { echo "comms-bundle: $f is missing" >&2; exit 1; }
done
cat >"$out/comms.sh" <<'RUN'
#!/usr/bin/env bash
# raft-comms on a machine with two GPUs; every program here keeps NVLink multicast off.
#   ./comms.sh tests [LOGDIR]     raft-comms's tests under RAFT_REQUIRE_GPU=1, two GPUs promised
#                                 (RAFT_REQUIRE_GPUS=1 ./comms.sh tests on one GPU: the two-GPU
#                                 tests then skip, visibly, instead of failing)
#   ./comms.sh example            the distributed sum: 2 processes × 1 GPU, then 1 process × 2 GPUs
#   ./comms.sh bench [LOGDIR]     comms-bench and torch_allreduce.py, 8 B to 1 GiB, JSON lines
#   ./comms.sh mpirun [LOGDIR]    every collective and dtype, and the example, under Open MPI's
#                                 `mpirun -np 2` (issue 32)
#   ./comms.sh net [LOGDIR]       the socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, as
#                                 across two hosts): every collective and dtype, then comms-bench
#                                 and torch in turns (two each), compared (issue 32)
#   ./comms.sh all [LOGDIR]       tests, example and bench
set -u
here=$(cd "$(dirname "$0")" && pwd)
site=${RAFT_TORCH_SITE:-/opt/torch/.venv/lib/python3.12/site-packages}
export LD_LIBRARY_PATH="$here/lib:${RAFT_CUDA_LIBS:-$site/nvidia/cu13/lib}:${LD_LIBRARY_PATH:-}"
if [ -z "${RAFT_COMMS_NCCL_LIB:-}" ] && [ -e "$site/nvidia/nccl/lib/libnccl.so.2" ]; then
  export RAFT_COMMS_NCCL_LIB="$site/nvidia/nccl/lib/libnccl.so.2"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAFT_REQUIRE_GPU=1 RAFT_REQUIRE_GPUS=${RAFT_REQUIRE_GPUS:-2} RAFT_RUN="$here/bin/raft-run"
logs=${2:-$here/logs}; mkdir -p "$logs"
failed=0
tests() {
  for t in comms_counts comms_groups comms_rendezvous comms_launcher raft_comms comms_clique comms_splits comms_processes; do
    start=$SECONDS
    # A hung binary ends the step at its bound (124), not the device call.
    timeout -k 10 "${RAFT_TEST_TIMEOUT:-540}" "$here/tests/$t" --test-threads=1 --nocapture >"$logs/$t.log" 2>&1
    rc=$?
    summary=$(grep -E '^test result:' "$logs/$t.log" | tail -n 1)
    echo "$t: rc=$rc ${summary:-no summary (see $logs/$t.log)} ($((SECONDS - start)) s)"
    [ $rc -eq 0 ] || failed=1
  done
  grep -h "SURVIVOR_ERROR\|NCCL (" "$logs"/comms_*.log || true
  # The ignored probe (docs/RELIABILITY.md, left open): reported, not counted, so a run says
  # when it starts passing.
  timeout -k 10 120 "$here/tests/comms_groups" --ignored --test-threads=1 --nocapture >"$logs/comms_groups-ignored.log" 2>&1
  echo "comms_groups --ignored (reported only): rc=$? $(grep -E '^test result:' "$logs/comms_groups-ignored.log" | tail -n 1)"
}
example() {
  "$here/bin/raft-run" -n 2 "$here/bin/allreduce_sum" || failed=1
  "$here/bin/allreduce_sum" || failed=1
}
bench() {
  "$here/bin/raft-run" -n 2 "$here/bin/comms-bench" | tee "$logs/comms-bench.jsonl" || failed=1
  "$here/bin/raft-run" -n 2 python3 "$here/bench/torch_allreduce.py" | tee "$logs/torch-allreduce.jsonl" || failed=1
}
# Every collective for every dtype (comms_processes' "collectives" role: counts not divisible
# by the world size included), two ranks started by `launcher`; RANK_OK from both or a failure.
collectives() { # label, then the launcher's words up to the program
  label=$1; shift
  start=$SECONDS
  RAFT_COMMS_CHILD=collectives RAFT_COMMS_TIMEOUT=60 "$@" "$here/tests/comms_processes" \
    two_processes_every_collective_for_every_type --exact --nocapture --test-threads=1 >"$logs/collectives-$label.log" 2>&1
  rc=$?
  oks=$(grep -c '^RANK_OK' "$logs/collectives-$label.log")
  echo "collectives ($label): rc=$rc, $oks of 2 ranks RANK_OK ($((SECONDS - start)) s)"
  [ $rc -eq 0 ] && [ "$oks" = 2 ] || failed=1
}
mpi() {
  command -v mpirun >/dev/null || { echo "mpirun: not on this machine"; failed=1; return; }
  # Open MPI gives each rank OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}; the rendezvous address is
  # ours to give (docs/COMMS.md). -x passes a variable to every rank.
  port=$((29500 + RANDOM % 400))
  mpi_run=(mpirun -np 2 --allow-run-as-root --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port
    -x LD_LIBRARY_PATH -x RAFT_COMMS_NCCL_LIB -x NCCL_NVLS_ENABLE -x RAFT_REQUIRE_GPU -x RAFT_REQUIRE_GPUS -x RAFT_COMMS_CHILD -x RAFT_COMMS_TIMEOUT)
  collectives mpirun "${mpi_run[@]}"
  port=$((port + 1))
  mpirun -np 2 --allow-run-as-root --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port \
    -x LD_LIBRARY_PATH -x RAFT_COMMS_NCCL_LIB -x NCCL_NVLS_ENABLE "$here/bin/allreduce_sum" || failed=1
}
net() {
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
  collectives sockets "$here/bin/raft-run" -n 2
  for turn in 1 2; do
    "$here/bin/raft-run" -n 2 "$here/bin/comms-bench" >"$logs/net-comms-bench-$turn.jsonl" || failed=1
    "$here/bin/raft-run" -n 2 python3 "$here/bench/torch_allreduce.py" >"$logs/net-torch-allreduce-$turn.jsonl" || failed=1
  done
  python3 "$here/bench/compare_allreduce.py" "$logs"/net-comms-bench-1.jsonl "$logs"/net-torch-allreduce-1.jsonl \
    "$logs"/net-comms-bench-2.jsonl "$logs"/net-torch-allreduce-2.jsonl | tee "$logs/net-compare.md" || failed=1
  unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
}
case "${1:-all}" in
  tests) tests ;;
  example) example ;;
  bench) bench ;;
  mpirun) mpi ;;
  net) net ;;
  all) tests; example; bench ;;
  *) echo "usage: comms.sh tests|example|bench|mpirun|net|all [LOGDIR]" >&2; exit 2 ;;
esac
exit $failed
RUN
chmod +x "$out/comms.sh"
echo "comms bundle: $out ($(du -sh "$out" | cut -f1))"
ls "$out"/tests "$out"/bin "$out"/lib

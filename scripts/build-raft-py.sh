#!/usr/bin/env bash
# Builds the Python extension raft_py (crates/raft-py) and lays it out for Python: the cdylib
# copied to `raft_py.abi3.so` (abi3: any CPython >= 3.9 imports it), beside its tests.
#   scripts/build-raft-py.sh                 -> gpu-bundle/python/ (carry gpu-bundle to the GPU machine)
#   RAFT_PY_OUT=dir RAFT_PY_PROFILE=dev scripts/build-raft-py.sh    (a debug build elsewhere)
# The extension needs the shim and the RAPIDS libraries at run time: `cargo xtask gpu-bundle`
# puts them in gpu-bundle/lib, and crates/raft-py/run-gpu.sh points Python at both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
profile=${RAFT_PY_PROFILE:-release}
out=${RAFT_PY_OUT:-$root/gpu-bundle/python}
cd "$root"
if [ "$profile" = release ]; then cargo build -p raft-py --release; dir=release; else cargo build -p raft-py --profile "$profile"; dir=$([ "$profile" = dev ] && echo debug || echo "$profile"); fi
mkdir -p "$out"
cp "target/$dir/libraft_py.so" "$out/raft_py.abi3.so"
cp crates/raft-py/tests/test_torch.py crates/raft-py/tests/test_cpu.py crates/raft-py/tests/bench_gemm.py crates/raft-py/run-gpu.sh "$out/"
echo "raft_py: $out/raft_py.abi3.so"

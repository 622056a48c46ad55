#!/usr/bin/env bash
# Runs raft_py's PyTorch test or GEMM bench on the GPU machine (no Rust toolchain there), with
# the image's torch virtualenv, the bundle's shim and RAPIDS libraries, and the extension built
# by scripts/build-raft-py.sh (gpu-bundle/python/, where this script is copied).
#   gpu-bundle/python/run-gpu.sh test          (exit status: the test's)
#   gpu-bundle/python/run-gpu.sh bench [N] [ITERS]
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=${RAFT_BUNDLE:-$(cd "$here/.." && pwd)}
py=${RAFT_PYTHON:-/opt/torch/.venv/bin/python3}
cuda_libs=${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
export LD_LIBRARY_PATH="$bundle/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
export RAFT_RS_SHIM="$bundle/lib/libraftrs_shim.so"
export PYTHONPATH="$here:${PYTHONPATH:-}"
step=${1:-test}; shift || true
case $step in
  test) exec "$py" "$here/test_torch.py" "$@" ;;
  bench) exec "$py" "$here/bench_gemm.py" "$@" ;;
  *) echo "usage: $0 test|bench [N] [ITERS]" >&2; exit 2 ;;
esac

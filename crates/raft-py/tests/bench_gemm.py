"""f16 / bf16 (and f32) GEMM at 8192³: raft_py.gemm (cublasGemmEx on raft-rs's resources, f32
accumulation, tensors in and out through DLPack) beside torch.matmul of the same tensors, in
the same process and run. Median TFLOP/s over ITERS timed calls after WARMUP; each call timed
on the host up to the end of its GPU work (raft_py.gemm waits for its stream; torch.matmul is
followed by torch.cuda.synchronize()), so both include the same kind of wait.

    python3 bench_gemm.py [N] [ITERS]      (N = 8192, ITERS = 30)

Prints a markdown table and one RESULT line per dtype with the ratio raft_py / torch.
"""
import statistics
import sys
import time

import raft_py

raft_py.rmm_map_address()  # the shim and its CUDA runtime first (see test_torch.py)

import torch  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
WARMUP = 5


def timed(f):
    out = []
    for i in range(WARMUP + ITERS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        if i >= WARMUP:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    # Matmul at full precision for f32 rows (TF32 off), as in NATIVE-STACK's torch numbers.
    torch.backends.cuda.matmul.allow_tf32 = False
    flops = 2.0 * N * N * N
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {N}x{N}x{N}, median of {ITERS}\n")
    print("| dtype | raft_py.gemm TFLOP/s | torch.matmul TFLOP/s | ratio |")
    print("| --- | --- | --- | --- |")
    for dtype in [torch.float16, torch.bfloat16, torch.float32]:
        a = torch.randn(N, N, device="cuda", dtype=dtype)
        b = torch.randn(N, N, device="cuda", dtype=dtype)
        ours = timed(lambda: raft_py.gemm(a, b))
        theirs = timed(lambda: torch.matmul(a, b))
        c = torch.from_dlpack(raft_py.gemm(a[:256], b))
        ok = torch.allclose(c.float(), torch.matmul(a[:256], b).float(), rtol=2e-2, atol=2.0)
        r, t = flops / ours / 1e12, flops / theirs / 1e12
        name = str(dtype)[6:]
        print(f"| {name} | {r:.1f} | {t:.1f} | {r / t:.3f} |", flush=True)
        print(f"RESULT gemm_{name}_{N} raft_tflops={r:.1f} torch_tflops={t:.1f} ratio={r / t:.3f} same_values={ok}", file=sys.stderr, flush=True)
        del a, b, c
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

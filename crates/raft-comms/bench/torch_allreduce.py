#!/usr/bin/env python3
"""Allreduce bus bandwidth of torch.distributed (NCCL backend), f32, 8 B to 1 GiB: the baseline
of raft-comms's `comms-bench`, measured the same way, one JSON line per size (rank 0 prints).

    raft-run -n 2 python3 crates/raft-comms/bench/torch_allreduce.py [--min-bytes 8] [--max-bytes 1073741824]
    torchrun --nproc-per-node 2 crates/raft-comms/bench/torch_allreduce.py

Method (as comms-bench and nccl-tests): in-place all_reduce (sum) of a zeroed tensor; W warm-up
calls, a barrier, then N calls back to back and one torch.cuda.synchronize(); time per call =
the slowest rank's elapsed / N; algbw = bytes / time, busbw = algbw * 2(n-1)/n. N: about 256 MiB
moved per size, between 20 and 1000 calls.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1), set here
before torch initialises NCCL whatever the launcher did.
"""
import argparse
import json
import os
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def iterations(nbytes: int) -> int:
    return max(20, min(1000, (256 << 20) // nbytes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    if rank == 0:
        print(f"torch_allreduce: {world} ranks, torch {torch.__version__}, NCCL {nccl}", flush=True, file=sys.stderr)

    check = torch.ones(1 << 16, dtype=torch.float32, device=device)
    dist.all_reduce(check)
    torch.cuda.synchronize()
    assert bool((check == world).all()), "the allreduce check failed"

    nbytes = 1 << max(2, (args.min_bytes - 1).bit_length())
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        iters = args.iters or iterations(nbytes)
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[local])
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        mine = (time.perf_counter() - start) / iters
        slowest = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        t = slowest.item()
        algbw = nbytes / t / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(
                json.dumps(
                    {
                        "bench": "allreduce",
                        "impl": "torch.distributed",
                        "dtype": "f32",
                        "ranks": world,
                        "bytes": nbytes,
                        "count": count,
                        "iters": iters,
                        "time_us": round(t * 1e6, 3),
                        "algbw_GBps": round(algbw, 3),
                        "busbw_GBps": round(busbw, 3),
                        "nccl": nccl,
                    }
                ),
                flush=True,
            )
        del buf
        nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

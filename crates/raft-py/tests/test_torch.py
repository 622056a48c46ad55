"""raft_py against the image's PyTorch, on the GPU machine (issue 31).

Run with crates/raft-py/run-gpu.sh (it sets the library paths); plain `python3 test_torch.py`
works too once raft_py is importable. Prints one RESULT line per check and exits non-zero on
the first failure.

raft_py is imported and its shim loaded before torch: the shim's libcudart.so.13 (13.2, carried
in the bundle) is then the process's, and torch's libraries bind to it by soname.
"""
import ctypes
import os
import sys

import raft_py

MAP_RUST = raft_py.rmm_map_address()  # loads the shim (and RMM) before torch

import torch  # noqa: E402


def check(name, ok, detail=""):
    print(f"RESULT {name} {'ok' if ok else 'FAILED'} {detail}".rstrip(), flush=True)
    if not ok:
        sys.exit(1)


def loaded(substr):
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if substr in line and "/" in line})


def test_one_rmm():
    # The shim the extension loaded, asked directly through ctypes (the same file: dlopen hands
    # back the loaded copy), and the extension's answer: one map.
    shims = loaded("libraftrs_shim.so")
    check("one_shim", len(shims) == 1, str(shims))
    shim = ctypes.CDLL(shims[0])
    out = ctypes.c_void_p()
    rc = shim.raftrs_rmm_map_address(ctypes.byref(out))
    check("rmm_map_address_both_sides", rc == 0 and out.value == MAP_RUST == raft_py.rmm_map_address(),
          f"python(ctypes)={out.value:#x} rust={MAP_RUST:#x}")
    rmm = loaded("librmm.so")
    check("one_librmm", len(rmm) == 1, str(rmm))
    print("INFO libcudart:", loaded("libcudart.so"), "libcublas:", loaded("libcublas.so"), flush=True)


def test_gemm_matches_torch():
    torch.manual_seed(0)
    for dtype, tol in [(torch.float32, 1e-4), (torch.float64, 1e-10), (torch.float16, 2e-2), (torch.bfloat16, 1e-1)]:
        for ta, tb in [(False, False), (True, False), (False, True), (True, True)]:
            m, k, n = 67, 129, 35
            a = torch.randn(k, m, device="cuda", dtype=dtype).t() if ta else torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype).t() if tb else torch.randn(k, n, device="cuda", dtype=dtype)
            c = torch.from_dlpack(raft_py.gemm(a, b))
            want = torch.matmul(a.double(), b.double())
            err = ((c.double() - want).abs().max() / want.abs().max()).item()
            check(f"gemm_{str(dtype)[6:]}_{'T' if ta else 'N'}{'T' if tb else 'N'}",
                  c.shape == (m, n) and c.dtype == dtype and c.is_contiguous() and err < tol, f"max rel err {err:.2e}")
    # The product is ordered on torch's current stream: used at once by torch, on a side stream too.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.randn(512, 512, device="cuda")
        c = torch.from_dlpack(raft_py.gemm(a, a))
        d = c + 0
    s.synchronize()
    check("gemm_on_a_side_stream", torch.allclose(d, a @ a, atol=1e-3, rtol=1e-4))


def test_no_copy():
    t = torch.arange(1000, device="cuda", dtype=torch.float32)
    check("import_no_copy", raft_py.address_of(t) == t.data_ptr(), f"{t.data_ptr():#x}")
    check("import_view_of_a_slice", raft_py.address_of(t[10:]) == t.data_ptr() + 40)
    r = raft_py.zeros(1000, "float16")
    ptr = r.data_ptr
    u = torch.from_dlpack(r)
    check("export_no_copy", u.data_ptr() == ptr and u.dtype == torch.float16 and u.shape == (1000,), f"{ptr:#x}")
    u += 1
    check("round_trip_back_in_no_copy", raft_py.address_of(u) == ptr)
    try:
        torch.from_dlpack(r)
        check("export_only_once", False)
    except BufferError:
        check("export_only_once", True)
    for dt, tdt in [("int8", torch.int8), ("uint8", torch.uint8), ("int32", torch.int32), ("int64", torch.int64), ("bfloat16", torch.bfloat16)]:
        x = torch.from_dlpack(raft_py.zeros(7, dt))
        check(f"export_{dt}", x.dtype == tdt and int(x.abs().sum()) == 0)
    try:
        raft_py.address_of(torch.zeros(4, 4, device="cuda")[:, ::2])
        check("refuses_strided", False)
    except ValueError as e:
        check("refuses_strided", "not contiguous" in str(e), str(e))


def test_no_leak():
    a = torch.randn(64, 64, device="cuda")
    for _ in range(100):  # warm: pools, handles, torch's caches
        torch.from_dlpack(raft_py.gemm(a, a)).sum()
    torch.cuda.synchronize()
    arrays0, torch0, free0 = raft_py.live_arrays(), torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    for i in range(10_000):
        c = torch.from_dlpack(raft_py.gemm(a, a))
        if i % 2:
            raft_py.address_of(c)  # back into raft_py and out again
        del c
        # Exported, never consumed: the capsule's destructor deletes it.
        raft_py.zeros(16).__dlpack__(stream=-1)
    torch.cuda.synchronize()
    arrays1, torch1, free1 = raft_py.live_arrays(), torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    check("no_leak_10000_exchanges", arrays1 == arrays0 and torch1 == torch0 and free0 - free1 < (64 << 20),
          f"live arrays {arrays0}->{arrays1}, torch allocated {torch0}->{torch1}, device free {free0}->{free1}")


def test_stream_argument_checked():
    """`__dlpack__(stream=...)` refuses what is no stream (0, other negatives than -1, small or
    unaligned values) with ValueError before touching the driver, and a refusal leaves the
    tensor with its object: the next consumer still gets it (helper-35's first and fifth
    findings: the value went to cuStreamWaitEvent as a handle, and a refusal dropped the array)."""
    t = raft_py.zeros(16)
    for bad in (0, -2, 0x10, 4097, (1 << 20) + 4):
        try:
            t.__dlpack__(stream=bad)
        except ValueError:
            continue
        check(f"stream_{bad}_refused", False, "accepted")
    x = torch.from_dlpack(t)
    torch.cuda.synchronize()
    check("stream_arguments_refused_and_the_tensor_kept", x.numel() == 16 and float(x.sum()) == 0.0, f"{x}")


def test_a_consumer_naming_no_stream_does_not_write_into_the_next_array():
    """A tensor taken with `__dlpack__()` (stream=None: the consumer works on the legacy default
    stream) or `__dlpack__(stream=-1)`, written by torch behind a second of sleep there and let
    go at once: the next raft_py array given the same block must read zeros. Before the
    seventeenth audit's fix the free was ordered after the consumer's stream only when the
    consumer named one, and torch's write landed in the next array (helper-77's finding)."""
    n = 1 << 24
    # The kernels loaded before the timed part (CUDA loads modules lazily: a first launch waits
    # for the load, which let the write land before the free on the code before the fix).
    warm = torch.empty(n, device="cuda")
    torch.cuda._sleep(1000)
    warm.fill_(1.0)
    torch.cuda.synchronize()
    del warm
    for stream in (None, -1):
        t = raft_py.zeros(n)
        old = t.data_ptr
        cap = t.__dlpack__() if stream is None else t.__dlpack__(stream=stream)
        x = torch.utils.dlpack.from_dlpack(cap)
        torch.cuda._sleep(2_000_000_000)  # about a second on torch's (legacy default) stream
        x.fill_(7.0)
        del x, cap, t
        z = raft_py.zeros(n)
        reused = z.data_ptr == old
        total = float(torch.from_dlpack(z).sum())
        torch.cuda.synchronize()
        check(f"no_stream_{stream}_the_pool_reissued_the_block", reused, f"{old:#x} -> {z.data_ptr:#x}")
        check(f"no_stream_{stream}_consumer_write_ordered_before_the_free", total == 0.0, f"sum {total}")


def test_from_dlpack_inside_a_graph_capture():
    """`torch.from_dlpack` of a raft_py tensor inside `torch.cuda.graph` (global capture mode):
    the export's order made the capturing stream wait for an event recorded outside the capture,
    which the driver refuses, invalidating the capture (the thirteenth audit). Now the host waits
    for the tensor's work instead: the capture ends, and its graph replays on the tensor's data.
    Last: a failed capture may leave torch's capture state behind."""
    a = torch.randn(256, 256, device="cuda")
    r = raft_py.gemm(a, a)
    want = 2 * (a @ a)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            x = torch.from_dlpack(r)
            out = x * 2
        g.replay()
        torch.cuda.synchronize()
        check("from_dlpack_inside_a_graph_capture", torch.allclose(out, want, atol=1e-2, rtol=1e-3))
    except Exception as e:  # noqa: BLE001 (the check reports whatever the capture raised)
        check("from_dlpack_inside_a_graph_capture", False, repr(e))


if __name__ == "__main__":
    print(f"INFO torch {torch.__version__}, device {torch.cuda.get_device_name()}, pid {os.getpid()}", flush=True)
    test_one_rmm()
    test_gemm_matches_torch()
    test_no_copy()
    test_no_leak()
    test_stream_argument_checked()
    test_a_consumer_naming_no_stream_does_not_write_into_the_next_array()
    test_from_dlpack_inside_a_graph_capture()
    print("RESULT all ok", flush=True)

"""raft_py's checks that need no GPU (run by CI on a machine without one, `.ci/run`):

A tensor that is not CUDA memory, or names a device below 0, is refused by its DLPack device
before any resources are made (the nineteenth audit: a host tensor made device 0's context and
resources first, and without a driver its refusal said "no CUDA driver").

    PYTHONPATH=<dir of raft_py.abi3.so> python3 crates/raft-py/tests/test_cpu.py
"""
import raft_py


class Producer:
    """An object that says where its tensor lives, and fails the test if asked for the tensor."""

    def __init__(self, kind, device):
        self.where = (kind, device)

    def __dlpack_device__(self):
        return self.where

    def __dlpack__(self, **_):
        raise AssertionError("the tensor was asked for before its device was refused")


def refused(kind, device):
    try:
        raft_py.gemm(Producer(kind, device), Producer(kind, device))
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        return e
    raise AssertionError(f"gemm of a tensor on ({kind}, {device}) was not refused")


def test_a_host_tensor_is_refused_before_any_resources_are_made():
    for kind in (1, 3):  # kDLCPU, kDLCUDAHost
        e = refused(kind, 0)
        assert isinstance(e, TypeError) and "not CUDA memory" in str(e), repr(e)


def test_a_device_below_zero_is_refused():
    e = refused(2, -1)  # kDLCUDA, device -1
    assert isinstance(e, ValueError) and "device -1" in str(e), repr(e)


if __name__ == "__main__":
    tests = [f for name, f in sorted(globals().items()) if name.startswith("test_")]
    for t in tests:
        t()
        print(f"ok {t.__name__}")
    print(f"RESULT all ok ({len(tests)} tests)")

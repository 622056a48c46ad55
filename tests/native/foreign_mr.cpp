// Memory resources installed by "another library": C++ beside this one that sets RMM's
// per-device resource itself, as a library linked into the same process would. Used by the tests
// of what the shim assumes of resources it did not make (`tests/tests/global_capture.rs`).
#include <rmm/cuda_device.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {

/// Makes `device` current on the calling thread and installs, as its RMM resource, a binning
/// resource over a fresh CUDA async pool with one bin of `cudaMalloc`/`cudaFree` for sizes up to
/// `bin_bytes` (`add_bin` with a bin resource: what a binning resource of another library may
/// hold). 0 when installed, 1 when the device could not be made current, 2 when RMM refused.
int raft_tests_install_foreign_binning(int device, std::size_t bin_bytes)
{
  try {
    if (cudaSetDevice(device) != cudaSuccess) { return 1; }
    static rmm::mr::cuda_memory_resource plain{};  // the bin's resource, alive to the exit
    rmm::mr::binning_memory_resource binning{rmm::mr::cuda_async_memory_resource{}};
    binning.add_bin(bin_bytes, rmm::device_async_resource_ref{plain});
    rmm::mr::set_per_device_resource(rmm::cuda_device_id{device},
                                     cuda::mr::any_resource<cuda::mr::device_accessible>{binning});
    return 0;
  } catch (...) {
    return 2;
  }
}

}  // extern "C"

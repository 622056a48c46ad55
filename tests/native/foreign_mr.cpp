// "Another library": C++ beside this one that sets RMM's per-device resource itself, or uses a
// raw cuBLAS handle, as a library linked into the same process would. Used by the tests of what
// the shim assumes of what it did not do (`tests/tests/global_capture.rs`, `backpressure.rs`).
#include <raft/core/resource/cublaslt_handle.hpp>
#include <raft/core/resources.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cublas_v2.h>
#include <cusolverDn.h>
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

/// RAFT's cuBLASLt handle of a lent `raft::resources` (what RAFT's `linalg::gemm` takes, and cuVS
/// through it), made on first use by the resources' factory; null when that failed.
void* raft_tests_cublaslt_handle(void* raft_resources)
{
  try {
    return raft::resource::get_cublaslt_handle(*static_cast<raft::resources*>(raft_resources));
  } catch (...) {
    return nullptr;
  }
}

/// Sets a cuBLAS handle's pointer mode to device (`device != 0`) or host, as a user of the raw
/// handle might; 0 on success.
int raft_tests_cublas_set_pointer_mode(void* handle, int device)
{
  return cublasSetPointerMode(static_cast<cublasHandle_t>(handle),
                              device != 0 ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST) == CUBLAS_STATUS_SUCCESS
           ? 0
           : 1;
}

/// A cuBLAS handle's stream and pointer mode (1: device, 0: host); 0 on success.
int raft_tests_cublas_state(void* handle, void** stream, int* device_pointers)
{
  auto h = static_cast<cublasHandle_t>(handle);
  cudaStream_t s{};
  cublasPointerMode_t mode{};
  if (cublasGetStream(h, &s) != CUBLAS_STATUS_SUCCESS || cublasGetPointerMode(h, &mode) != CUBLAS_STATUS_SUCCESS) { return 1; }
  *stream          = s;
  *device_pointers = mode == CUBLAS_POINTER_MODE_DEVICE ? 1 : 0;
  return 0;
}

/// Changes a cuBLAS handle's FP64 emulation settings as a user of the raw handle might: the
/// device address cuBLAS writes the mantissa bit count to (`bit_count`), and the largest
/// mantissa bit count (40); 0 on success.
int raft_tests_cublas_set_emulation(void* handle, void* bit_count)
{
  auto h = static_cast<cublasHandle_t>(handle);
  return cublasSetFixedPointEmulationMantissaBitCountPointer(h, static_cast<int*>(bit_count)) == CUBLAS_STATUS_SUCCESS &&
             cublasSetFixedPointEmulationMaxMantissaBitCount(h, 40) == CUBLAS_STATUS_SUCCESS
           ? 0
           : 1;
}

/// A cuBLAS handle's FP64 emulation settings: the bit count's device address and the largest
/// mantissa bit count; 0 on success.
int raft_tests_cublas_emulation(void* handle, void** bit_count, int* max_bits)
{
  auto h = static_cast<cublasHandle_t>(handle);
  int* p{};
  if (cublasGetFixedPointEmulationMantissaBitCountPointer(h, &p) != CUBLAS_STATUS_SUCCESS ||
      cublasGetFixedPointEmulationMaxMantissaBitCount(h, max_bits) != CUBLAS_STATUS_SUCCESS) {
    return 1;
  }
  *bit_count = p;
  return 0;
}

/// Sets a dense cuSOLVER handle's math mode to FP32 emulated through BF16x9 (`emulated != 0`)
/// or the default; 0 on success.
int raft_tests_cusolver_dn_set_math_mode(void* handle, int emulated)
{
  return cusolverDnSetMathMode(static_cast<cusolverDnHandle_t>(handle),
                               emulated != 0 ? CUSOLVER_FP32_EMULATED_BF16X9_MATH : CUSOLVER_DEFAULT_MATH) ==
             CUSOLVER_STATUS_SUCCESS
           ? 0
           : 1;
}

/// A dense cuSOLVER handle's math mode (1: emulated, 0: default), or -1 when it cannot be read.
int raft_tests_cusolver_dn_math_mode(void* handle)
{
  cusolverMathMode_t mode{};
  if (cusolverDnGetMathMode(static_cast<cusolverDnHandle_t>(handle), &mode) != CUSOLVER_STATUS_SUCCESS) { return -1; }
  return mode == CUSOLVER_FP32_EMULATED_BF16X9_MATH ? 1 : 0;
}

}  // extern "C"

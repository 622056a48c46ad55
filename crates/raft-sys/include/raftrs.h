/*
 * raftrs.h: the C face of the C++ shim over RAFT's resource layer and RMM.
 *
 * Every function is noexcept on the C++ side: a C++ exception is caught inside the shim and
 * becomes a status, with its message kept in a thread-local buffer that the caller reads with
 * raftrs_last_error() and clears with raftrs_clear_error() right after the failing call.
 * Nothing unwinds across this boundary.
 */
#ifndef RAFTRS_H
#define RAFTRS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */

/** Result of every fallible call: one of the RAFTRS_STATUS_* values. */
typedef int32_t raftrs_status;

#define RAFTRS_STATUS_OK 0
/** An allocation failed (rmm::out_of_memory, std::bad_alloc, cudaErrorMemoryAllocation). */
#define RAFTRS_STATUS_OUT_OF_MEMORY 1
/** A CUDA runtime, driver or library (cuBLAS, cuSOLVER, cuSPARSE) call failed. */
#define RAFTRS_STATUS_CUDA 2
/** Refused before reaching the GPU: a bad argument, a logic error in RAFT or RMM. */
#define RAFTRS_STATUS_LOGIC 3
/** Anything else. */
#define RAFTRS_STATUS_GENERIC 4

/** The message of the last failed call on this thread ("" when none). Valid until the next
 *  raftrs_ call on this thread. */
const char* raftrs_last_error(void);
/** Forgets the last message on this thread. */
void raftrs_clear_error(void);

/* ---- what the shim was compiled against -------------------------------------------------- */

/** Version macros and layout facts of the headers the shim was compiled against. */
typedef struct raftrs_build_info {
  int32_t raft_major;
  int32_t raft_minor;
  int32_t raft_patch;
  int32_t rmm_major;
  int32_t rmm_minor;
  int32_t rmm_patch;
  /** CCCL_VERSION, e.g. 3004003 for 3.4.3. */
  int32_t cccl_version;
  /** CUDART_VERSION, e.g. 13020 for 13.2. */
  int32_t cudart_version;
  /** sizeof(raft::device_resources). */
  size_t handle_size;
  /** sizeof(raft::resources). */
  size_t resources_size;
  /** RMM's inline ABI namespace, e.g. "_RMM_26_8" (NUL-terminated). */
  char rmm_abi_namespace[32];
} raftrs_build_info;

void raftrs_get_build_info(raftrs_build_info* out);

/** sizeof(raft::device_resources) in RAFT 26.08.00: the shim refuses to compile (a
 *  static_assert) against headers where the handle has another size. */
#define RAFTRS_EXPECTED_HANDLE_SIZE 32

/* ---- the CUDA runtime -------------------------------------------------------------------- */

/** cudaRuntimeGetVersion: the runtime actually loaded (works without a driver). */
raftrs_status raftrs_runtime_version(int32_t* out);
/** cudaDriverGetVersion: 0 when no driver is installed. */
raftrs_status raftrs_driver_version(int32_t* out);
/** cudaGetDeviceCount. */
raftrs_status raftrs_device_count(int32_t* out);
/** cudaGetDevice: the calling thread's current device. */
raftrs_status raftrs_current_device(int32_t* out);
/** cudaDevAttrMemoryPoolsSupported of a device (0 or 1). */
raftrs_status raftrs_device_memory_pools_supported(int32_t device, int32_t* out);
/** cudaMemcpyAsync with cudaMemcpyDefault on a stream of `device`. */
raftrs_status raftrs_memcpy_async(int32_t device, void* dst, const void* src, size_t bytes, void* stream);
/** cudaMemsetAsync on a stream of `device`. */
raftrs_status raftrs_memset_async(int32_t device, void* dst, int32_t value, size_t bytes, void* stream);

/* ---- raft::device_resources --------------------------------------------------------------- */

/** A raft::device_resources built on a stream the caller owns (and destroys after it). */
typedef struct raftrs_resources raftrs_resources;

#define RAFTRS_HANDLE_CUBLAS 0
#define RAFTRS_HANDLE_CUSOLVER_DN 1
#define RAFTRS_HANDLE_CUSOLVER_SP 2
#define RAFTRS_HANDLE_CUSPARSE 3

/** Builds raft::device_resources on `stream` for `device`; no handle is created yet. */
raftrs_status raftrs_resources_create(int32_t device, void* stream, raftrs_resources** out);
/** Destroys the resources and the handles they made (not the stream). */
raftrs_status raftrs_resources_destroy(raftrs_resources* res);
/** raft::resource::sync_stream: waits for the resources' stream. */
raftrs_status raftrs_resources_sync(raftrs_resources* res);
/** The resources' handle of one RAFTRS_HANDLE_* kind, created on first use on the resources'
 *  device and bound to its stream. */
raftrs_status raftrs_resources_handle(raftrs_resources* res, int32_t kind, void** out);
/** Whether RAFT already made the handle of that kind (1) or not yet (0). */
raftrs_status raftrs_resources_has_handle(raftrs_resources* res, int32_t kind, int32_t* out);

/* ---- RMM's per-device memory resource ----------------------------------------------------- */

/** RMM's initial cuda_memory_resource (cudaMalloc), or an equal one. */
#define RAFTRS_MR_CUDA 0
/** rmm::mr::cuda_async_memory_resource (cudaMallocAsync pool). */
#define RAFTRS_MR_CUDA_ASYNC 1
/** rmm::mr::managed_memory_resource (cudaMallocManaged). */
#define RAFTRS_MR_MANAGED 2
/** rmm::mr::statistics_resource_adaptor over another resource. */
#define RAFTRS_MR_STATISTICS 3
/** Anything else a user installed. */
#define RAFTRS_MR_OTHER 4

/** The kind of the device's current RMM resource (RAFTRS_MR_*). */
raftrs_status raftrs_mr_current(int32_t device, int32_t* out);
/** Installs a new resource of `kind` (CUDA, CUDA_ASYNC or MANAGED) as the device's current. */
raftrs_status raftrs_mr_set(int32_t device, int32_t kind);
/** Puts RMM's initial cuda_memory_resource back as the device's current. */
raftrs_status raftrs_mr_reset(int32_t device);
/** The default-resource rule: when the current resource equals RMM's initial
 *  cuda_memory_resource and the device supports memory pools, installs a
 *  cuda_async_memory_resource and sets *installed to 1; otherwise leaves it and sets 0. */
raftrs_status raftrs_mr_install_default(int32_t device, int32_t* installed);
/** Wraps the device's current resource in a statistics adaptor (no-op if it already is one). */
raftrs_status raftrs_mr_enable_statistics(int32_t device);
/** Bytes allocated now and at peak through the device's statistics adaptor. */
raftrs_status raftrs_mr_statistics(int32_t device, int64_t* current_bytes, int64_t* peak_bytes);

/** Bytes from the device's current RMM resource, on a stream (freed by the same resource). */
typedef struct raftrs_buffer raftrs_buffer;

/** Allocates `bytes` through the device's current RMM resource, stream-ordered on `stream`. */
raftrs_status raftrs_buffer_create(int32_t device, void* stream, size_t bytes, raftrs_buffer** out);
/** Frees the buffer stream-ordered on `stream`. */
raftrs_status raftrs_buffer_destroy(raftrs_buffer* buf, void* stream);
/** The buffer's device pointer. */
void* raftrs_buffer_data(raftrs_buffer* buf);
/** 1 when the resource that made the buffer frees stream-ordered without blocking (the async
 *  pool, or a statistics adaptor over it); 0 when freeing may wait (cudaFree synchronises). */
int32_t raftrs_buffer_stream_ordered(raftrs_buffer* buf);

/* ---- work through the resources' handles -------------------------------------------------- */

/** Column-major C = alpha * op(A) * op(B) + beta * C through the resources' cuBLAS handle,
 *  on its stream (cublasSgemm). trans_*: 0 = N, 1 = T. */
raftrs_status raftrs_gemm_f32(raftrs_resources* res, int32_t trans_a, int32_t trans_b, int64_t m,
                              int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
/** The same in double precision (cublasDgemm). */
raftrs_status raftrs_gemm_f64(raftrs_resources* res, int32_t trans_a, int32_t trans_b, int64_t m,
                              int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                              const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif /* RAFTRS_H */

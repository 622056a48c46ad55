/*
 * raftrs.h: the C face of the C++ shim over RAFT's resource layer and RMM.
 *
 * Every function is noexcept on the C++ side: a C++ exception is caught inside the shim and
 * becomes a status, with its message kept in a thread-local buffer that the caller reads with
 * raftrs_last_error() and clears with raftrs_clear_error() right after the failing call.
 * Nothing unwinds across this boundary.
 *
 * The shim is a shared object (libraftrs_shim.so) that Rust loads at first use: a binary has no
 * load-time dependency on RAFT, RMM or CUDA, and one whose stack is missing still starts.
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
 *  raftrs_ call on this thread. The buffer is a plain thread-local array (no destructor): it
 *  stays valid while threads and the process exit. */
const char* raftrs_last_error(void);
/** Forgets the last message on this thread. */
void raftrs_clear_error(void);

/* ---- which header the shim was compiled from --------------------------------------------- */

/** A hash of this header's text (FNV-1a, 64 bits) as it was when the shim was built: the loader
 *  refuses a shim whose functions were declared differently from the bindings it calls them
 *  through. Takes no argument and makes no call: safe to call before anything else. */
uint64_t raftrs_header_hash(void);

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

/** Which build of librmm.so: the GNU build-id (lower-case hex, empty: none) of the one the shim
 *  was linked against at build time, and of the one mapped in this process now, with its path
 *  (empty: none mapped under a librmm.so name). A librmm of the same release but another build
 *  (another package, a rebuild) may lay out what the shim's inline RMM code reads otherwise. */
typedef struct raftrs_librmm_identity {
  char linked[72];
  char mapped[72];
  char mapped_path[1024];
} raftrs_librmm_identity;

void raftrs_get_librmm_identity(raftrs_librmm_identity* out);

/** sizeof(raft::device_resources) in RAFT 26.08.00: the shim refuses to compile (a
 *  static_assert) against headers where the handle has another size. */
#define RAFTRS_EXPECTED_HANDLE_SIZE 32

/* ---- the CUDA runtime -------------------------------------------------------------------- */

/** cudaRuntimeGetVersion: the runtime actually loaded (works without a driver). */
raftrs_status raftrs_runtime_version(int32_t* out);
/** cudaDriverGetVersion: 0 when no driver is installed. */
raftrs_status raftrs_driver_version(int32_t* out);
/** cudaGetDeviceCount; 0 (not an error) when a driver is there but no device. */
raftrs_status raftrs_device_count(int32_t* out);
/** cudaGetDevice: the calling thread's current device. */
raftrs_status raftrs_current_device(int32_t* out);
/** Tells the shim that `context` is `device`'s primary context and stays retained for the life
 *  of the process (the Rust side retains each device's once, for good): a call that must run on
 *  `device` and finds that context current then switches nothing and asks the runtime nothing
 *  (one driver read instead of three calls). A device outside [0, 64) is ignored. */
raftrs_status raftrs_note_primary_context(int32_t device, void* context);
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

/** Destroys the library handles (cuBLAS, cuBLASLt, cuSOLVER, cuSPARSE) that released resources of `device`
 * left to be reused (a handle is otherwise never destroyed while the process runs: destroying
 * one synchronises the device, which invalidates another thread's stream capture). For the
 * out-of-memory path. `*destroyed`: how many. */
raftrs_status raftrs_handles_trim(int32_t device, int32_t* destroyed);

/** Builds raft::device_resources on `stream` for `device`; no handle is created yet. */
raftrs_status raftrs_resources_create(int32_t device, void* stream, raftrs_resources** out);
/** Destroys the resources (not the stream); the handles they made are kept for later resources of
 *  the device (see raftrs_handles_trim). */
raftrs_status raftrs_resources_destroy(raftrs_resources* res);
/** raft::resource::sync_stream: waits for the resources' stream. */
raftrs_status raftrs_resources_sync(raftrs_resources* res);
/** The resources' handle of one RAFTRS_HANDLE_* kind, created on first use on the resources'
 *  device and bound to its stream. */
raftrs_status raftrs_resources_handle(raftrs_resources* res, int32_t kind, void** out);
/** The `raft::resources*` (base of the raft::device_resources) behind `res`, for C and C++ code
 *  that takes RAFT's resources (cuVS's cuvsResources_t, RAFT's comms). The checked handle
 *  factories are installed first, so RAFT code reaching the handles through it gets an error,
 *  never an uninitialised handle. Valid until the resources are destroyed. */
raftrs_status raftrs_resources_native(raftrs_resources* res, void** out);
/** Whether RAFT already made the handle of that kind (1) or not yet (0). */
raftrs_status raftrs_resources_has_handle(raftrs_resources* res, int32_t kind, int32_t* out);

/* ---- RMM memory resources, owned ------------------------------------------------------- */

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
/** rmm::mr::pool_memory_resource (a coalescing pool over an upstream). */
#define RAFTRS_MR_POOL 5
/** rmm::mr::arena_memory_resource (per-thread arenas over an upstream). */
#define RAFTRS_MR_ARENA 6
/** rmm::mr::binning_memory_resource (fixed-size bins, larger sizes from the upstream). */
#define RAFTRS_MR_BINNING 7
/** rmm::mr::limiting_resource_adaptor (refuses past a byte limit). */
#define RAFTRS_MR_LIMITING 8
/** rmm::mr::tracking_resource_adaptor (remembers every live allocation). */
#define RAFTRS_MR_TRACKING 9
/** rmm::mr::logging_resource_adaptor (RMM's CSV log of every allocation and free). */
#define RAFTRS_MR_LOGGING 10
/** rmm::mr::failure_callback_resource_adaptor (a callback decides whether to retry). */
#define RAFTRS_MR_FAILURE_CALLBACK 11
/** rmm::mr::thread_safe_resource_adaptor (a mutex around the upstream). */
#define RAFTRS_MR_THREAD_SAFE 12
/** rmm::mr::pinned_host_memory_resource (page-locked host memory the device can reach). */
#define RAFTRS_MR_PINNED_HOST 13

/** One RMM device memory resource, owned: a cuda::mr::any_resource<device_accessible> holding a
 *  copy of the resource. RMM 26.08's stateful resources (pools, adaptors) are shared handles, so
 *  a copy shares the very same pool; the stateless ones (cuda, managed) are interchangeable.
 *  Every raftrs_mr and every buffer made from one keeps the resource alive. */
typedef struct raftrs_mr raftrs_mr;

/** A new handle to `device`'s current RMM resource (a shared copy of RMM's per-device entry,
 *  taken under RMM's own lock). Fails when the current resource cannot be shared (its copy does
 *  not compare equal to it). */
raftrs_status raftrs_mr_current(int32_t device, raftrs_mr** out);
/** Makes (a shared copy of) `mr` the current resource of its device; `*previous` receives the
 *  resource it replaced (pass NULL to drop it: buffers made from it keep it alive). */
raftrs_status raftrs_mr_set_current(const raftrs_mr* mr, raftrs_mr** previous);
/** Puts RMM's initial cuda_memory_resource back as `device`'s current; `*previous` as above. */
raftrs_status raftrs_mr_reset_current(int32_t device, raftrs_mr** previous);
/** The default-resource rule: when the current resource equals RMM's initial
 *  cuda_memory_resource and the device supports memory pools, installs a
 *  cuda_async_memory_resource and sets *installed to 1; otherwise leaves it and sets 0. */
raftrs_status raftrs_mr_install_default(int32_t device, int32_t* installed);
/** A new resource of `kind` (CUDA, CUDA_ASYNC or MANAGED) made on `device`. */
raftrs_status raftrs_mr_new(int32_t device, int32_t kind, raftrs_mr** out);
/** A statistics_resource_adaptor over (a shared copy of) `upstream`, on its device. */
raftrs_status raftrs_mr_new_statistics(const raftrs_mr* upstream, raftrs_mr** out);
/** A new rmm::mr::pinned_host_memory_resource for `device`. */
raftrs_status raftrs_mr_new_pinned_host(int32_t device, raftrs_mr** out);
/** A new cuda_async_memory_resource on `device`; a negative size means "RMM's default". */
raftrs_status raftrs_mr_new_cuda_async(int32_t device, int64_t initial_pool_size, int64_t release_threshold, raftrs_mr** out);
/** pool_memory_resource over `upstream`: `initial` bytes first (negative: RMM's default, half the
 *  free memory), growing up to `maximum` (negative: no maximum). */
raftrs_status raftrs_mr_new_pool(const raftrs_mr* upstream, int64_t initial, int64_t maximum, raftrs_mr** out);
/** arena_memory_resource over `upstream` (`arena_size` negative: RMM's default). */
raftrs_status raftrs_mr_new_arena(const raftrs_mr* upstream, int64_t arena_size, raftrs_mr** out);
/** binning_memory_resource over `upstream` with bins of 2^min_exponent .. 2^max_exponent bytes,
 *  0 <= min <= max <= 30 (RMM makes each bin size as the int `1 << exponent`). */
raftrs_status raftrs_mr_new_binning(const raftrs_mr* upstream, int32_t min_exponent, int32_t max_exponent, raftrs_mr** out);
/** limiting_resource_adaptor over `upstream`, refusing past `limit` bytes (as out of memory). */
raftrs_status raftrs_mr_new_limiting(const raftrs_mr* upstream, size_t limit, raftrs_mr** out);
/** tracking_resource_adaptor over `upstream`. */
raftrs_status raftrs_mr_new_tracking(const raftrs_mr* upstream, raftrs_mr** out);
/** thread_safe_resource_adaptor over `upstream`. */
raftrs_status raftrs_mr_new_thread_safe(const raftrs_mr* upstream, raftrs_mr** out);
/** logging_resource_adaptor over `upstream`, writing RMM's CSV log to `path` (flushed on every
 *  event when `auto_flush` is 1). */
raftrs_status raftrs_mr_new_logging(const raftrs_mr* upstream, const char* path, int32_t auto_flush, raftrs_mr** out);

/** Called when an allocation of `bytes` failed for lack of memory: return 1 to retry, 0 to give
 *  up (the allocation then fails as out of memory). Must not unwind. */
typedef int32_t (*raftrs_failure_callback)(size_t bytes, void* arg);
/** Releases a callback's `arg` when the adaptor holding it goes. */
typedef void (*raftrs_drop_arg)(void* arg);
/** failure_callback_resource_adaptor over `upstream`; the adaptor owns `arg` (dropped with
 *  `drop_arg` when its last copy goes, also when this call fails). */
raftrs_status raftrs_mr_new_failure_callback(const raftrs_mr* upstream,
                                             raftrs_failure_callback callback,
                                             void* arg,
                                             raftrs_drop_arg drop_arg,
                                             raftrs_mr** out);

/** Live allocations through a tracking adaptor: their count and bytes. */
raftrs_status raftrs_mr_tracking(const raftrs_mr* mr, size_t* count, size_t* bytes);
/** RMM's text report of the live allocations of a tracking adaptor, copied into `buf` (at most
 *  `capacity` bytes, NUL-terminated); `*needed` gets the report's full length + 1. */
raftrs_status raftrs_mr_tracking_report(const raftrs_mr* mr, char* buf, size_t capacity, size_t* needed);
/** Bytes allocated through a limiting adaptor, and its limit. */
raftrs_status raftrs_mr_limits(const raftrs_mr* mr, size_t* allocated, size_t* limit);
/** Counts of a statistics adaptor: allocations now, at peak, and in all. */
raftrs_status raftrs_mr_statistics_counts(const raftrs_mr* mr, int64_t* current, int64_t* peak, int64_t* total);
/** Total bytes ever allocated through a statistics adaptor. */
raftrs_status raftrs_mr_statistics_total_bytes(const raftrs_mr* mr, int64_t* total);
/** Another handle to the same resource. */
raftrs_status raftrs_mr_clone(const raftrs_mr* mr, raftrs_mr** out);
/** Drops this handle; the resource goes when its last handle and buffer have. */
raftrs_status raftrs_mr_destroy(raftrs_mr* mr);
/** Registers the function called when the last copy of a pool, arena or binning resource goes
 *  on a thread that must not wait while frees into it are still queued on some stream: the
 *  resource is kept, and `hook` (given its device) should get raftrs_mr_drain_deferred called on a thread that
 *  may wait. Without a hook the last copy waits where it goes. */
raftrs_status raftrs_mr_on_deferred(void (*hook)(int32_t device));
/** Waits for the streams that freed into each deferred resource, then destroys it (on its
 *  device). `drained` is how many went. */
raftrs_status raftrs_mr_drain_deferred(uint64_t* drained);
/** CUDA async pools this shim made: created with cudaMemPoolCreate, retired (their last copy
 *  (handle, buffer, adaptor or RMM map entry) gone) and reused, since the process started. A
 *  retired pool is never destroyed (the driver must not see a pool destroyed while a free into it
 *  is still queued on a stream that goes on working): its memory goes back to the driver and the
 *  next async pool made on its device is that pool again. */
raftrs_status raftrs_mr_async_pools(uint64_t* made, uint64_t* retired, uint64_t* reused);
/** The CUDA async pool behind `mr` (itself, or the upstream of its adaptors): the bytes it has
 *  reserved from the driver and the bytes in use (`found` 0, and zeros, when there is none). */
raftrs_status raftrs_mr_async_pool_bytes(const raftrs_mr* mr, int32_t* found, uint64_t* reserved, uint64_t* used);
/** Gives the unused memory of every retired async pool back to the driver now (no wait):
 *  `released` is the bytes they hold less, `held` what they still hold (memory whose
 *  stream-ordered free has not run yet). Every pool is tried; the first failure is returned. */
raftrs_status raftrs_mr_trim_retired(uint64_t* released, uint64_t* held);
/** The RAFTRS_MR_* kind of the resource. */
raftrs_status raftrs_mr_kind(const raftrs_mr* mr, int32_t* out);
/** The device the resource was made for. */
raftrs_status raftrs_mr_device(const raftrs_mr* mr, int32_t* out);
/** 1 when memory from one can be freed by the other (RMM's resource equality), else 0. */
raftrs_status raftrs_mr_equal(const raftrs_mr* a, const raftrs_mr* b, int32_t* out);
/** Bytes allocated now and at peak through a statistics adaptor (a Logic error for another kind). */
raftrs_status raftrs_mr_statistics(const raftrs_mr* mr, int64_t* current_bytes, int64_t* peak_bytes);
/** Gives the unused memory of the CUDA async pool behind `mr` (the device's current resource
 *  when null, looking through adaptors) back to the driver (cudaMemPoolTrimTo(pool, 0));
 *  `trimmed` is 1 when there was such a pool, else 0. */
raftrs_status raftrs_mr_trim_async(int32_t device, const raftrs_mr* mr, int32_t* trimmed);
/** The address of RMM's per-device resource map as this shim binds it
 *  (rmm::mr::detail::get_ref_map()): one process, one address, when every library shares it. */
raftrs_status raftrs_rmm_map_address(void** out);

/** Device bytes from an RMM resource, on a stream; the buffer keeps its resource alive. */
typedef struct raftrs_buffer raftrs_buffer;

/** Allocates `bytes` on `stream` from `mr`, or from `device`'s current resource when `mr` is
 *  NULL (the buffer then holds a shared copy of it). `*data` receives the device pointer and
 *  `*stream_ordered` 1 when the resource frees stream-ordered without blocking (the async pool,
 *  RMM's pools, or adaptors over them), 0 when freeing may wait (cudaFree synchronises).
 *  Before any CUDA call, a size within 4096 bytes of SIZE_MAX (RMM's rounding would wrap) is
 *  RAFTRS_STATUS_LOGIC and a size over 2^48 bytes RAFTRS_STATUS_OUT_OF_MEMORY. */
raftrs_status raftrs_buffer_create(int32_t device,
                                   const raftrs_mr* mr,
                                   void* stream,
                                   size_t bytes,
                                   raftrs_buffer** out,
                                   void** data,
                                   int32_t* stream_ordered);
/** Frees the buffer stream-ordered on `stream`, through the resource that made it. */
raftrs_status raftrs_buffer_destroy(raftrs_buffer* buf, void* stream);
/** raftrs_buffer_destroy, naming the handle that keeps `stream` alive (a non-NULL `stream`
 *  only): a pool, arena or binning resource freed into may then take a reference to the stream
 *  (through the functions of raftrs_buffer_on_streams) instead of recording an event at every
 *  free, and records once when it lets the stream go. */
raftrs_status raftrs_buffer_free(raftrs_buffer* buf, void* stream, const void* stream_owner);
/** Registers (once; later calls are ignored) how a stream's keeping handle is taken (`retain`),
 *  dropped (`release`: the last one destroys the stream) and asked whether the caller's is the
 *  only one left (`sole`: 1 or 0). None may unwind. */
raftrs_status raftrs_buffer_on_streams(void (*retain)(const void*),
                                       void (*release)(const void*),
                                       int32_t (*sole)(const void*));
/** Lets device `peer` access the buffer's memory where it comes from a CUDA async pool
 *  (cudaMemPoolSetAccess on the pool, unless cudaMemPoolGetAccess says it has it): peer copies then go over the
 *  devices' link instead of through the host. `granted` is 1 for such a pool, else 0. */
raftrs_status raftrs_buffer_grant_peer(const raftrs_buffer* buf, int32_t peer, int32_t* granted);

/** Allocates `bytes` on `stream` from `mr` without a buffer record (issue 30: no heap object per
 *  allocation): the caller keeps the block's pointer and size and keeps `mr` alive until it frees
 *  the block with raftrs_mr_deallocate_held. With `current` set, `mr` (may be NULL) is the
 *  caller's copy of `device`'s current resource, used while it compares equal to the entry of
 *  RMM's per-device map (read under RMM's lock); otherwise a copy of the entry is made, used, and
 *  returned in `*fresh`, which the caller owns (raftrs_mr_destroy), keeps alive until the free and
 *  frees the block through. `*fresh` is NULL when `mr` was used. `*data` is NULL for 0 bytes
 *  (nothing is allocated); sizes and `*stream_ordered` as raftrs_buffer_create.
 *  `capture_may_begin` is NULL or a flag of the caller's, read (acquire) before and again after
 *  the allocation: while it reads 0, the caller vouches that no CUDA graph capture of `stream` can
 *  have begun (the stream's handle never left the caller, and the stream never waited for work
 *  a capture could have recorded) and the stream is not asked; otherwise (and for NULL) it is
 *  asked before (a capturing stream is refused) and after (through a resource a capture can
 *  take, a capture begun meanwhile stops the process), as raftrs_buffer_create does. */
raftrs_status raftrs_mr_allocate_held(int32_t device,
                                     const raftrs_mr* mr,
                                     int32_t current,
                                     void* stream,
                                     size_t bytes,
                                     void** data,
                                     int32_t* stream_ordered,
                                     raftrs_mr** fresh,
                                     const uint8_t* capture_may_begin);
/** Frees `bytes` at `data` (from raftrs_mr_allocate_held through `mr`, or through the `*fresh` it
 *  returned, passed here as `mr`) stream-ordered on `stream`, on `mr`'s device; `stream_owner` as
 *  raftrs_buffer_free. A NULL `data` frees nothing. `capture_may_begin` as for
 *  raftrs_mr_allocate_held: the stream is asked before (a capturing stream keeps the block) and
 *  after the free unless the flag reads 0. */
raftrs_status raftrs_mr_deallocate_held(
  const raftrs_mr* mr, void* stream, const void* stream_owner, void* data, size_t bytes, const uint8_t* capture_may_begin);
/** raftrs_buffer_grant_peer for memory of `mr`. */
raftrs_status raftrs_mr_grant_peer(const raftrs_mr* mr, int32_t peer, int32_t* granted);

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

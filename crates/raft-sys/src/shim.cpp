// The C++ shim: RAFT's resource layer and RMM's per-device memory resources behind the C header
// raftrs.h. Every entry point runs inside guard(), which turns any C++ exception into a status
// and a thread-local message: nothing unwinds into Rust.

#include "raftrs.h"
#include "fence.hpp"

#include <raft/core/device_resources.hpp>
#include <raft/core/resource/cublas_handle.hpp>
#include <raft/core/resource/cusolver_dn_handle.hpp>
#include <raft/core/resource/cusolver_sp_handle.hpp>
#include <raft/core/resource/cusparse_handle.hpp>
#include <raft/core/resource/device_id.hpp>
#include <raft/core/resource/resource_types.hpp>
#include <raft/version_config.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/failure_callback_resource_adaptor.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/logging_resource_adaptor.hpp>
#include <rmm/mr/managed_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/pinned_host_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/mr/thread_safe_resource_adaptor.hpp>
#include <rmm/mr/tracking_resource_adaptor.hpp>
#include <rmm/process_is_exiting.hpp>
#include <rmm/version_config.hpp>

#include <cublas_v2.h>
#include <cuda/std/version>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

static_assert(sizeof(raft::device_resources) == RAFTRS_EXPECTED_HANDLE_SIZE,
              "raft::device_resources changed size: RAFT's handle layout moved under this binding. "
              "Update RAFTRS_EXPECTED_HANDLE_SIZE and the committed ABI tag (cargo xtask abi-check --bless) "
              "only after checking the new layout.");

namespace {

// A plain array, not a std::string: glibc runs thread-local destructors before the exit
// handlers, so a std::string here would be destroyed while the exit teardown still calls the
// shim. An array has no destructor and stays valid to the end of the thread and the process.
constexpr std::size_t last_error_size = 2048;
thread_local char last_error[last_error_size];

raftrs_status fail(raftrs_status status, char const* what) noexcept
{
  std::size_t n = std::strlen(what);
  if (n >= last_error_size) { n = last_error_size - 1; }
  std::memcpy(last_error, what, n);
  last_error[n] = '\0';
  return status;
}

/// Whether a library's failure text says an allocation failed (RAFT reports cuBLAS, cuSOLVER
/// and cuSPARSE statuses by name in its exceptions).
bool says_alloc_failed(char const* what) noexcept
{
  return std::strstr(what, "STATUS_ALLOC_FAILED") != nullptr ||
         std::strstr(what, "cudaErrorMemoryAllocation") != nullptr;
}

/// A CUDA runtime call that failed: the status, and a message saying in words what failed
/// with the CUDA error's name ("counting the devices failed: cudaErrorNoDevice: …").
struct cuda_failure : std::runtime_error {
  cudaError_t code;
  cuda_failure(cudaError_t c, char const* doing)
    : std::runtime_error(std::string(doing) + " failed: " + cudaGetErrorName(c) + ": " + cudaGetErrorString(c)),
      code(c)
  {
  }
};

/// `doing` says in words what the call was for; the message never shows C expressions.
void check(cudaError_t code, char const* doing)
{
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw cuda_failure(code, doing);
  }
}

/// A cuBLAS call that failed (OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED, via guard()).
void check_cublas(cublasStatus_t status, char const* doing)
{
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw raft::cublas_error(std::string(doing) + " failed: " + cublasGetStatusName(status) + ": " +
                             cublasGetStatusString(status));
  }
}

/// Runs `body`, mapping every exception to one of the four status kinds.
template <typename F>
raftrs_status guard(F&& body) noexcept
{
  try {
    body();
    return RAFTRS_STATUS_OK;
  } catch (cuda_failure const& e) {
    bool oom = e.code == cudaErrorMemoryAllocation;
    return fail(oom ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (rmm::out_of_memory const& e) {
    return fail(RAFTRS_STATUS_OUT_OF_MEMORY, e.what());
  } catch (rmm::bad_alloc const& e) {
    // RMM throws bad_alloc for any failed cudaMalloc*, also one that failed because the context
    // is broken (a kernel fault): out of memory only when CUDA said so.
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (std::bad_alloc const& e) {
    return fail(RAFTRS_STATUS_OUT_OF_MEMORY, e.what());
  } catch (raft::cuda_error const& e) {
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cublas_error const& e) {
    // A handle's creation is the library's likeliest allocation: ~65 MiB of device memory.
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cusolver_error const& e) {
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cusparse_error const& e) {
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (rmm::cuda_error const& e) {
    return fail(says_alloc_failed(e.what()) ? RAFTRS_STATUS_OUT_OF_MEMORY : RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::logic_error const& e) {
    return fail(RAFTRS_STATUS_LOGIC, e.what());
  } catch (std::logic_error const& e) {
    // rmm::logic_error, rmm::invalid_argument and rmm::out_of_range derive from it.
    return fail(RAFTRS_STATUS_LOGIC, e.what());
  } catch (std::exception const& e) {
    return fail(RAFTRS_STATUS_GENERIC, e.what());
  } catch (...) {
    return fail(RAFTRS_STATUS_GENERIC, "an unknown C++ exception");
  }
}

/// Primary contexts the Rust side retains for the life of the process, by device (see
/// raftrs_note_primary_context): a handle here stays valid and belongs to its device.
constexpr int noted_primaries_max = 64;
std::atomic<void*> noted_primaries[noted_primaries_max]{};

void* noted_primary(int device)
{
  return device >= 0 && device < noted_primaries_max ? noted_primaries[device].load(std::memory_order_acquire) : nullptr;
}

/// Makes `device` current for the calling thread and puts back on exit the exact context that
/// was current before (or none): RAFT creates handles on whichever device is current at their
/// first use, and a thread may have switched devices since the resources were made. Putting
/// back "device 0" instead of "no context" would create device 0's context in a process that
/// only uses device 1 (one rank per GPU), which run 21 saw fail.
class device_scope {
 public:
  explicit device_scope(int device) : device_{device}
  {
    auto const* d = driver_ctx_api();
    void* ctx     = nullptr;
    if (d != nullptr && d->get(&ctx) == 0) {
      saved_ctx_ = true;
      previous_  = ctx;
      // Already on the device's primary context (the common case): nothing to switch or ask.
      if (ctx != nullptr && ctx == noted_primary(device)) { return; }
    }
    // With a context bound, the runtime reports its device; with none, its answer is only its
    // default (0), and the thread must be switched whatever the device.
    if (!saved_ctx_ || previous_ != nullptr) {
      int current = -1;
      check(cudaGetDevice(&current), "reading the current device");
      if (current == device) { return; }
      if (!saved_ctx_) { previous_device_ = current; }
    }
    check(cudaSetDevice(device), "making the device current");
    switched_ = true;
  }
  ~device_scope()
  {
    if (!switched_) { return; }
    if (!saved_ctx_) {
      cudaSetDevice(previous_device_);
    } else if (previous_ != nullptr) {
      driver_ctx_api()->set(previous_);
    } else if (device_ != 0) {
      // A thread that had no context: where device 0's primary context exists, the thread is
      // put back on it (what the runtime binds to such a thread on its first call anyway), so
      // its runtime device is 0 again. Where it does not (a rank that only uses device 1), the
      // thread gets "none" back and device 0 is never woken; the runtime then remembers
      // `device_` as the thread's device, which binds nothing until the thread's next runtime
      // call. Switched to device 0, the thread simply keeps device 0's primary context.
      auto const* d = driver_ctx_api();
      if (!(device_zero_active(d) && cudaSetDevice(0) == cudaSuccess)) { d->set(nullptr); }
    }
  }
  device_scope(device_scope const&)            = delete;
  device_scope& operator=(device_scope const&) = delete;

 private:
  /// The driver's context calls, looked up once through the runtime (which has loaded the
  /// driver); null where the runtime cannot give them (then the runtime's device is restored).
  struct driver_ctx {
    using get_fn   = int (*)(void**);
    using set_fn   = int (*)(void*);
    using dev_fn   = int (*)(int*, int);
    using state_fn = int (*)(int, unsigned int*, int*);
    get_fn get;
    set_fn set;
    dev_fn device_get;
    state_fn primary_state;
  };
  /// Whether device 0's primary context is active (made, and not released).
  static bool device_zero_active(driver_ctx const* d)
  {
    int dev = 0, active = 0;
    unsigned int flags = 0;
    return d->device_get(&dev, 0) == 0 && d->primary_state(dev, &flags, &active) == 0 && active != 0;
  }
  static driver_ctx const* driver_ctx_api()
  {
    static driver_ctx const* const api = []() -> driver_ctx const* {
      void* fns[4]             = {};
      char const* const names[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGet", "cuDevicePrimaryCtxGetState"};
      for (int i = 0; i < 4; ++i) {
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion(names[i], &fns[i], 12000, cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess || fns[i] == nullptr) {
          cudaGetLastError();
          return nullptr;
        }
      }
      return new driver_ctx{reinterpret_cast<driver_ctx::get_fn>(fns[0]),
                            reinterpret_cast<driver_ctx::set_fn>(fns[1]),
                            reinterpret_cast<driver_ctx::dev_fn>(fns[2]),
                            reinterpret_cast<driver_ctx::state_fn>(fns[3])};
    }();
    return api;
  }
  void* previous_{nullptr};
  int device_{0};
  int previous_device_{0};
  bool saved_ctx_{false};
  bool switched_{false};
};

raft::resource::resource_type handle_type(int32_t kind)
{
  switch (kind) {
    case RAFTRS_HANDLE_CUBLAS: return raft::resource::resource_type::CUBLAS_HANDLE;
    case RAFTRS_HANDLE_CUSOLVER_DN: return raft::resource::resource_type::CUSOLVER_DN_HANDLE;
    case RAFTRS_HANDLE_CUSOLVER_SP: return raft::resource::resource_type::CUSOLVER_SP_HANDLE;
    case RAFTRS_HANDLE_CUSPARSE: return raft::resource::resource_type::CUSPARSE_HANDLE;
    default: throw std::invalid_argument("unknown handle kind " + std::to_string(kind));
  }
}

/// A library handle made for RAFT's resources, created eagerly in the constructor, which throws
/// when the library refuses. RAFT 26.08's own handle resources only log a failed create (and
/// then hand out an uninitialised handle); through these, a failed create reaches the caller as
/// an error (`*_STATUS_ALLOC_FAILED`: out of memory) and nothing is cached, so a later call may
/// try again.
template <typename Handle, typename Status, Status Success, typename Traits>
class checked_handle final : public raft::resource::resource {
 public:
  explicit checked_handle(rmm::cuda_stream_view stream)
  {
    auto created = Traits::create(&handle_);
    if (created != Success) { Traits::fail("creating", created); }
    auto bound = Traits::set_stream(handle_, stream.value());
    if (bound != Success) {
      Traits::destroy(handle_);
      Traits::fail("binding to the resources' stream", bound);
    }
  }
  ~checked_handle() override { Traits::destroy(handle_); }
  checked_handle(checked_handle const&)            = delete;
  checked_handle& operator=(checked_handle const&) = delete;
  void* get_resource() override { return &handle_; }

 private:
  Handle handle_{};
};

template <typename Resource>
class checked_factory final : public raft::resource::resource_factory {
 public:
  checked_factory(raft::resource::resource_type type, rmm::cuda_stream_view stream) : type_(type), stream_(stream) {}
  raft::resource::resource_type get_resource_type() override { return type_; }
  raft::resource::resource* make_resource() override { return new Resource(stream_); }

 private:
  raft::resource::resource_type type_;
  rmm::cuda_stream_view stream_;
};

struct cublas_traits {
  static cublasStatus_t create(cublasHandle_t* h) { return cublasCreate(h); }
  static cublasStatus_t set_stream(cublasHandle_t h, cudaStream_t s) { return cublasSetStream(h, s); }
  static void destroy(cublasHandle_t h) { cublasDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cublasStatus_t st)
  {
    throw raft::cublas_error(std::string(doing) + " the cuBLAS handle failed: " + cublasGetStatusName(st) + ": " +
                             cublasGetStatusString(st));
  }
};

/// cuSOLVER has no status-name function: the names that matter, and the number otherwise.
std::string cusolver_status_name(cusolverStatus_t st)
{
  switch (st) {
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    default: return "cusolverStatus " + std::to_string(static_cast<int>(st));
  }
}

struct cusolver_dn_traits {
  static cusolverStatus_t create(cusolverDnHandle_t* h) { return cusolverDnCreate(h); }
  static cusolverStatus_t set_stream(cusolverDnHandle_t h, cudaStream_t s) { return cusolverDnSetStream(h, s); }
  static void destroy(cusolverDnHandle_t h) { cusolverDnDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusolverStatus_t st)
  {
    throw raft::cusolver_error(std::string(doing) + " the dense cuSOLVER handle failed: " + cusolver_status_name(st));
  }
};

struct cusolver_sp_traits {
  static cusolverStatus_t create(cusolverSpHandle_t* h) { return cusolverSpCreate(h); }
  static cusolverStatus_t set_stream(cusolverSpHandle_t h, cudaStream_t s) { return cusolverSpSetStream(h, s); }
  static void destroy(cusolverSpHandle_t h) { cusolverSpDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusolverStatus_t st)
  {
    throw raft::cusolver_error(std::string(doing) + " the sparse cuSOLVER handle failed: " + cusolver_status_name(st));
  }
};

struct cusparse_traits {
  static cusparseStatus_t create(cusparseHandle_t* h) { return cusparseCreate(h); }
  static cusparseStatus_t set_stream(cusparseHandle_t h, cudaStream_t s) { return cusparseSetStream(h, s); }
  static void destroy(cusparseHandle_t h) { cusparseDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusparseStatus_t st)
  {
    throw raft::cusparse_error(std::string(doing) + " the cuSPARSE handle failed: " + cusparseGetErrorName(st) + ": " +
                               cusparseGetErrorString(st));
  }
};

using checked_cublas      = checked_handle<cublasHandle_t, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublas_traits>;
using checked_cusolver_dn = checked_handle<cusolverDnHandle_t, cusolverStatus_t, CUSOLVER_STATUS_SUCCESS, cusolver_dn_traits>;
using checked_cusolver_sp = checked_handle<cusolverSpHandle_t, cusolverStatus_t, CUSOLVER_STATUS_SUCCESS, cusolver_sp_traits>;
using checked_cusparse    = checked_handle<cusparseHandle_t, cusparseStatus_t, CUSPARSE_STATUS_SUCCESS, cusparse_traits>;

/// The four factories of one resources object, allocated together.
struct checked_factories {
  explicit checked_factories(rmm::cuda_stream_view s)
    : cublas(raft::resource::resource_type::CUBLAS_HANDLE, s),
      cusolver_dn(raft::resource::resource_type::CUSOLVER_DN_HANDLE, s),
      cusolver_sp(raft::resource::resource_type::CUSOLVER_SP_HANDLE, s),
      cusparse(raft::resource::resource_type::CUSPARSE_HANDLE, s)
  {
  }
  checked_factory<checked_cublas> cublas;
  checked_factory<checked_cusolver_dn> cusolver_dn;
  checked_factory<checked_cusolver_sp> cusolver_sp;
  checked_factory<checked_cusparse> cusparse;
};

/// The C++ object behind raftrs_resources: RAFT's device_resources, plus a look at whether a
/// lazily made resource exists yet (RAFT keeps its cells protected, a subclass may read them).
class shim_resources final : public raft::device_resources {
 public:
  shim_resources(int device, cudaStream_t stream)
    : raft::device_resources(rmm::cuda_stream_view{stream}), device_(device)
  {
  }

  /// Installs the checked handle factories (once; later calls are one atomic load). Every shim
  /// entry point that lets RAFT code reach these resources' handles calls it first, so RAFT's
  /// own factories (which hand out an uninitialised handle when a create fails) never run.
  /// Done on first use rather than in the constructor: resources that never take a handle pay
  /// nothing for it.
  void ensure_checked_factories()
  {
    using raft::resource::resource_type;
    if (has_resource_factory(resource_type::CUBLAS_HANDLE)) { return; }
    // One allocation for the four; each cell gets an aliasing pointer into it. The cells exist
    // (RAFT's constructor made them): a CAS each; a racing caller's CAS simply loses.
    auto all = std::make_shared<checked_factories>(raft::resource::get_cuda_stream(*this));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusolver_dn));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusolver_sp));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusparse));
    // cuBLAS last: its factory being set is what tells the others are.
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cublas));
  }

  [[nodiscard]] bool has(raft::resource::resource_type type) const
  {
    return cells_[type]->res.load() != nullptr;
  }

  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_;
};

shim_resources& unwrap(raftrs_resources* res)
{
  if (res == nullptr) { throw std::invalid_argument("null resources"); }
  return *reinterpret_cast<shim_resources*>(res);
}

using any_device_resource = cuda::mr::any_resource<cuda::mr::device_accessible>;
using statistics_mr       = rmm::mr::statistics_resource_adaptor;
using tracking_mr         = rmm::mr::tracking_resource_adaptor;
using limiting_mr         = rmm::mr::limiting_resource_adaptor;
using failure_mr          = rmm::mr::failure_callback_resource_adaptor<rmm::out_of_memory>;
// The pool-like resources this shim makes: destroyed only once the streams that freed into them
// are done (fence.hpp).
using fenced_pool    = raftrs_fence::fenced_mr<rmm::mr::pool_memory_resource>;
using fenced_arena   = raftrs_fence::fenced_mr<rmm::mr::arena_memory_resource>;
using fenced_binning = raftrs_fence::fenced_mr<rmm::mr::binning_memory_resource>;

/// One retired async pool: its device, the pool (alive, never destroyed).
struct retired_pool {
  int device;
  rmm::mr::cuda_async_memory_resource pool;
};

static_assert(std::is_nothrow_move_constructible_v<retired_pool>,
              "a retired pool must move without throwing: a pool destroyed by accident is the crash it avoids");

/// Async pools whose last copy is gone, kept alive for the next async pool made on their device.
/// Never destroyed (the process's end gives them back to the OS). The counters only grow; they
/// are read for `raft::stats()`.
struct retired_pools {
  std::mutex lock;
  std::vector<retired_pool> pools;
  std::size_t slots{0};              ///< pools ever made or being made: the capacity kept (under `lock`)
  std::atomic<uint64_t> made{0};     ///< pools created with cudaMemPoolCreate
  std::atomic<uint64_t> retired{0};  ///< last copies gone
  std::atomic<uint64_t> reused{0};   ///< retired pools handed to a new resource
};

retired_pools& the_retired()
{
  static auto* r = new retired_pools{};
  return *r;
}

/// A CUDA async pool this shim made, shared by every copy (handles, buffers, adaptors, RMM's
/// per-device map). When the last copy goes, the pool is never destroyed: it is retired (its
/// release threshold set to 0 and trimmed, so its memory goes back to the driver, now or at the
/// next synchronisation once the frees still queued into it have run), and the next async pool
/// asked for on its device is this one again, primed and set as asked.
///
/// Why: the driver crashes when a pool is destroyed while a stream-ordered free into it is still
/// queued and that stream then goes on working (GPU run 42, `scenarios raw-pool-streams`, driver
/// API only: SIGSEGV or SIGFPE in 4 of 4 runs; with the stream waited for before the destroy,
/// 0 of 4; CUDA documents such a destroy as allowed). Every way of destroying later that was
/// tried failed on the GPU: a device-wide wait deadlocked inside libcuda (run 45), pools
/// destroyed once the streams that freed had been waited for left other stream waits hung
/// (run 46), and a graveyard drained by release threads still crashed, hung and ran the driver
/// out of pools inside the whole `rmm` test binary (run 48). A pool that is never destroyed has
/// no such moment; reuse bounds the pools alive by the most ever alive at once.
class async_pool_guard {
 public:
  async_pool_guard(int device, rmm::mr::cuda_async_memory_resource pool) : device_{device}, pool_{std::move(pool)} {}
  ~async_pool_guard() { retire(device_, std::move(pool_)); }
  async_pool_guard(async_pool_guard const&)            = delete;
  async_pool_guard(async_pool_guard&&)                 = delete;
  async_pool_guard& operator=(async_pool_guard const&) = delete;
  async_pool_guard& operator=(async_pool_guard&&)      = delete;

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    return pool_.allocate(stream, bytes, alignment);
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    pool_.deallocate(stream, ptr, bytes, alignment);
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment) { return pool_.allocate_sync(bytes, alignment); }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    pool_.deallocate_sync(ptr, bytes, alignment);
  }
  [[nodiscard]] bool operator==(async_pool_guard const& other) const noexcept { return pool_ == other.pool_; }
  [[nodiscard]] bool operator!=(async_pool_guard const& other) const noexcept { return !(*this == other); }
  friend void get_property(async_pool_guard const&, cuda::mr::device_accessible) noexcept {}

  [[nodiscard]] rmm::mr::cuda_async_memory_resource& pool() noexcept { return pool_; }

  /// Keeps `pool` for reuse; its unused memory goes back to the driver. Never allocates: every
  /// pool took a slot of `retired_pools::pools`' capacity when it was made (see
  /// `guarded_async`). No CUDA call once the process is exiting (the driver may be gone: a crash
  /// inside libcuda rather than an error, says `rmm::process_is_exiting`); a pool retired then
  /// is simply kept.
  static void retire(int device, rmm::mr::cuda_async_memory_resource pool) noexcept
  {
    if (!rmm::process_is_exiting()) {
      cudaMemPool_t handle = pool.pool_handle();
      uint64_t zero        = 0;
      if (cudaMemPoolSetAttribute(handle, cudaMemPoolAttrReleaseThreshold, &zero) != cudaSuccess ||
          cudaMemPoolTrimTo(handle, 0) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
      }
    }
    auto& r = the_retired();
    std::lock_guard<std::mutex> lock{r.lock};
    if (r.pools.size() < r.pools.capacity()) {
      r.pools.push_back(retired_pool{device, std::move(pool)});  // within capacity: no allocation
    } else {
      // Unreachable while every pool took its slot; kept rather than destroyed all the same.
      static_cast<void>(new (std::nothrow) rmm::mr::cuda_async_memory_resource(std::move(pool)));
    }
    r.retired.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  int device_;
  rmm::mr::cuda_async_memory_resource pool_;
};

using guarded_async_mr = cuda::mr::shared_resource<async_pool_guard>;

/// Whether a retired pool can be handed out as if new: nothing of it in use as the driver counts
/// it (`cudaMemPoolAttrUsedMemCurrent` 0: an earlier owner's last frees have at least been
/// queued; one still queued on its stream could otherwise make the new owner's first allocations
/// wait on that stream), and no other device given access to it (its peer access is revoked
/// here, with nothing allocated). A pool that is not ready is left retired.
bool ready_for_reuse(retired_pool const& p, int devices)
{
  cudaMemPool_t handle = p.pool.pool_handle();
  uint64_t used        = 1;
  if (cudaMemPoolGetAttribute(handle, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return false;
  }
  if (used != 0) { return false; }
  for (int peer = 0; peer < devices; ++peer) {
    if (peer == p.device) { continue; }
    cudaMemLocation where{};
    where.type = cudaMemLocationTypeDevice;
    where.id   = peer;
    cudaMemAccessFlags flags{};
    if (cudaMemPoolGetAccess(&flags, handle, &where) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return false;
    }
    if (flags == cudaMemAccessFlagsProtNone) { continue; }
    cudaMemAccessDesc desc{};
    desc.location = where;
    desc.flags    = cudaMemAccessFlagsProtNone;
    if (cudaMemPoolSetAccess(handle, &desc, 1) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return false;
    }
  }
  return true;
}

/// A guard over `pool`; if making it fails (allocation), the pool is retired again, never
/// destroyed.
guarded_async_mr guard_pool(int device, rmm::mr::cuda_async_memory_resource&& pool)
{
  try {
    return cuda::mr::make_shared_resource<async_pool_guard>(device, std::move(pool));
  } catch (...) {
    async_pool_guard::retire(device, std::move(pool));
    throw;
  }
}

/// An async pool on `device` (which must be current), guarded, with RMM's semantics for the two
/// sizes (`cuda_async_memory_resource`'s constructor): the release threshold is "never" unless
/// given, and the pool is primed by allocating and freeing `initial_pool_size` on the null
/// stream. A retired pool of the device that is ready for reuse is taken first; a new one is
/// made only when none is.
any_device_resource guarded_async(int device,
                                  std::optional<std::size_t> initial_pool_size = {},
                                  std::optional<std::size_t> release_threshold = {})
{
  auto& r = the_retired();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    devices = 0;
  }
  std::optional<rmm::mr::cuda_async_memory_resource> taken;
  {
    std::lock_guard<std::mutex> lock{r.lock};
    for (auto it = r.pools.rbegin(); it != r.pools.rend(); ++it) {
      if (it->device == device && ready_for_reuse(*it, devices)) {
        taken.emplace(std::move(it->pool));  // a nothrow move
        r.pools.erase(std::next(it).base());
        break;
      }
    }
    if (!taken) {
      // The slot a new pool will take in the retired list when it retires, taken now so that
      // retiring never allocates (throws here, before any pool exists, when there is no room).
      r.slots += 1;
      r.pools.reserve(r.slots);
    }
  }
  if (!taken) {
    rmm::mr::cuda_async_memory_resource fresh{initial_pool_size, release_threshold};
    r.made.fetch_add(1, std::memory_order_relaxed);
    return any_device_resource{guard_pool(device, std::move(fresh))};
  }
  // From here the guard owns the pool: if anything below throws, it retires the pool again.
  auto shared          = guard_pool(device, std::move(*taken));
  cudaMemPool_t handle = shared.get().pool().pool_handle();
  uint64_t threshold   = release_threshold.value_or(std::numeric_limits<std::size_t>::max());
  check(cudaMemPoolSetAttribute(handle, cudaMemPoolAttrReleaseThreshold, &threshold),
        "setting the release threshold of a reused async pool");
  uint64_t zero = 0;
  check(cudaMemPoolSetAttribute(handle, cudaMemPoolAttrReservedMemHigh, &zero), "resetting an async pool's peak");
  check(cudaMemPoolSetAttribute(handle, cudaMemPoolAttrUsedMemHigh, &zero), "resetting an async pool's peak");
  if (initial_pool_size.has_value()) {
    auto& pool = shared.get().pool();
    void* p    = pool.allocate(cuda::stream_ref{cudaStream_t{nullptr}}, *initial_pool_size, rmm::CUDA_ALLOCATION_ALIGNMENT);
    pool.deallocate(cuda::stream_ref{cudaStream_t{nullptr}}, p, *initial_pool_size, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  any_device_resource out{std::move(shared)};
  r.reused.fetch_add(1, std::memory_order_relaxed);
  return out;
}

/// The CUDA async pool `ref` is (guarded or not), or null.
rmm::mr::cuda_async_memory_resource* as_async(rmm::device_async_resource_ref& ref)
{
  if (auto* g = cuda::mr::resource_cast<guarded_async_mr>(&ref)) { return &g->get().pool(); }
  return cuda::mr::resource_cast<rmm::mr::cuda_async_memory_resource>(&ref);
}

/// Serialises this library's read-modify-write of RMM's per-device map (RMM locks each call,
/// not a sequence of calls).
std::mutex& mr_lock()
{
  static std::mutex lock;
  return lock;
}

int32_t classify(rmm::device_async_resource_ref ref)
{
  // This library's own async pools first: the common case (every allocation from the default
  // resource asks), and a type of this shim's anonymous namespace, so a pointer comparison
  // rather than a string comparison of two type names.
  if (ref.type() == typeid(guarded_async_mr)) { return RAFTRS_MR_CUDA_ASYNC; }
  if (ref == rmm::device_async_resource_ref{rmm::mr::detail::initial_resource()}) {
    return RAFTRS_MR_CUDA;
  }
  auto const& type = ref.type();
  if (type == typeid(rmm::mr::cuda_memory_resource)) { return RAFTRS_MR_CUDA; }
  if (type == typeid(rmm::mr::cuda_async_memory_resource)) {
    return RAFTRS_MR_CUDA_ASYNC;
  }
  if (type == typeid(rmm::mr::managed_memory_resource)) { return RAFTRS_MR_MANAGED; }
  if (type == typeid(statistics_mr)) { return RAFTRS_MR_STATISTICS; }
  if (type == typeid(fenced_pool) || type == typeid(rmm::mr::pool_memory_resource)) { return RAFTRS_MR_POOL; }
  if (type == typeid(fenced_arena) || type == typeid(rmm::mr::arena_memory_resource)) { return RAFTRS_MR_ARENA; }
  if (type == typeid(fenced_binning) || type == typeid(rmm::mr::binning_memory_resource)) {
    return RAFTRS_MR_BINNING;
  }
  if (type == typeid(limiting_mr)) { return RAFTRS_MR_LIMITING; }
  if (type == typeid(tracking_mr)) { return RAFTRS_MR_TRACKING; }
  if (type == typeid(rmm::mr::logging_resource_adaptor)) { return RAFTRS_MR_LOGGING; }
  if (type == typeid(failure_mr)) { return RAFTRS_MR_FAILURE_CALLBACK; }
  if (type == typeid(rmm::mr::thread_safe_resource_adaptor)) { return RAFTRS_MR_THREAD_SAFE; }
  if (type == typeid(rmm::mr::pinned_host_memory_resource)) { return RAFTRS_MR_PINNED_HOST; }
  return RAFTRS_MR_OTHER;
}

int device_count()
{
  int n = 0;
  auto code = cudaGetDeviceCount(&n);
  // A driver with no device is a machine with zero devices, not a failure.
  if (code == cudaErrorNoDevice) {
    cudaGetLastError();
    return 0;
  }
  check(code, "counting the devices");
  return n;
}

void check_device(int32_t device)
{
  int count = device_count();
  if (device < 0 || device >= count) {
    throw std::out_of_range("no device " + std::to_string(device) + " among " +
                            std::to_string(count));
  }
}

/// An owned resource: what raftrs_mr points at. `device` is the device it was made for (RMM's
/// resources must be used with that device current).
struct shim_mr {
  int device;
  any_device_resource resource;
};

shim_mr const& unwrap(raftrs_mr const* mr)
{
  if (mr == nullptr) { throw std::invalid_argument("null memory resource"); }
  return *reinterpret_cast<shim_mr const*>(mr);
}

raftrs_mr* wrap(shim_mr* mr) { return reinterpret_cast<raftrs_mr*>(mr); }

/// Every touch of RMM's per-device map holds this shared; the exit handler below takes it
/// exclusively and marks the map gone. Checking `rmm::process_is_exiting()` and then touching
/// the map was not atomic: another thread could pass the check while `exit` ran the handlers
/// and the map's destructor. Now a touch either ends before the map starts dying or is refused.
struct rmm_map_state {
  std::shared_mutex lock;
  bool gone{false};
};

rmm_map_state& map_state()
{
  static auto* s = new rmm_map_state{};  // never destroyed: used until the very end
  return *s;
}

void mark_map_gone() noexcept
{
  auto& s = map_state();
  std::unique_lock<std::shared_mutex> lock{s.lock};
  s.gone = true;
}

/// Registers `mark_map_gone` right after RMM's map (and RMM's own exit hook) exist: exit
/// handlers run in reverse order, so it runs before the map is destroyed. (A handler of this
/// library registered before it, the raft-exit hook in a process that made no map first, then
/// finds the map refused: its teardown is skipped, never run against a dying map.)
void register_map_exit()
{
  static bool const registered = [] {
    static_cast<void>(rmm::mr::detail::get_ref_map());
    return std::atexit(mark_map_gone) == 0;
  }();
  static_cast<void>(registered);
}

/// A touch of RMM's per-device map: refused (`std::logic_error`) once the process is exiting.
/// Not reentrant: take one per entry point.
class rmm_map_use {
 public:
  rmm_map_use() : lock_{(register_map_exit(), map_state().lock)}
  {
    if (map_state().gone || rmm::process_is_exiting()) {
      throw std::logic_error("RMM's per-device memory resources are gone: the process is exiting");
    }
  }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

/// A copy of `device`'s entry in RMM's per-device map, taken under RMM's own lock, so no other
/// thread can replace (and destroy) the entry while it is copied. A missing entry is RMM's
/// initial cuda_memory_resource, stateless, so a copy of it is as good as it. The caller holds
/// an `rmm_map_use`.
any_device_resource copy_current_held(int device)
{
  std::lock_guard<std::mutex> lock{rmm::mr::detail::ref_map_lock()};
  auto& map = rmm::mr::detail::get_ref_map();
  auto found = map.find(device);
  if (found == map.end()) { return any_device_resource{rmm::mr::detail::initial_resource()}; }
  any_device_resource copy{found->second};
  // RMM's resource equality means "each can free what the other allocated": a copy that is not
  // equal (a resource whose copies own separate state) cannot stand for the original.
  if (!(copy == found->second)) {
    throw std::logic_error("the current memory resource of device " + std::to_string(device) +
                           " cannot be shared: a copy of it does not compare equal to it");
  }
  return copy;
}

/// [`copy_current_held`] with its own map use.
any_device_resource copy_current(int device)
{
  rmm_map_use alive;
  return copy_current_held(device);
}

/// An adaptor of type `Adaptor` over (a shared copy of) `upstream`, made on the upstream's device.
template <typename Adaptor, typename... Args>
raftrs_mr* adapt(raftrs_mr const* upstream, Args&&... args)
{
  auto const& u = unwrap(upstream);
  device_scope scope{u.device};
  return wrap(new shim_mr{u.device, any_device_resource{Adaptor{any_device_resource{u.resource}, std::forward<Args>(args)...}}});
}

/// A pool-like `R` over (a shared copy of) `upstream`, fenced (fence.hpp), made on the upstream's
/// device.
template <typename R, typename... Args>
raftrs_mr* adapt_fenced(raftrs_mr const* upstream, Args&&... args)
{
  auto const& u = unwrap(upstream);
  device_scope scope{u.device};
  auto made = cuda::mr::make_shared_resource<raftrs_fence::fenced<R>>(
    u.device, any_device_resource{u.resource}, std::forward<Args>(args)...);
  return wrap(new shim_mr{u.device, any_device_resource{std::move(made)}});
}

/// `optional` from the C side's "negative means none".
std::optional<std::size_t> size_or_none(int64_t v)
{
  return v < 0 ? std::nullopt : std::optional<std::size_t>{static_cast<std::size_t>(v)};
}

/// A cast of the resource behind a handle to an adaptor type (nullptr when it is another kind).
template <typename T>
T* cast(raftrs_mr const* mr)
{
  auto const& m = unwrap(mr);
  rmm::device_async_resource_ref ref{const_cast<any_device_resource&>(m.resource)};
  return cuda::mr::resource_cast<T>(&ref);
}

/// The most bytes one allocation may ask for: 2^48 (256 TiB), more than any device or any host's
/// page-locked memory holds. RMM's resources round sizes up (to 256 bytes; the pinned host
/// resource adds a header) with arithmetic that wraps near SIZE_MAX: a pool served SIZE_MAX bytes
/// as a 0-byte block, the pinned resource gave 256 bytes for SIZE_MAX - 7. The Rust side refuses
/// the same sizes first (MAX_ALLOCATION_BYTES and ROUNDING_SLACK in raft-core's result layer).
constexpr std::size_t max_allocation_bytes = std::size_t{1} << 48;
/// Sizes within this of SIZE_MAX are not sizes (their rounding wraps): a logic error.
constexpr std::size_t rounding_slack = 4096;

/// Refuses what no resource can serve; touches no CUDA (callable without a driver).
void refuse_unservable(std::size_t bytes)
{
  if (bytes > std::numeric_limits<std::size_t>::max() - rounding_slack) {
    throw std::invalid_argument(std::to_string(bytes) +
                                " bytes: rounding the size up to an allocation's alignment wraps around");
  }
  if (bytes > max_allocation_bytes) {
    throw rmm::out_of_memory(std::to_string(bytes) +
                             " bytes is more than any device or host memory holds (at most 2^48 bytes in one allocation)");
  }
}

/// The device memory behind raftrs_buffer: the pointer and its own copy of the resource that
/// must free it. Replacing the per-device resource, or dropping every other handle to it, never
/// invalidates a live buffer.
struct shim_buffer {
  int device;
  void* ptr;
  std::size_t bytes;
  any_device_resource mr;
  bool stream_ordered;
};

/// The upstream of an adaptor of type `A` behind `mr` (or nothing when `mr` is no `A`).
template <typename A>
std::optional<rmm::device_async_resource_ref> upstream_of(rmm::device_async_resource_ref mr)
{
  auto* a = cuda::mr::resource_cast<A>(&mr);
  if (a == nullptr) { return std::nullopt; }
  return a->get_upstream_resource();
}

/// The upstream of a pool-like `R` behind `mr`, fenced (made here) or not (made elsewhere).
template <typename R>
std::optional<rmm::device_async_resource_ref> upstream_of_pooled(rmm::device_async_resource_ref mr)
{
  if (auto* f = cuda::mr::resource_cast<raftrs_fence::fenced_mr<R>>(&mr)) {
    return f->get().inner().get_upstream_resource();
  }
  return upstream_of<R>(mr);
}

/// The upstream of an adaptor or pool behind `mr`, when it has one this shim knows.
std::optional<rmm::device_async_resource_ref> upstream_any(rmm::device_async_resource_ref mr)
{
  switch (classify(mr)) {
    case RAFTRS_MR_STATISTICS: return upstream_of<statistics_mr>(mr);
    case RAFTRS_MR_LIMITING: return upstream_of<limiting_mr>(mr);
    case RAFTRS_MR_TRACKING: return upstream_of<tracking_mr>(mr);
    case RAFTRS_MR_LOGGING: return upstream_of<rmm::mr::logging_resource_adaptor>(mr);
    case RAFTRS_MR_FAILURE_CALLBACK: return upstream_of<failure_mr>(mr);
    case RAFTRS_MR_THREAD_SAFE: return upstream_of<rmm::mr::thread_safe_resource_adaptor>(mr);
    case RAFTRS_MR_BINNING: return upstream_of_pooled<rmm::mr::binning_memory_resource>(mr);
    case RAFTRS_MR_POOL: return upstream_of_pooled<rmm::mr::pool_memory_resource>(mr);
    default: return std::nullopt;
  }
}

/// Refuses a pool, arena, binning or thread-safe resource over a chain that holds a failure
/// callback: those hold their own lock while they take memory from upstream, so the callback
/// would run under it, and a callback that frees through the same resource (what it is for)
/// would lock it again on the same thread.
void refuse_over_failure_callback(raftrs_mr const* upstream, char const* what)
{
  auto const& u = unwrap(upstream);
  std::optional<rmm::device_async_resource_ref> at{rmm::device_async_resource_ref{const_cast<any_device_resource&>(u.resource)}};
  // The whole chain, however deep (a bound let a callback 33 adaptors down through): it ends,
  // since every adaptor was made over a resource that existed before it.
  for (; at.has_value(); at = upstream_any(*at)) {
    if (classify(*at) == RAFTRS_MR_FAILURE_CALLBACK) {
      throw std::logic_error(std::string("a ") + what +
                             " over a failure-callback adaptor would run the callback under its own lock: "
                             "put the failure callback on top instead");
    }
  }
}

/// Whether freeing `bytes` through `mr`, on the stream the block was allocated on (never the
/// legacy default stream: `on_own_stream`), never blocks the caller: the async pool and RMM's
/// pool (their frees return blocks to a free list, stream-ordered), the arena for blocks of at
/// most 1 MiB, and any adaptor over such a resource. cudaFree, cudaFreeHost, the arena's large
/// blocks and unknown resources may synchronise.
bool frees_stream_ordered(rmm::device_async_resource_ref mr, std::size_t bytes, bool on_own_stream, int depth = 0)
{
  if (depth > 32) { return false; }
  std::optional<rmm::device_async_resource_ref> up;
  switch (classify(mr)) {
    case RAFTRS_MR_CUDA_ASYNC:
    case RAFTRS_MR_POOL: return true;
    // RMM 26.08's arena (rmm/mr/detail/arena.hpp) synchronises the stream when it frees a block
    // its global arena handles (over superblock::minimum_size, 1 MiB, after alignment) or one
    // that belongs to another stream's arena. A block of at most 1 MiB freed on the (non-default)
    // stream that allocated it goes back to that stream's own arena without waiting.
    case RAFTRS_MR_ARENA:
      return on_own_stream && rmm::align_up(bytes, rmm::CUDA_ALLOCATION_ALIGNMENT) <= (std::size_t{1} << 20);
    case RAFTRS_MR_STATISTICS: up = upstream_of<statistics_mr>(mr); break;
    case RAFTRS_MR_LIMITING: up = upstream_of<limiting_mr>(mr); break;
    case RAFTRS_MR_TRACKING: up = upstream_of<tracking_mr>(mr); break;
    case RAFTRS_MR_LOGGING: up = upstream_of<rmm::mr::logging_resource_adaptor>(mr); break;
    case RAFTRS_MR_FAILURE_CALLBACK: up = upstream_of<failure_mr>(mr); break;
    case RAFTRS_MR_THREAD_SAFE: up = upstream_of<rmm::mr::thread_safe_resource_adaptor>(mr); break;
    // Sizes past the largest bin go to the upstream.
    case RAFTRS_MR_BINNING: up = upstream_of_pooled<rmm::mr::binning_memory_resource>(mr); break;
    default: return false;
  }
  return up.has_value() && frees_stream_ordered(*up, bytes, on_own_stream, depth + 1);
}

template <typename T, typename Gemm>
raftrs_status gemm(raftrs_resources* res,
                   int32_t trans_a,
                   int32_t trans_b,
                   int64_t m,
                   int64_t n,
                   int64_t k,
                   T alpha,
                   T const* a,
                   int64_t lda,
                   T const* b,
                   int64_t ldb,
                   T beta,
                   T* c,
                   int64_t ldc,
                   Gemm call,
                   char const* name) noexcept
{
  return guard([&] {
    auto& r = unwrap(res);
    for (int64_t v : {m, n, k, lda, ldb, ldc}) {
      if (v < 0 || v > INT32_MAX) {
        throw std::invalid_argument(std::string(name) + ": a dimension is out of cuBLAS's int range");
      }
    }
    device_scope scope{r.device()};
    r.ensure_checked_factories();
    auto handle = raft::resource::get_cublas_handle(r);
    check_cublas(cublasSetStream(handle, raft::resource::get_cuda_stream(r).value()),
                 "binding the cuBLAS handle to the resources' stream");
    // alpha and beta are host values: RAFT code given these resources (cuVS, a lend) may have
    // left the shared handle in device pointer mode, where cuBLAS would read them as addresses.
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "setting cuBLAS's host pointer mode");
    auto op = [](int32_t t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; };
    check_cublas(call(handle,
                      op(trans_a),
                      op(trans_b),
                      static_cast<int>(m),
                      static_cast<int>(n),
                      static_cast<int>(k),
                      &alpha,
                      a,
                      static_cast<int>(lda),
                      b,
                      static_cast<int>(ldb),
                      &beta,
                      c,
                      static_cast<int>(ldc)),
                 name);  // name says what ran: "the fp32 matrix product (cublasSgemm)"
  });
}

}  // namespace

extern "C" {

uint64_t raftrs_header_hash(void) { return RAFTRS_HEADER_HASH; }

const char* raftrs_last_error(void) { return last_error; }

void raftrs_clear_error(void) { last_error[0] = '\0'; }

void raftrs_get_build_info(raftrs_build_info* out)
{
  if (out == nullptr) { return; }
  std::memset(out, 0, sizeof(*out));
  out->raft_major     = RAFT_VERSION_MAJOR;
  out->raft_minor     = RAFT_VERSION_MINOR;
  out->raft_patch     = RAFT_VERSION_PATCH;
  out->rmm_major      = RMM_VERSION_MAJOR;
  out->rmm_minor      = RMM_VERSION_MINOR;
  out->rmm_patch      = RMM_VERSION_PATCH;
  out->cccl_version   = CCCL_VERSION;
  out->cudart_version = CUDART_VERSION;
  out->handle_size    = sizeof(raft::device_resources);
  out->resources_size = sizeof(raft::resources);
#define RAFTRS_STR2(x) #x
#define RAFTRS_STR(x)  RAFTRS_STR2(x)
  std::strncpy(out->rmm_abi_namespace, RAFTRS_STR(RMM_ABI_NAMESPACE), sizeof(out->rmm_abi_namespace) - 1);
#undef RAFTRS_STR
#undef RAFTRS_STR2
}

raftrs_status raftrs_runtime_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaRuntimeGetVersion(&v), "reading the CUDA runtime version");
    *out = v;
  });
}

raftrs_status raftrs_driver_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaDriverGetVersion(&v), "reading the CUDA driver version");
    *out = v;
  });
}

raftrs_status raftrs_note_primary_context(int32_t device, void* context)
{
  return guard([&] {
    if (device >= 0 && device < noted_primaries_max) {
      noted_primaries[device].store(context, std::memory_order_release);
    }
  });
}

raftrs_status raftrs_device_count(int32_t* out)
{
  return guard([&] {
    *out = device_count();
  });
}

raftrs_status raftrs_current_device(int32_t* out)
{
  return guard([&] {
    int d = 0;
    check(cudaGetDevice(&d), "reading the current device");
    *out = d;
  });
}

raftrs_status raftrs_device_memory_pools_supported(int32_t device, int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, device), "asking whether the device supports memory pools");
    *out = v;
  });
}

raftrs_status raftrs_memcpy_async(int32_t device, void* dst, const void* src, size_t bytes, void* stream)
{
  return guard([&] {
    device_scope scope{device};
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
          "queueing a copy");
  });
}

raftrs_status raftrs_memset_async(int32_t device, void* dst, int32_t value, size_t bytes, void* stream)
{
  return guard([&] {
    device_scope scope{device};
    check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "queueing a memset");
  });
}

raftrs_status raftrs_resources_create(int32_t device, void* stream, raftrs_resources** out)
{
  return guard([&] {
    *out = nullptr;
    device_scope scope{device};
    auto res = new shim_resources(device, static_cast<cudaStream_t>(stream));
    // Record the device now, while it is current, so RAFT never guesses it later.
    try {
      (void)raft::resource::get_device_id(*res);
    } catch (...) {
      delete res;
      throw;
    }
    *out = reinterpret_cast<raftrs_resources*>(res);
  });
}

raftrs_status raftrs_resources_destroy(raftrs_resources* res)
{
  return guard([&] {
    if (res == nullptr) { return; }
    auto* r = &unwrap(res);
    // Handles are destroyed on their own device.
    device_scope scope{r->device()};
    delete r;
  });
}

raftrs_status raftrs_resources_sync(raftrs_resources* res)
{
  return guard([&] {
    auto& r = unwrap(res);
    r.sync_stream();
  });
}

raftrs_status raftrs_resources_handle(raftrs_resources* res, int32_t kind, void** out)
{
  return guard([&] {
    auto& r = unwrap(res);
    (void)handle_type(kind);  // refuses an unknown kind
    device_scope scope{r.device()};
    r.ensure_checked_factories();
    switch (kind) {
      case RAFTRS_HANDLE_CUBLAS: *out = raft::resource::get_cublas_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_DN: *out = raft::resource::get_cusolver_dn_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_SP: *out = raft::resource::get_cusolver_sp_handle(r); break;
      case RAFTRS_HANDLE_CUSPARSE: *out = raft::resource::get_cusparse_handle(r); break;
      default: break;
    }
  });
}

raftrs_status raftrs_resources_native(raftrs_resources* res, void** out)
{
  return guard([&] {
    auto& r = unwrap(res);
    r.ensure_checked_factories();
    *out = static_cast<void*>(static_cast<raft::resources*>(&r));
  });
}

raftrs_status raftrs_resources_has_handle(raftrs_resources* res, int32_t kind, int32_t* out)
{
  return guard([&] { *out = unwrap(res).has(handle_type(kind)) ? 1 : 0; });
}

raftrs_status raftrs_mr_current(int32_t device, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    check_device(device);
    *out = wrap(new shim_mr{device, copy_current(device)});
  });
}

raftrs_status raftrs_mr_set_current(const raftrs_mr* mr, raftrs_mr** previous)
{
  return guard([&] {
    if (previous != nullptr) { *previous = nullptr; }
    auto const& m = unwrap(mr);
    check_device(m.device);
    auto fresh = std::make_unique<shim_mr>(shim_mr{m.device, any_device_resource{}});
    rmm_map_use alive;
    std::lock_guard<std::mutex> lock{mr_lock()};
    any_device_resource old =
      rmm::mr::set_per_device_resource(rmm::cuda_device_id{m.device}, any_device_resource{m.resource});
    if (previous != nullptr) {
      fresh->resource = std::move(old);
      *previous       = wrap(fresh.release());
    }
  });
}

raftrs_status raftrs_mr_reset_current(int32_t device, raftrs_mr** previous)
{
  return guard([&] {
    if (previous != nullptr) { *previous = nullptr; }
    check_device(device);
    device_scope scope{device};
    rmm_map_use alive;
    std::lock_guard<std::mutex> lock{mr_lock()};
    auto fresh = std::make_unique<shim_mr>(shim_mr{device, copy_current_held(device)});
    rmm::mr::reset_per_device_resource(rmm::cuda_device_id{device});
    if (previous != nullptr) { *previous = wrap(fresh.release()); }
  });
}

raftrs_status raftrs_mr_install_default(int32_t device, int32_t* installed)
{
  return guard([&] {
    *installed = 0;
    check_device(device);
    int pools = 0;
    check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device),
          "asking whether the device supports memory pools");
    if (pools == 0) { return; }
    device_scope scope{device};
    rmm_map_use alive;
    std::lock_guard<std::mutex> lock{mr_lock()};
    rmm::cuda_device_id id{device};
    if (rmm::mr::get_per_device_resource_ref(id) !=
        rmm::device_async_resource_ref{rmm::mr::detail::initial_resource()}) {
      return;  // someone else chose this device's resource: leave it alone
    }
    rmm::mr::set_per_device_resource(id, guarded_async(device));
    *installed = 1;
  });
}

raftrs_status raftrs_mr_new(int32_t device, int32_t kind, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    check_device(device);
    device_scope scope{device};
    switch (kind) {
      case RAFTRS_MR_CUDA:
        *out = wrap(new shim_mr{device, any_device_resource{rmm::mr::cuda_memory_resource{}}});
        break;
      case RAFTRS_MR_CUDA_ASYNC:
        *out = wrap(new shim_mr{device, guarded_async(device)});
        break;
      case RAFTRS_MR_MANAGED:
        *out = wrap(new shim_mr{device, any_device_resource{rmm::mr::managed_memory_resource{}}});
        break;
      default:
        throw std::invalid_argument("cannot make a memory resource of kind " + std::to_string(kind) +
                                    " on its own");
    }
  });
}

raftrs_status raftrs_mr_new_statistics(const raftrs_mr* upstream, raftrs_mr** out)
{
  return guard([&] {
    *out         = nullptr;
    auto const& u = unwrap(upstream);
    device_scope scope{u.device};
    *out = wrap(new shim_mr{u.device, any_device_resource{statistics_mr{any_device_resource{u.resource}}}});
  });
}

raftrs_status raftrs_mr_new_pinned_host(int32_t device, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    check_device(device);
    device_scope scope{device};
    *out = wrap(new shim_mr{device, any_device_resource{rmm::mr::pinned_host_memory_resource{}}});
  });
}

raftrs_status raftrs_mr_new_cuda_async(int32_t device, int64_t initial_pool_size, int64_t release_threshold, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    check_device(device);
    device_scope scope{device};
    *out = wrap(new shim_mr{device, guarded_async(device, size_or_none(initial_pool_size), size_or_none(release_threshold))});
  });
}

raftrs_status raftrs_mr_new_pool(const raftrs_mr* upstream, int64_t initial, int64_t maximum, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    refuse_over_failure_callback(upstream, "pool");
    std::size_t first = 0;
    if (initial >= 0) {
      first = static_cast<std::size_t>(initial);
    } else {
      // RMM's default, half the free memory, of the device the pool is for: RMM reads the
      // current device's, which is the calling thread's, maybe another device.
      device_scope scope{unwrap(upstream).device};
      first = rmm::percent_of_free_device_memory(50);
    }
    *out = adapt_fenced<rmm::mr::pool_memory_resource>(upstream, first, size_or_none(maximum));
  });
}

raftrs_status raftrs_mr_new_arena(const raftrs_mr* upstream, int64_t arena_size, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    refuse_over_failure_callback(upstream, "arena");
    *out = adapt_fenced<rmm::mr::arena_memory_resource>(upstream, size_or_none(arena_size));
  });
}

raftrs_status raftrs_mr_new_binning(const raftrs_mr* upstream, int32_t min_exponent, int32_t max_exponent, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    // RMM sizes each bin as the int `1 << exponent`: 31 and above overflow it. Checked first,
    // before anything is read from the upstream.
    if (min_exponent < 0 || max_exponent > 30 || min_exponent > max_exponent) {
      throw std::invalid_argument("bin exponents must satisfy 0 <= min <= max <= 30, given " +
                                  std::to_string(min_exponent) + " and " + std::to_string(max_exponent));
    }
    refuse_over_failure_callback(upstream, "binning resource");
    *out = adapt_fenced<rmm::mr::binning_memory_resource>(
      upstream, static_cast<int8_t>(min_exponent), static_cast<int8_t>(max_exponent));
  });
}

raftrs_status raftrs_mr_new_limiting(const raftrs_mr* upstream, size_t limit, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    *out = adapt<limiting_mr>(upstream, limit);
  });
}

raftrs_status raftrs_mr_new_tracking(const raftrs_mr* upstream, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    *out = adapt<tracking_mr>(upstream, false);
  });
}

raftrs_status raftrs_mr_new_thread_safe(const raftrs_mr* upstream, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    refuse_over_failure_callback(upstream, "thread-safe adaptor");
    *out = adapt<rmm::mr::thread_safe_resource_adaptor>(upstream);
  });
}

raftrs_status raftrs_mr_new_logging(const raftrs_mr* upstream, const char* path, int32_t auto_flush, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    if (path == nullptr || *path == '\0') { throw std::invalid_argument("the log needs a file path"); }
    *out = adapt<rmm::mr::logging_resource_adaptor>(upstream, std::string{path}, auto_flush != 0);
  });
}

raftrs_status raftrs_mr_new_failure_callback(const raftrs_mr* upstream,
                                             raftrs_failure_callback callback,
                                             void* arg,
                                             raftrs_drop_arg drop_arg,
                                             raftrs_mr** out)
{
  // The argument is owned from here on: whatever happens, `drop_arg` runs exactly once, when the
  // last copy of the callback (inside the shared adaptor) goes.
  std::shared_ptr<void> holder;
  try {
    holder = std::shared_ptr<void>(arg, [drop_arg](void* a) {
      if (drop_arg != nullptr) { drop_arg(a); }
    });
  } catch (...) {
    if (drop_arg != nullptr) { drop_arg(arg); }
    return fail(RAFTRS_STATUS_OUT_OF_MEMORY, "no memory for the failure callback");
  }
  return guard([&] {
    *out = nullptr;
    if (callback == nullptr) { throw std::invalid_argument("null failure callback"); }
    rmm::mr::failure_callback_t call = [callback, holder](std::size_t bytes, void*) {
      return callback(bytes, holder.get()) != 0;
    };
    *out = adapt<failure_mr>(upstream, std::move(call), nullptr);
  });
}

raftrs_status raftrs_mr_tracking(const raftrs_mr* mr, size_t* count, size_t* bytes)
{
  return guard([&] {
    auto* t = cast<tracking_mr>(mr);
    if (t == nullptr) { throw std::logic_error("the memory resource is not a tracking adaptor"); }
    *count = t->get_outstanding_allocations().size();
    *bytes = t->get_allocated_bytes();
  });
}

raftrs_status raftrs_mr_tracking_report(const raftrs_mr* mr, char* buf, size_t capacity, size_t* needed)
{
  return guard([&] {
    auto* t = cast<tracking_mr>(mr);
    if (t == nullptr) { throw std::logic_error("the memory resource is not a tracking adaptor"); }
    auto text = t->get_outstanding_allocations_str();
    *needed   = text.size() + 1;
    if (buf != nullptr && capacity > 0) {
      auto n = std::min(text.size(), capacity - 1);
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
  });
}

raftrs_status raftrs_mr_limits(const raftrs_mr* mr, size_t* allocated, size_t* limit)
{
  return guard([&] {
    auto* l = cast<limiting_mr>(mr);
    if (l == nullptr) { throw std::logic_error("the memory resource is not a limiting adaptor"); }
    *allocated = l->get_allocated_bytes();
    *limit     = l->get_allocation_limit();
  });
}

raftrs_status raftrs_mr_statistics_counts(const raftrs_mr* mr, int64_t* current, int64_t* peak, int64_t* total)
{
  return guard([&] {
    auto* st = cast<statistics_mr>(mr);
    if (st == nullptr) { throw std::logic_error("the memory resource is not a statistics adaptor"); }
    auto c   = st->get_allocations_counter();
    *current = c.value;
    *peak    = c.peak;
    *total   = c.total;
  });
}

raftrs_status raftrs_mr_statistics_total_bytes(const raftrs_mr* mr, int64_t* total)
{
  return guard([&] {
    auto* st = cast<statistics_mr>(mr);
    if (st == nullptr) { throw std::logic_error("the memory resource is not a statistics adaptor"); }
    *total = st->get_bytes_counter().total;
  });
}

raftrs_status raftrs_mr_clone(const raftrs_mr* mr, raftrs_mr** out)
{
  return guard([&] {
    *out         = nullptr;
    auto const& m = unwrap(mr);
    *out         = wrap(new shim_mr{m.device, any_device_resource{m.resource}});
  });
}

raftrs_status raftrs_mr_destroy(raftrs_mr* mr)
{
  return guard([&] {
    if (mr == nullptr) { return; }
    auto* m = reinterpret_cast<shim_mr*>(mr);
    // The last handle of a pool destroys it: on its own device, on the release thread that
    // called this, so it may wait for the streams that freed into it (fence.hpp).
    device_scope scope{m->device};
    raftrs_fence::may_wait here;
    delete m;
  });
}

raftrs_status raftrs_mr_on_deferred(void (*hook)(int32_t device))
{
  return guard([&] { raftrs_fence::the_deferred().hook.store(hook, std::memory_order_release); });
}

raftrs_status raftrs_mr_drain_deferred(uint64_t* drained)
{
  return guard([&] {
    *drained = 0;
    auto& d = raftrs_fence::the_deferred();
    std::vector<raftrs_fence::deferred> taken;
    {
      std::lock_guard<std::mutex> lock{d.lock};
      taken.swap(d.items);
    }
    for (auto& item : taken) {
      if (rmm::process_is_exiting()) {
        // Too late for CUDA: leave the rest to the OS (never destroyed).
        static_cast<void>(item.fence.release());
        static_cast<void>(new (std::nothrow) any_device_resource(std::move(item.resource)));
        continue;
      }
      std::optional<device_scope> scope;
      try {
        scope.emplace(item.device);
      } catch (...) {
        static_cast<void>(cudaGetLastError());  // waited for and destroyed all the same: never skipped
      }
      item.fence->wait();
      item.resource = any_device_resource{};  // the last copy: RMM's destructor runs now, on its device
      ++*drained;
    }
  });
}

raftrs_status raftrs_mr_async_pools(uint64_t* made, uint64_t* retired, uint64_t* reused)
{
  return guard([&] {
    auto& r  = the_retired();
    *made    = r.made.load(std::memory_order_relaxed);
    *retired = r.retired.load(std::memory_order_relaxed);
    *reused  = r.reused.load(std::memory_order_relaxed);
  });
}

raftrs_status raftrs_mr_async_pool_bytes(const raftrs_mr* mr, int32_t* found, uint64_t* reserved, uint64_t* used)
{
  return guard([&] {
    *found    = 0;
    *reserved = 0;
    *used     = 0;
    auto const& m = unwrap(mr);
    device_scope scope{m.device};
    std::optional<rmm::device_async_resource_ref> at{rmm::device_async_resource_ref{const_cast<any_device_resource&>(m.resource)}};
    for (int depth = 0; at.has_value() && depth < 32; ++depth) {
      if (auto* async = as_async(*at)) {
        cudaMemPool_t pool = async->pool_handle();
        check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, reserved), "reading the async pool's reserved memory");
        check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, used), "reading the async pool's memory in use");
        *found = 1;
        return;
      }
      at = upstream_any(*at);
    }
  });
}

raftrs_status raftrs_mr_trim_retired(uint64_t* released, uint64_t* held)
{
  return guard([&] {
    *released = 0;
    *held     = 0;
    auto& r = the_retired();
    std::lock_guard<std::mutex> lock{r.lock};
    cudaError_t failed = cudaSuccess;
    auto note     = [&](cudaError_t code) {
      static_cast<void>(cudaGetLastError());
      if (failed == cudaSuccess) { failed = code; }  // the first failure is the one returned
    };
    for (auto& p : r.pools) {
      uint64_t before = 0, after = 0;
      cudaError_t code = cudaSuccess;
      try {
        // On the pool's device: a thread with no context would otherwise get device 0's.
        device_scope scope{p.device};
        cudaMemPool_t handle = p.pool.pool_handle();
        code                 = cudaMemPoolGetAttribute(handle, cudaMemPoolAttrReservedMemCurrent, &before);
        if (code == cudaSuccess) { code = cudaMemPoolTrimTo(handle, 0); }
        if (code == cudaSuccess) { code = cudaMemPoolGetAttribute(handle, cudaMemPoolAttrReservedMemCurrent, &after); }
      } catch (cuda_failure const& e) {
        code = e.code;  // the device could not be made current: every other pool is still tried
      }
      if (code != cudaSuccess) {
        note(code);
        continue;
      }
      if (before > after) { *released += before - after; }
      *held += after;
    }
    check(failed, "giving a retired async pool's unused memory back");
  });
}

raftrs_status raftrs_mr_kind(const raftrs_mr* mr, int32_t* out)
{
  return guard([&] {
    auto const& m = unwrap(mr);
    *out = classify(rmm::device_async_resource_ref{const_cast<any_device_resource&>(m.resource)});
  });
}

raftrs_status raftrs_mr_device(const raftrs_mr* mr, int32_t* out)
{
  return guard([&] { *out = unwrap(mr).device; });
}

raftrs_status raftrs_mr_equal(const raftrs_mr* a, const raftrs_mr* b, int32_t* out)
{
  return guard([&] {
    auto const& x = unwrap(a);
    auto const& y = unwrap(b);
    *out          = (x.device == y.device && x.resource == y.resource) ? 1 : 0;
  });
}

raftrs_status raftrs_mr_statistics(const raftrs_mr* mr, int64_t* current_bytes, int64_t* peak_bytes)
{
  return guard([&] {
    auto const& m = unwrap(mr);
    rmm::device_async_resource_ref ref{const_cast<any_device_resource&>(m.resource)};
    auto* stat = cuda::mr::resource_cast<statistics_mr>(&ref);
    if (stat == nullptr) { throw std::logic_error("the memory resource is not a statistics adaptor"); }
    auto counter   = stat->get_bytes_counter();
    *current_bytes = counter.value;
    *peak_bytes    = counter.peak;
  });
}

raftrs_status raftrs_mr_trim_async(int32_t device, const raftrs_mr* mr, int32_t* trimmed)
{
  return guard([&] {
    *trimmed = 0;
    check_device(device);
    device_scope scope{device};
    any_device_resource held = mr == nullptr ? copy_current(device) : unwrap(mr).resource;
    std::optional<rmm::device_async_resource_ref> at{rmm::device_async_resource_ref{held}};
    for (int depth = 0; at.has_value() && depth < 32; ++depth) {
      if (auto* async = as_async(*at)) {
        check(cudaMemPoolTrimTo(async->pool_handle(), 0), "giving the async pool's unused memory back");
        *trimmed += 1;
        return;
      }
      at = upstream_any(*at);
    }
  });
}

raftrs_status raftrs_buffer_grant_peer(const raftrs_buffer* buf, int32_t peer, int32_t* granted)
{
  return guard([&] {
    *granted = 0;
    if (buf == nullptr) { throw std::invalid_argument("null buffer"); }
    check_device(peer);
    auto const& b = *reinterpret_cast<shim_buffer const*>(buf);
    // Memory of a CUDA async pool is visible to another device only once the pool grants it
    // (cudaMemPoolSetAccess), whatever the contexts' peer access says. Asked each time (a
    // query): a cache keyed by pool handle would miss a new pool at a reused handle.
    std::optional<rmm::device_async_resource_ref> at{rmm::device_async_resource_ref{const_cast<any_device_resource&>(b.mr)}};
    for (int depth = 0; at.has_value() && depth < 32; ++depth) {
      if (auto* async = as_async(*at)) {
        cudaMemPool_t pool = async->pool_handle();
        device_scope scope{b.device};
        cudaMemLocation where{};
        where.type = cudaMemLocationTypeDevice;
        where.id   = peer;
        cudaMemAccessFlags flags{};
        check(cudaMemPoolGetAccess(&flags, pool, &where), "asking whether a peer device may access the async pool");
        if (flags != cudaMemAccessFlagsProtReadWrite) {
          cudaMemAccessDesc desc{};
          desc.location = where;
          desc.flags    = cudaMemAccessFlagsProtReadWrite;
          check(cudaMemPoolSetAccess(pool, &desc, 1), "giving a peer device access to the async pool");
        }
        *granted = 1;
        return;
      }
      at = upstream_any(*at);
    }
  });
}

raftrs_status raftrs_rmm_map_address(void** out)
{
  return guard([&] { *out = static_cast<void*>(&rmm::mr::detail::get_ref_map()); });
}

raftrs_status raftrs_buffer_create(int32_t device,
                                   const raftrs_mr* mr,
                                   void* stream,
                                   size_t bytes,
                                   raftrs_buffer** out,
                                   void** data,
                                   int32_t* stream_ordered)
{
  return guard([&] {
    *out = nullptr;
    // First: the resources' own arithmetic must never see such a size, and the check needs no
    // device.
    refuse_unservable(bytes);
    device_scope scope{device};
    auto owned = std::make_unique<shim_buffer>(shim_buffer{device, nullptr, bytes, any_device_resource{}, false});
    if (mr == nullptr) {
      owned->mr = copy_current(device);
    } else {
      auto const& m = unwrap(mr);
      if (m.device != device) {
        throw std::invalid_argument("a memory resource of device " + std::to_string(m.device) +
                                    " cannot allocate on device " + std::to_string(device));
      }
      owned->mr = m.resource;
    }
    rmm::device_async_resource_ref ref{owned->mr};
    owned->stream_ordered = frees_stream_ordered(ref, bytes, stream != nullptr);
    cuda::stream_ref s{static_cast<cudaStream_t>(stream)};
    if (bytes != 0) { owned->ptr = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
    *data           = owned->ptr;
    *stream_ordered = owned->stream_ordered ? 1 : 0;
    *out            = reinterpret_cast<raftrs_buffer*>(owned.release());
  });
}

raftrs_status raftrs_buffer_destroy(raftrs_buffer* buf, void* stream)
{
  return guard([&] {
    if (buf == nullptr) { return; }
    std::unique_ptr<shim_buffer> b{reinterpret_cast<shim_buffer*>(buf)};
    device_scope scope{b->device};
    if (b->ptr != nullptr) {
      rmm::device_async_resource_ref{b->mr}.deallocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, b->ptr, b->bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    }
    // Destroyed here, inside the device scope, so a pool's destructor runs on its device and the
    // caller's context is put back after it (the Rust side takes no context guard around this).
    b.reset();
  });
}

raftrs_status raftrs_gemm_f32(raftrs_resources* res,
                              int32_t trans_a,
                              int32_t trans_b,
                              int64_t m,
                              int64_t n,
                              int64_t k,
                              float alpha,
                              const float* a,
                              int64_t lda,
                              const float* b,
                              int64_t ldb,
                              float beta,
                              float* c,
                              int64_t ldc)
{
  return gemm<float>(
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasSgemm, "the fp32 matrix product (cublasSgemm)");
}

raftrs_status raftrs_gemm_f64(raftrs_resources* res,
                              int32_t trans_a,
                              int32_t trans_b,
                              int64_t m,
                              int64_t n,
                              int64_t k,
                              double alpha,
                              const double* a,
                              int64_t lda,
                              const double* b,
                              int64_t ldb,
                              double beta,
                              double* c,
                              int64_t ldc)
{
  return gemm<double>(
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasDgemm, "the fp64 matrix product (cublasDgemm)");
}

}  // extern "C"

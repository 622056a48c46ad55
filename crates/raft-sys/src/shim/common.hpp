// What every translation unit of the shim shares: the exception guard every entry point runs
// inside, the CUDA error checks, and `device_scope`. Everything here has one definition for the
// whole shim (things with state are defined in common.cpp); hidden, so of the shim's own code the
// shared object exports only the `raftrs_*` entry points of raftrs.h, as when the shim was one
// file. The RMM and RAFT templates it instantiates keep the default visibility their headers
// give them (about 680 symbols, among them RMM's per-device resource map and the pool's
// `get_event`: found by `nm -D`, the tenth audit's review).
#pragma once

#include "raftrs.h"

#include <raft/core/cublas_macros.hpp>
#include <raft/core/cusolver_macros.hpp>
#include <raft/core/cusparse_macros.hpp>
#include <raft/core/error.hpp>

#include <rmm/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace raftrs_shim __attribute__((visibility("hidden"))) {

/// Stores `what` as the calling thread's last error (common.cpp) and returns `status`.
raftrs_status fail(raftrs_status status, char const* what) noexcept;

/// Whether a library's failure text says an allocation failed (RAFT reports cuBLAS, cuSOLVER
/// and cuSPARSE statuses by name in its exceptions).
inline bool says_alloc_failed(char const* what) noexcept
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
inline void check(cudaError_t code, char const* doing)
{
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw cuda_failure(code, doing);
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
extern std::atomic<void*> noted_primaries[noted_primaries_max];

inline void* noted_primary(int device)
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
      if (ctx != nullptr && ctx == noted_primary(device)) [[likely]] { return; }
    }
    enter();
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
  /// The switch itself, out of line (issue 30: inline, the common case kept its frame and the
  /// error paths' code on every call); common.cpp.
  [[gnu::noinline]] void enter();
  /// Inline: one load once the calls are looked up (common.cpp's `driver_ctx_lookup`).
  static driver_ctx const* driver_ctx_api()
  {
    auto const* found = driver_ctx_found.load(std::memory_order_acquire);
    return found != nullptr ? found : driver_ctx_lookup();
  }
  static driver_ctx const* driver_ctx_lookup();
  static std::atomic<driver_ctx const*> driver_ctx_found;
  void* previous_{nullptr};
  int device_{0};
  int previous_device_{0};
  bool saved_ctx_{false};
  bool switched_{false};
};

/// The number of devices (0 where the driver has none); common.cpp.
int device_count();

/// `cuStreamIsCapturing`, once looked up (`stream_capturing_lookup`, common.cpp); null before.
using is_capturing_fn = int (*)(void*, int*);
extern std::atomic<is_capturing_fn> is_capturing_found;

/// `stream_capturing` before the entry point is found, or where it cannot be (common.cpp).
bool stream_capturing_lookup(void* stream) noexcept;

/// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`, through the
/// driver's entry point: binds no context). The legacy default stream (null) cannot be captured:
/// false without a call. A failed query (a sticky error of earlier work) is no capture: the call
/// it guards reports that error itself. Inline (issue 30: asked up to four times an allocation).
inline bool stream_capturing(void* stream) noexcept
{
  if (stream == nullptr) { return false; }
  // Relaxed: the pointer is a function's address, nothing published with it.
  auto const query = is_capturing_found.load(std::memory_order_relaxed);
  if (query == nullptr) [[unlikely]] { return stream_capturing_lookup(stream); }
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return query(stream, &status) == 0 && status != 0;
}

/// `cuThreadExchangeStreamCaptureMode`, once looked up (`exchange_mode_lookup`, common.cpp); null
/// before, and where it cannot be found.
using exchange_mode_fn = int (*)(int*);
extern std::atomic<exchange_mode_fn> exchange_mode_found;

/// Looks `cuThreadExchangeStreamCaptureMode` up and publishes it (null where it cannot be found).
exchange_mode_fn exchange_mode_lookup() noexcept;

/// The calling thread's stream-capture mode set to relaxed for a scope, for the hot paths (an
/// async pool's every allocation and free): the driver's entry point called directly (the
/// runtime's `cudaThreadExchangeStreamCaptureMode`, which `raftrs_fence::relaxed_capture` uses,
/// adds its own entry), the mode put back only when it was exchanged.
struct relaxed_capture_hot {
  int before{2};  // CU_STREAM_CAPTURE_MODE_RELAXED
  exchange_mode_fn exchange{nullptr};
  relaxed_capture_hot() noexcept
  {
    exchange = exchange_mode_found.load(std::memory_order_relaxed);
    if (exchange == nullptr) [[unlikely]] { exchange = exchange_mode_lookup(); }
    if (exchange != nullptr && exchange(&before) != 0) [[unlikely]] { exchange = nullptr; }
  }
  ~relaxed_capture_hot()
  {
    if (exchange != nullptr) { exchange(&before); }
  }
  relaxed_capture_hot(relaxed_capture_hot const&)            = delete;
  relaxed_capture_hot& operator=(relaxed_capture_hot const&) = delete;
};

/// Stops the process: a capture began on `stream` (on another thread) while `what` was queued
/// on it, so the graph may hold the allocation or free, and whether it ran cannot be known. As
/// the Rust side does for copies and GEMMs (`stop_if_captured_meanwhile`); common.cpp.
[[noreturn]] void stop_captured_meanwhile(char const* what) noexcept;

/// Refuses a device number that is not one of the machine's (common.cpp).
void check_device(int32_t device);

}  // namespace raftrs_shim

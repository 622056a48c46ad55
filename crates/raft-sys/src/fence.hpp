// Pool-like RMM resources (pool, arena, binning) destroyed only after the work on their memory.
//
// RMM 26.08's pool destructor hands its upstream blocks back (`deallocate_sync`, on the legacy
// default stream) before its base class waits for the events of the streams that freed into it,
// and the legacy stream is not ordered with the non-blocking streams this library uses: a pool
// dropped right after a GEMM was queued into one of its arrays gave the memory back to its
// upstream (and, for an async upstream, to the next allocation or to a trim) while the GEMM
// still wrote it. `fenced<R>` records an event on every stream that frees into `R` and waits for
// those events before `R` is destroyed. The wait never happens on the thread that let go of the
// last copy unless nothing is pending: a resource with work still queued is deferred, and the
// hook the Rust side registered schedules `raftrs_mr_drain_deferred` on a release thread.
//
// No cudaDeviceSynchronize anywhere: a device-wide wait during destroys deadlocked inside
// libcuda against another thread's cuStreamSynchronize (GPU run 45). Only events this file
// recorded are waited for, as RMM's own destructor does.
#pragma once

#include <rmm/process_is_exiting.hpp>
#include <cuda/memory_resource>
#include <cuda_runtime_api.h>
#include <algorithm>
#include <exception>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace raftrs_fence {

/// The calling thread's stream-capture mode set to relaxed for a scope: in global (or the
/// thread's own thread-local) capture mode the driver refuses event waits and queries at once,
/// which must never read as "the work is done".
struct relaxed_capture {
  cudaStreamCaptureMode before{cudaStreamCaptureModeRelaxed};
  relaxed_capture() noexcept
  {
    if (cudaThreadExchangeStreamCaptureMode(&before) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      before = cudaStreamCaptureModeRelaxed;
    }
  }
  ~relaxed_capture()
  {
    if (cudaThreadExchangeStreamCaptureMode(&before) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
  }
  relaxed_capture(relaxed_capture const&)            = delete;
  relaxed_capture& operator=(relaxed_capture const&) = delete;
};

/// Keeps `r` alive for the rest of the process: what a resource whose memory may still be in use
/// gets instead of its destructor.
template <typename Resource>
inline void leave_to_the_os(Resource const& r) noexcept
{
  try {
    static_cast<void>(new cuda::mr::any_resource<cuda::mr::device_accessible>{r});
  } catch (...) {
    std::terminate();  // neither destroying nor keeping it is possible: never free memory in use
  }
}

/// One event per stream that freed into a resource, re-recorded at every free: once all have
/// completed, nothing queued so far still uses the resource's memory.
class stream_fence {
 public:
  stream_fence() = default;
  stream_fence(stream_fence const&)            = delete;
  stream_fence& operator=(stream_fence const&) = delete;
  ~stream_fence()
  {
    // Reached only after `wait` (or at exit, where the events are left to the OS).
    if (rmm::process_is_exiting()) { return; }
    for (auto& e : events_) { static_cast<void>(cudaEventDestroy(e.second)); }
  }

  /// Called after a free on `stream` was queued (the device is current).
  void note(cudaStream_t stream) noexcept
  {
    std::lock_guard<std::mutex> lock{lock_};
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
      // A record on a capturing stream would be a node of the graph, never an event this file
      // can wait for: the resource is never destroyed (left to the OS) rather than guessed done.
      static_cast<void>(cudaGetLastError());
      poisoned_ = true;
      return;
    }
    auto it = std::find_if(events_.begin(), events_.end(), [&](auto const& p) { return p.first == stream; });
    if (it == events_.end()) {
      prune();
      cudaEvent_t e{};
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        block_on(stream);  // no event to wait for later: wait now (only when CUDA is failing)
        return;
      }
      try {
        events_.emplace_back(stream, e);
      } catch (...) {
        static_cast<void>(cudaEventDestroy(e));
        block_on(stream);
        return;
      }
      it = std::prev(events_.end());
    } else {
      // A handle may have been reused by a new stream while the old one's work still runs (a
      // stream destroyed with work queued finishes it): chain the old record into the new one.
      if (cudaStreamWaitEvent(stream, it->second, 0) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
    }
    if (cudaEventRecord(it->second, stream) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      block_on(stream);
    }
  }

  /// Whether every recorded free has completed. Only a completed event, or a context that can
  /// run nothing any more, counts: a query refused because some thread captures a stream
  /// (global mode) or because the event was recorded into a capture is "not known done".
  bool all_done() noexcept
  {
    relaxed_capture relaxed;
    std::lock_guard<std::mutex> lock{lock_};
    for (auto& e : events_) {
      auto q = cudaEventQuery(e.second);
      if (q == cudaSuccess) { continue; }
      static_cast<void>(cudaGetLastError());
      if (!work_is_over(q)) { return false; }
    }
    return true;
  }

  /// Waits for every recorded free, then forgets the events. Returns false when a wait was
  /// refused for another reason than a dead context (a capture): the memory may still be in
  /// use, and the caller must not destroy the resource.
  [[nodiscard]] bool wait() noexcept
  {
    relaxed_capture relaxed;
    std::lock_guard<std::mutex> lock{lock_};
    bool all = !poisoned_;
    for (auto& e : events_) {
      auto w = cudaEventSynchronize(e.second);
      if (w != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        all = all && work_is_over(w);
      }
      static_cast<void>(cudaEventDestroy(e.second));
    }
    events_.clear();
    return all;
  }

 private:
  /// Forgets the streams whose last free has completed: the list stays as long as the streams
  /// with work pending, not every stream that ever freed.
  void prune() noexcept
  {
    auto done = [](std::pair<cudaStream_t, cudaEvent_t> const& p) {
      if (cudaEventQuery(p.second) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return false;
      }
      static_cast<void>(cudaEventDestroy(p.second));
      return true;
    };
    events_.erase(std::remove_if(events_.begin(), events_.end(), done), events_.end());
  }
  static void block_on(cudaStream_t stream) noexcept
  {
    if (cudaStreamSynchronize(stream) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
  }

  /// Whether a wait's or query's failure means no work of the context can still run (a sticky
  /// error, a destroyed context, the runtime unloading): then nothing uses the memory any more.
  static bool work_is_over(cudaError_t e) noexcept
  {
    switch (e) {
      case cudaErrorIllegalAddress:
      case cudaErrorLaunchFailure:
      case cudaErrorIllegalInstruction:
      case cudaErrorMisalignedAddress:
      case cudaErrorInvalidAddressSpace:
      case cudaErrorInvalidPc:
      case cudaErrorHardwareStackError:
      case cudaErrorAssert:
      case cudaErrorContextIsDestroyed:
      case cudaErrorCudartUnloading:
      case cudaErrorDeviceUninitialized:
      case cudaErrorECCUncorrectable: return true;
      default: return false;
    }
  }

  std::mutex lock_;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> events_;
  bool poisoned_{false};
};

using any_device_resource = cuda::mr::any_resource<cuda::mr::device_accessible>;

/// A resource whose waits were still pending when its last copy went: destroyed by
/// `drain_deferred` once its fence is waited for.
struct deferred {
  int device;
  any_device_resource resource;
  std::unique_ptr<stream_fence> fence;
};

struct deferred_list {
  std::mutex lock;
  std::vector<deferred> items;
  std::atomic<void (*)(int32_t)> hook{nullptr};
};

/// Set while the calling thread may block on the GPU (a release thread destroying a handle):
/// a resource whose last copy goes there is waited for on the spot rather than deferred.
inline thread_local bool waiting_allowed = false;

struct may_wait {
  bool before{waiting_allowed};
  may_wait() { waiting_allowed = true; }
  ~may_wait() { waiting_allowed = before; }
  may_wait(may_wait const&)            = delete;
  may_wait& operator=(may_wait const&) = delete;
};

/// Never destroyed: resources still deferred at exit are left to the OS.
inline deferred_list& the_deferred()
{
  static auto* d = new deferred_list{};
  return *d;
}

/// `R` (an RMM pool, arena or binning resource, itself a shared handle) with a fence; held in a
/// `cuda::mr::shared_resource`, so the destructor runs once, when the last copy goes.
template <typename R>
class fenced {
 public:
  template <typename... Args>
  explicit fenced(int device, Args&&... args)
    : device_{device}, fence_{std::make_unique<stream_fence>()}, inner_{std::forward<Args>(args)...}
  {
  }
  fenced(fenced const&)            = delete;
  fenced(fenced&&)                 = delete;
  fenced& operator=(fenced const&) = delete;
  fenced& operator=(fenced&&)      = delete;

  ~fenced()
  {
    if (rmm::process_is_exiting()) {
      static_cast<void>(fence_.release());  // no CUDA call at exit; RMM's own destructor skips too
      return;
    }
    if (waiting_allowed || fence_->all_done()) {
      // Nothing pending, or a thread that may wait: `inner_` goes after it, unless a wait was
      // refused (a capture), when it is kept for the rest of the process instead.
      if (!fence_->wait()) { leave_to_the_os(inner_); }
      return;
    }
    auto& d    = the_deferred();
    auto* hook = d.hook.load(std::memory_order_acquire);
    if (hook != nullptr) {
      try {
        any_device_resource copy{inner_};  // the last copy once `inner_` goes
        {
          std::lock_guard<std::mutex> lock{d.lock};
          d.items.reserve(d.items.size() + 1);
          d.items.push_back(deferred{device_, std::move(copy), nullptr});  // within capacity
          d.items.back().fence = std::move(fence_);
        }
        hook(device_);
        return;
      } catch (...) {
        // Nothing was queued (the fence moves last, without throwing): wait here instead.
      }
    }
    // No release thread to hand it to: wait here rather than corrupt memory.
    if (!fence_->wait()) { leave_to_the_os(inner_); }
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    return inner_.allocate(stream, bytes, alignment);
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    inner_.deallocate(stream, ptr, bytes, alignment);
    fence_->note(stream.get());
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment) { return inner_.allocate_sync(bytes, alignment); }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    inner_.deallocate_sync(ptr, bytes, alignment);
  }
  [[nodiscard]] bool operator==(fenced const& other) const noexcept { return inner_ == other.inner_; }
  [[nodiscard]] bool operator!=(fenced const& other) const noexcept { return !(*this == other); }
  friend void get_property(fenced const&, cuda::mr::device_accessible) noexcept {}

  [[nodiscard]] R& inner() noexcept { return inner_; }

 private:
  int device_;
  std::unique_ptr<stream_fence> fence_;
  R inner_;
};

template <typename R>
using fenced_mr = cuda::mr::shared_resource<fenced<R>>;

}  // namespace raftrs_fence

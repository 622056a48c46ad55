// Pool-like RMM resources (pool, arena, binning) destroyed only after the work on their memory.
//
// RMM 26.08's pool destructor hands its upstream blocks back (`deallocate_sync`, on the legacy
// default stream) before its base class waits for the events of the streams that freed into it,
// and the legacy stream is not ordered with the non-blocking streams this library uses: a pool
// dropped right after a GEMM was queued into one of its arrays gave the memory back to its
// upstream (and, for an async upstream, to the next allocation or to a trim) while the GEMM
// still wrote it. `fenced<R>` waits, before `R` is destroyed, for an event recorded on every
// stream that freed into `R` after that stream's last free. The wait never happens on the
// thread that let go of the last copy unless nothing is pending: a resource with work still
// queued is deferred, and the hook the Rust side registered schedules `raftrs_mr_drain_deferred`
// on a release thread.
//
// When the event is recorded (issue 30: an event record, a wait and a capture query on every
// free cost ~1.3 µs, more than the arena's whole allocation):
// - A free whose stream's owner is known (`raftrs_buffer_free` and `raftrs_mr_deallocate_held`
//   name the Rust `Arc<CudaStream>`
//   that keeps the stream alive, through `freeing_on`) records nothing. The fence takes its own
//   reference to that stream on the stream's first such free (`held`) and records the event
//   only when it lets the stream go: when the fence is destroyed, or when the fence is the
//   stream's last holder (every resources object and array of it gone) and another stream
//   comes. A record at that moment covers everything queued on the stream until then, a
//   superset of the work before its last free: the guarantee is the same, and the stream
//   cannot be destroyed, nor its handle reused by another stream, while the fence holds it.
//   Later frees on a held stream are a thread-local hint compared with the fence's epoch: no
//   lock, no CUDA call. Every let-go bumps the epoch before the record and the release, so no
//   hint outlives the hold it stands for (a handle reused after the release misses the hint).
//   A let-go never races a free on the same stream: the fence lets a stream go only when it is
//   the last holder (no array left to free on it) or when its own last copy goes (no free
//   left at all).
// - Any other free (C++ code freeing through the resource on a stream of its own: its life is
//   unknown here) records at once, as before, chaining the previous record of the same handle
//   (the handle may belong to a new stream while the old one's work still runs). A free of
//   this kind on a held stream records nothing: the let-go's record covers it.
// - The capture query runs where an event is recorded, not at every free. A record into a
//   capturing stream is a node of the graph, never an event this file can wait for: then the
//   resource is never destroyed (left to the OS) rather than guessed done. A free on a held
//   stream while it captures is not seen, but no work of the graph can use the memory through
//   this library either: the arrays refuse pointers and copies on capturing streams (`foreign.rs`,
//   `copy.rs`), so the graph holds none of the memory, and what the stream queued for real is
//   covered by the let-go's record.
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

// Hidden, as the shim's own namespace: the process-wide state below (the keeper, the hints, the
// deferred list) is this shared object's alone, never unified with another copy of this header
// elsewhere in the process (exported, its inline variables were GNU unique symbols, which the
// dynamic loader binds to the first definition loaded: the benchmark's C++ baseline has one).
// The types stay the same by name, though (libstdc++ compares type_info names): a resource
// fenced by another copy of this header must never reach the shim (none does; the benchmark's
// stay in the benchmark).
namespace raftrs_fence __attribute__((visibility("hidden"))) {

/// The calling thread's stream-capture mode set to relaxed for a scope: in global (or the
/// thread's own thread-local) capture mode the driver refuses event waits and queries at once,
/// which must never read as "the work is done".
struct relaxed_capture {
  cudaStreamCaptureMode before{cudaStreamCaptureModeRelaxed};
  /// Whether the mode was exchanged: a failed first exchange changed nothing, and nothing is put
  /// back (putting `before` back then would leave the thread relaxed for good).
  bool swapped{false};
  relaxed_capture() noexcept
  {
    swapped = cudaThreadExchangeStreamCaptureMode(&before) == cudaSuccess;
    if (!swapped) { static_cast<void>(cudaGetLastError()); }
  }
  ~relaxed_capture()
  {
    if (swapped && cudaThreadExchangeStreamCaptureMode(&before) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
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

/// The Rust side's calls on the handle that keeps a stream alive (an `Arc<CudaStream>`):
/// take a reference, drop one, and whether the caller's reference is the only one left.
struct stream_keeper {
  void (*retain)(void const*);
  void (*release)(void const*);
  int32_t (*sole)(void const*);
};

/// Registered once by the Rust side (`raftrs_buffer_on_streams`); never freed.
inline std::atomic<stream_keeper const*> the_keeper{nullptr};

/// The free `raftrs_buffer_free` or `raftrs_mr_deallocate_held` is running on this thread: its
/// stream and the handle that keeps that stream alive (null when unknown). Read by every fence
/// the free passes through.
struct freeing_stream {
  cudaStream_t stream{nullptr};
  void const* owner{nullptr};
};

/// This thread's hints "fence `fence` held `stream` at epoch `epoch`": the fast path of a free.
struct held_hint {
  uint64_t fence{0};
  cudaStream_t stream{nullptr};
  uint64_t epoch{0};
};

/// This thread's part in the frees: the free running (`freeing_on`) and the hints. One
/// thread-local, looked up once by each user (issue 30: in a shared object loaded with dlopen,
/// every thread-local access is a call to `__tls_get_addr`; four of them in each free).
struct thread_frees {
  freeing_stream freeing{};
  held_hint hints[4]{};
  unsigned next_hint{0};
};
inline thread_local thread_frees this_thread{};

/// Set for the length of one free (see `freeing_stream`).
struct freeing_on {
  thread_frees& frees{this_thread};
  freeing_stream before{frees.freeing};
  freeing_on(cudaStream_t stream, void const* owner) noexcept { frees.freeing = freeing_stream{stream, owner}; }
  ~freeing_on() { frees.freeing = before; }
  freeing_on(freeing_on const&)            = delete;
  freeing_on& operator=(freeing_on const&) = delete;
};

/// Per stream that freed into a resource: the last event recorded on it (or none), and the
/// handle that keeps it alive while the fence holds it (see the header comment). Once every
/// event has completed and no stream is held, nothing queued so far uses the resource's memory.
class stream_fence {
 public:
  stream_fence() = default;
  stream_fence(stream_fence const&)            = delete;
  stream_fence& operator=(stream_fence const&) = delete;
  ~stream_fence()
  {
    // Reached only after `wait` (or at exit, where the events and holds are left to the OS).
    if (rmm::process_is_exiting()) { return; }
    for (auto& e : entries_) {
      if (e.event != nullptr) { static_cast<void>(cudaEventDestroy(e.event)); }
    }
  }

  /// Called after a free on `stream` was queued (the device is current).
  void note(cudaStream_t stream) noexcept
  {
    auto const* keeper = the_keeper.load(std::memory_order_acquire);
    auto const& frees = this_thread;
    if (keeper != nullptr && frees.freeing.owner != nullptr && frees.freeing.stream == stream && stream != nullptr) {
      auto const epoch = epoch_.load(std::memory_order_seq_cst);
      for (auto const& h : frees.hints) {
        if (h.fence == id_ && h.stream == stream && h.epoch == epoch) { return; }  // held already
      }
      hold(stream, frees.freeing.owner, *keeper);
      return;
    }
    record_now(stream);
  }

  /// Records every held stream's work and lets the streams go (the resource's last copy is
  /// going: no free can come any more).
  void let_all_go() noexcept
  {
    std::vector<void const*> released;
    {
      std::lock_guard<std::mutex> lock{lock_};
      for (auto& e : entries_) {
        if (e.held != nullptr) { let_go(e, released); }
      }
    }
    release(released);
  }

  /// Whether every recorded free has completed. Only a completed event, or a context that can
  /// run nothing any more, counts: a query refused because some thread captures a stream
  /// (global mode) or because the event was recorded into a capture is "not known done". A
  /// stream still held is not done (`let_all_go` comes first).
  bool all_done() noexcept
  {
    relaxed_capture relaxed;
    std::lock_guard<std::mutex> lock{lock_};
    for (auto& e : entries_) {
      if (e.held != nullptr) { return false; }
      if (e.event == nullptr) { continue; }
      auto q = cudaEventQuery(e.event);
      if (q == cudaSuccess) { continue; }
      static_cast<void>(cudaGetLastError());
      if (!work_is_over(q)) { return false; }
    }
    return true;
  }

  /// Waits for every recorded free, then forgets the events. Returns false when a wait was
  /// refused for another reason than a dead context (a capture), or a stream is still held:
  /// the memory may still be in use, and the caller must not destroy the resource.
  [[nodiscard]] bool wait() noexcept
  {
    relaxed_capture relaxed;
    std::lock_guard<std::mutex> lock{lock_};
    bool all = !poisoned_;
    for (auto& e : entries_) {
      all = all && e.held == nullptr;
      if (e.event == nullptr) { continue; }
      auto w = cudaEventSynchronize(e.event);
      if (w != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        all = all && work_is_over(w);
      }
      static_cast<void>(cudaEventDestroy(e.event));
      e.event = nullptr;
    }
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [](entry const& e) { return e.held == nullptr; }),
                   entries_.end());
    return all;
  }

 private:
  struct entry {
    cudaStream_t stream;
    cudaEvent_t event;  ///< the last record on this handle, or null
    void const* held;   ///< the reference this fence holds on the stream, or null
  };

  /// The slow path of a free on a stream whose owner is known: the fence takes a reference to
  /// the stream (alive: the freeing array holds one for the length of the free), and lets go of
  /// the streams only it still holds.
  void hold(cudaStream_t stream, void const* owner, stream_keeper const& keeper) noexcept
  {
    std::vector<void const*> released;
    bool held = false;
    {
      std::lock_guard<std::mutex> lock{lock_};
      auto found = find(stream);
      if (found != entries_.end() && found->held != nullptr) {
        held = true;
      } else {
        try {
          prune();  // may drop this stream's entry (not held, its record done): found again below
          auto it = find(stream);
          if (it == entries_.end()) {
            entries_.push_back(entry{stream, nullptr, nullptr});
            it = std::prev(entries_.end());
          }
          keeper.retain(owner);  // after the last step that can throw
          it->held = owner;
          held     = true;
          // Streams whose every resources object and array is gone: recorded and let go, so a
          // long-lived resource does not keep every stream that ever freed into it.
          for (auto& e : entries_) {
            if (e.held != nullptr && e.stream != stream && keeper.sole(e.held) != 0) { let_go(e, released); }
          }
        } catch (...) {
          held = false;  // no room for the entry: record now instead
        }
      }
      if (held) { remember(stream); }
    }
    release(released);
    if (!held) { record_now(stream); }
  }

  /// The eager record of a free whose stream's life is unknown here.
  void record_now(cudaStream_t stream) noexcept
  {
    std::lock_guard<std::mutex> lock{lock_};
    auto it = find(stream);
    if (it != entries_.end() && it->held != nullptr) { return; }  // the let-go's record covers it
    if (it == entries_.end()) {
      prune();
      try {
        entries_.push_back(entry{stream, nullptr, nullptr});
      } catch (...) {
        block_on(stream);  // no entry to wait for later: wait now (only when memory is short)
        return;
      }
      it = std::prev(entries_.end());
    }
    record(*it);
  }

  /// Records `e`'s stream's work so far and drops the fence's reference (into `released`, let go
  /// after the lock). The epoch moves first: no hint of this hold survives it.
  void let_go(entry& e, std::vector<void const*>& released) noexcept
  {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    record(e);
    try {
      released.push_back(e.held);
    } catch (...) {
      // No room to let it go after the lock: keep the reference (the stream outlives its need).
    }
    e.held = nullptr;
  }

  /// Records an event on `e`'s stream after everything queued on it so far (under the lock).
  void record(entry& e) noexcept
  {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(e.stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
      // A record on a capturing stream would be a node of the graph, never an event this file
      // can wait for: the resource is never destroyed (left to the OS) rather than guessed done.
      static_cast<void>(cudaGetLastError());
      poisoned_ = true;
      return;
    }
    if (e.event == nullptr) {
      if (cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        e.event = nullptr;
        block_on(e.stream);  // no event to wait for later: wait now (only when CUDA is failing)
        return;
      }
    } else {
      // A handle may have been reused by a new stream while the old one's work still runs (a
      // stream destroyed with work queued finishes it): chain the old record into the new one.
      if (cudaStreamWaitEvent(e.stream, e.event, 0) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
    }
    if (cudaEventRecord(e.event, e.stream) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      block_on(e.stream);
    }
  }

  std::vector<entry>::iterator find(cudaStream_t stream)
  {
    return std::find_if(entries_.begin(), entries_.end(), [&](entry const& e) { return e.stream == stream; });
  }

  /// This thread's hint that `stream` is held at the current epoch (under the lock).
  void remember(cudaStream_t stream) noexcept
  {
    auto& frees                          = this_thread;
    frees.hints[frees.next_hint++ % 4] = held_hint{id_, stream, epoch_.load(std::memory_order_seq_cst)};
  }

  /// Lets the references go, outside the lock: the last reference to a stream destroys it.
  static void release(std::vector<void const*> const& released) noexcept
  {
    auto const* keeper = the_keeper.load(std::memory_order_acquire);
    if (keeper == nullptr || rmm::process_is_exiting()) { return; }  // at exit: left to the OS
    for (auto const* r : released) { keeper->release(r); }
  }

  /// Forgets the streams no longer held whose last record has completed: the list stays as
  /// long as the streams with work pending or held, not every stream that ever freed.
  void prune() noexcept
  {
    // Event queries are refused (and invalidate the capture) while another thread captures in
    // global mode, as in `all_done` (the eighth audit).
    relaxed_capture relaxed;
    auto done = [](entry const& e) {
      if (e.held != nullptr) { return false; }
      if (e.event == nullptr) { return true; }
      if (cudaEventQuery(e.event) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return false;
      }
      static_cast<void>(cudaEventDestroy(e.event));
      return true;
    };
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), done), entries_.end());
  }
  /// Waits for `stream` now, in relaxed capture mode. A wait refused for another reason than a
  /// dead context leaves the memory possibly in use: the resource is then never destroyed
  /// (`poisoned_`, under the lock), as for a record refused by a capture.
  void block_on(cudaStream_t stream) noexcept
  {
    relaxed_capture relaxed;
    auto w = cudaStreamSynchronize(stream);
    if (w != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      if (!work_is_over(w)) { poisoned_ = true; }
    }
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

  static uint64_t next_id() noexcept
  {
    static std::atomic<uint64_t> ids{1};
    return ids.fetch_add(1, std::memory_order_relaxed);
  }

  std::mutex lock_;
  std::vector<entry> entries_;
  std::atomic<uint64_t> epoch_{1};
  uint64_t const id_{next_id()};  ///< never reused: a hint never names another fence
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
    // No free can come any more: the held streams' work so far is recorded, the streams let go.
    fence_->let_all_go();
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

  /// For a binning resource: the largest bin its constructor made (sizes up to it go to
  /// fixed-size pools, whose frees never block; see `free_order_of`). 0 otherwise. Set once,
  /// before the resource is handed out.
  [[nodiscard]] std::size_t ordered_up_to() const noexcept { return ordered_up_to_; }
  void set_ordered_up_to(std::size_t bytes) noexcept { ordered_up_to_ = bytes; }

 private:
  int device_;
  std::size_t ordered_up_to_{0};
  std::unique_ptr<stream_fence> fence_;
  R inner_;
};

template <typename R>
using fenced_mr = cuda::mr::shared_resource<fenced<R>>;

}  // namespace raftrs_fence

// Issue 30's floors of `DeviceResources::new()` + `release()` + drop (docs/BENCHMARKS.md): C++
// doing the steps this library's soundness requires of them, and with the steps its design adds.
// Compiled beside baseline.cpp (the bare C++ rows), with the same toolchain and headers.
#include <raft/core/device_resources.hpp>
#include <raft/core/resource/device_id.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <utility>
#include <vector>

// The shim's fence header, for its `relaxed_capture` (hidden namespace: this copy never meets
// the shim's).
#include "fence.hpp"

namespace {
/// `cuCtxGetCurrent` (an entry point from the runtime) and the context of the thread that first
/// asked (the bench's thread, on device 0): the floors' device check, as baseline.cpp's
/// `context_check` makes it.
struct context_read {
  using get_fn = CUresult (*)(CUcontext*);
  get_fn get_current{};
  CUcontext ctx{};

  context_read()
  {
    void* f{};
    cudaDriverEntryPointQueryResult q{};
    cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &f, 12000, cudaEnableDefault, &q);
    get_current = reinterpret_cast<get_fn>(f);
    if (get_current != nullptr) { get_current(&ctx); }
  }

  /// One read of the thread's context, compared with the expected one.
  [[nodiscard]] bool on_device() const
  {
    CUcontext c{};
    return get_current != nullptr && get_current(&c) == CUDA_SUCCESS && c == ctx;
  }
};
}  // namespace

namespace {
/// The state a resources object needs in C++ for `new()` + `release()` to be sound (the floor
/// of bl_create_release_floor): the native object under a reader-writer lock (a use holds it
/// shared, a release takes it exclusively), the release's progress under a mutex (a second
/// release waits for the first), and the object's slot in the registry of live objects (the
/// exit releases what is still alive).
struct floor_resources {
  std::shared_mutex native_lock;
  std::mutex releasing;
  int phase{0};  // 0 alive, 1 releasing, 2 released
  cudaStream_t stream{};
  raft::device_resources* res{};
  std::size_t slot{};

  floor_resources() = default;
  floor_resources(floor_resources const&)            = delete;
  floor_resources& operator=(floor_resources const&) = delete;
  ~floor_resources()
  {
    // What a failed step left (nothing after a release).
    delete res;
    if (stream != nullptr) { static_cast<void>(cudaStreamDestroy(stream)); }
  }
};

/// The registry of live objects: a slot each, reused once freed (as the library keeps it).
struct floor_registry {
  std::mutex lock;
  std::vector<std::weak_ptr<floor_resources>> slots;
  std::vector<std::size_t> free;
};

floor_registry& live_floor_resources()
{
  static floor_registry r;
  return r;
}

/// An object's slot in the registry, freed when the object is dropped (or a step failed).
struct floor_slot {
  std::size_t at;

  explicit floor_slot(std::shared_ptr<floor_resources> const& s)
  {
    auto& reg = live_floor_resources();
    std::lock_guard<std::mutex> lock{reg.lock};
    if (reg.free.empty()) {
      at = reg.slots.size();
      reg.slots.emplace_back(s);
    } else {
      at = reg.free.back();
      reg.free.pop_back();
      reg.slots[at] = s;
    }
    s->slot = at;
  }
  floor_slot(floor_slot const&)            = delete;
  floor_slot& operator=(floor_slot const&) = delete;
  ~floor_slot()
  {
    auto& reg = live_floor_resources();
    std::lock_guard<std::mutex> lock{reg.lock};
    reg.slots[at].reset();
    reg.free.push_back(at);
  }
};

/// The registry of the streams' capture flags (`result/exposure.rs`): a flag per resources object
/// under its stream's handle, taken out at the release.
struct floor_flags {
  std::mutex lock;
  /// No node allocated per entry, as in the library's `HashMap`: a short vector (a handful of
  /// live streams in the bench).
  std::vector<std::pair<std::uintptr_t, std::weak_ptr<std::atomic<bool>>>> by_stream;
};

floor_flags& floor_capture_flags()
{
  static floor_flags f;
  return f;
}

/// `bl_create_release_floor`, or with `as_designed` the two steps this library's design adds to
/// them: the stream's capture flag registered at the creation and raised and taken out at the
/// release (issue 30's private streams), and RAFT's object destroyed with the thread's capture mode
/// relaxed (the eleventh audit: cuBLAS's destroy and RMM's frees of the workspaces, refused during
/// another thread's global capture, leaked what they freed).
int32_t create_release_floor(bool as_designed)
{
  try {
    static context_read const h;
    if (!h.on_device()) { return 1; }
    auto s = std::make_shared<floor_resources>();
    if (cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess) {
      s->stream = nullptr;
      return 1;
    }
    s->res = new raft::device_resources(rmm::cuda_stream_view{s->stream});  // the stream is s's until released
    (void)raft::resource::get_device_id(*s->res);
    std::shared_ptr<std::atomic<bool>> flag;
    auto const key = reinterpret_cast<std::uintptr_t>(s->stream);
    if (as_designed) {
      flag = std::make_shared<std::atomic<bool>>(false);
      auto& f = floor_capture_flags();
      std::lock_guard<std::mutex> lock{f.lock};
      auto found = std::find_if(f.by_stream.begin(), f.by_stream.end(), [&](auto const& e) { return e.first == key; });
      if (found != f.by_stream.end()) {
        found->second = flag;
      } else {
        f.by_stream.emplace_back(key, flag);
      }
    }
    // Declared after `s`: the slot is freed first when this scope ends (the drop below), also
    // when a step fails.
    floor_slot const slot{s};
    // release
    {
      std::lock_guard<std::mutex> lock{s->releasing};
      if (s->phase != 0) { return 1; }
      s->phase = 1;
    }
    raft::device_resources* res{};
    cudaStream_t stream{};
    {
      std::unique_lock<std::shared_mutex> lock{s->native_lock};
      res    = std::exchange(s->res, nullptr);
      stream = std::exchange(s->stream, nullptr);
    }
    bool const bound = h.on_device();
    {
      std::optional<raftrs_fence::relaxed_capture> relaxed;
      if (as_designed) { relaxed.emplace(); }
      delete res;
    }
    if (as_designed) {
      flag->store(true, std::memory_order_seq_cst);
      auto& f = floor_capture_flags();
      std::lock_guard<std::mutex> lock{f.lock};
      auto found = std::find_if(f.by_stream.begin(), f.by_stream.end(), [&](auto const& e) { return e.first == key; });
      // Only this object's own entry, compared by address (`Weak::as_ptr`), no count taken.
      if (found != f.by_stream.end() && !found->second.owner_before(flag) && !flag.owner_before(found->second)) {
        *found = std::move(f.by_stream.back());
        f.by_stream.pop_back();
      }
    }
    bool const destroyed = cudaStreamDestroy(stream) == cudaSuccess;
    {
      std::lock_guard<std::mutex> lock{s->releasing};
      s->phase = 2;
    }
    // drop: the slot, then the state (end of scope)
    return bound && destroyed ? 0 : 1;
  } catch (...) {
    return 1;
  }
}
}  // namespace

extern "C" {
// Issue 30's floor of `DeviceResources::new()` + `release()` + drop: C++ doing the steps this
// library's soundness requires of them, and nothing else. new: the thread's context read (which
// device; the device's context bound for the creation), a non-blocking stream, RAFT's object on
// it with its device recorded (so RAFT never guesses it later from whichever device is current),
// the shared state made and its slot taken in the registry of live objects. release: the state
// marked releasing under its mutex, the native object taken under the exclusive lock, the thread's
// context read again (a release binds the stream's device: it may run on any thread), RAFT's
// object and the stream destroyed, the state marked released. drop: the slot freed, the state
// freed.
int32_t bl_create_release_floor() { return create_release_floor(false); }

// The same plus the two steps this library's design adds to them (see create_release_floor):
// what is left between ours and this is the layer's waste.
int32_t bl_create_release_floor_as_designed() { return create_release_floor(true); }
}

// The memory-resource types the shim's translation units share: what a raftrs_mr is, the
// guarded async pool (its type is what `classify` recognises), the touch of RMM's per-device
// map, and the walk up an adaptor chain. Definitions with state live in one .cpp each.
#pragma once

#include "common.hpp"
#include "../fence.hpp"

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/failure_callback_resource_adaptor.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/logging_resource_adaptor.hpp>
#include <rmm/mr/managed_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>
#include <rmm/mr/pinned_host_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/mr/thread_safe_resource_adaptor.hpp>
#include <rmm/mr/tracking_resource_adaptor.hpp>
#include <rmm/process_is_exiting.hpp>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace raftrs_shim __attribute__((visibility("hidden"))) {

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

/// The one list of retired pools (async_pools.cpp).
retired_pools& the_retired();

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

  // Every call into the pool runs with the thread's capture mode relaxed: the driver refuses
  // cuMemAllocFromPoolAsync and cuMemFreeAsync, on a stream no capture holds, in the thread's
  // global mode while another thread captures in global mode (PyTorch's default), and the
  // refusal invalidates that capture; RMM's free swallows it (noexcept), so the block never went
  // back (the thirteenth audit, its second helper's probe on the H200). The shim's own buffers
  // refuse a capture of the allocating stream before the call, whatever the mode (buffers.cpp);
  // RAFT's or cuVS's allocations through the current resource reach the pool unchecked, where the
  // mode decides nothing about what a captured stream takes. Two mode switches through the
  // driver's entry point per call (`relaxed_capture_hot`).
  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    relaxed_capture_hot relaxed;
    return pool_.allocate(stream, bytes, alignment);
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    relaxed_capture_hot relaxed;
    pool_.deallocate(stream, ptr, bytes, alignment);
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment)
  {
    relaxed_capture_hot relaxed;
    return pool_.allocate_sync(bytes, alignment);
  }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    relaxed_capture_hot relaxed;
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

/// An async pool on `device` (which must be current), guarded, with RMM's semantics for the two
/// sizes (`cuda_async_memory_resource`'s constructor): the release threshold is "never" unless
/// given, and the pool is primed by allocating and freeing `initial_pool_size` on the null
/// stream. A retired pool of the device that is ready for reuse is taken first; a new one is
/// made only when none is.
any_device_resource guarded_async(int device,
                                  std::optional<std::size_t> initial_pool_size = {},
                                  std::optional<std::size_t> release_threshold = {});

/// The CUDA async pool `ref` is (guarded or not), or null.
rmm::mr::cuda_async_memory_resource* as_async(rmm::device_async_resource_ref& ref);

/// The kind (`RAFTRS_MR_*`) of the resource behind `ref` (memory_resources.cpp).
int32_t classify(rmm::device_async_resource_ref ref);

/// An owned resource: what raftrs_mr points at. `device` is the device it was made for (RMM's
/// resources must be used with that device current).
struct shim_mr {
  int device;
  any_device_resource resource;
  /// How frees through `resource` order (a `free_order`), worked out at the first allocation:
  /// the resource never changes, so its adaptor chain is walked once, not per allocation.
  /// Negative: not yet worked out.
  mutable std::atomic<int64_t> order{-1};
  /// Whether `resource` wraps a reference to a resource (`current_equals_held`): 1 or 0, -1
  /// until first asked (its type never changes).
  mutable std::atomic<int8_t> by_reference{-1};
  /// Whether an allocation or free through `resource` may be taken into a CUDA graph when its
  /// stream is being captured (`may_be_captured`, buffers.cpp): 1 or 0, -1 until first asked.
  mutable std::atomic<int8_t> captures{-1};
  /// Whether an allocation through `resource` may make its stream wait for another stream's
  /// event (`may_join_another_stream`, buffers.cpp): 1 or 0, -1 until first asked.
  mutable std::atomic<int8_t> joins{-1};
};

/// How a resource's frees order, as the largest block (after RMM's alignment) whose free on the
/// stream that allocated it never blocks the caller: `frees_may_block` (0) when any free may
/// block, `frees_stream_ordered_always` when every free is stream-ordered (on any stream), and
/// in between a size: RMM's arena (1 MiB: larger blocks go to its global arena, which
/// synchronises), this shim's binning resource (its largest bin: smaller sizes go to
/// fixed-size pools) over an upstream that may block.
using free_order = int64_t;
inline constexpr free_order frees_may_block             = 0;
inline constexpr free_order frees_stream_ordered_always = std::numeric_limits<int64_t>::max();

/// The `free_order` of the resource behind `mr` (a walk down its adaptors; buffers.cpp).
free_order free_order_of(rmm::device_async_resource_ref mr);

/// Whether `device`'s entry in RMM's per-device map compares equal to `cached` (read under
/// RMM's lock, so the entry cannot be replaced meanwhile). The caller holds an `rmm_map_use`.
bool current_equals_held(int device, shim_mr const& cached);

inline shim_mr const& unwrap(raftrs_mr const* mr)
{
  if (mr == nullptr) { throw std::invalid_argument("null memory resource"); }
  return *reinterpret_cast<shim_mr const*>(mr);
}

inline raftrs_mr* wrap(shim_mr* mr) { return reinterpret_cast<raftrs_mr*>(mr); }

/// A touch of RMM's per-device map: refused (`std::logic_error`) once the process is exiting.
/// Not reentrant: take one per entry point. Defined with the map's exit handling (exit.cpp).
class rmm_map_use {
 public:
  rmm_map_use();

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

/// A copy of `device`'s entry in RMM's per-device map, taken under RMM's own lock, so no other
/// thread can replace (and destroy) the entry while it is copied. A missing entry is RMM's
/// initial cuda_memory_resource, stateless, so a copy of it is as good as it. The caller holds
/// an `rmm_map_use`.
any_device_resource copy_current_held(int device);

/// [`copy_current_held`] with its own map use.
any_device_resource copy_current(int device);

/// The upstream of an adaptor of type `A` behind `mr` (or nothing when `mr` is no `A`).
template <typename A>
std::optional<rmm::device_async_resource_ref> upstream_of(rmm::device_async_resource_ref mr)
{
  auto* a = cuda::mr::resource_cast<A>(&mr);
  if (a == nullptr) { return std::nullopt; }
  return a->get_upstream_resource();
}

/// The upstream of a pool or a binning resource made here, when that upstream's frees may block
/// (`cudaMalloc`, `cudaMallocHost`, managed memory, and adaptors over them): every call into it,
/// a growth (a pool's next block, a bin's next chunk, a binning resource's block too large for
/// its bins) and the blocks handed back, runs with the thread's capture mode relaxed. In the
/// thread's global mode the driver refuses those calls while another thread captures in global
/// mode (PyTorch's default), and the refusal invalidates that capture (the thirteenth audit: the
/// twelfth left a pool's growth refused). Only the upstream's calls pay the two mode switches,
/// never an allocation the pool serves itself; an upstream that relaxes its own calls (this
/// shim's async pool, pools and binning resources) is used bare (`growing_from`).
class relaxed_upstream {
 public:
  explicit relaxed_upstream(any_device_resource upstream) : upstream_{std::move(upstream)} {}

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  {
    raftrs_fence::relaxed_capture relaxed;
    return upstream_.allocate(stream, bytes, alignment);
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    raftrs_fence::relaxed_capture relaxed;
    upstream_.deallocate(stream, ptr, bytes, alignment);
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment)
  {
    raftrs_fence::relaxed_capture relaxed;
    return upstream_.allocate_sync(bytes, alignment);
  }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    raftrs_fence::relaxed_capture relaxed;
    upstream_.deallocate_sync(ptr, bytes, alignment);
  }
  [[nodiscard]] bool operator==(relaxed_upstream const& other) const noexcept { return upstream_ == other.upstream_; }
  [[nodiscard]] bool operator!=(relaxed_upstream const& other) const noexcept { return !(*this == other); }
  friend void get_property(relaxed_upstream const&, cuda::mr::device_accessible) noexcept {}

  /// The resource it relaxes the calls into.
  [[nodiscard]] rmm::device_async_resource_ref get_upstream_resource() noexcept { return upstream_; }

 private:
  any_device_resource upstream_;
};

/// The upstream of a pool-like `R` behind `mr`, fenced (made here) or not (made elsewhere); the
/// resource under a `relaxed_upstream`, which is not a resource of its own.
template <typename R>
std::optional<rmm::device_async_resource_ref> upstream_of_pooled(rmm::device_async_resource_ref mr)
{
  if (auto* f = cuda::mr::resource_cast<raftrs_fence::fenced_mr<R>>(&mr)) {
    rmm::device_async_resource_ref up = f->get().inner().get_upstream_resource();
    if (auto* relaxed = cuda::mr::resource_cast<relaxed_upstream>(&up)) { return relaxed->get_upstream_resource(); }
    return up;
  }
  return upstream_of<R>(mr);
}

/// The upstream of an adaptor or pool behind `mr`, when it has one this shim knows.
std::optional<rmm::device_async_resource_ref> upstream_any(rmm::device_async_resource_ref mr);

}  // namespace raftrs_shim

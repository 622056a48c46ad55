// CUDA async pools this shim makes: never destroyed, retired for reuse when their last copy
// goes (see `async_pool_guard` in memory.hpp for why), and the entry points that count, trim
// and measure them.
#include "memory.hpp"

#include <cuda/memory_resource>

#include <iterator>
#include <limits>

namespace raftrs_shim __attribute__((visibility("hidden"))) {

retired_pools& the_retired()
{
  static auto* r = new retired_pools{};
  return *r;
}

}  // namespace raftrs_shim

using namespace raftrs_shim;

namespace {

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

/// Primes a guarded pool to `initial_pool_size` (one allocation of that size, freed at once),
/// as RMM's constructor does; a failure throws, and the guard (dropped by the caller's unwind)
/// retires the pool.
void prime(guarded_async_mr& shared, std::optional<std::size_t> initial_pool_size)
{
  if (!initial_pool_size.has_value()) { return; }
  auto& pool = shared.get().pool();
  void* p    = pool.allocate(cuda::stream_ref{cudaStream_t{nullptr}}, *initial_pool_size, rmm::CUDA_ALLOCATION_ALIGNMENT);
  pool.deallocate(cuda::stream_ref{cudaStream_t{nullptr}}, p, *initial_pool_size, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

}  // namespace

namespace raftrs_shim __attribute__((visibility("hidden"))) {

any_device_resource guarded_async(int device,
                                  std::optional<std::size_t> initial_pool_size,
                                  std::optional<std::size_t> release_threshold)
{
  // A pool's creation (cudaMemPoolCreate), a reused one's questions and settings, and its
  // priming: all refused in the thread's global mode while another thread captures in global
  // mode, which the refusal invalidates (the thirteenth audit: through MemoryResource::cuda_async
  // and the default pool's installation).
  // Through the driver's entry point: no runtime call that could bind device 0's context on a
  // thread that has none.
  relaxed_capture_hot relaxed;
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
    // Made without its initial size and primed below through the guard, as a reused pool is:
    // RMM's constructor primes before it completes, and a priming that failed (an initial size
    // past the device's memory) left the pool made and never destroyed, one more at every
    // such call, until the driver had none left (the fifteenth audit).
    rmm::mr::cuda_async_memory_resource fresh{std::nullopt, release_threshold};
    r.made.fetch_add(1, std::memory_order_relaxed);
    auto shared = guard_pool(device, std::move(fresh));
    prime(shared, initial_pool_size);
    return any_device_resource{std::move(shared)};
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
  prime(shared, initial_pool_size);
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

}  // namespace raftrs_shim

extern "C" {

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
    relaxed_capture_hot relaxed;  // the pool's attributes: as in guarded_async
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
    relaxed_capture_hot relaxed;  // the pools' attributes and trims, outside any device scope: as in guarded_async
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

raftrs_status raftrs_mr_trim_async(int32_t device, const raftrs_mr* mr, int32_t* trimmed)
{
  return guard([&] {
    *trimmed = 0;
    check_device(device);
    device_scope scope{device};
    relaxed_capture_hot relaxed;  // the trim: as in guarded_async
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

}  // extern "C"

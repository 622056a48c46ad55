// Device memory behind raftrs_buffer, each holding its own copy of the resource that frees it,
// and the copies, memsets and peer grants on it.
#include "memory.hpp"

#include <cuda/memory_resource>

#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

using namespace raftrs_shim;

namespace {

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

}  // namespace

extern "C" {

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

}  // extern "C"

// Device memory behind raftrs_buffer, each holding its own copy of the resource that frees it;
// held allocations (the caller keeps the resource alive) without such a record; and the copies,
// memsets and peer grants on device memory.
#include "memory.hpp"

#include <cuda/memory_resource>

#include <algorithm>
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

/// Throws the refusal of `bytes` (`refuse_unservable`; out of line, and never on the hot path).
[[noreturn, gnu::cold, gnu::noinline]] void throw_unservable(std::size_t bytes)
{
  if (bytes > std::numeric_limits<std::size_t>::max() - rounding_slack) {
    throw std::invalid_argument(std::to_string(bytes) +
                                " bytes: rounding the size up to an allocation's alignment wraps around");
  }
  throw rmm::out_of_memory(std::to_string(bytes) +
                           " bytes is more than any device or host memory holds (at most 2^48 bytes in one allocation)");
}

/// Refuses what no resource can serve; touches no CUDA (callable without a driver). A compare
/// inline, the message built out of line (issue 30: the whole function's frame on every
/// allocation).
inline void refuse_unservable(std::size_t bytes)
{
  if (bytes > max_allocation_bytes) [[unlikely]] { throw_unservable(bytes); }
}

/// The device memory behind raftrs_buffer: the pointer and its own copy of the resource that
/// must free it. Replacing the per-device resource, or dropping every other handle to it, never
/// invalidates a live buffer. (A held allocation, raftrs_mr_allocate_held, has no such record:
/// the caller keeps the pointer, the size and the resource that frees it.)
struct shim_buffer {
  int device;
  void* ptr;
  std::size_t bytes;
  any_device_resource owned;
  bool stream_ordered;

  rmm::device_async_resource_ref ref() const
  {
    return rmm::device_async_resource_ref{const_cast<any_device_resource&>(owned)};
  }
};

/// Whether freeing `bytes` from a resource of order `order`, on the stream the block was
/// allocated on (never the legacy default stream: `on_own_stream`), never blocks the caller.
bool frees_stream_ordered(free_order order, std::size_t bytes, bool on_own_stream)
{
  if (order == frees_stream_ordered_always) { return true; }
  // RMM 26.08's arena (rmm/mr/detail/arena.hpp) synchronises the stream when it frees a block
  // its global arena handles (over superblock::minimum_size, 1 MiB, after alignment) or one
  // that belongs to another stream's arena; a binning resource hands sizes past its largest bin
  // to its upstream. A block within the size freed on the (non-default) stream that allocated it
  // stays with the stream-ordered part.
  // RMM's align_up, inline (it is a call into librmm otherwise). `bytes` is at most 2^48 at an
  // allocation (refuse_unservable), and a free passes the size its allocation returned, so the
  // sum cannot wrap; a size near SIZE_MAX passed to a free anyway would only be read as
  // stream-ordered (no relaxed capture mode around it), never used as a size.
  constexpr std::size_t align = rmm::CUDA_ALLOCATION_ALIGNMENT;
  static_assert((align & (align - 1)) == 0, "RMM's alignment is a power of two");
  return on_own_stream && order > 0 && ((bytes + align - 1) & ~(align - 1)) <= static_cast<std::size_t>(order);
}

/// `m`'s free order, walked once per resource handle.
free_order order_of(shim_mr const& m)
{
  auto known = m.order.load(std::memory_order_relaxed);
  if (known >= 0) { return known; }
  auto found = free_order_of(rmm::device_async_resource_ref{const_cast<any_device_resource&>(m.resource)});
  m.order.store(found, std::memory_order_relaxed);  // the same answer whoever stores it
  return found;
}

/// The first answer `decide` gives down `mr`'s chain: `decide` says 1 or 0 of a resource kind
/// it knows and -1 of an adaptor, whose upstream is asked next. An adaptor whose upstream this
/// shim cannot see, or a chain that ends without an answer, is taken as the worse answer (1).
template <typename Decide>
bool first_answer_down_the_chain(rmm::device_async_resource_ref mr, Decide decide)
{
  for (std::optional<rmm::device_async_resource_ref> at{mr}; at.has_value(); at = upstream_any(*at)) {
    int const answer = decide(classify(*at));
    if (answer >= 0) { return answer != 0; }
  }
  return true;
}

/// `walk`'s answer for `m`, worked out once per resource handle and kept in `cache` (-1 until
/// first asked; the resource never changes, so the same answer whoever stores it).
template <typename Walk>
bool cached(std::atomic<int8_t>& cache, shim_mr const& m, Walk walk)
{
  auto known = cache.load(std::memory_order_relaxed);
  if (known >= 0) { return known != 0; }
  bool found = walk(rmm::device_async_resource_ref{const_cast<any_device_resource&>(m.resource)});
  cache.store(found ? 1 : 0, std::memory_order_relaxed);
  return found;
}

/// Whether an allocation or a free through `mr` may put work into a CUDA graph when its stream
/// is being captured: a CUDA async pool anywhere down the chain (`cudaMallocFromPoolAsync` and
/// `cudaFreeAsync` become graph nodes); a pool or a binning resource (RMM's
/// `stream_ordered_memory_resource`, which a pool and each fixed-size bin are: a free records
/// its stream's event, an allocation that takes a block freed on another stream waits for that
/// stream's event, and a growth allocates from the upstream on the caller's stream; a binning
/// resource made elsewhere may also hold bins of any resource); or a resource this shim cannot
/// see into. `cudaMalloc`, managed and page-locked memory cannot be captured (in global capture
/// mode they fail instead), and RMM 26.08's arena takes its whole global arena from its
/// upstream when it is made (`allocate_sync`), never on a stream afterwards.
bool may_be_captured(rmm::device_async_resource_ref mr)
{
  return first_answer_down_the_chain(mr, [](int32_t kind) {
    switch (kind) {
      case RAFTRS_MR_CUDA:
      case RAFTRS_MR_MANAGED:
      case RAFTRS_MR_PINNED_HOST:
      case RAFTRS_MR_ARENA: return 0;
      case RAFTRS_MR_CUDA_ASYNC:
      case RAFTRS_MR_POOL:
      case RAFTRS_MR_BINNING:
      case RAFTRS_MR_OTHER: return 1;
      default: return -1;  // an adaptor: its upstream decides
    }
  });
}

/// `m`'s `may_be_captured`, walked once per resource handle.
bool captures_of(shim_mr const& m) { return cached(m.captures, m, may_be_captured); }

/// Whether an allocation through `mr` may make its stream wait for an event of another stream:
/// RMM's pool and binning resources (`stream_ordered_memory_resource`: a block freed on another
/// stream is taken, or every stream's free list merged, after `cudaStreamWaitEvent` on that
/// stream's last free), and a resource this shim cannot see into. A wait on an event recorded
/// into a capture (a free there by code outside these crates) takes the allocating stream into
/// the capture, so a stream no code outside the library holds may be capturing after such an
/// allocation (the tenth audit). The CUDA async pool (the driver orders its reuse), the arena
/// (a foreign block goes to its global arena after a host wait), `cudaMalloc`, managed and
/// page-locked memory never wait on a stream.
bool may_join_another_stream(rmm::device_async_resource_ref mr)
{
  return first_answer_down_the_chain(mr, [](int32_t kind) {
    switch (kind) {
      case RAFTRS_MR_CUDA:
      case RAFTRS_MR_MANAGED:
      case RAFTRS_MR_PINNED_HOST:
      case RAFTRS_MR_ARENA:
      case RAFTRS_MR_CUDA_ASYNC: return 0;
      case RAFTRS_MR_POOL:
      case RAFTRS_MR_BINNING:
      case RAFTRS_MR_OTHER: return 1;
      default: return -1;  // an adaptor: its upstream decides
    }
  });
}

/// `m`'s `may_join_another_stream`, walked once per resource handle.
bool joins_of(shim_mr const& m) { return cached(m.joins, m, may_join_another_stream); }

/// The refusals below, thrown out of line (issue 30: the message's construction kept a frame on
/// every allocation and free).
[[noreturn, gnu::cold, gnu::noinline]] void throw_capturing_allocation()
{
  throw std::logic_error(
    "the stream is being captured into a CUDA graph: an allocation on it could become a node of the graph, its "
    "memory valid only while the graph runs; allocate before the capture begins or after it ends");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_capturing_free()
{
  throw std::logic_error(
    "the stream is being captured into a CUDA graph: the block is not freed (its free would become a node of "
    "the graph) and stays allocated, with its resource, until the process ends; drop arrays before the "
    "capture begins or after it ends");
}

/// Refuses an allocation on a stream being captured into a CUDA graph. Through a CUDA async pool
/// the allocation would become a node of the graph, its address backed only while the graph
/// runs (a copy into it outside the graph faults, or writes memory the graph's launches reuse);
/// a pool or a bin growing from such an upstream would keep that address in its free lists.
/// Refused for every resource, so the rule does not depend on what the resource is built from.
inline void refuse_capturing_allocation(void* stream)
{
  if (stream_capturing(stream)) [[unlikely]] { throw_capturing_allocation(); }
}

/// Refuses a free on a stream being captured into a CUDA graph: through a CUDA async pool the
/// free would become a node of the graph, run at each launch (a second launch frees the block
/// again, after it may have been handed out anew), and not now; a pool's free would record its
/// stream's event into the graph, where the next allocation on another stream cannot wait for
/// it. The caller keeps the block, and the resource that owns it, for the process's life.
inline void refuse_capturing_free(void* stream)
{
  if (stream_capturing(stream)) [[unlikely]] { throw_capturing_free(); }
}

/// Allocates `bytes` on `stream` through `b`'s resource (the device is current; the stream was
/// found not capturing).
void allocate_into(shim_buffer& b, free_order order, void* stream, std::size_t bytes)
{
  b.stream_ordered = frees_stream_ordered(order, bytes, stream != nullptr);
  if (bytes != 0) {
    // Relaxed unless stream-ordered, as its free is (cudaMalloc, cudaMallocHost: refused during
    // another thread's global capture, which they invalidate; the twelfth audit).
    std::optional<raftrs_fence::relaxed_capture> relaxed;
    if (!b.stream_ordered) { relaxed.emplace(); }
    b.ptr = b.ref().allocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    if (stream_capturing(stream) && may_be_captured(b.ref())) { stop_captured_meanwhile("an allocation"); }
  }
}

/// Frees `buf` through its resource on `stream`; `owner` keeps that stream alive (fence.hpp).
void free_buffer(raftrs_buffer* buf, void* stream, void const* owner)
{
  if (buf == nullptr) { return; }
  std::unique_ptr<shim_buffer> b{reinterpret_cast<shim_buffer*>(buf)};
  std::optional<device_scope> scope;
  try {
    if (b->ptr != nullptr) { refuse_capturing_free(stream); }
    scope.emplace(b->device);
    if (b->ptr != nullptr) {
      // Relaxed unless stream-ordered, as in raftrs_mr_deallocate_held (page-locked memory's
      // cudaFreeHost, here).
      std::optional<raftrs_fence::relaxed_capture> relaxed;
      if (!b->stream_ordered) { relaxed.emplace(); }
      raftrs_fence::freeing_on freeing{static_cast<cudaStream_t>(stream), owner};
      b->ref().deallocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, b->ptr, b->bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      if (stream_capturing(stream) && may_be_captured(b->ref())) { stop_captured_meanwhile("a free"); }
    }
  } catch (...) {
    // Not freed: the record and its copy of the resource are kept for the process's life, never
    // destroyed while work may still use the block.
    static_cast<void>(b.release());
    throw;
  }
  // Destroyed here, inside the device scope, so a pool's destructor (its own last copy) runs on
  // its device and the caller's context is put back after it (the Rust side takes no context
  // guard around this); relaxed, as in raftrs_mr_destroy.
  raftrs_fence::relaxed_capture relaxed;
  b.reset();
}

/// Lets device `peer` access memory of `mr` (made for `device`) where it comes from a CUDA async
/// pool; whether it does. Memory of an async pool is visible to another device only once the
/// pool grants it (cudaMemPoolSetAccess), whatever the contexts' peer access says. Asked each
/// time (a query): a cache keyed by pool handle would miss a new pool at a reused handle.
bool grant_peer_of(rmm::device_async_resource_ref mr, int device, int32_t peer)
{
  check_device(peer);
  std::optional<rmm::device_async_resource_ref> at{mr};
  for (int depth = 0; at.has_value() && depth < 32; ++depth) {
    if (auto* async = as_async(*at)) {
      cudaMemPool_t pool = async->pool_handle();
      device_scope scope{device};
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
      return true;
    }
    at = upstream_any(*at);
  }
  return false;
}

/// The resource a held allocation on `device` uses: `mr`, or, with `current`, the caller's copy
/// of the current resource (`mr`, may be null) while it compares equal to RMM's map entry (RMM's
/// equality: each frees what the other allocated), checked under RMM's lock; otherwise a fresh
/// copy of the entry, left in `made` for the caller to hand over.
shim_mr const* held_resource(int32_t device, raftrs_mr const* mr, int32_t current, std::unique_ptr<shim_mr>& made)
{
  if (mr == nullptr && current == 0) { throw std::invalid_argument("null memory resource"); }
  shim_mr const* use = mr == nullptr ? nullptr : &unwrap(mr);
  if (use != nullptr && use->device != device) {
    throw std::invalid_argument("a memory resource of device " + std::to_string(use->device) +
                                " cannot allocate on device " + std::to_string(device));
  }
  if (current != 0) {
    rmm_map_use alive;
    if (use == nullptr || !current_equals_held(device, *use)) {
      made.reset(new shim_mr{device, copy_current_held(device)});
      use = made.get();
    }
  }
  return use;
}

}  // namespace

namespace raftrs_shim __attribute__((visibility("hidden"))) {

free_order free_order_of(rmm::device_async_resource_ref mr)
{
  // The whole chain (adaptors are made over resources that existed before them: it ends).
  for (std::optional<rmm::device_async_resource_ref> at{mr}; at.has_value();) {
    switch (classify(*at)) {
      case RAFTRS_MR_CUDA_ASYNC:
      case RAFTRS_MR_POOL: return frees_stream_ordered_always;
      case RAFTRS_MR_ARENA: return free_order{1} << 20;
      case RAFTRS_MR_STATISTICS: at = upstream_of<statistics_mr>(*at); break;
      case RAFTRS_MR_LIMITING: at = upstream_of<limiting_mr>(*at); break;
      case RAFTRS_MR_TRACKING: at = upstream_of<tracking_mr>(*at); break;
      case RAFTRS_MR_LOGGING: at = upstream_of<rmm::mr::logging_resource_adaptor>(*at); break;
      case RAFTRS_MR_FAILURE_CALLBACK: at = upstream_of<failure_mr>(*at); break;
      case RAFTRS_MR_THREAD_SAFE: {
        // One mutex around every upstream call: a free that blocks (a large block's cudaFree on
        // a release thread) holds it, so a small free behind it would wait for the whole device
        // too. Inline only when no free of the upstream ever blocks.
        auto up = upstream_of<rmm::mr::thread_safe_resource_adaptor>(*at);
        auto upstream = up.has_value() ? free_order_of(*up) : frees_may_block;
        return upstream == frees_stream_ordered_always ? upstream : frees_may_block;
      }
      case RAFTRS_MR_BINNING: {
        // Sizes up to this shim's own binning resource's largest bin go to the fixed-size pools
        // its constructor made (RMM's `stream_ordered_memory_resource`: a free never blocks);
        // larger ones to the upstream. A binning resource made elsewhere may hold bins of any
        // resource (`add_bin`, a `cuda_memory_resource` bin say), which its upstream's order
        // does not tell: its frees may block (the fifteenth audit: an async upstream made them
        // all "stream-ordered", freed inline with no stream wait and in the thread's own capture
        // mode).
        auto* f = cuda::mr::resource_cast<fenced_binning>(&*at);
        if (f == nullptr) { return frees_may_block; }
        std::size_t bins = f->get().ordered_up_to();
        auto up          = upstream_of_pooled<rmm::mr::binning_memory_resource>(*at);
        auto upstream = up.has_value() ? free_order_of(*up) : frees_may_block;
        if (upstream == frees_stream_ordered_always) { return upstream; }
        return std::max(upstream, static_cast<free_order>(bins));
      }
      default: return frees_may_block;
    }
  }
  return frees_may_block;
}

}  // namespace raftrs_shim

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
    auto const& b = *reinterpret_cast<shim_buffer const*>(buf);
    *granted      = grant_peer_of(b.ref(), b.device, peer) ? 1 : 0;
  });
}

raftrs_status raftrs_mr_grant_peer(const raftrs_mr* mr, int32_t peer, int32_t* granted)
{
  return guard([&] {
    *granted = 0;
    if (mr == nullptr) { throw std::invalid_argument("null memory resource"); }
    auto const& m = unwrap(mr);
    *granted      = grant_peer_of(rmm::device_async_resource_ref{const_cast<any_device_resource&>(m.resource)}, m.device, peer) ? 1 : 0;
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
    // First: the resources' own arithmetic must never see such a size, and the checks need no
    // device.
    refuse_unservable(bytes);
    refuse_capturing_allocation(stream);
    device_scope scope{device};
    auto owned = std::make_unique<shim_buffer>(shim_buffer{device, nullptr, bytes, any_device_resource{}, false});
    if (mr == nullptr) {
      owned->owned = copy_current(device);
    } else {
      auto const& m = unwrap(mr);
      if (m.device != device) {
        throw std::invalid_argument("a memory resource of device " + std::to_string(m.device) +
                                    " cannot allocate on device " + std::to_string(device));
      }
      owned->owned = m.resource;
    }
    allocate_into(*owned, free_order_of(owned->ref()), stream, bytes);
    *data           = owned->ptr;
    *stream_ordered = owned->stream_ordered ? 1 : 0;
    *out            = reinterpret_cast<raftrs_buffer*>(owned.release());
  });
}

/// Whether a held allocation's or free's stream must be asked about a capture: unless the
/// caller's flag reads 0 (see raftrs.h). Read with acquire semantics before and again after the
/// call, so that a capture begun after a first read of 0 (the flag was raised before the stream's
/// handle left the caller, and the capture's begin was ordered before this call's work by the
/// driver) is seen by the second.
static bool may_capture(uint8_t const* flag) noexcept
{
  return flag == nullptr || __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
}

/// An allocation or free that is not stream-ordered (cudaMalloc, cudaHostAlloc and their frees,
/// the arena's large blocks) with the thread's capture mode relaxed: in its own global mode the
/// driver refuses them while another thread captures a stream in global mode, invalidating that
/// capture (and a refused free is swallowed by RMM, leaking the block: the eleventh and twelfth
/// audits). Out of line, so that the stream-ordered hot path carries neither the mode's switch
/// nor its cleanup.
[[gnu::cold, gnu::noinline]] static void* allocate_relaxed(rmm::device_async_resource_ref r, cudaStream_t s, std::size_t bytes)
{
  raftrs_fence::relaxed_capture relaxed;
  return r.allocate(cuda::stream_ref{s}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

[[gnu::cold, gnu::noinline]] static void deallocate_relaxed(rmm::device_async_resource_ref r, cudaStream_t s, void* data, std::size_t bytes)
{
  raftrs_fence::relaxed_capture relaxed;
  r.deallocate(cuda::stream_ref{s}, data, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

raftrs_status raftrs_mr_allocate_held(int32_t device,
                                     const raftrs_mr* mr,
                                     int32_t current,
                                     void* stream,
                                     size_t bytes,
                                     void** data,
                                     int32_t* stream_ordered,
                                     raftrs_mr** fresh,
                                     const uint8_t* capture_may_begin)
{
  return guard([&] {
    *data           = nullptr;
    *stream_ordered = 0;
    *fresh          = nullptr;
    refuse_unservable(bytes);
    if (may_capture(capture_may_begin)) { refuse_capturing_allocation(stream); }
    device_scope scope{device};
    std::unique_ptr<shim_mr> made;
    shim_mr const* use = held_resource(device, mr, current, made);
    *stream_ordered    = frees_stream_ordered(order_of(*use), bytes, stream != nullptr) ? 1 : 0;
    if (bytes != 0) {
      rmm::device_async_resource_ref r{const_cast<any_device_resource&>(use->resource)};
      auto const on = static_cast<cudaStream_t>(stream);
      // Relaxed where the free is (allocate_relaxed); never on the stream-ordered hot path.
      *data = *stream_ordered != 0 ? r.allocate(cuda::stream_ref{on}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT)
                                   : allocate_relaxed(r, on, bytes);
      // Asked only of a resource whose allocation a capture can take (one cached walk); on a
      // private stream too when the allocation may have waited for another stream's event (a
      // capture there takes this stream in with its flag down).
      if (captures_of(*use) && (may_capture(capture_may_begin) || joins_of(*use)) && stream_capturing(stream)) {
        stop_captured_meanwhile("an allocation");
      }
    }
    *fresh = made != nullptr ? wrap(made.release()) : nullptr;
  });
}

raftrs_status raftrs_mr_deallocate_held(
  const raftrs_mr* mr, void* stream, const void* stream_owner, void* data, size_t bytes, const uint8_t* capture_may_begin)
{
  return guard([&] {
    if (mr == nullptr) { throw std::invalid_argument("null memory resource"); }
    if (data == nullptr) { return; }  // a 0-byte allocation took nothing
    auto const& m = unwrap(mr);
    // The caller keeps `mr` (and the block) on failure.
    if (may_capture(capture_may_begin)) { refuse_capturing_free(stream); }
    device_scope scope{m.device};
    // A free that is not stream-ordered runs on a release thread after a wait for its stream,
    // relaxed (deallocate_relaxed); the stream-ordered frees (the hot path) are not touched.
    raftrs_fence::freeing_on freeing{static_cast<cudaStream_t>(stream), stream != nullptr ? stream_owner : nullptr};
    rmm::device_async_resource_ref r{const_cast<any_device_resource&>(m.resource)};
    auto const on = static_cast<cudaStream_t>(stream);
    if (frees_stream_ordered(order_of(m), bytes, stream != nullptr)) {
      r.deallocate(cuda::stream_ref{on}, data, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    } else {
      deallocate_relaxed(r, on, data, bytes);
    }
    if (captures_of(m) && may_capture(capture_may_begin) && stream_capturing(stream)) { stop_captured_meanwhile("a free"); }
  });
}

raftrs_status raftrs_buffer_destroy(raftrs_buffer* buf, void* stream)
{
  return guard([&] { free_buffer(buf, stream, nullptr); });
}

raftrs_status raftrs_buffer_free(raftrs_buffer* buf, void* stream, const void* stream_owner)
{
  return guard([&] { free_buffer(buf, stream, stream != nullptr ? stream_owner : nullptr); });
}

raftrs_status raftrs_buffer_on_streams(void (*retain)(const void*), void (*release)(const void*), int32_t (*sole)(const void*))
{
  return guard([&] {
    if (retain == nullptr || release == nullptr || sole == nullptr) { throw std::invalid_argument("null stream keeper"); }
    if (raftrs_fence::the_keeper.load(std::memory_order_acquire) != nullptr) { return; }  // the first stays
    static raftrs_fence::stream_keeper const keeper{retain, release, sole};
    raftrs_fence::the_keeper.store(&keeper, std::memory_order_release);
  });
}

}  // extern "C"

// RMM's memory resources behind raftrs_mr: the per-device map (read, replaced, reset), the
// resources and adaptors this shim makes over one another, and what a handle's resource is.
// Pool-like resources are fenced (fence.hpp); async pools are guarded (async_pools.cpp).
#include "memory.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>

using namespace raftrs_shim;

namespace {

/// Serialises this library's read-modify-write of RMM's per-device map (RMM locks each call,
/// not a sequence of calls).
std::mutex& mr_lock()
{
  static std::mutex lock;
  return lock;
}

}  // namespace

namespace raftrs_shim __attribute__((visibility("hidden"))) {

int32_t classify(rmm::device_async_resource_ref ref)
{
  // This library's own async pools first: the common case (every allocation from the default
  // resource asks), and a type of this shim's own hidden namespace, so a pointer comparison
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

namespace {
/// Whether `r` holds a reference to a resource rather than the resource (a library that
/// installed `any_resource{resource_ref{its_own_pool}}`): the referent may be destroyed while
/// the reference is still held, so nothing may call through a kept copy of it. The type is read
/// from the wrapper itself, never from the referent.
bool wraps_a_reference(any_device_resource const& r)
{
  auto const& t = r.type();
  return t == typeid(rmm::device_async_resource_ref) || t == typeid(rmm::device_resource_ref) ||
         t == typeid(rmm::host_device_async_resource_ref) || t == typeid(rmm::host_device_resource_ref);
}
}  // namespace

bool current_equals_held(int device, shim_mr const& cached)
{
  // A kept copy of a reference may point at a resource its owner destroyed since (nothing of
  // ours kept it alive): never compared, a fresh copy is taken instead, as before issue 30.
  // Asked once per handle, not at every allocation (eight type comparisons were on the default
  // path: issue 29's before/after, run 119).
  auto by_reference = cached.by_reference.load(std::memory_order_relaxed);
  if (by_reference < 0) {
    by_reference = wraps_a_reference(cached.resource) ? 1 : 0;
    cached.by_reference.store(by_reference, std::memory_order_relaxed);  // the same answer whoever stores it
  }
  if (by_reference != 0) { return false; }
  std::lock_guard<std::mutex> lock{rmm::mr::detail::ref_map_lock()};
  auto& map  = rmm::mr::detail::get_ref_map();
  auto found = map.find(device);
  if (found == map.end()) { return cached.resource == any_device_resource{rmm::mr::detail::initial_resource()}; }
  // `cached` wraps no reference, and any_resource's equality compares the wrapped types before it
  // calls anything: an entry that wraps a reference (another type) is unequal without a call
  // through it, whatever became of its referent.
  return cached.resource == found->second;
}

/// [`copy_current_held`] with its own map use.
any_device_resource copy_current(int device)
{
  rmm_map_use alive;
  return copy_current_held(device);
}

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

}  // namespace raftrs_shim

namespace {

/// An adaptor of type `Adaptor` over (a shared copy of) `upstream`, made on the upstream's device.
template <typename Adaptor, typename... Args>
raftrs_mr* adapt(raftrs_mr const* upstream, Args&&... args)
{
  auto const& u = unwrap(upstream);
  device_scope scope{u.device};
  raftrs_fence::relaxed_capture relaxed;  // see adapt_fenced
  return wrap(new shim_mr{u.device, any_device_resource{Adaptor{any_device_resource{u.resource}, std::forward<Args>(args)...}}});
}

/// The upstream a pool or a binning resource is made over: (a shared copy of) `upstream`, behind
/// a `relaxed_upstream` (memory.hpp: their growth is what calls it after the construction) unless
/// it relaxes its own calls: this shim's async pool (`async_pool_guard`) and its own pools and
/// binning resources (their growth is relaxed by their own upstream). Anything else, an async
/// pool or a pool made by other code included, is wrapped: the switches cost only on growth.
any_device_resource growing_from(any_device_resource const& upstream)
{
  rmm::device_async_resource_ref ref{const_cast<any_device_resource&>(upstream)};
  auto const& type = ref.type();
  if (type == typeid(guarded_async_mr) || type == typeid(fenced_pool) || type == typeid(fenced_binning)) {
    return any_device_resource{upstream};
  }
  return any_device_resource{relaxed_upstream{any_device_resource{upstream}}};
}

/// A pool-like `R` over `upstream` (as given: a copy of a handle's resource, or `growing_from`'s),
/// fenced (fence.hpp), made on `device`.
template <typename R, typename... Args>
raftrs_mr* adapt_fenced(int device, any_device_resource upstream, Args&&... args)
{
  device_scope scope{device};
  // A pool's or an arena's first block comes from its upstream (cudaMalloc) here: relaxed, as
  // the allocations that are not stream-ordered are (the twelfth audit's review).
  raftrs_fence::relaxed_capture relaxed;
  auto made = cuda::mr::make_shared_resource<raftrs_fence::fenced<R>>(device, std::move(upstream), std::forward<Args>(args)...);
  return wrap(new shim_mr{device, any_device_resource{std::move(made)}});
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

}  // namespace

extern "C" {

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
    // Made before the swap: a failure to allocate it must not drop the old resource in there.
    std::unique_ptr<shim_mr> fresh{new shim_mr{m.device, any_device_resource{}}};
    rmm_map_use alive;
    std::lock_guard<std::mutex> lock{mr_lock()};
    any_device_resource old =
      rmm::mr::set_per_device_resource(rmm::cuda_device_id{m.device}, any_device_resource{m.resource});
    if (previous != nullptr) {
      fresh->resource = std::move(old);  // its free order is worked out when first used
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
    std::unique_ptr<shim_mr> fresh{new shim_mr{device, copy_current_held(device)}};
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
    raftrs_fence::relaxed_capture relaxed;  // the pool's creation and its first block
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
    auto const& u = unwrap(upstream);
    *out = adapt_fenced<rmm::mr::pool_memory_resource>(u.device, growing_from(u.resource), first, size_or_none(maximum));
  });
}

raftrs_status raftrs_mr_new_arena(const raftrs_mr* upstream, int64_t arena_size, raftrs_mr** out)
{
  return guard([&] {
    *out = nullptr;
    refuse_over_failure_callback(upstream, "arena");
    // RMM 26.08's arena takes its whole global arena from the upstream here and gives it back
    // only when destroyed (relaxed where it is destroyed): no growth to relax.
    auto const& u = unwrap(upstream);
    *out = adapt_fenced<rmm::mr::arena_memory_resource>(u.device, any_device_resource{u.resource}, size_or_none(arena_size));
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
    auto const& u = unwrap(upstream);
    auto* made    = adapt_fenced<rmm::mr::binning_memory_resource>(
      u.device, growing_from(u.resource), static_cast<int8_t>(min_exponent), static_cast<int8_t>(max_exponent));
    // The bins RMM's constructor adds: 2^min .. 2^max, each aligned up (add_bin), fixed-size
    // pools all; sizes up to the largest free without blocking whatever the upstream.
    // (Not found, the size stays 0: every free takes the upstream's order, as before.)
    if (auto* f = cast<fenced_binning>(made)) {
      f->get().set_ordered_up_to(rmm::align_up(std::size_t{1} << max_exponent, rmm::CUDA_ALLOCATION_ALIGNMENT));
    }
    *out = made;
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
    // The constructor already called the deleter on `arg` ([util.smartptr.shared.const]: "If an
    // exception is thrown, d(p) is called"): calling `drop_arg` here too freed it twice (the
    // eighth audit).
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
    // Counted under the adaptor's own lock: `get_outstanding_allocations()` hands out the map
    // itself, which RMM documents as safe only with no concurrent allocation or free through
    // the adaptor, and reading its size then raced their changes (the fifteenth audit). The
    // report takes the read lock and writes one line per allocation (no call stacks: the shim
    // makes its tracking adaptors without them).
    std::string const report = t->get_outstanding_allocations_str();
    *count                   = static_cast<std::size_t>(std::count(report.begin(), report.end(), '\n'));
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
    // A destructor's waits and frees (cudaFree of a pool's blocks) are not refused while
    // another thread captures a stream in global mode (they would leak the memory).
    raftrs_fence::relaxed_capture relaxed;
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
      if (!item.fence->wait()) {
        // A wait refused (a capture): the memory may still be in use, never destroyed.
        raftrs_fence::leave_to_the_os(item.resource);
        continue;
      }
      raftrs_fence::relaxed_capture relaxed;  // as in raftrs_mr_destroy
      item.resource = any_device_resource{};  // the last copy: RMM's destructor runs now, on its device
      ++*drained;
    }
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

}  // extern "C"

// The C++ side of the benchmark: the same operations written directly against RAFT, RMM and the
// CUDA runtime, compiled with the shim's toolchain against the same headers, timed by the same
// Rust clock in the same process.
#include <raft/core/device_resources.hpp>
#include <raft/core/resource/cublas_handle.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <mutex>
#include <utility>
#include <stdexcept>
#include <cstdint>
#include <vector>

namespace {
struct own {
  cudaStream_t stream{};
  raft::device_resources* res{};
};

own make()
{
  own o;
  cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking);
  o.res = new raft::device_resources(rmm::cuda_stream_view{o.stream});
  return o;
}

void destroy(own& o)
{
  delete o.res;
  cudaStreamDestroy(o.stream);
}

cudaStream_t bench_stream();

/// The C++ async pool of the allocation rows, made once.
rmm::mr::cuda_async_memory_resource& async_mr()
{
  static rmm::mr::cuda_async_memory_resource mr{};
  return mr;
}

/// The pool of bl_alloc_free_pool (256 MiB to start), made once.
rmm::mr::pool_memory_resource& bench_pool()
{
  static rmm::mr::pool_memory_resource mr{rmm::mr::cuda_memory_resource{}, std::size_t{256} << 20};
  return mr;
}

/// Allocate + free `bytes` through `mr` on the bench stream; 0 on success.
template <typename Resource>
int32_t alloc_free(Resource& mr, size_t bytes)
{
  try {
    if (bytes == 0) { return 0; }  // as the shim: no RMM call for nothing (the 0-byte step rows)
    cuda::stream_ref s{bench_stream()};
    void* p = mr.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    mr.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    return 0;
  } catch (...) {
    return 1;
  }
}

/// The stream the allocation rows use instead of their own (`bl_use_stream`): null, their own.
std::atomic<cudaStream_t> stream_override{nullptr};

/// Whether the floors take the stream for private (`bl_floor_private`), and the flag they then
/// read (never raised: their stream's handle never leaves the bench).
std::atomic<int32_t> floor_private{0};
std::atomic<uint8_t> private_flag{0};

/// The stream of the C++ allocation rows: ours (the resources' own, set by `bl_use_stream`) so
/// both sides allocate and free on the same stream, else one of their own. (Run 132: the async
/// pool's allocate + free differed by ~100 ns at 256 B between two idle streams.)
cudaStream_t bench_stream()
{
  if (auto s = stream_override.load(std::memory_order_acquire); s != nullptr) { return s; }
  static cudaStream_t s = [] {
    cudaStream_t t{};
    cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking);
    return t;
  }();
  return s;
}
}  // namespace

extern "C" {
/// Makes `stream` (a `cudaStream_t` that outlives the rows; null: their own again) the stream
/// of the C++ allocation rows.
void bl_use_stream(void* stream) { stream_override.store(static_cast<cudaStream_t>(stream), std::memory_order_release); }

/// With `on` set, the floors' capture checks read a flag that is down instead of asking the
/// stream: the floor of an allocation on a stream whose handle never left the library.
void bl_floor_private(int32_t on) { floor_private.store(on, std::memory_order_relaxed); }

/// RAFT C++ code on a lent `raft::resources*` (tests/tests/lend.rs): its stream and its cuBLAS
/// handle, as RAFT's own accessors give them.
void* bl_lent_stream(void* res)
{
  return static_cast<void*>(raft::resource::get_cuda_stream(*static_cast<raft::resources*>(res)).value());
}
void* bl_lent_cublas(void* res)
{
  return static_cast<void*>(raft::resource::get_cublas_handle(*static_cast<raft::resources*>(res)));
}

/// cudaRuntimeGetVersion through a call linked into this binary: what every shim call was
/// before the shim became a library loaded at first use.
int32_t bl_runtime_version(int32_t* out)
{
  int v   = 0;
  auto rc = cudaRuntimeGetVersion(&v);
  *out    = v;
  return rc;
}

// cudaStreamCreateWithFlags(NonBlocking) + raft::device_resources on it + destroy both.
int32_t bl_create_release()
{
  try {
    auto o = make();
    destroy(o);
    return 0;
  } catch (...) {
    return 1;
  }
}

// The two halves of bl_create_release, timed apart: make (stream + RAFT object) into `out`,
// then destroy what bl_make made.
int32_t bl_make(void** out)
{
  try {
    *out = new own(make());
    return 0;
  } catch (...) {
    return 1;
  }
}

int32_t bl_destroy(void* made)
{
  auto* o = static_cast<own*>(made);
  destroy(*o);
  delete o;
  return 0;
}

// The stream alone: cudaStreamCreateWithFlags(NonBlocking) + cudaStreamDestroy.
int32_t bl_stream_create_destroy()
{
  cudaStream_t s{};
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) { return 1; }
  return cudaStreamDestroy(s) == cudaSuccess ? 0 : 1;
}

int32_t bl_stream_sync(void* stream) { return cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); }

// 1 MiB (or `bytes`) allocate + free through a C++ cuda_async_memory_resource, stream-ordered.
int32_t bl_alloc_free_async(size_t bytes) { return alloc_free(async_mr(), bytes); }

// The same pool's memory through the CUDA runtime directly (cudaMallocFromPoolAsync +
// cudaFreeAsync, what the resource calls), without RMM's layer.
int32_t bl_alloc_free_async_runtime(size_t bytes)
{
  void* p{};
  if (cudaMallocFromPoolAsync(&p, bytes, async_mr().pool_handle(), bench_stream()) != cudaSuccess) { return 1; }
  return cudaFreeAsync(p, bench_stream()) == cudaSuccess ? 0 : 1;
}

// The same through the driver API (cuMemAllocFromPoolAsync + cuMemFreeAsync, entry points from
// the runtime), without the runtime's layer either: the floor of a stream-ordered allocation.
int32_t bl_alloc_free_async_driver(size_t bytes)
{
  using alloc_fn = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  using free_fn  = CUresult (*)(CUdeviceptr, CUstream);
  static auto const fns = [] {
    void* a{};
    void* f{};
    cudaDriverEntryPointQueryResult qa{}, qf{};
    cudaGetDriverEntryPointByVersion("cuMemAllocFromPoolAsync", &a, 12000, cudaEnableDefault, &qa);
    cudaGetDriverEntryPointByVersion("cuMemFreeAsync", &f, 12000, cudaEnableDefault, &qf);
    return std::pair{reinterpret_cast<alloc_fn>(a), reinterpret_cast<free_fn>(f)};
  }();
  if (fns.first == nullptr || fns.second == nullptr) { return 2; }
  CUdeviceptr p{};
  auto pool = reinterpret_cast<CUmemoryPool>(async_mr().pool_handle());
  if (fns.first(&p, bytes, pool, bench_stream()) != CUDA_SUCCESS) { return 1; }
  return fns.second(p, bench_stream()) == CUDA_SUCCESS ? 0 : 1;
}

// The same through cuda_memory_resource (cudaMalloc / cudaFree).
int32_t bl_alloc_free_cuda(size_t bytes)
{
  static rmm::mr::cuda_memory_resource mr{};
  return alloc_free(mr, bytes);
}

// The same through a pool_memory_resource over cudaMalloc (256 MiB to start), made once.
int32_t bl_alloc_free_pool(size_t bytes) { return alloc_free(bench_pool(), bytes); }

// The same through an arena_memory_resource over cudaMalloc (1 GiB arena), made once.
int32_t bl_alloc_free_arena(size_t bytes)
{
  static rmm::mr::arena_memory_resource mr{rmm::mr::cuda_memory_resource{}, std::size_t{1} << 30};
  return alloc_free(mr, bytes);
}

// New resources, then the time of the first raft::resource::get_cublas_handle, in ns.
int64_t bl_first_cublas_ns()
{
  try {
    auto o     = make();
    auto start = std::chrono::steady_clock::now();
    (void)raft::resource::get_cublas_handle(*o.res);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    destroy(o);
    return ns;
  } catch (...) {
    return -1;
  }
}

// `n` resources alive at once (each with its own stream), then all destroyed; `with_cublas`
// makes each take a cuBLAS handle. Returns ns to create all and the device bytes they held.
int32_t bl_scale(int32_t n, int32_t with_cublas, int64_t* create_ns, int64_t* bytes_held)
{
  try {
    size_t free_before = 0, free_after = 0, total = 0;
    cudaDeviceSynchronize();
    cudaMemGetInfo(&free_before, &total);
    std::vector<own> all;
    all.reserve(n);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      all.push_back(make());
      if (with_cublas) { (void)raft::resource::get_cublas_handle(*all.back().res); }
    }
    *create_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    cudaDeviceSynchronize();
    cudaMemGetInfo(&free_after, &total);
    *bytes_held = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
    for (auto& o : all) { destroy(o); }
    return 0;
  } catch (...) {
    return 1;
  }
}
}

namespace {
std::vector<own>& held()
{
  static std::vector<own> v;
  return v;
}
}  // namespace

extern "C" {
// Keeps `n` C++ resources (stream + raft::device_resources) alive until bl_unhold().
int32_t bl_hold(int32_t n)
{
  try {
    for (int i = 0; i < n; ++i) { held().push_back(make()); }
    return 0;
  } catch (...) {
    return 1;
  }
}

void bl_unhold()
{
  for (auto& o : held()) { destroy(o); }
  held().clear();
}
}


extern "C" {
// Allocate + free through the device's current RMM resource, looked up on every call, as code
// using RMM's default resource does (rmm::mr::get_per_device_resource_ref).
int32_t bl_alloc_free_per_device(size_t bytes)
{
  auto mr = rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{0});
  return alloc_free(mr, bytes);
}

// The shim's allocation steps without its device switches, on the same resource: a copy of the
// current resource taken under RMM's lock and checked to compare equal (what keeps an allocation's
// resource alive), kept in a heap object when `heap`, allocate and free through that copy.
int32_t bl_alloc_free_copied(size_t bytes, int32_t heap)
{
  using any_device_resource = cuda::mr::any_resource<cuda::mr::device_accessible>;
  struct held {
    void* ptr;
    any_device_resource mr;
  };
  try {
    any_device_resource copy = [] {
      std::lock_guard<std::mutex> lock{rmm::mr::detail::ref_map_lock()};
      auto& map  = rmm::mr::detail::get_ref_map();
      auto found = map.find(0);
      if (found == map.end()) { throw std::logic_error("no resource for device 0"); }
      any_device_resource c{found->second};
      if (!(c == found->second)) { throw std::logic_error("a copy that is not equal"); }
      return c;
    }();
    cuda::stream_ref s{bench_stream()};
    if (heap != 0) {
      auto h = std::make_unique<held>(held{nullptr, std::move(copy)});
      rmm::device_async_resource_ref ref{h->mr};
      h->ptr = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      ref.deallocate(s, h->ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    } else {
      rmm::device_async_resource_ref ref{copy};
      void* p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    }
    return 0;
  } catch (...) {
    return 1;
  }
}
}

#include <rmm/mr/binning_memory_resource.hpp>

#include <atomic>
#include <thread>

namespace {
/// The arena of bl_alloc_free_arena, shared with the threaded rows.
rmm::mr::arena_memory_resource& bench_arena()
{
  static rmm::mr::arena_memory_resource mr{rmm::mr::cuda_memory_resource{}, std::size_t{1} << 30};
  return mr;
}

/// The binning resource of bl_alloc_free_binning, made once.
rmm::mr::binning_memory_resource& bench_binning()
{
  static rmm::mr::binning_memory_resource mr{rmm::mr::cuda_memory_resource{}, 8, 20};
  return mr;
}

/// Non-blocking streams for the threaded rows, made once (the arena keeps an arena per stream).
cudaStream_t thread_stream(int i)
{
  static std::vector<cudaStream_t> streams = [] {
    std::vector<cudaStream_t> v(64);
    for (auto& s : v) { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
    return v;
  }();
  return streams.at(static_cast<std::size_t>(i));
}
}  // namespace

extern "C" {
// The same through a binning_memory_resource over cudaMalloc, bins 2^8 .. 2^20 bytes, made once.
int32_t bl_alloc_free_binning(size_t bytes) { return alloc_free(bench_binning(), bytes); }

// The same through the arena of bl_alloc_free_arena.
int32_t bl_alloc_free_bench_arena(size_t bytes) { return alloc_free(bench_arena(), bytes); }

// `threads` threads (each on a stream of its own) allocating and freeing `bytes` `iters` times
// from one arena over cudaMalloc; `*ns` is the time from their common start to the last one's
// end (the threads are started and waiting before the clock starts).
int32_t bl_arena_threads(int32_t threads, int32_t iters, size_t bytes, int64_t* ns)
{
  try {
    if (threads < 1 || threads > 64) { return 2; }
    auto& mr = bench_arena();
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::atomic<int> failed{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      cudaStream_t s = thread_stream(t);
      ts.emplace_back([&, s] {
        cudaSetDevice(0);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {}
        try {
          for (int i = 0; i < iters; ++i) {
            void* p = mr.allocate(cuda::stream_ref{s}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
            mr.deallocate(cuda::stream_ref{s}, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
          }
        } catch (...) {
          failed.fetch_add(1);
        }
      });
    }
    while (ready.load() < threads) {}
    auto start = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& t : ts) { t.join(); }
    *ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    return failed.load() == 0 ? 0 : 1;
  } catch (...) {
    return 1;
  }
}
}

#include <shared_mutex>
#include <vector>

// The fence the shim puts on every pool-like resource (pool, arena, binning: the same header,
// compiled here a second time; its namespace is hidden, so this copy and the shim's never meet).
#include "fence.hpp"

namespace {
using any_device_resource = cuda::mr::any_resource<cuda::mr::device_accessible>;

/// The floor's stream keeper: the streams the rows free on (the bench's own, or the resources'
/// stream `bl_use_stream` names) live for the whole run and the fenced floor resources are never
/// destroyed, so holding a stream is a no-op (the shim's keeper counts the stream's Rust `Arc`).
void floor_retain(void const*) {}
void floor_release(void const*) {}
int32_t floor_sole(void const*) { return 0; }
raftrs_fence::stream_keeper const floor_keeper{floor_retain, floor_release, floor_sole};

/// `R` over a type-erased cudaMalloc resource, fenced exactly as the shim makes it
/// (`adapt_fenced` in memory_resources.cpp), held as any resource is held.
template <typename R, typename... Args>
std::shared_ptr<any_device_resource> fenced_like_the_shim(Args&&... args)
{
  return std::make_shared<any_device_resource>(cuda::mr::make_shared_resource<raftrs_fence::fenced<R>>(
    0, any_device_resource{rmm::mr::cuda_memory_resource{}}, std::forward<Args>(args)...));
}

/// `cuCtxGetCurrent` (an entry point from the runtime) and the context of the thread that first
/// asked (the bench's thread, on device 0): the floors' device check. `held_state` is one;
/// `bl_create_release_floor` makes its own, as `floor_state` must not be made before the library
/// installs device 0's default resource.
struct context_check {
  using get_fn       = CUresult (*)(CUcontext*);
  using capturing_fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  using exchange_fn  = CUresult (*)(CUstreamCaptureMode*);
  get_fn get_current{};
  capturing_fn is_capturing{};
  exchange_fn exchange_mode{};
  CUcontext ctx{};

  context_check()
  {
    void* f{};
    cudaDriverEntryPointQueryResult q{};
    cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &f, 12000, cudaEnableDefault, &q);
    get_current = reinterpret_cast<get_fn>(f);
    if (get_current != nullptr) { get_current(&ctx); }
    void* g{};
    cudaGetDriverEntryPointByVersion("cuStreamIsCapturing", &g, 12000, cudaEnableDefault, &q);
    is_capturing = reinterpret_cast<capturing_fn>(g);
    void* x{};
    cudaGetDriverEntryPointByVersion("cuThreadExchangeStreamCaptureMode", &x, 12000, cudaEnableDefault, &q);
    exchange_mode = reinterpret_cast<exchange_fn>(x);
  }

  /// The thread's capture mode relaxed for a scope where `on` (an async pool's call, as the
  /// shim's `async_pool_guard` relaxes each since the thirteenth audit: the driver refuses them
  /// while another thread captures in global mode): two driver calls, as the shim's
  /// `relaxed_capture_hot` makes.
  struct relaxed_if {
    exchange_fn exchange{};
    CUstreamCaptureMode before{CU_STREAM_CAPTURE_MODE_RELAXED};
    relaxed_if(context_check const& h, bool on) : exchange{on ? h.exchange_mode : nullptr}
    {
      if (exchange != nullptr && exchange(&before) != CUDA_SUCCESS) { exchange = nullptr; }
    }
    ~relaxed_if()
    {
      if (exchange != nullptr) { exchange(&before); }
    }
    relaxed_if(relaxed_if const&)            = delete;
    relaxed_if& operator=(relaxed_if const&) = delete;
  };

  /// Whether `s` is being captured into a CUDA graph: the query the shim makes before every
  /// allocation and free on a stream, and after one through a resource a capture can take
  /// (`stream_capturing`, the shim's common.hpp: the same driver entry point). With a private
  /// stream (`bl_floor_private`: issue 30's flag, `result/exposure.rs`), the flag's acquire read
  /// instead, down: what the shim's `may_capture` does while no capture can begin.
  [[nodiscard]] bool capturing(cudaStream_t s) const
  {
    if (floor_private.load(std::memory_order_relaxed) != 0) {
      if (private_flag.load(std::memory_order_acquire) == 0) { return false; }
    }
    return asks(s);
  }

  /// The driver's answer, whatever the flag: what the shim asks after an allocation through a
  /// resource that may make the stream wait for another stream's event (`joins_another_stream`).
  [[nodiscard]] bool asks(cudaStream_t s) const
  {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing == nullptr || (is_capturing(reinterpret_cast<CUstream>(s), &status) == CUDA_SUCCESS &&
                                       status != CU_STREAM_CAPTURE_STATUS_NONE);
  }

  /// One read of the thread's context, compared with the expected one.
  [[nodiscard]] bool on_device() const
  {
    CUcontext c{};
    return get_current != nullptr && get_current(&c) == CUDA_SUCCESS && c == ctx;
  }
};

/// What the floor rows below hold, made once: `cuCtxGetCurrent` (an entry point from the
/// runtime), counted handles to the resources of the explicit-resource rows (a pool of 256 MiB,
/// a 1 GiB arena and a 2^8..2^20 binning resource over cudaMalloc, each fenced as the shim fences
/// its own, as soundness requires of a pool-like resource; the async pool of bl_alloc_free_async),
/// to a copy of device 0's current resource (what the default path keeps), to the bench stream
/// and to a stand-in for the resources object, the context the handles belong to and the "not
/// released" lock.
struct held_state : context_check {
  std::shared_ptr<any_device_resource> kinds[4]{
    fenced_like_the_shim<rmm::mr::pool_memory_resource>(std::size_t{256} << 20, std::optional<std::size_t>{}),
    fenced_like_the_shim<rmm::mr::arena_memory_resource>(std::optional<std::size_t>{std::size_t{1} << 30}),
    fenced_like_the_shim<rmm::mr::binning_memory_resource>(int8_t{8}, int8_t{20}),
    std::make_shared<any_device_resource>(async_mr())};
  std::shared_ptr<any_device_resource> current;
  /// Kind 5: this library's own async pool, seen through a view (`bl_async_share_pool_of`).
  std::shared_ptr<any_device_resource> shared_async;
  std::shared_ptr<cudaStream_t> stream{std::make_shared<cudaStream_t>(bench_stream())};
  std::shared_ptr<int> resources{std::make_shared<int>(0)};
  std::shared_mutex released;

  held_state()
  {
    raftrs_fence::the_keeper.store(&floor_keeper, std::memory_order_release);
    std::lock_guard<std::mutex> lock{rmm::mr::detail::ref_map_lock()};
    auto& map  = rmm::mr::detail::get_ref_map();
    auto found = map.find(0);
    if (found != map.end()) { current = std::make_shared<any_device_resource>(found->second); }
  }

  /// The resource of `kind` (0 pool, 1 arena, 2 binning, 3 async pool; 4 the current resource,
  /// revalidated: compared with device 0's map entry under RMM's lock, as the library's default
  /// path compares its kept copy at each allocation), or null.
  [[nodiscard]] std::shared_ptr<any_device_resource> const* resource(int32_t kind)
  {
    if (kind >= 0 && kind < 4) { return &kinds[kind]; }
    if (kind == 5) { return shared_async != nullptr ? &shared_async : nullptr; }
    if (kind != 4 || current == nullptr) { return nullptr; }
    std::lock_guard<std::mutex> lock{rmm::mr::detail::ref_map_lock()};
    auto& map  = rmm::mr::detail::get_ref_map();
    auto found = map.find(0);
    if (found == map.end() || !(*current == found->second)) { return nullptr; }  // replaced: not in the bench
    return &current;
  }
};

/// Whether the floor resource of `kind` is one whose allocation or free a capture can take, as
/// the shim's `may_be_captured` says of it: the pool (0) and the binning resource (2), whose
/// frees record stream events, and the async pools (3, 5, and 4, the current resource: the
/// library's async pool in the bench); not the arena (1).
bool may_be_captured(int32_t kind) { return kind != 1; }

/// Whether the floors relax the calls into the resource of `kind` themselves, as the shim's
/// `async_pool_guard` does since the thirteenth audit: the plain C++ async pool (3) and the view
/// of the library's pool (5). Not the current resource (4): in the bench it is the library's
/// guarded pool, which relaxes its own calls (counted once, as in ours).
bool relaxes_calls(int32_t kind) { return kind == 3 || kind == 5; }

/// Whether an allocation through the floor resource of `kind` may make the stream wait for
/// another stream's event, as the shim's `may_join_another_stream` says of it: the pool (0) and
/// the binning resource (2). After such an allocation the shim asks the driver whatever the
/// stream's flag says (the tenth audit), and so do the floors.
bool joins_another_stream(int32_t kind) { return kind == 0 || kind == 2; }

/// The question after an allocation through the floor resource of `kind`, as the shim asks it.
bool captured_after_allocation(context_check const& h, int32_t kind, cudaStream_t on)
{
  if (!may_be_captured(kind)) { return false; }
  return joins_another_stream(kind) ? h.asks(on) : h.capturing(on);
}

held_state& floor_state()
{
  // Never destroyed: its fenced resources hold deferred frees on the stream the rows used, which
  // may be a resources object's stream destroyed before the exit (bl_use_stream); a destructor
  // at exit let them go through that dead handle, inside libcuda (alloc-profile, run 145).
  static held_state* s = new held_state;
  return *s;
}

/// The live-allocation count of the rows, as the library keeps it since issue 30's second part:
/// per thread, written only by its thread (a load and a store, no read-modify-write).
void count_live(int64_t delta)
{
  thread_local std::atomic<int64_t> live{0};
  live.store(live.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}
}  // namespace

extern "C" {
// Issue 30's floor of an allocation: C++ doing the steps this library's soundness requires of
// one, and nothing else, through resource `kind` (see held_state::resource; 4 is the default
// path: the kept copy revalidated under RMM's lock): the resources object's "not released" check
// (a shared lock taken and let go), the device check (one cuCtxGetCurrent compared with the
// context the resources hold; again at the free, which must run on the block's device: RMM's
// device_buffer sets its device to free, the shim's free scopes it), a record of the allocation
// (inline: the array holds its parts
// in itself, no heap object since issue 30's third part) holding a reference to the
// resource (a shared_ptr copy: the resource outlives the block) and to the stream (another: the
// stream outlives the free), a live-allocation count (per thread, as the library keeps it), the
// allocation and its free through the type-erased resource (as any resource of any kind is
// held; a pool-like one fenced, its free taking the fence's hint path), and the record dropped.
// No device switch. The capture checks (the fifth audit's follow-up): the stream asked whether
// it is being captured into a CUDA graph before the allocation and before the free, and again
// after each through a resource a capture can take (every kind but the arena: may_be_captured);
// after an allocation through a pool or a binning resource the driver is asked whatever a private
// stream's flag says (joins_another_stream), as the shim asks since the tenth audit. An async
// pool's allocation and free each with the thread's capture mode relaxed (relaxes_calls), as the
// shim's since the thirteenth audit.
int32_t bl_alloc_free_held(int32_t kind, size_t bytes)
{
  struct record {
    std::shared_ptr<any_device_resource> mr;
    std::shared_ptr<cudaStream_t> stream;
    void* ptr;
  };
  auto& h = floor_state();
  try {
    if (h.get_current == nullptr) { return 2; }
    std::shared_lock<std::shared_mutex> alive{h.released};
    if (!h.on_device()) { return 3; }
    auto const* mr = h.resource(kind);
    if (mr == nullptr) { return 4; }
    std::optional<record> r{record{*mr, h.stream, nullptr}};  // inline, as the array holds its parts
    count_live(1);
    rmm::device_async_resource_ref ref{*r->mr};
    cudaStream_t on = bench_stream();  // the resources' own, as ours (bl_use_stream)
    if (h.capturing(on)) { return 6; }
    // 0 bytes: no RMM call, as the shim skips it (the row that isolates the steps' own cost).
    if (bytes != 0) {
      {
        context_check::relaxed_if relaxed{h, relaxes_calls(kind)};
        r->ptr = ref.allocate(cuda::stream_ref{on}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      if (captured_after_allocation(h, kind, on)) { return 7; }
      if (h.capturing(on)) { return 8; }
      // The free on the block's device: checked (one context read compared), as the shim's
      // free scopes its device and as RMM's own device_buffer sets its device to free.
      if (!h.on_device()) { return 5; }
      // The free names the stream's keeping handle, so a fence takes its hint path (fence.hpp).
      raftrs_fence::freeing_on freeing{on, r->stream.get()};
      {
        context_check::relaxed_if relaxed{h, relaxes_calls(kind)};
        ref.deallocate(cuda::stream_ref{on}, r->ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      if (may_be_captured(kind) && h.capturing(on)) { return 9; }
    }
    count_live(-1);
    r.reset();
    return 0;
  } catch (...) {
    return 1;
  }
}

// The same steps plus the two this library's design adds to every array: a third counted handle
// (the array holds its resources object, which `DeviceVec::resources` returns) and the thread's
// record of the resources in use (a thread-local stack pushed and popped around the call: a
// memory failure callback that calls back into the same resources must not wait for its own read
// lock). The objects are counted exactly as `DeviceVec::new_in` + drop counts its own: what is
// left between the two is the layer's waste.
int32_t bl_alloc_free_held_as_designed(int32_t kind, size_t bytes)
{
  struct record {
    std::shared_ptr<any_device_resource> mr;
    std::shared_ptr<cudaStream_t> stream;
    std::shared_ptr<int> resources;
    void* ptr;
  };
  thread_local std::vector<std::pair<uint64_t, void const*>> in_use;
  auto& h = floor_state();
  try {
    if (h.get_current == nullptr) { return 2; }
    std::shared_lock<std::shared_mutex> alive{h.released};
    in_use.emplace_back(1, h.resources.get());
    if (!h.on_device()) { return 3; }
    auto const* mr = h.resource(kind);
    if (mr == nullptr) { return 4; }
    std::optional<record> r{record{*mr, h.stream, h.resources, nullptr}};
    rmm::device_async_resource_ref ref{*r->mr};
    // Allocated under the read lock, as `DeviceVec::new_in` does; freed without it, as its drop.
    cudaStream_t on = bench_stream();
    if (h.capturing(on)) { return 6; }
    if (bytes != 0) {
      {
        context_check::relaxed_if relaxed{h, relaxes_calls(kind)};
        r->ptr = ref.allocate(cuda::stream_ref{on}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      if (captured_after_allocation(h, kind, on)) { return 7; }
    }
    in_use.pop_back();
    alive.unlock();
    count_live(1);
    count_live(-1);
    if (bytes != 0) {
      if (h.capturing(on)) { return 8; }
      // The free on the block's device: checked (one context read compared), as the shim's
      // free scopes its device and as RMM's own device_buffer sets its device to free.
      if (!h.on_device()) { return 5; }
      raftrs_fence::freeing_on freeing{on, r->stream.get()};
      {
        context_check::relaxed_if relaxed{h, relaxes_calls(kind)};
        ref.deallocate(cuda::stream_ref{on}, r->ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      if (may_be_captured(kind) && h.capturing(on)) { return 9; }
    }
    r.reset();
    return 0;
  } catch (...) {
    return 1;
  }
}

// The floor of returning an owned handle to a per-thread default, in C++: a thread-local
// shared_ptr copied out and the copy destroyed (one atomic increment, one decrement), what
// `current_device_resources` does at the least while it returns an owned `DeviceResources`.
int32_t bl_tls_shared_ptr_copy()
{
  thread_local std::shared_ptr<int> const held_ptr = std::make_shared<int>(7);
  std::shared_ptr<int> copy = held_ptr;
  return *copy == 7 ? 0 : 1;
}
}


#include <rmm/mr/cuda_async_view_memory_resource.hpp>

namespace {
/// A view of this library's async pool (`bl_async_share_pool_of`), for the C++ rows that must
/// allocate from the very pool ours uses.
std::optional<rmm::mr::cuda_async_view_memory_resource>& shared_async_view()
{
  static std::optional<rmm::mr::cuda_async_view_memory_resource> v;
  return v;
}
}  // namespace

extern "C" {
// Points the C++ "same pool" rows at the CUDA memory pool `ptr` was allocated from (this
// library's async pool: `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)`), seen through
// RMM's `cuda_async_view_memory_resource`: ours and C++ then allocate from one pool on one stream,
// with one history. Also floor kind 5 (bl_alloc_free_held). Null forgets the view (before the
// pool is dropped). 0 on success.
int32_t bl_async_share_pool_of(void const* ptr)
{
  if (ptr == nullptr) {
    // Forgotten before the pool goes: no view of a destroyed pool is kept.
    shared_async_view().reset();
    floor_state().shared_async.reset();
    return 0;
  }
  using attr_fn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  void* f{};
  cudaDriverEntryPointQueryResult q{};
  cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &f, 12000, cudaEnableDefault, &q);
  if (f == nullptr) { return 2; }
  CUmemoryPool pool{};
  if (reinterpret_cast<attr_fn>(f)(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS ||
      pool == nullptr) {
    return 1;
  }
  try {
    auto& view = shared_async_view().emplace(reinterpret_cast<cudaMemPool_t>(pool));
    floor_state().shared_async = std::make_shared<any_device_resource>(view);
    return 0;
  } catch (...) {
    return 3;
  }
}

// `bytes` allocate + free through the view of bl_async_share_pool_of, on the rows' stream.
int32_t bl_alloc_free_async_shared(size_t bytes)
{
  auto& view = shared_async_view();
  if (!view.has_value()) { return 2; }
  return alloc_free(*view, bytes);
}
}

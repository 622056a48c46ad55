// The C++ shim: RAFT's resource layer and RMM's per-device memory resources behind the C header
// raftrs.h. Every entry point runs inside guard(), which turns any C++ exception into a status
// and a thread-local message: nothing unwinds into Rust.

#include "raftrs.h"

#include <raft/core/device_resources.hpp>
#include <raft/core/resource/cublas_handle.hpp>
#include <raft/core/resource/cusolver_dn_handle.hpp>
#include <raft/core/resource/cusolver_sp_handle.hpp>
#include <raft/core/resource/cusparse_handle.hpp>
#include <raft/core/resource/device_id.hpp>
#include <raft/core/resource/resource_types.hpp>
#include <raft/version_config.hpp>

#include <rmm/aligned.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/managed_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/version_config.hpp>

#include <cublas_v2.h>
#include <cuda/std/version>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <typeinfo>

static_assert(sizeof(raft::device_resources) == RAFTRS_EXPECTED_HANDLE_SIZE,
              "raft::device_resources changed size: RAFT's handle layout moved under this binding. "
              "Update RAFTRS_EXPECTED_HANDLE_SIZE and the committed ABI tag (cargo xtask abi-check --bless) "
              "only after checking the new layout.");

namespace {

thread_local std::string last_error;

raftrs_status fail(raftrs_status status, char const* what)
{
  // Assigning can itself throw std::bad_alloc; the status still reaches the caller.
  try {
    last_error = what;
  } catch (...) {
  }
  return status;
}

/// A CUDA runtime call that failed: the status and a message naming the error.
struct cuda_failure : std::runtime_error {
  cudaError_t code;
  cuda_failure(cudaError_t c, char const* call)
    : std::runtime_error(std::string(call) + ": " + cudaGetErrorName(c) + ": " + cudaGetErrorString(c)),
      code(c)
  {
  }
};

void check(cudaError_t code, char const* call)
{
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so the next call starts clean
    throw cuda_failure(code, call);
  }
}

#define RAFTRS_CUDA_TRY(call) check((call), #call)

void check_cublas(cublasStatus_t status, char const* call)
{
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw raft::cublas_error(std::string(call) + ": " + cublasGetStatusName(status) + ": " +
                             cublasGetStatusString(status));
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
  } catch (std::bad_alloc const& e) {
    // rmm::bad_alloc also lands here: an allocation that failed, for whatever reason.
    return fail(RAFTRS_STATUS_OUT_OF_MEMORY, e.what());
  } catch (raft::cuda_error const& e) {
    return fail(RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cublas_error const& e) {
    return fail(RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cusolver_error const& e) {
    return fail(RAFTRS_STATUS_CUDA, e.what());
  } catch (raft::cusparse_error const& e) {
    return fail(RAFTRS_STATUS_CUDA, e.what());
  } catch (rmm::cuda_error const& e) {
    return fail(RAFTRS_STATUS_CUDA, e.what());
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

/// Makes `device` current for the calling thread and puts the previous device back on exit:
/// RAFT creates handles on whichever device is current at their first use, and a thread may
/// have switched devices since the resources were made.
class device_scope {
 public:
  explicit device_scope(int device)
  {
    RAFTRS_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) { RAFTRS_CUDA_TRY(cudaSetDevice(device)); }
    switched_ = previous_ != device;
  }
  ~device_scope()
  {
    if (switched_) { cudaSetDevice(previous_); }
  }
  device_scope(device_scope const&)            = delete;
  device_scope& operator=(device_scope const&) = delete;

 private:
  int previous_{0};
  bool switched_{false};
};

raft::resource::resource_type handle_type(int32_t kind)
{
  switch (kind) {
    case RAFTRS_HANDLE_CUBLAS: return raft::resource::resource_type::CUBLAS_HANDLE;
    case RAFTRS_HANDLE_CUSOLVER_DN: return raft::resource::resource_type::CUSOLVER_DN_HANDLE;
    case RAFTRS_HANDLE_CUSOLVER_SP: return raft::resource::resource_type::CUSOLVER_SP_HANDLE;
    case RAFTRS_HANDLE_CUSPARSE: return raft::resource::resource_type::CUSPARSE_HANDLE;
    default: throw std::invalid_argument("unknown handle kind " + std::to_string(kind));
  }
}

/// The C++ object behind raftrs_resources: RAFT's device_resources, plus a look at whether a
/// lazily made resource exists yet (RAFT keeps its cells protected, a subclass may read them).
class shim_resources final : public raft::device_resources {
 public:
  shim_resources(int device, cudaStream_t stream)
    : raft::device_resources(rmm::cuda_stream_view{stream}), device_(device)
  {
  }

  [[nodiscard]] bool has(raft::resource::resource_type type) const
  {
    return cells_[type]->res.load() != nullptr;
  }

  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_;
};

shim_resources& unwrap(raftrs_resources* res)
{
  if (res == nullptr) { throw std::invalid_argument("null resources"); }
  return *reinterpret_cast<shim_resources*>(res);
}

using any_device_resource = cuda::mr::any_resource<cuda::mr::device_accessible>;
using statistics_mr       = rmm::mr::statistics_resource_adaptor;

/// Serialises this library's read-modify-write of RMM's per-device map (RMM locks each call,
/// not a sequence of calls).
std::mutex& mr_lock()
{
  static std::mutex lock;
  return lock;
}

int32_t classify(rmm::device_async_resource_ref ref)
{
  if (ref == rmm::device_async_resource_ref{rmm::mr::detail::initial_resource()}) {
    return RAFTRS_MR_CUDA;
  }
  auto const& type = ref.type();
  if (type == typeid(rmm::mr::cuda_memory_resource)) { return RAFTRS_MR_CUDA; }
  if (type == typeid(rmm::mr::cuda_async_memory_resource)) { return RAFTRS_MR_CUDA_ASYNC; }
  if (type == typeid(rmm::mr::managed_memory_resource)) { return RAFTRS_MR_MANAGED; }
  if (type == typeid(statistics_mr)) { return RAFTRS_MR_STATISTICS; }
  return RAFTRS_MR_OTHER;
}

void check_device(int32_t device)
{
  int count = 0;
  RAFTRS_CUDA_TRY(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw std::out_of_range("no device " + std::to_string(device) + " among " +
                            std::to_string(count));
  }
}

/// The device memory behind raftrs_buffer: the pointer and the resource that must free it (a
/// reference, as rmm::device_buffer keeps; RMM's rule is that a resource outlives what it gave).
struct shim_buffer {
  int device;
  void* ptr;
  std::size_t bytes;
  rmm::device_async_resource_ref mr;
  bool stream_ordered;
};

/// Whether freeing through `mr` never blocks the caller: the async pool, directly or under the
/// statistics adaptor this library installs.
bool frees_stream_ordered(rmm::device_async_resource_ref mr)
{
  auto kind = classify(mr);
  if (kind == RAFTRS_MR_CUDA_ASYNC) { return true; }
  if (kind == RAFTRS_MR_STATISTICS) {
    auto* stat = cuda::mr::resource_cast<statistics_mr>(&mr);
    return stat != nullptr && classify(stat->get_upstream_resource()) == RAFTRS_MR_CUDA_ASYNC;
  }
  return false;
}

template <typename T, typename Gemm>
raftrs_status gemm(raftrs_resources* res,
                   int32_t trans_a,
                   int32_t trans_b,
                   int64_t m,
                   int64_t n,
                   int64_t k,
                   T alpha,
                   T const* a,
                   int64_t lda,
                   T const* b,
                   int64_t ldb,
                   T beta,
                   T* c,
                   int64_t ldc,
                   Gemm call,
                   char const* name) noexcept
{
  return guard([&] {
    auto& r = unwrap(res);
    for (int64_t v : {m, n, k, lda, ldb, ldc}) {
      if (v < 0 || v > INT32_MAX) {
        throw std::invalid_argument(std::string(name) + ": a dimension is out of range");
      }
    }
    device_scope scope{r.device()};
    auto handle = raft::resource::get_cublas_handle(r);
    check_cublas(cublasSetStream(handle, raft::resource::get_cuda_stream(r).value()),
                 "cublasSetStream");
    auto op = [](int32_t t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; };
    check_cublas(call(handle,
                      op(trans_a),
                      op(trans_b),
                      static_cast<int>(m),
                      static_cast<int>(n),
                      static_cast<int>(k),
                      &alpha,
                      a,
                      static_cast<int>(lda),
                      b,
                      static_cast<int>(ldb),
                      &beta,
                      c,
                      static_cast<int>(ldc)),
                 name);
  });
}

}  // namespace

extern "C" {

const char* raftrs_last_error(void) { return last_error.c_str(); }

void raftrs_clear_error(void) { last_error.clear(); }

void raftrs_get_build_info(raftrs_build_info* out)
{
  if (out == nullptr) { return; }
  std::memset(out, 0, sizeof(*out));
  out->raft_major     = RAFT_VERSION_MAJOR;
  out->raft_minor     = RAFT_VERSION_MINOR;
  out->raft_patch     = RAFT_VERSION_PATCH;
  out->rmm_major      = RMM_VERSION_MAJOR;
  out->rmm_minor      = RMM_VERSION_MINOR;
  out->rmm_patch      = RMM_VERSION_PATCH;
  out->cccl_version   = CCCL_VERSION;
  out->cudart_version = CUDART_VERSION;
  out->handle_size    = sizeof(raft::device_resources);
  out->resources_size = sizeof(raft::resources);
#define RAFTRS_STR2(x) #x
#define RAFTRS_STR(x)  RAFTRS_STR2(x)
  std::strncpy(out->rmm_abi_namespace, RAFTRS_STR(RMM_ABI_NAMESPACE), sizeof(out->rmm_abi_namespace) - 1);
#undef RAFTRS_STR
#undef RAFTRS_STR2
}

raftrs_status raftrs_runtime_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    RAFTRS_CUDA_TRY(cudaRuntimeGetVersion(&v));
    *out = v;
  });
}

raftrs_status raftrs_driver_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    RAFTRS_CUDA_TRY(cudaDriverGetVersion(&v));
    *out = v;
  });
}

raftrs_status raftrs_device_count(int32_t* out)
{
  return guard([&] {
    int n = 0;
    RAFTRS_CUDA_TRY(cudaGetDeviceCount(&n));
    *out = n;
  });
}

raftrs_status raftrs_current_device(int32_t* out)
{
  return guard([&] {
    int d = 0;
    RAFTRS_CUDA_TRY(cudaGetDevice(&d));
    *out = d;
  });
}

raftrs_status raftrs_device_memory_pools_supported(int32_t device, int32_t* out)
{
  return guard([&] {
    int v = 0;
    RAFTRS_CUDA_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, device));
    *out = v;
  });
}

raftrs_status raftrs_memcpy_async(int32_t device, void* dst, const void* src, size_t bytes, void* stream)
{
  return guard([&] {
    device_scope scope{device};
    RAFTRS_CUDA_TRY(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  });
}

raftrs_status raftrs_memset_async(int32_t device, void* dst, int32_t value, size_t bytes, void* stream)
{
  return guard([&] {
    device_scope scope{device};
    RAFTRS_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
  });
}

raftrs_status raftrs_resources_create(int32_t device, void* stream, raftrs_resources** out)
{
  return guard([&] {
    *out = nullptr;
    device_scope scope{device};
    auto res = new shim_resources(device, static_cast<cudaStream_t>(stream));
    // Record the device now, while it is current, so RAFT never guesses it later.
    try {
      (void)raft::resource::get_device_id(*res);
    } catch (...) {
      delete res;
      throw;
    }
    *out = reinterpret_cast<raftrs_resources*>(res);
  });
}

raftrs_status raftrs_resources_destroy(raftrs_resources* res)
{
  return guard([&] {
    if (res == nullptr) { return; }
    auto* r = &unwrap(res);
    // Handles are destroyed on their own device.
    device_scope scope{r->device()};
    delete r;
  });
}

raftrs_status raftrs_resources_sync(raftrs_resources* res)
{
  return guard([&] {
    auto& r = unwrap(res);
    r.sync_stream();
  });
}

raftrs_status raftrs_resources_handle(raftrs_resources* res, int32_t kind, void** out)
{
  return guard([&] {
    auto& r  = unwrap(res);
    auto t   = handle_type(kind);
    (void)t;
    device_scope scope{r.device()};
    switch (kind) {
      case RAFTRS_HANDLE_CUBLAS: *out = raft::resource::get_cublas_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_DN: *out = raft::resource::get_cusolver_dn_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_SP: *out = raft::resource::get_cusolver_sp_handle(r); break;
      case RAFTRS_HANDLE_CUSPARSE: *out = raft::resource::get_cusparse_handle(r); break;
      default: break;
    }
  });
}

raftrs_status raftrs_resources_has_handle(raftrs_resources* res, int32_t kind, int32_t* out)
{
  return guard([&] { *out = unwrap(res).has(handle_type(kind)) ? 1 : 0; });
}

raftrs_status raftrs_mr_current(int32_t device, int32_t* out)
{
  return guard([&] {
    check_device(device);
    *out = classify(rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{device}));
  });
}

raftrs_status raftrs_mr_set(int32_t device, int32_t kind)
{
  return guard([&] {
    check_device(device);
    device_scope scope{device};
    std::lock_guard<std::mutex> lock{mr_lock()};
    rmm::cuda_device_id id{device};
    switch (kind) {
      case RAFTRS_MR_CUDA:
        rmm::mr::set_per_device_resource(id, rmm::mr::cuda_memory_resource{});
        break;
      case RAFTRS_MR_CUDA_ASYNC:
        rmm::mr::set_per_device_resource(id, rmm::mr::cuda_async_memory_resource{});
        break;
      case RAFTRS_MR_MANAGED:
        rmm::mr::set_per_device_resource(id, rmm::mr::managed_memory_resource{});
        break;
      default:
        throw std::invalid_argument("cannot install a memory resource of kind " +
                                    std::to_string(kind));
    }
  });
}

raftrs_status raftrs_mr_reset(int32_t device)
{
  return guard([&] {
    check_device(device);
    device_scope scope{device};
    std::lock_guard<std::mutex> lock{mr_lock()};
    rmm::mr::reset_per_device_resource(rmm::cuda_device_id{device});
  });
}

raftrs_status raftrs_mr_install_default(int32_t device, int32_t* installed)
{
  return guard([&] {
    *installed = 0;
    check_device(device);
    int pools = 0;
    RAFTRS_CUDA_TRY(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    if (pools == 0) { return; }
    device_scope scope{device};
    std::lock_guard<std::mutex> lock{mr_lock()};
    rmm::cuda_device_id id{device};
    if (rmm::mr::get_per_device_resource_ref(id) !=
        rmm::device_async_resource_ref{rmm::mr::detail::initial_resource()}) {
      return;  // someone else chose this device's resource: leave it alone
    }
    rmm::mr::set_per_device_resource(id, rmm::mr::cuda_async_memory_resource{});
    *installed = 1;
  });
}

raftrs_status raftrs_mr_enable_statistics(int32_t device)
{
  return guard([&] {
    check_device(device);
    device_scope scope{device};
    std::lock_guard<std::mutex> lock{mr_lock()};
    rmm::cuda_device_id id{device};
    if (rmm::mr::get_per_device_resource_ref(id).type() == typeid(statistics_mr)) { return; }
    // Take the current resource out (the initial one stands in for a moment), wrap it, put the
    // wrapper back: allocations already made through the old resource stay valid, since the
    // adaptor owns it now.
    any_device_resource upstream =
      rmm::mr::set_per_device_resource(id, rmm::device_async_resource_ref{rmm::mr::detail::initial_resource()});
    rmm::mr::set_per_device_resource(id, statistics_mr{std::move(upstream)});
  });
}

raftrs_status raftrs_mr_statistics(int32_t device, int64_t* current_bytes, int64_t* peak_bytes)
{
  return guard([&] {
    check_device(device);
    auto ref   = rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{device});
    auto* stat = cuda::mr::resource_cast<statistics_mr>(&ref);
    if (stat == nullptr) {
      throw std::logic_error("statistics are not enabled on device " + std::to_string(device));
    }
    auto counter   = stat->get_bytes_counter();
    *current_bytes = counter.value;
    *peak_bytes    = counter.peak;
  });
}

raftrs_status raftrs_buffer_create(int32_t device, void* stream, size_t bytes, raftrs_buffer** out)
{
  return guard([&] {
    *out = nullptr;
    device_scope scope{device};
    auto mr = rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{device});
    cuda::stream_ref s{static_cast<cudaStream_t>(stream)};
    void* ptr = bytes == 0 ? nullptr : mr.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    try {
      *out = reinterpret_cast<raftrs_buffer*>(new shim_buffer{device, ptr, bytes, mr, frees_stream_ordered(mr)});
    } catch (...) {
      if (ptr != nullptr) { mr.deallocate(s, ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
      throw;
    }
  });
}

raftrs_status raftrs_buffer_destroy(raftrs_buffer* buf, void* stream)
{
  return guard([&] {
    if (buf == nullptr) { return; }
    auto* b = reinterpret_cast<shim_buffer*>(buf);
    device_scope scope{b->device};
    if (b->ptr != nullptr) {
      b->mr.deallocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, b->ptr, b->bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    }
    delete b;
  });
}

void* raftrs_buffer_data(raftrs_buffer* buf)
{
  return buf == nullptr ? nullptr : reinterpret_cast<shim_buffer*>(buf)->ptr;
}

int32_t raftrs_buffer_stream_ordered(raftrs_buffer* buf)
{
  return buf != nullptr && reinterpret_cast<shim_buffer*>(buf)->stream_ordered ? 1 : 0;
}

raftrs_status raftrs_gemm_f32(raftrs_resources* res,
                              int32_t trans_a,
                              int32_t trans_b,
                              int64_t m,
                              int64_t n,
                              int64_t k,
                              float alpha,
                              const float* a,
                              int64_t lda,
                              const float* b,
                              int64_t ldb,
                              float beta,
                              float* c,
                              int64_t ldc)
{
  return gemm<float>(
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasSgemm, "cublasSgemm");
}

raftrs_status raftrs_gemm_f64(raftrs_resources* res,
                              int32_t trans_a,
                              int32_t trans_b,
                              int64_t m,
                              int64_t n,
                              int64_t k,
                              double alpha,
                              const double* a,
                              int64_t lda,
                              const double* b,
                              int64_t ldb,
                              double beta,
                              double* c,
                              int64_t ldc)
{
  return gemm<double>(
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasDgemm, "cublasDgemm");
}

}  // extern "C"

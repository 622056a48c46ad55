// RAFT's resources behind raftrs_resources: raft::device_resources with checked cuBLAS, cuSOLVER
// and cuSPARSE handles, the GEMM entry points that use them, the device queries, and the build
// facts (RAFT's handle layout among them).
#include "../fence.hpp"
#include "common.hpp"

#include <raft/core/device_resources.hpp>
#include <raft/core/resource/cublas_handle.hpp>
#include <raft/core/resource/cublaslt_handle.hpp>
#include <raft/core/resource/cusolver_dn_handle.hpp>
#include <raft/core/resource/cusolver_sp_handle.hpp>
#include <raft/core/resource/cusparse_handle.hpp>
#include <raft/core/resource/device_id.hpp>
#include <raft/core/resource/resource_types.hpp>
#include <raft/version_config.hpp>

#include <rmm/version_config.hpp>

#include <cuda/std/version>

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

static_assert(sizeof(raft::device_resources) == RAFTRS_EXPECTED_HANDLE_SIZE,
              "raft::device_resources changed size: RAFT's handle layout moved under this binding. "
              "Update RAFTRS_EXPECTED_HANDLE_SIZE and the committed ABI tag (cargo xtask abi-check --bless) "
              "only after checking the new layout.");

using namespace raftrs_shim;

namespace {

/// A cuBLAS call that failed (OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED, via guard()).
void check_cublas(cublasStatus_t status, char const* doing)
{
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw raft::cublas_error(std::string(doing) + " failed: " + cublasGetStatusName(status) + ": " +
                             cublasGetStatusString(status));
  }
}

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

/// The library handles of one kind that resources objects let go, kept per device for the next
/// ones: while the process runs a handle is never destroyed. `cublasDestroy`, `cusolverDnDestroy`
/// and `cusolverSpDestroy` synchronise the device, which invalidates any stream capture in
/// progress on it, in any thread and any mode (the sixteenth audit; run 206: a release or drop
/// of resources that had made one broke another thread's capture, PyTorch's CUDA graphs say),
/// and a handle costs tens of milliseconds (and a cuBLAS one ~65 MiB) to make. PyTorch keeps its
/// cuBLAS handles the same way. `raftrs_handles_trim` destroys the kept ones of a device (the
/// out-of-memory path). Never destroyed itself: releases at the exit still hand handles back.
template <typename Handle>
struct kept_handles {
  std::mutex lock;
  std::vector<std::pair<int, Handle>> kept;     // (device, handle)
  std::vector<std::pair<int, Handle>> spoiled;  // refused their settings: never reused, trimmed

  static kept_handles& of()
  {
    static auto* k = new kept_handles;
    return *k;
  }
  /// The handle of `device` kept last (its memory the likeliest still in cache).
  std::optional<Handle> take(int device)
  {
    std::lock_guard<std::mutex> hold{lock};
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
      if (it->first == device) {
        Handle h = it->second;
        kept.erase(std::next(it).base());
        return h;
      }
    }
    return std::nullopt;
  }
  /// Keeps `h` for `device`; leaks it when the list cannot grow (a destructor may not throw).
  void keep(int device, Handle h) noexcept
  {
    try {
      std::lock_guard<std::mutex> hold{lock};
      kept.emplace_back(device, h);
    } catch (...) {
    }
  }
  /// Keeps `h`, which refused its settings, for the trim only (a destroy now would synchronise
  /// the device); leaks it when the list cannot grow.
  void keep_spoiled(int device, Handle h) noexcept
  {
    try {
      std::lock_guard<std::mutex> hold{lock};
      spoiled.emplace_back(device, h);
    } catch (...) {
    }
  }
  /// Takes every kept handle of `device` out (the spoiled ones too), for the caller to destroy
  /// outside the lock.
  std::vector<Handle> take_all(int device)
  {
    std::lock_guard<std::mutex> hold{lock};
    std::vector<Handle> out;
    for (auto* list : {&kept, &spoiled}) {
      for (auto it = list->begin(); it != list->end();) {
        if (it->first == device) {
          out.push_back(it->second);
          it = list->erase(it);
        } else {
          ++it;
        }
      }
    }
    return out;
  }
};

/// A library handle made for RAFT's resources (or one kept from earlier resources of the same
/// device, every setting put back to what the first handle of its kind made on that device in
/// this process read: `Traits::settings`), ready in the constructor, which
/// throws when the library refuses. RAFT 26.08's own handle resources only log a failed create
/// (and then hand out an uninitialised handle); through these, a failed create reaches the
/// caller as an error (`*_STATUS_ALLOC_FAILED`: out of memory) and nothing is cached, so a later
/// call may try again. Made (and taken) on `device`'s primary context, whatever context the
/// thread that first asks has (RAFT code in a lend may run under another library's): a kept
/// handle belongs to its device's primary context. Let go, the handle is unbound from the
/// resources' stream (which is destroyed next) and kept (`kept_handles`), not destroyed.
template <typename Handle, typename Status, Status Success, typename Traits>
class checked_handle final : public raft::resource::resource {
 public:
  checked_handle(rmm::cuda_stream_view stream, int device) : device_{device}
  {
    device_scope scope{device_};
    // Read before a kept handle is taken out of the list: the read locks (and could throw),
    // which lost the handle taken (helper 115). Without them a kept handle is not reused, and
    // stays in the list for the trim.
    auto const fresh = fresh_settings(device_);
    if (auto kept = fresh ? kept_handles<Handle>::of().take(device_) : std::nullopt) {
      // Bound to this stream and every setting put back to a fresh handle's: a reused handle is
      // one made now (the seventeenth audit: settings missed here outlived their user, among
      // them a device address cuBLAS writes through in emulated FP64 GEMMs).
      if (Traits::set_stream(*kept, stream.value()) == Success && Traits::apply(*kept, *fresh) == Success) {
        handle_ = *kept;
        return;
      }
      // A handle that refuses its settings is not reused, nor destroyed now (a destroy
      // synchronises the device): left to the trim, and a new one made.
      (void)Traits::set_stream(*kept, nullptr);
      kept_handles<Handle>::of().keep_spoiled(device_, *kept);
    }
    auto created = Traits::create(&handle_);
    if (created != Success) { Traits::fail("creating", created); }
    // The settings of a handle nobody has touched yet: what a reused one is put back to.
    remember_fresh_settings(device_, handle_);
    auto bound = Traits::set_stream(handle_, stream.value());
    if (bound != Success) {
      // Left to the trim as a spoiled one is, not destroyed now: cuBLAS's and cuSOLVER's
      // destroys synchronise the device, which invalidates any other thread's capture (the
      // sixteenth audit's rule: no library handle is destroyed while the process runs).
      (void)Traits::set_stream(handle_, nullptr);
      kept_handles<Handle>::of().keep_spoiled(device_, handle_);
      Traits::fail("binding to the resources' stream", bound);
    }
  }
  ~checked_handle() override
  {
    // Bound to the legacy stream until reused: the resources' stream is destroyed right after.
    (void)Traits::set_stream(handle_, nullptr);
    kept_handles<Handle>::of().keep(device_, handle_);
  }
  checked_handle(checked_handle const&)            = delete;
  checked_handle& operator=(checked_handle const&) = delete;
  void* get_resource() override { return &handle_; }

 private:
  /// The settings read from the first handle of this kind made on `device` in the process,
  /// right after its create (none yet: a kept handle cannot be put back, and is not reused).
  /// Per device: a host may hold GPUs of different architectures.
  static std::optional<typename Traits::settings> fresh_settings(int device)
  {
    std::lock_guard<std::mutex> hold{fresh_lock_};
    for (auto const& [d, s] : fresh_) {
      if (d == device) { return s; }
    }
    return std::nullopt;
  }
  static void remember_fresh_settings(int device, Handle h) noexcept
  {
    try {
      std::lock_guard<std::mutex> hold{fresh_lock_};
      for (auto const& entry : fresh_) {
        if (entry.first == device) { return; }
      }
      typename Traits::settings s{};
      if (Traits::read(h, &s) == Success) { fresh_.emplace_back(device, s); }
    } catch (...) {
      // Not remembered: this device's kept handles are then not reused (`fresh_settings`).
    }
  }
  static inline std::mutex fresh_lock_;
  static inline std::vector<std::pair<int, typename Traits::settings>> fresh_;

  Handle handle_{};
  int device_;
};

template <typename Resource>
class checked_factory final : public raft::resource::resource_factory {
 public:
  checked_factory(raft::resource::resource_type type, rmm::cuda_stream_view stream, int device)
    : type_(type), stream_(stream), device_(device)
  {
  }
  raft::resource::resource_type get_resource_type() override { return type_; }
  raft::resource::resource* make_resource() override { return new Resource(stream_, device_); }

 private:
  raft::resource::resource_type type_;
  rmm::cuda_stream_view stream_;
  int device_;
};

/// A getter and a setter of one handle setting that older updates of the library lack (cuBLAS
/// 13 and cuSOLVER 12 gained their FP64 emulation settings in later updates: the PyTorch
/// image's cuSOLVER has its math mode and emulation strategy but none of the FP64 fixed-point
/// settings). Looked up in the copy of the library the shim already links (`RTLD_NOLOAD`),
/// never linked: a library without them would refuse to load the shim. Absent, the setting
/// cannot have been changed by anyone, and is neither read nor put back.
template <typename Get, typename Set>
struct optional_setting {
  Get get = nullptr;
  Set set = nullptr;
  optional_setting(char const* library, char const* get_name, char const* set_name) noexcept
  {
    void* lib = dlopen(library, RTLD_NOLOAD | RTLD_LAZY);
    if (lib == nullptr) { return; }
    auto g = reinterpret_cast<Get>(dlsym(lib, get_name));
    auto s = reinterpret_cast<Set>(dlsym(lib, set_name));
    if (g != nullptr && s != nullptr) {
      get = g;
      set = s;
    }
    dlclose(lib);  // the reference RTLD_NOLOAD took; the library stays (the shim links it)
  }
  [[nodiscard]] bool present() const noexcept { return get != nullptr; }
};

/// `prefix` `Get`/`Set` `what` (cuBLAS's and cuSOLVER's naming), as a member named `what`.
#define RAFTRS_OPTIONAL_SETTING(library, prefix, what)                                   \
  optional_setting<decltype(&prefix##Get##what), decltype(&prefix##Set##what)> what{ \
    library, #prefix "Get" #what, #prefix "Set" #what}

struct cublas_traits {
  static cublasStatus_t create(cublasHandle_t* h) { return cublasCreate(h); }
  /// `cublasSetStream` also puts the workspace back to cuBLAS's own.
  static cublasStatus_t set_stream(cublasHandle_t h, cudaStream_t s) { return cublasSetStream(h, s); }
  /// Every setting of cuBLAS 13's handle a previous user may have changed through the raw
  /// handle (the handles' contract asks users to leave them; this is the safety net). The
  /// workspace goes back with the stream.
  struct settings {
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
    cublasAtomicsMode_t atomics;
    int sm_count_target;
    cublasEmulationStrategy_t emulation;
    cudaEmulationSpecialValuesSupport special_values;
    cudaEmulationMantissaControl mantissa_control;
    int max_mantissa_bits;
    int mantissa_bit_offset;
    int* mantissa_bit_count;  // a device address cuBLAS writes in emulated FP64 GEMMs (null: none)
  };
  /// The settings later cuBLAS 13 updates added (`optional_setting`).
  struct optional {
    RAFTRS_OPTIONAL_SETTING("libcublas.so.13", cublas, EmulationSpecialValuesSupport);
    RAFTRS_OPTIONAL_SETTING("libcublas.so.13", cublas, FixedPointEmulationMantissaControl);
    RAFTRS_OPTIONAL_SETTING("libcublas.so.13", cublas, FixedPointEmulationMaxMantissaBitCount);
    RAFTRS_OPTIONAL_SETTING("libcublas.so.13", cublas, FixedPointEmulationMantissaBitOffset);
    RAFTRS_OPTIONAL_SETTING("libcublas.so.13", cublas, FixedPointEmulationMantissaBitCountPointer);
    static optional const& api()
    {
      static optional const looked_up{};
      return looked_up;
    }
  };
  static cublasStatus_t read(cublasHandle_t h, settings* s)
  {
    auto const& o  = optional::api();
    cublasStatus_t st = cublasGetPointerMode(h, &s->pointer_mode);
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasGetMathMode(h, &s->math_mode); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasGetAtomicsMode(h, &s->atomics); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasGetSmCountTarget(h, &s->sm_count_target); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasGetEmulationStrategy(h, &s->emulation); }
    auto get = [&](auto const& setting, auto* value) {
      if (st == CUBLAS_STATUS_SUCCESS && setting.present()) { st = setting.get(h, value); }
    };
    get(o.EmulationSpecialValuesSupport, &s->special_values);
    get(o.FixedPointEmulationMantissaControl, &s->mantissa_control);
    get(o.FixedPointEmulationMaxMantissaBitCount, &s->max_mantissa_bits);
    get(o.FixedPointEmulationMantissaBitOffset, &s->mantissa_bit_offset);
    get(o.FixedPointEmulationMantissaBitCountPointer, &s->mantissa_bit_count);
    return st;
  }
  static cublasStatus_t apply(cublasHandle_t h, settings const& s)
  {
    auto const& o  = optional::api();
    cublasStatus_t st = cublasSetPointerMode(h, s.pointer_mode);
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasSetMathMode(h, s.math_mode); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasSetAtomicsMode(h, s.atomics); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasSetSmCountTarget(h, s.sm_count_target); }
    if (st == CUBLAS_STATUS_SUCCESS) { st = cublasSetEmulationStrategy(h, s.emulation); }
    auto set = [&](auto const& setting, auto value) {
      if (st == CUBLAS_STATUS_SUCCESS && setting.present()) { st = setting.set(h, value); }
    };
    set(o.EmulationSpecialValuesSupport, s.special_values);
    set(o.FixedPointEmulationMantissaControl, s.mantissa_control);
    set(o.FixedPointEmulationMaxMantissaBitCount, s.max_mantissa_bits);
    set(o.FixedPointEmulationMantissaBitOffset, s.mantissa_bit_offset);
    set(o.FixedPointEmulationMantissaBitCountPointer, s.mantissa_bit_count);
    return st;
  }
  static void destroy(cublasHandle_t h) { cublasDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cublasStatus_t st)
  {
    throw raft::cublas_error(std::string(doing) + " the cuBLAS handle failed: " + cublasGetStatusName(st) + ": " +
                             cublasGetStatusString(st));
  }
};

/// cuSOLVER has no status-name function: the names that matter, and the number otherwise.
std::string cusolver_status_name(cusolverStatus_t st)
{
  switch (st) {
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    default: return "cusolverStatus " + std::to_string(static_cast<int>(st));
  }
}

struct cusolver_dn_traits {
  static cusolverStatus_t create(cusolverDnHandle_t* h) { return cusolverDnCreate(h); }
  static cusolverStatus_t set_stream(cusolverDnHandle_t h, cudaStream_t s) { return cusolverDnSetStream(h, s); }
  /// Every setting of cuSOLVER 12's dense handle (as cuBLAS's above).
  struct settings {
    cusolverDeterministicMode_t deterministic;
    cusolverMathMode_t math_mode;
    cudaEmulationStrategy_t emulation;
    cudaEmulationMantissaControl_t mantissa_control;
    int max_mantissa_bits;
    int mantissa_bit_offset;
    cudaEmulationSpecialValuesSupport_t special_values;
  };
  /// The settings later cuSOLVER 12 updates added (`optional_setting`).
  struct optional {
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, MathMode);
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, EmulationStrategy);
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, FixedPointEmulationMantissaControl);
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, FixedPointEmulationMaxMantissaBitCount);
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, FixedPointEmulationMantissaBitOffset);
    RAFTRS_OPTIONAL_SETTING("libcusolver.so.12", cusolverDn, EmulationSpecialValuesSupport);
    static optional const& api()
    {
      static optional const looked_up{};
      return looked_up;
    }
  };
  static cusolverStatus_t read(cusolverDnHandle_t h, settings* s)
  {
    auto const& o    = optional::api();
    cusolverStatus_t st = cusolverDnGetDeterministicMode(h, &s->deterministic);
    auto get = [&](auto const& setting, auto* value) {
      if (st == CUSOLVER_STATUS_SUCCESS && setting.present()) { st = setting.get(h, value); }
    };
    get(o.MathMode, &s->math_mode);
    get(o.EmulationStrategy, &s->emulation);
    get(o.FixedPointEmulationMantissaControl, &s->mantissa_control);
    get(o.FixedPointEmulationMaxMantissaBitCount, &s->max_mantissa_bits);
    get(o.FixedPointEmulationMantissaBitOffset, &s->mantissa_bit_offset);
    get(o.EmulationSpecialValuesSupport, &s->special_values);
    return st;
  }
  static cusolverStatus_t apply(cusolverDnHandle_t h, settings const& s)
  {
    auto const& o    = optional::api();
    cusolverStatus_t st = cusolverDnSetDeterministicMode(h, s.deterministic);
    auto set = [&](auto const& setting, auto value) {
      if (st == CUSOLVER_STATUS_SUCCESS && setting.present()) { st = setting.set(h, value); }
    };
    set(o.MathMode, s.math_mode);
    set(o.EmulationStrategy, s.emulation);
    set(o.FixedPointEmulationMantissaControl, s.mantissa_control);
    set(o.FixedPointEmulationMaxMantissaBitCount, s.max_mantissa_bits);
    set(o.FixedPointEmulationMantissaBitOffset, s.mantissa_bit_offset);
    set(o.EmulationSpecialValuesSupport, s.special_values);
    return st;
  }
  static void destroy(cusolverDnHandle_t h) { cusolverDnDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusolverStatus_t st)
  {
    throw raft::cusolver_error(std::string(doing) + " the dense cuSOLVER handle failed: " + cusolver_status_name(st));
  }
};

struct cusolver_sp_traits {
  static cusolverStatus_t create(cusolverSpHandle_t* h) { return cusolverSpCreate(h); }
  static cusolverStatus_t set_stream(cusolverSpHandle_t h, cudaStream_t s) { return cusolverSpSetStream(h, s); }
  struct settings {};  // none besides the stream
  static cusolverStatus_t read(cusolverSpHandle_t, settings*) { return CUSOLVER_STATUS_SUCCESS; }
  static cusolverStatus_t apply(cusolverSpHandle_t, settings const&) { return CUSOLVER_STATUS_SUCCESS; }
  static void destroy(cusolverSpHandle_t h) { cusolverSpDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusolverStatus_t st)
  {
    throw raft::cusolver_error(std::string(doing) + " the sparse cuSOLVER handle failed: " + cusolver_status_name(st));
  }
};

struct cusparse_traits {
  static cusparseStatus_t create(cusparseHandle_t* h) { return cusparseCreate(h); }
  static cusparseStatus_t set_stream(cusparseHandle_t h, cudaStream_t s) { return cusparseSetStream(h, s); }
  struct settings {
    cusparsePointerMode_t pointer_mode;
  };
  static cusparseStatus_t read(cusparseHandle_t h, settings* s) { return cusparseGetPointerMode(h, &s->pointer_mode); }
  static cusparseStatus_t apply(cusparseHandle_t h, settings const& s) { return cusparseSetPointerMode(h, s.pointer_mode); }
  static void destroy(cusparseHandle_t h) { cusparseDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cusparseStatus_t st)
  {
    throw raft::cusparse_error(std::string(doing) + " the cuSPARSE handle failed: " + cusparseGetErrorName(st) + ": " +
                               cusparseGetErrorString(st));
  }
};

/// cuBLASLt (RAFT's `linalg::gemm`, and cuVS through it): no stream or settings on the handle;
/// `cublasLtDestroy` synchronises the device as `cublasDestroy` does.
struct cublaslt_traits {
  static cublasStatus_t create(cublasLtHandle_t* h) { return cublasLtCreate(h); }
  static cublasStatus_t set_stream(cublasLtHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
  struct settings {};
  static cublasStatus_t read(cublasLtHandle_t, settings*) { return CUBLAS_STATUS_SUCCESS; }
  static cublasStatus_t apply(cublasLtHandle_t, settings const&) { return CUBLAS_STATUS_SUCCESS; }
  static void destroy(cublasLtHandle_t h) { cublasLtDestroy(h); }
  [[noreturn]] static void fail(char const* doing, cublasStatus_t st)
  {
    throw raft::cublas_error(std::string(doing) + " the cuBLASLt handle failed: " + cublasGetStatusName(st) + ": " +
                             cublasGetStatusString(st));
  }
};

using checked_cublas      = checked_handle<cublasHandle_t, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublas_traits>;
using checked_cublaslt    = checked_handle<cublasLtHandle_t, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublaslt_traits>;
using checked_cusolver_dn = checked_handle<cusolverDnHandle_t, cusolverStatus_t, CUSOLVER_STATUS_SUCCESS, cusolver_dn_traits>;
using checked_cusolver_sp = checked_handle<cusolverSpHandle_t, cusolverStatus_t, CUSOLVER_STATUS_SUCCESS, cusolver_sp_traits>;
using checked_cusparse    = checked_handle<cusparseHandle_t, cusparseStatus_t, CUSPARSE_STATUS_SUCCESS, cusparse_traits>;

/// The five factories of one resources object, allocated together.
struct checked_factories {
  checked_factories(rmm::cuda_stream_view s, int device)
    : cublas(raft::resource::resource_type::CUBLAS_HANDLE, s, device),
      cublaslt(raft::resource::resource_type::CUBLASLT_HANDLE, s, device),
      cusolver_dn(raft::resource::resource_type::CUSOLVER_DN_HANDLE, s, device),
      cusolver_sp(raft::resource::resource_type::CUSOLVER_SP_HANDLE, s, device),
      cusparse(raft::resource::resource_type::CUSPARSE_HANDLE, s, device)
  {
  }
  checked_factory<checked_cublas> cublas;
  checked_factory<checked_cublaslt> cublaslt;
  checked_factory<checked_cusolver_dn> cusolver_dn;
  checked_factory<checked_cusolver_sp> cusolver_sp;
  checked_factory<checked_cusparse> cusparse;
};

/// The C++ object behind raftrs_resources: RAFT's device_resources, plus a look at whether a
/// lazily made resource exists yet (RAFT keeps its cells protected, a subclass may read them).
class shim_resources final : public raft::device_resources {
 public:
  shim_resources(int device, cudaStream_t stream)
    : raft::device_resources(rmm::cuda_stream_view{stream}), device_(device)
  {
  }

  /// Installs the checked handle factories (once; later calls are one atomic load). Every shim
  /// entry point that lets RAFT code reach these resources' handles calls it first, so RAFT's
  /// own factories (which hand out an uninitialised handle when a create fails) never run.
  /// Done on first use rather than in the constructor: resources that never take a handle pay
  /// nothing for it.
  void ensure_checked_factories()
  {
    using raft::resource::resource_type;
    if (has_resource_factory(resource_type::CUBLAS_HANDLE)) { return; }
    // One allocation for the five; each cell gets an aliasing pointer into it. The cells exist
    // (RAFT's constructor made them): a CAS each; a racing caller's CAS simply loses.
    auto all = std::make_shared<checked_factories>(raft::resource::get_cuda_stream(*this), device_);
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cublaslt));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusolver_dn));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusolver_sp));
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cusparse));
    // cuBLAS last: its factory being set is what tells the others are.
    ensure_default_factory(std::shared_ptr<raft::resource::resource_factory>(all, &all->cublas));
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
        throw std::invalid_argument(std::string(name) + ": a dimension is out of cuBLAS's int range");
      }
    }
    device_scope scope{r.device()};
    // Every GEMM runs relaxed. The first makes the handle (the thirteenth audit: that second
    // way to the handle's creation ran in global mode, refused during another thread's global
    // capture, which the refusal invalidated); and a handle's first GEMM, made already, still
    // made cuBLAS do work the driver refuses beside such a capture (run 189: the capture
    // invalidated, the GEMM itself fine), as may a kernel cuBLAS first loads for a later shape.
    // The resources' stream is not being captured (refused before this call), so the mode
    // decides nothing about what is queued; two driver calls beside a cuBLAS launch.
    relaxed_capture_hot relaxed;
    r.ensure_checked_factories();
    auto handle = raft::resource::get_cublas_handle(r);
    check_cublas(cublasSetStream(handle, raft::resource::get_cuda_stream(r).value()),
                 "binding the cuBLAS handle to the resources' stream");
    // alpha and beta are host values: RAFT code given these resources (cuVS, a lend) may have
    // left the shared handle in device pointer mode, where cuBLAS would read them as addresses.
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "setting cuBLAS's host pointer mode");
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
                 name);  // name says what ran: "the fp32 matrix product (cublasSgemm)"
  });
}

/// The GNU build-id (hex) and path of the librmm.so this shim is bound to, from its loaded
/// `PT_NOTE` segments (`dl_iterate_phdr`); both empty when none is. The object is the one the
/// loader gives the soname `librmm.so` (what the shim's DT_NEEDED names: `dlopen` with
/// RTLD_NOLOAD finds that very one, not a copy under another name; the review, helper 102).
void librmm_mapped_identity(char* id, std::size_t id_size, char* path, std::size_t path_size) noexcept
{
  void* handle = dlopen("librmm.so", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) { return; }
  link_map* map = nullptr;
  bool const known = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr;
  ElfW(Addr) const base = known ? map->l_addr : 0;
  dlclose(handle);  // balances the RTLD_NOLOAD reference; the shim's own keeps it mapped
  if (!known) { return; }
  struct found_t {
    char* id;
    std::size_t id_size;
    char* path;
    std::size_t path_size;
    ElfW(Addr) base;
  } found{id, id_size, path, path_size, base};
  dl_iterate_phdr(
    [](dl_phdr_info* info, std::size_t, void* data) -> int {
      auto* f = static_cast<found_t*>(data);
      if (info->dlpi_addr != f->base || info->dlpi_name == nullptr) { return 0; }
      std::strncpy(f->path, info->dlpi_name, f->path_size - 1);
      for (int i = 0; i < info->dlpi_phnum; ++i) {
        auto const& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_NOTE) { continue; }
        std::size_t const align = ph.p_align == 8 ? 8 : 4;
        auto up                 = [align](std::size_t n) { return (n + align - 1) & ~(align - 1); };
        // SAFETY (of the reads): the loader mapped this segment whole, p_memsz bytes from here.
        auto const* notes = reinterpret_cast<unsigned char const*>(info->dlpi_addr + ph.p_vaddr);
        std::size_t at = 0;
        while (at + sizeof(ElfW(Nhdr)) <= ph.p_memsz) {
          ElfW(Nhdr) nh;
          std::memcpy(&nh, notes + at, sizeof(nh));
          std::size_t const desc = at + up(sizeof(ElfW(Nhdr)) + nh.n_namesz);
          std::size_t const next = at + up(desc - at + nh.n_descsz);
          if (desc + nh.n_descsz > ph.p_memsz || next <= at) { break; }
          if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
              std::memcmp(notes + at + sizeof(ElfW(Nhdr)), "GNU", 4) == 0) {
            std::size_t w = 0;
            for (std::size_t k = 0; k < nh.n_descsz && w + 3 <= f->id_size; ++k, w += 2) {
              std::snprintf(f->id + w, 3, "%02x", static_cast<unsigned>(notes[desc + k]));
            }
            return 1;
          }
          at = next;
        }
      }
      return 1;  // librmm found, without a build-id
    },
    &found);
}

}  // namespace

extern "C" {

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

void raftrs_get_librmm_identity(raftrs_librmm_identity* out)
{
  if (out == nullptr) { return; }
  std::memset(out, 0, sizeof(*out));
  std::strncpy(out->linked, RAFTRS_LIBRMM_BUILD_ID, sizeof(out->linked) - 1);
  librmm_mapped_identity(out->mapped, sizeof(out->mapped), out->mapped_path, sizeof(out->mapped_path));
}

raftrs_status raftrs_runtime_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaRuntimeGetVersion(&v), "reading the CUDA runtime version");
    *out = v;
  });
}

raftrs_status raftrs_driver_version(int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaDriverGetVersion(&v), "reading the CUDA driver version");
    *out = v;
  });
}

raftrs_status raftrs_device_count(int32_t* out)
{
  return guard([&] {
    *out = device_count();
  });
}

raftrs_status raftrs_current_device(int32_t* out)
{
  return guard([&] {
    int d = 0;
    check(cudaGetDevice(&d), "reading the current device");
    *out = d;
  });
}

raftrs_status raftrs_device_memory_pools_supported(int32_t device, int32_t* out)
{
  return guard([&] {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, device), "asking whether the device supports memory pools");
    *out = v;
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
    // Handles are let go on their own device (kept, not destroyed: `kept_handles`).
    device_scope scope{r->device()};
    // RMM's frees of the resources' workspaces may synchronise:
    // in the thread's own global capture mode the driver refuses that while another thread
    // captures in global mode (leaking what it frees). The caller drained the stream first.
    raftrs_fence::relaxed_capture relaxed;
    delete r;
  });
}

raftrs_status raftrs_resources_sync(raftrs_resources* res)
{
  return guard([&] {
    auto& r = unwrap(res);
    // RAFT's sync_stream polls through the runtime, which binds device 0's primary context to a
    // thread that has none (a process that only uses device 1 would wake device 0).
    device_scope scope{r.device()};
    // Its polls (cudaStreamQuery) in the thread's global capture mode are refused while another
    // thread captures in global mode, invalidating that capture (the twelfth audit); the caller
    // refused a capturing stream of its own first.
    raftrs_fence::relaxed_capture relaxed;
    r.sync_stream();
  });
}

raftrs_status raftrs_resources_handle(raftrs_resources* res, int32_t kind, void** out)
{
  return guard([&] {
    auto& r = unwrap(res);
    auto const type = handle_type(kind);  // refuses an unknown kind
    device_scope scope{r.device()};
    // A handle's creation (cublasCreate and the like) makes calls the driver refuses in global
    // mode while another thread captures in global mode, invalidating that capture (the twelfth
    // audit's review): relaxed while it is not made yet (a handle made already is only read).
    // The mode decides only such refusals: what is queued on a stream is captured, or not,
    // whatever it is.
    std::optional<raftrs_fence::relaxed_capture> relaxed;
    if (!r.has(type)) { relaxed.emplace(); }
    r.ensure_checked_factories();
    switch (kind) {
      case RAFTRS_HANDLE_CUBLAS: *out = raft::resource::get_cublas_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_DN: *out = raft::resource::get_cusolver_dn_handle(r); break;
      case RAFTRS_HANDLE_CUSOLVER_SP: *out = raft::resource::get_cusolver_sp_handle(r); break;
      case RAFTRS_HANDLE_CUSPARSE: *out = raft::resource::get_cusparse_handle(r); break;
      default: break;
    }
  });
}

raftrs_status raftrs_handles_trim(int32_t device, int32_t* destroyed)
{
  return guard([&] {
    *destroyed = 0;
    device_scope scope{device};
    // Destroying synchronises the device: relaxed, as every such call here (the driver's
    // refusal beside another thread's global capture would leave the handle half-destroyed).
    raftrs_fence::relaxed_capture relaxed;
    auto destroy_all = [&](auto& kept, auto destroy) {
      for (auto h : kept.take_all(device)) {
        destroy(h);
        ++*destroyed;
      }
    };
    destroy_all(kept_handles<cublasHandle_t>::of(), cublas_traits::destroy);
    destroy_all(kept_handles<cublasLtHandle_t>::of(), cublaslt_traits::destroy);
    destroy_all(kept_handles<cusolverDnHandle_t>::of(), cusolver_dn_traits::destroy);
    destroy_all(kept_handles<cusolverSpHandle_t>::of(), cusolver_sp_traits::destroy);
    destroy_all(kept_handles<cusparseHandle_t>::of(), cusparse_traits::destroy);
  });
}

raftrs_status raftrs_resources_native(raftrs_resources* res, void** out)
{
  return guard([&] {
    auto& r = unwrap(res);
    r.ensure_checked_factories();
    *out = static_cast<void*>(static_cast<raft::resources*>(&r));
  });
}

raftrs_status raftrs_resources_has_handle(raftrs_resources* res, int32_t kind, int32_t* out)
{
  return guard([&] { *out = unwrap(res).has(handle_type(kind)) ? 1 : 0; });
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
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasSgemm, "the fp32 matrix product (cublasSgemm)");
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
    res, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cublasDgemm, "the fp64 matrix product (cublasDgemm)");
}

}  // extern "C"

// raft-comms's C++ shim: the thread's last error, libnccl opened at run time (dlopen, so the
// shim needs only nccl.h to build), NCCL's and CUDA's failures as exceptions, the driver's
// context calls behind device_scope; and the entry points that load NCCL and make unique ids.

#include "common.hpp"

#include <raft/version_config.hpp>
#include <rmm/version_config.hpp>

#include <cuda/std/version>
#include <cuda_runtime_api.h>

#include <cstring>

#pragma GCC visibility push(hidden)  // internal to the shim, as in common.hpp

namespace raftcomms {

// ---- errors ---------------------------------------------------------------------------------

// A plain array, not a std::string: glibc destroys thread-locals before the exit handlers run,
// and an array has no destructor (the same rule as raft-sys's shim).
thread_local char last_error[last_error_size];

raftcomms_status fail(raftcomms_status status, char const* what) noexcept
{
  std::size_t n = std::strlen(what);
  if (n >= last_error_size) { n = last_error_size - 1; }
  std::memcpy(last_error, what, n);
  last_error[n] = '\0';
  return status;
}

void check_cuda(cudaError_t code, char const* doing)
{
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw cuda_failure(code, doing);
  }
}

bool says_out_of_memory(char const* what) noexcept
{
  return std::strstr(what, "out of memory") != nullptr || std::strstr(what, "cudaErrorMemoryAllocation") != nullptr;
}

// ---- libnccl, opened at run time -------------------------------------------------------------

nccl_library& library()
{
  static nccl_library* lib = new nccl_library;
  return *lib;
}

nccl_api const& nccl()
{
  auto& lib = library();
  if (!lib.ok.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> hold(lib.lock);
    throw nccl_missing(lib.tried ? lib.error : std::string("libnccl was not loaded (raftcomms_nccl_load was not called)"));
  }
  return lib.api;
}

std::string version_text(int code)
{
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string((code % 10000) / 100) + "." + std::to_string(code % 100);
}

void load_nccl(char const* path)
{
  auto& lib = library();
  std::lock_guard<std::mutex> hold(lib.lock);
  if (lib.tried) { return; }
  lib.tried       = true;
  char const* tried = path != nullptr ? path : "libnccl.so.2";
  void* handle    = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    char const* why = dlerror();
    lib.error       = std::string("could not open ") + tried + ": " + (why != nullptr ? why : "unknown dlopen error");
    return;
  }
  nccl_api api;
  std::string missing;
#define RAFTCOMMS_NCCL_LOOKUP(name)                                                        \
  api.name = reinterpret_cast<decltype(&::nccl##name)>(dlsym(handle, "nccl" #name));       \
  if (api.name == nullptr && missing.empty()) { missing = "nccl" #name; }
  RAFTCOMMS_NCCL_FUNCTIONS(RAFTCOMMS_NCCL_LOOKUP)
#undef RAFTCOMMS_NCCL_LOOKUP
  Dl_info info{};
  std::string where = tried;
  if (api.GetVersion != nullptr && dladdr(reinterpret_cast<void*>(api.GetVersion), &info) != 0 && info.dli_fname != nullptr) {
    where = info.dli_fname;
  }
  if (!missing.empty()) {
    lib.error = where + " has no " + missing + ": NCCL " + version_text(RAFTCOMMS_MIN_NCCL_VERSION) + " or newer is needed";
    return;  // the handle stays open: harmless, and dlclose of NCCL at run time is not
  }
  int version = 0;
  if (api.GetVersion(&version) != ncclSuccess || version < RAFTCOMMS_MIN_NCCL_VERSION) {
    lib.error = where + " is NCCL " + version_text(version) + ": " + version_text(RAFTCOMMS_MIN_NCCL_VERSION) + " or newer is needed";
    return;
  }
  lib.api     = api;
  lib.version = version;
  lib.path    = where;
  lib.ok.store(true, std::memory_order_release);
}

/// `doing failed: <NCCL's name of the result>: <NCCL's last error>`.
std::string nccl_message(ncclResult_t r, char const* doing)
{
  auto const& api   = nccl();
  std::string what  = std::string(doing) + " failed: " + api.GetErrorString(r);
  char const* last  = api.GetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') { what += std::string(": ") + last; }
  return what;
}

/// Throws on any result but ncclSuccess and ncclInProgress; returns the result.
ncclResult_t check_nccl(ncclResult_t r, char const* doing)
{
  if (r != ncclSuccess && r != ncclInProgress) { throw nccl_failure(r, nccl_message(r, doing)); }
  return r;
}

/// Whether a failed call leaves the communicator usable: a refused argument does.
bool leaves_comm_usable(ncclResult_t r) { return r == ncclInvalidArgument || r == ncclInvalidUsage; }

// ---- devices and groups ---------------------------------------------------------------------------
driver_ctx const* driver()
{
  static std::atomic<driver_ctx*> found{nullptr};
  if (auto* d = found.load(std::memory_order_acquire)) { return d; }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) { return nullptr; }
  auto* fresh = new driver_ctx{reinterpret_cast<driver_ctx::get_fn>(dlsym(lib, "cuCtxGetCurrent")),
                               reinterpret_cast<driver_ctx::set_fn>(dlsym(lib, "cuCtxSetCurrent"))};
  if (fresh->get == nullptr || fresh->set == nullptr) {
    delete fresh;
    return nullptr;
  }
  driver_ctx* expected = nullptr;
  if (!found.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return expected;
  }
  return fresh;  // kept for the process's life
}

/// ncclGroupStart / ncclGroupEnd depth on this thread (a plain int: no destructor).
thread_local int group_depth = 0;

/// Whether this thread's NCCL group is open (a plain bool: no destructor).
thread_local bool nccl_group_open = false;

}  // namespace raftcomms

#pragma GCC visibility pop

using namespace raftcomms;

extern "C" {

const char* raftcomms_last_error(void) { return last_error; }

void raftcomms_clear_error(void) { last_error[0] = '\0'; }

uint64_t raftcomms_header_hash(void) { return RAFTCOMMS_HEADER_HASH; }

int32_t raftcomms_header_nccl_version(void) { return NCCL_VERSION_CODE; }

void raftcomms_build_info(int32_t* raft, int32_t* rmm, int32_t* cccl, int32_t* cudart, char* librmm_build_id, size_t size)
{
  if (raft != nullptr) { *raft = RAFT_VERSION_MAJOR * 10000 + RAFT_VERSION_MINOR * 100 + RAFT_VERSION_PATCH; }
  if (rmm != nullptr) { *rmm = RMM_VERSION_MAJOR * 10000 + RMM_VERSION_MINOR * 100 + RMM_VERSION_PATCH; }
  if (cccl != nullptr) { *cccl = CCCL_VERSION; }
  if (cudart != nullptr) { *cudart = CUDART_VERSION; }
  if (librmm_build_id != nullptr && size > 0) {
    std::strncpy(librmm_build_id, RAFTCOMMS_LIBRMM_BUILD_ID, size - 1);
    librmm_build_id[size - 1] = '\0';
  }
}

raftcomms_status raftcomms_nccl_load(const char* path, int32_t* version)
{
  return guard([&] {
    load_nccl(path);
    nccl();  // throws the load's error
    if (version != nullptr) { *version = library().version; }
  });
}

raftcomms_status raftcomms_nccl_path(char* buf, size_t size)
{
  return guard([&] {
    nccl();
    if (buf == nullptr || size == 0) { return; }
    auto const& path = library().path;
    std::size_t n    = path.size() < size - 1 ? path.size() : size - 1;
    std::memcpy(buf, path.data(), n);
    buf[n] = '\0';
  });
}

raftcomms_status raftcomms_unique_id(uint8_t* out)
{
  static_assert(sizeof(ncclUniqueId) == RAFTCOMMS_UNIQUE_ID_BYTES, "ncclUniqueId changed size");
  return guard([&] {
    ncclUniqueId id;
    check_nccl(nccl().GetUniqueId(&id), "making an NCCL unique id");
    std::memcpy(out, &id, sizeof(id));
  });
}

}  // extern "C"

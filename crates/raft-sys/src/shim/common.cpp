// The shim's shared state: the thread-local last error (and the entry points that read it), the
// noted primary contexts, the driver's context calls, and the device count.
#include "common.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// A plain array, not a std::string: glibc runs thread-local destructors before the exit
// handlers, so a std::string here would be destroyed while the exit teardown still calls the
// shim. An array has no destructor and stays valid to the end of the thread and the process.
constexpr std::size_t last_error_size = 2048;
thread_local char last_error[last_error_size];

}  // namespace

namespace raftrs_shim __attribute__((visibility("hidden"))) {

raftrs_status fail(raftrs_status status, char const* what) noexcept
{
  std::size_t n = std::strlen(what);
  if (n >= last_error_size) { n = last_error_size - 1; }
  std::memcpy(last_error, what, n);
  last_error[n] = '\0';
  return status;
}

std::atomic<void*> noted_primaries[noted_primaries_max]{};

std::atomic<device_scope::driver_ctx const*> device_scope::driver_ctx_found{nullptr};

device_scope::driver_ctx const* device_scope::driver_ctx_lookup()
{
  static driver_ctx const* const api = []() -> driver_ctx const* {
    void* fns[4]             = {};
    char const* const names[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGet", "cuDevicePrimaryCtxGetState"};
    for (int i = 0; i < 4; ++i) {
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(names[i], &fns[i], 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess || fns[i] == nullptr) {
        cudaGetLastError();
        return nullptr;
      }
    }
    return new driver_ctx{reinterpret_cast<driver_ctx::get_fn>(fns[0]),
                          reinterpret_cast<driver_ctx::set_fn>(fns[1]),
                          reinterpret_cast<driver_ctx::dev_fn>(fns[2]),
                          reinterpret_cast<driver_ctx::state_fn>(fns[3])};
  }();
  // Published for driver_ctx_api's one load (release: the calls' struct is read through it).
  if (api != nullptr) { driver_ctx_found.store(api, std::memory_order_release); }
  return api;
}

void device_scope::enter()
{
  // A context is bound that is not the device's noted primary (the constructor's fast path said
  // so): another library's context of this device or another (cuCtxCreate, PyCUDA, a green
  // context). The runtime names its device, so "the same device" kept it before, and handles,
  // memory and launches landed in that context, whose addresses die with it (the eighteenth
  // audit). With the primary noted, it is bound whatever the device, and the exact context put
  // back on exit.
  if (saved_ctx_ && previous_ != nullptr) {
    if (void* primary = noted_primary(device_); primary != nullptr) {
      if (driver_ctx_api()->set(primary) != 0) {
        throw cuda_failure(cudaErrorDeviceUninitialized, "binding the device's primary context");
      }
      switched_ = true;
      return;
    }
  }
  // With a context bound, the runtime reports its device; with none, its answer is only its
  // default (0), and the thread must be switched whatever the device.
  if (!saved_ctx_ || previous_ != nullptr) {
    int current = -1;
    check(cudaGetDevice(&current), "reading the current device");
    if (current == device_) { return; }
    if (!saved_ctx_) { previous_device_ = current; }
  }
  check(cudaSetDevice(device_), "making the device current");
  switched_ = true;
}

std::atomic<is_capturing_fn> is_capturing_found{nullptr};

namespace {
/// The driver's entry point `name` (CUDA 12.0's version), or null where it cannot be found.
void* driver_entry(char const* name) noexcept
{
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}
}  // namespace

bool stream_capturing_lookup(void* stream) noexcept
{
  static auto const query = reinterpret_cast<is_capturing_fn>(driver_entry("cuStreamIsCapturing"));
  if (query != nullptr) {
    is_capturing_found.store(query, std::memory_order_relaxed);
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    return query(stream, &status) == 0 && status != 0;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

std::atomic<exchange_mode_fn> exchange_mode_found{nullptr};

exchange_mode_fn exchange_mode_lookup() noexcept
{
  static auto const exchange = reinterpret_cast<exchange_mode_fn>(driver_entry("cuThreadExchangeStreamCaptureMode"));
  if (exchange != nullptr) { exchange_mode_found.store(exchange, std::memory_order_relaxed); }
  return exchange;
}

void stop_captured_meanwhile(char const* what) noexcept
{
  std::fprintf(stderr, "raft-rs: a CUDA graph capture began on a stream while %s was queued on it; aborting\n", what);
  std::abort();
}

int device_count()
{
  int n = 0;
  auto code = cudaGetDeviceCount(&n);
  // A driver with no device is a machine with zero devices, not a failure.
  if (code == cudaErrorNoDevice) {
    cudaGetLastError();
    return 0;
  }
  check(code, "counting the devices");
  return n;
}

void check_device(int32_t device)
{
  int count = device_count();
  if (device < 0 || device >= count) {
    throw std::out_of_range("no device " + std::to_string(device) + " among " +
                            std::to_string(count));
  }
}

}  // namespace raftrs_shim

using namespace raftrs_shim;

extern "C" {

uint64_t raftrs_header_hash(void) { return RAFTRS_HEADER_HASH; }

const char* raftrs_last_error(void) { return last_error; }

void raftrs_clear_error(void) { last_error[0] = '\0'; }

raftrs_status raftrs_note_primary_context(int32_t device, void* context)
{
  return guard([&] {
    if (device >= 0 && device < noted_primaries_max) {
      noted_primaries[device].store(context, std::memory_order_release);
    }
  });
}

}  // extern "C"

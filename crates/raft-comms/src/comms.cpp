// raft-comms's C++ shim: NCCL communicators behind raftcomms.h, and RAFT's comms_iface over them
// (installed with raft::resource::set_comms). libnccl is opened at run time (dlopen), so the
// shim itself needs only nccl.h to build. Every entry point runs inside guard(): no C++
// exception reaches Rust.

#include "raftcomms.h"

#include <nccl.h>

#include <raft/core/comms.hpp>
#include <raft/core/resource/comms.hpp>

#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---- errors ---------------------------------------------------------------------------------

// A plain array, not a std::string: glibc destroys thread-locals before the exit handlers run,
// and an array has no destructor (the same rule as raft-sys's shim).
constexpr std::size_t last_error_size = 2048;
thread_local char last_error[last_error_size];

raftcomms_status fail(raftcomms_status status, char const* what) noexcept
{
  std::size_t n = std::strlen(what);
  if (n >= last_error_size) { n = last_error_size - 1; }
  std::memcpy(last_error, what, n);
  last_error[n] = '\0';
  return status;
}

/// An NCCL call that failed, with NCCL's own words (ncclGetErrorString, ncclGetLastError).
struct nccl_failure : std::runtime_error {
  ncclResult_t code;
  nccl_failure(ncclResult_t c, std::string const& what) : std::runtime_error(what), code(c) {}
};

/// A CUDA runtime call that failed.
struct cuda_failure : std::runtime_error {
  cudaError_t code;
  cuda_failure(cudaError_t c, char const* doing)
    : std::runtime_error(std::string(doing) + " failed: " + cudaGetErrorName(c) + ": " + cudaGetErrorString(c)), code(c)
  {
  }
};

/// libnccl is missing or too old.
struct nccl_missing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A wait that ran past its bound (the communicator was aborted).
struct timed_out : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

template <typename F>
raftcomms_status guard(F&& body) noexcept
{
  try {
    body();
    return RAFTCOMMS_STATUS_OK;
  } catch (nccl_failure const& e) {
    switch (e.code) {
      case ncclUnhandledCudaError:
        return fail(says_out_of_memory(e.what()) ? RAFTCOMMS_STATUS_OUT_OF_MEMORY : RAFTCOMMS_STATUS_CUDA, e.what());
      case ncclInvalidArgument:
      case ncclInvalidUsage: return fail(RAFTCOMMS_STATUS_LOGIC, e.what());
      default: return fail(says_out_of_memory(e.what()) ? RAFTCOMMS_STATUS_OUT_OF_MEMORY : RAFTCOMMS_STATUS_GENERIC, e.what());
    }
  } catch (cuda_failure const& e) {
    return fail(e.code == cudaErrorMemoryAllocation ? RAFTCOMMS_STATUS_OUT_OF_MEMORY : RAFTCOMMS_STATUS_CUDA, e.what());
  } catch (std::bad_alloc const& e) {
    return fail(RAFTCOMMS_STATUS_OUT_OF_MEMORY, e.what());
  } catch (std::logic_error const& e) {
    // raft::logic_error derives from it (RAFT's ASSERT / RAFT_EXPECTS).
    return fail(RAFTCOMMS_STATUS_LOGIC, e.what());
  } catch (std::exception const& e) {
    return fail(RAFTCOMMS_STATUS_GENERIC, e.what());
  } catch (...) {
    return fail(RAFTCOMMS_STATUS_GENERIC, "an unknown C++ exception");
  }
}

// ---- libnccl, opened at run time -------------------------------------------------------------

/// The NCCL functions the shim calls, typed from nccl.h.
struct nccl_api {
#define RAFTCOMMS_NCCL_FUNCTIONS(X)                                                                         \
  X(GetVersion)                                                                                             \
  X(GetUniqueId)                                                                                            \
  X(CommInitRankConfig)                                                                                     \
  X(CommFinalize)                                                                                           \
  X(CommDestroy)                                                                                            \
  X(CommAbort)                                                                                              \
  X(CommSplit)                                                                                              \
  X(CommGetAsyncError)                                                                                      \
  X(CommCount)                                                                                              \
  X(CommUserRank)                                                                                           \
  X(GetErrorString)                                                                                         \
  X(GetLastError)                                                                                           \
  X(GroupStart)                                                                                             \
  X(GroupEnd)                                                                                               \
  X(AllReduce)                                                                                              \
  X(Broadcast)                                                                                              \
  X(Reduce)                                                                                                 \
  X(AllGather)                                                                                              \
  X(ReduceScatter)                                                                                          \
  X(Send)                                                                                                   \
  X(Recv)
#define RAFTCOMMS_NCCL_FIELD(name) decltype(&::nccl##name) name = nullptr;
  RAFTCOMMS_NCCL_FUNCTIONS(RAFTCOMMS_NCCL_FIELD)
#undef RAFTCOMMS_NCCL_FIELD
};

/// What raftcomms_nccl_load found; made once, never destroyed (valid during the exit).
struct nccl_library {
  std::mutex lock;
  bool tried{false};
  std::atomic<bool> ok{false};
  nccl_api api;
  int version{0};
  std::string path;
  std::string error;
};

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

/// The driver's cuCtxGetCurrent / cuCtxSetCurrent, from the libcuda the process already loaded
/// (cudarc and the runtime load it): with them a scope puts back exactly the context the thread
/// had, also none. Without them (libcuda not loaded yet) the runtime's current device is used.
struct driver_ctx {
  using get_fn = int (*)(void**);
  using set_fn = int (*)(void*);
  get_fn get{nullptr};
  set_fn set{nullptr};
};

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

/// Makes `device` current for the calling thread and puts back what was current before (the
/// exact context, or none): NCCL creates a communicator on the current device, our events
/// must live on the communicator's, and a thread with no context (the watchdog, a
/// rank's main thread on device 1) must not be given device 0's by a runtime call.
class device_scope {
 public:
  explicit device_scope(int device) { enter(device, true); }
  /// For cleanup paths: a failure to switch is ignored (the calls that follow fail instead).
  device_scope(int device, std::nothrow_t) noexcept
  {
    try {
      enter(device, false);
    } catch (...) {
    }
  }
  ~device_scope()
  {
    if (!switched_) { return; }
    if (saved_ctx_) {
      driver()->set(ctx_);
    } else {
      cudaSetDevice(previous_);
    }
  }
  device_scope(device_scope const&)            = delete;
  device_scope& operator=(device_scope const&) = delete;

 private:
  void enter(int device, bool throwing)
  {
    auto const* d = driver();
    saved_ctx_    = d != nullptr && d->get(&ctx_) == 0;
    bool has_ctx  = !saved_ctx_ || ctx_ != nullptr;
    int current   = -1;
    if (has_ctx && cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      current = -1;
    }
    if (has_ctx && current == device) { return; }
    previous_      = current < 0 ? 0 : current;
    cudaError_t e  = cudaSetDevice(device);
    if (e != cudaSuccess) {
      if (throwing) { check_cuda(e, "making the communicator's device current"); }
      cudaGetLastError();
      return;
    }
    switched_ = true;
  }

  void* ctx_{nullptr};
  bool saved_ctx_{false};
  int previous_{0};
  bool switched_{false};
};

/// ncclGroupStart / ncclGroupEnd depth on this thread (a plain int: no destructor).
thread_local int group_depth = 0;

// ---- communicators -------------------------------------------------------------------------------

/// One NCCL communicator, shared by the Rust handle and every comms_iface installed from it.
struct comm_cell {
  std::mutex lock;
  ncclComm_t comm{nullptr};
  /// Set once the communicator was aborted or destroyed; `why` says which and why.
  bool ended{false};
  std::string why;
  int rank{-1};
  int size{-1};
  int device{0};
  double timeout_s{300.0};
  /// Recorded after each marked call: what the owner's watchdog looks at.
  cudaEvent_t event{nullptr};
  /// Where a non-blocking ncclCommSplit writes the new communicator, from NCCL's own thread,
  /// when the split's job ends (NULL until then, and NULL for no color). Heap-allocated and never
  /// freed (8 bytes a split): nothing here can know when NCCL's job has stopped writing it.
  ncclComm_t* split_slot{nullptr};
  /// Whether this rank gave a color to the split (then a communicator comes, or an error).
  bool split_colored{false};
  /// The thread whose open NCCL group holds calls on this communicator, until its outermost
  /// group ends (none: the default id). NCCL keeps a group per thread: a call from another thread
  /// meanwhile would join that group and be launched when it ends, after the caller's buffers may
  /// be gone (RAFT's C++ code reaches the communicator through get_comms, past the Rust side's
  /// own check).
  std::thread::id group_owner{};
};

using cell_ptr = std::shared_ptr<comm_cell>;

}  // namespace

struct raftcomms_comm {
  cell_ptr cell;
};

namespace {

comm_cell& cell_of(raftcomms_comm* h)
{
  if (h == nullptr || !h->cell) { throw std::invalid_argument("no communicator (a null handle)"); }
  return *h->cell;
}

/// Throws, saying why, when the communicator has ended. Under the cell's lock.
void live(comm_cell& c, char const* doing)
{
  if (c.ended || c.comm == nullptr) {
    throw std::logic_error(std::string(doing) + ": the communicator " + (c.why.empty() ? std::string("has ended") : c.why));
  }
}

/// Destroys the event (after the communicator ended; never waits for the device). Under the
/// cell's lock.
void release_device_objects(comm_cell& c) noexcept
{
  if (c.event == nullptr) { return; }
  device_scope scope{c.device, std::nothrow};
  cudaEventDestroy(c.event);
  cudaGetLastError();  // a broken context fails it: nothing more to do about it
  c.event = nullptr;
}

/// ncclCommAbort, once; the reason is kept. Under the cell's lock.
ncclResult_t abort_locked(comm_cell& c, std::string const& reason) noexcept
{
  if (c.ended) { return ncclSuccess; }
  ncclResult_t r = ncclSuccess;
  if (c.comm != nullptr) {
    device_scope scope{c.device, std::nothrow};
    try {
      r = nccl().CommAbort(c.comm);
    } catch (...) {
      r = ncclInternalError;
    }
  }
  c.comm  = nullptr;
  c.ended = true;
  c.why   = "was aborted: " + reason;
  release_device_objects(c);
  return r;
}

/// Creates the cell's event on its device.
void make_device_objects(comm_cell& c)
{
  device_scope scope{c.device};
  check_cuda(cudaEventCreateWithFlags(&c.event, cudaEventDisableTiming), "creating the communicator's event");
}

/// A new cell on `device`, with its event unless `bare` (no NCCL communicator yet).
cell_ptr new_cell(int device, double timeout_s, bool bare = false)
{
  auto c       = std::make_shared<comm_cell>();
  c->device    = device;
  c->timeout_s = timeout_s;
  if (!bare) { make_device_objects(*c); }
  return c;
}

/// Starts a non-blocking ncclCommSplit of `parent` into a new bare cell (under the parent's
/// lock, taken here). The child has no communicator until `finish_split`, after the parent's
/// state left ncclInProgress.
cell_ptr start_split(comm_cell& parent, int color, int key, char const* doing)
{
  auto child           = new_cell(parent.device, parent.timeout_s, true);
  child->split_slot    = new ncclComm_t(nullptr);
  child->split_colored = color >= 0;
  std::lock_guard<std::mutex> hold(parent.lock);
  live(parent, doing);
  device_scope scope{parent.device};
  ncclResult_t r = nccl().CommSplit(parent.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, child->split_slot, nullptr);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string what = nccl_message(r, doing);
    if (!leaves_comm_usable(r)) { abort_locked(parent, what); }
    throw nccl_failure(r, what);
  }
  return child;
}

void backoff(std::chrono::steady_clock::time_point start);

/// After the parent's wait: takes the new communicator NCCL writes when the split's job ends
/// (waiting for it, bounded by the timeout, should the parent have turned ready first), or none
/// for no color; gives the child its event. Returns whether there is one.
bool finish_split(comm_cell& child)
{
  std::lock_guard<std::mutex> hold(child.lock);
  if (child.split_slot == nullptr) { return child.comm != nullptr; }
  if (!child.split_colored) {
    child.split_slot = nullptr;  // NCCL writes NULL there: left to it
    child.ended      = true;
    child.why        = "was never made (no color)";
    return false;
  }
  auto start      = std::chrono::steady_clock::now();
  ncclComm_t made = nullptr;
  while ((made = __atomic_load_n(child.split_slot, __ATOMIC_ACQUIRE)) == nullptr) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > child.timeout_s) {
      child.split_slot = nullptr;
      child.ended      = true;
      child.why        = "was not made in time by the split";
      throw timed_out("ncclCommSplit gave no communicator within " + std::to_string(child.timeout_s) + " s");
    }
    backoff(start);
  }
  child.split_slot = nullptr;
  child.comm       = made;
  try {
    make_device_objects(child);
  } catch (...) {
    abort_locked(child, "creating its event failed");
    throw;
  }
  return true;
}

/// Waits a little longer each time: yields for the first 2 ms (a nonblocking communicator's
/// launch ends within tens of microseconds, and a sleep costs the timer's slack, 50 µs or more
/// on Linux: sleeping at once made an 8-byte allreduce 2.5x slower than torch's in run 24),
/// then 20 µs sleeps, and 200 µs ones after 100 ms (a wait for other ranks).
void backoff(std::chrono::steady_clock::time_point start)
{
  auto waited = std::chrono::steady_clock::now() - start;
  if (waited < std::chrono::milliseconds(2)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(100) ? 20 : 200));
  }
}

double seconds_since(std::chrono::steady_clock::time_point start)
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Waits until the communicator is no longer ncclInProgress; aborts it on an error or after
/// `timeout_s`. Takes the lock for each look only.
void wait_ready(comm_cell& c, double timeout_s, char const* doing)
{
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> hold(c.lock);
      live(c, doing);
      ncclResult_t state = ncclSuccess;
      ncclResult_t r     = nccl().CommGetAsyncError(c.comm, &state);
      if (r != ncclSuccess) { state = r; }
      if (state == ncclSuccess) {
        if (c.rank < 0) {
          check_nccl(nccl().CommUserRank(c.comm, &c.rank), "reading the communicator's rank");
          check_nccl(nccl().CommCount(c.comm, &c.size), "reading the communicator's size");
        }
        return;
      }
      if (state != ncclInProgress) {
        std::string what = nccl_message(state, doing);
        abort_locked(c, what);
        throw nccl_failure(state, what);
      }
      double waited = seconds_since(start);
      if (waited > timeout_s) {
        std::string what = std::string(doing) + " did not complete within " + std::to_string(timeout_s) +
                           " s (a rank that never arrived or died?); the communicator was aborted";
        abort_locked(c, what);
        throw timed_out(what);
      }
    }
    backoff(start);
  }
}

ncclDataType_t nccl_type(int32_t dtype)
{
  switch (dtype) {
    case RAFTCOMMS_DTYPE_U8: return ncclUint8;
    case RAFTCOMMS_DTYPE_I32: return ncclInt32;
    case RAFTCOMMS_DTYPE_I64: return ncclInt64;
    case RAFTCOMMS_DTYPE_F32: return ncclFloat32;
    case RAFTCOMMS_DTYPE_F64: return ncclFloat64;
    default: throw std::invalid_argument("unknown element type " + std::to_string(dtype));
  }
}

std::size_t type_size(ncclDataType_t t)
{
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: throw std::invalid_argument("unsupported element type");
  }
}

ncclRedOp_t nccl_op(int32_t op)
{
  switch (op) {
    case RAFTCOMMS_OP_SUM: return ncclSum;
    case RAFTCOMMS_OP_PROD: return ncclProd;
    case RAFTCOMMS_OP_MIN: return ncclMin;
    case RAFTCOMMS_OP_MAX: return ncclMax;
    default: throw std::invalid_argument("unknown reduction " + std::to_string(op));
  }
}

/// Ends the calling thread's hold on `c` once its outermost group has ended (ncclGroupEnd
/// returned, or failed and aborted it): until then another thread's call is refused, never
/// folded into this thread's group.
void release_group_owner(comm_cell& c) noexcept
{
  try {
    std::lock_guard<std::mutex> hold(c.lock);
    if (c.group_owner == std::this_thread::get_id()) { c.group_owner = std::thread::id{}; }
  } catch (...) {
    // Locking failed (std::system_error, never seen): the hold stays, and other threads' calls
    // keep being refused, the safe side. Called from a destructor: nothing may escape.
  }
}

/// Releases the calling thread's hold on `n` communicators when it goes out of scope: after
/// the group's end, on every path out of it.
struct owners_release {
  int32_t n;
  cell_ptr const* const* cells;
  owners_release(int32_t count, cell_ptr const* const* list) : n{count}, cells{list} {}
  owners_release(int32_t count, cell_ptr const* one) : n{count}, cells{nullptr}, single{one} {}
  ~owners_release()
  {
    if (single != nullptr && n > 0) { release_group_owner(**single); }
    for (int32_t i = 0; cells != nullptr && i < n; ++i) { release_group_owner(**cells[i]); }
  }
  owners_release(owners_release const&)            = delete;
  owners_release& operator=(owners_release const&) = delete;

 private:
  cell_ptr const* single{nullptr};
};

/// Runs one enqueueing NCCL call (or a group of them: `call` may start and end its own group)
/// on the communicator: under its lock, on its device; waits out ncclInProgress outside a
/// group; aborts the communicator when the failure leaves it unusable; records the event when
/// asked (outside a group).
template <typename F>
void run_op(comm_cell& c, cudaStream_t stream, bool mark, char const* doing, F&& call)
{
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard<std::mutex> hold(c.lock);
    live(c, doing);
    if (c.group_owner != std::thread::id{} && c.group_owner != std::this_thread::get_id()) {
      throw std::logic_error(std::string(doing) +
                             ": the communicator has calls in an open NCCL group on another thread; call it from that "
                             "thread, or after that group has ended");
    }
    device_scope scope{c.device};
    r = call(c.comm);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string what = nccl_message(r, doing);
      if (!leaves_comm_usable(r)) { abort_locked(c, what); }
      throw nccl_failure(r, what);
    }
    if (group_depth > 0) {
      c.group_owner = std::this_thread::get_id();
      return;  // deferred to the group's end
    }
    if (r == ncclSuccess) {
      // Launched: the common case records the event under the same lock and device.
      if (mark) { check_cuda(cudaEventRecord(c.event, stream), "recording the communicator's event"); }
      return;
    }
  }
  if (r == ncclInProgress) { wait_ready(c, c.timeout_s, doing); }
  if (mark) {
    std::lock_guard<std::mutex> hold(c.lock);
    live(c, doing);
    device_scope scope{c.device};
    check_cuda(cudaEventRecord(c.event, stream), "recording the communicator's event");
  }
}

/// The first half of a barrier on `stream`: an allreduce of one int, in device memory allocated
/// and freed in stream order around it (a free that waits for the device could hang behind
/// another communicator's stuck kernel). Outside a group only: the free must follow the launch.
void barrier_op(comm_cell& c, cudaStream_t stream, bool mark, char const* doing)
{
  if (group_depth > 0) { throw std::logic_error(std::string(doing) + ": a barrier inside a group would wait for itself"); }
  int* flag = nullptr;
  {
    device_scope scope{c.device};
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(int), stream), "allocating the barrier's int");
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), stream);
    if (e != cudaSuccess) {
      cudaFreeAsync(flag, stream);
      check_cuda(e, "clearing the barrier's int");
    }
  }
  try {
    run_op(c, stream, mark, doing, [&](ncclComm_t comm) { return nccl().AllReduce(flag, flag, 1, ncclInt32, ncclSum, comm, stream); });
  } catch (...) {
    // Either nothing was enqueued, or the communicator was aborted (no launch after that):
    // the free follows whatever did reach the stream.
    device_scope scope{c.device, std::nothrow};
    cudaFreeAsync(flag, stream);
    cudaGetLastError();
    throw;
  }
  device_scope scope{c.device};
  check_cuda(cudaFreeAsync(flag, stream), "freeing the barrier's int");
}

/// ncclGroupStart ... ncclGroupEnd around `body`, ending the group also when `body` fails.
template <typename F>
ncclResult_t in_group(F&& body)
{
  auto const& api = nccl();
  ncclResult_t r  = api.GroupStart();
  if (r != ncclSuccess) { return r; }
  ncclResult_t inner = ncclSuccess;
  try {
    inner = body();
  } catch (...) {
    api.GroupEnd();
    throw;
  }
  ncclResult_t end = api.GroupEnd();
  return inner != ncclSuccess ? inner : end;
}

/// One look at a communicator: its asynchronous error, else whether `stream` (or its event) is
/// done. Under the cell's lock.
int32_t query_locked(comm_cell& c, cudaStream_t stream, bool use_stream, char const* doing)
{
  live(c, doing);
  ncclResult_t state = ncclSuccess;
  ncclResult_t r     = nccl().CommGetAsyncError(c.comm, &state);
  if (r != ncclSuccess) { state = r; }
  if (state == ncclInProgress) { return RAFTCOMMS_STATE_PENDING; }
  if (state != ncclSuccess) { throw nccl_failure(state, nccl_message(state, doing)); }
  device_scope scope{c.device};  // no runtime call may bind device 0 to a thread without a context
  cudaError_t e = use_stream ? cudaStreamQuery(stream) : cudaEventQuery(c.event);
  if (e == cudaSuccess) { return RAFTCOMMS_STATE_DONE; }
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return RAFTCOMMS_STATE_PENDING;
  }
  check_cuda(e, use_stream ? "waiting for the stream" : "waiting for the communicator's event");
  return RAFTCOMMS_STATE_PENDING;
}

/// Finalize (non-blocking), wait, destroy; abort when the wait fails. For communicators that a
/// comms_iface owns (RAFT's comm_split), never for the Rust side's.
void close_owned(comm_cell& c) noexcept
{
  try {
    {
      std::lock_guard<std::mutex> hold(c.lock);
      if (c.ended || c.comm == nullptr) { return; }
      device_scope scope{c.device};
      check_nccl(nccl().CommFinalize(c.comm), "finalizing a split communicator");
    }
    wait_ready(c, c.timeout_s, "finalizing a split communicator");
    std::lock_guard<std::mutex> hold(c.lock);
    if (c.ended || c.comm == nullptr) { return; }
    device_scope scope{c.device};
    nccl().CommDestroy(c.comm);
    c.comm  = nullptr;
    c.ended = true;
    c.why   = "was destroyed";
    release_device_objects(c);
  } catch (...) {
    std::lock_guard<std::mutex> hold(c.lock);
    abort_locked(c, "finalizing a split communicator failed");
  }
}

// ---- RAFT's comms_iface over NCCL -------------------------------------------------------------

ncclDataType_t raft_type(raft::comms::datatype_t t)
{
  using raft::comms::datatype_t;
  switch (t) {
    case datatype_t::CHAR: return ncclInt8;
    case datatype_t::UINT8: return ncclUint8;
    case datatype_t::INT32: return ncclInt32;
    case datatype_t::UINT32: return ncclUint32;
    case datatype_t::INT64: return ncclInt64;
    case datatype_t::UINT64: return ncclUint64;
    case datatype_t::FLOAT32: return ncclFloat32;
    case datatype_t::FLOAT64: return ncclFloat64;
  }
  throw std::invalid_argument("unknown RAFT datatype");
}

ncclRedOp_t raft_op(raft::comms::op_t op)
{
  using raft::comms::op_t;
  switch (op) {
    case op_t::SUM: return ncclSum;
    case op_t::PROD: return ncclProd;
    case op_t::MIN: return ncclMin;
    case op_t::MAX: return ncclMax;
  }
  throw std::invalid_argument("unknown RAFT reduction");
}

/// RAFT's communicator interface over one NCCL communicator: what RAFT's and cuVS's
/// multi-GPU code reaches through raft::resource::get_comms.
class nccl_comms final : public raft::comms::comms_iface {
 public:
  nccl_comms(cell_ptr cell, cudaStream_t stream, bool owned) : cell_(std::move(cell)), stream_(stream), owned_(owned)
  {
    std::lock_guard<std::mutex> hold(cell_->lock);
    rank_ = cell_->rank;
    size_ = cell_->size;
  }
  ~nccl_comms() override
  {
    if (owned_) { close_owned(*cell_); }
  }
  nccl_comms(nccl_comms const&)            = delete;
  nccl_comms& operator=(nccl_comms const&) = delete;

  int get_size() const override { return size_; }
  int get_rank() const override { return rank_; }

  std::unique_ptr<raft::comms::comms_iface> comm_split(int color, int key) const override
  {
    cell_ptr child = start_split(*cell_, color, key, "comm_split");
    wait_ready(*cell_, cell_->timeout_s, "comm_split");  // the split completes with the parent
    if (!finish_split(*child)) { throw raft::logic_error("comm_split: this rank's color gave no communicator"); }
    wait_ready(*child, child->timeout_s, "comm_split");
    return std::make_unique<nccl_comms>(child, stream_, true);
  }

  void barrier() const override
  {
    barrier_op(*cell_, stream_, false, "barrier");
    if (sync_stream(stream_) != raft::comms::status_t::SUCCESS) {
      throw raft::logic_error("barrier: the stream did not complete (a failed rank?)");
    }
  }

  raft::comms::status_t sync_stream(cudaStream_t stream) const override
  {
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::lock_guard<std::mutex> hold(cell_->lock);
        if (cell_->ended) { return raft::comms::status_t::ABORT; }
        int32_t state = RAFTCOMMS_STATE_PENDING;
        try {
          state = query_locked(*cell_, stream, true, "sync_stream");
        } catch (nccl_failure const& e) {
          abort_locked(*cell_, e.what());
          return raft::comms::status_t::ABORT;
        } catch (...) {
          return raft::comms::status_t::ERROR;
        }
        if (state == RAFTCOMMS_STATE_DONE) { return raft::comms::status_t::SUCCESS; }
        if (seconds_since(start) > cell_->timeout_s) {
          abort_locked(*cell_, "sync_stream timed out after " + std::to_string(cell_->timeout_s) + " s");
          return raft::comms::status_t::ABORT;
        }
      }
      backoff(start);
    }
  }

  void isend(const void*, size_t, int, int, raft::comms::request_t*) const override { host_p2p("isend"); }
  void irecv(void*, size_t, int, int, raft::comms::request_t*) const override { host_p2p("irecv"); }
  void waitall(int, raft::comms::request_t[]) const override { host_p2p("waitall"); }

  void allreduce(const void* send, void* recv, size_t count, raft::comms::datatype_t t, raft::comms::op_t op,
                 cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "allreduce",
           [&](ncclComm_t comm) { return nccl().AllReduce(send, recv, count, raft_type(t), raft_op(op), comm, stream); });
  }

  void bcast(void* buff, size_t count, raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    bcast(buff, buff, count, t, root, stream);
  }

  void bcast(const void* send, void* recv, size_t count, raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "bcast",
           [&](ncclComm_t comm) { return nccl().Broadcast(send, recv, count, raft_type(t), root, comm, stream); });
  }

  void reduce(const void* send, void* recv, size_t count, raft::comms::datatype_t t, raft::comms::op_t op, int root,
              cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "reduce",
           [&](ncclComm_t comm) { return nccl().Reduce(send, recv, count, raft_type(t), raft_op(op), root, comm, stream); });
  }

  void allgather(const void* send, void* recv, size_t sendcount, raft::comms::datatype_t t, cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "allgather",
           [&](ncclComm_t comm) { return nccl().AllGather(send, recv, sendcount, raft_type(t), comm, stream); });
  }

  void allgatherv(const void* send, void* recv, const size_t* counts, const size_t* displs, raft::comms::datatype_t t,
                  cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "allgatherv",
           [&](ncclComm_t comm) { return allgatherv_calls(comm, send, recv, counts, displs, raft_type(t), size_, stream); });
  }

  void gather(const void* send, void* recv, size_t sendcount, raft::comms::datatype_t t, int root,
              cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "gather",
           [&](ncclComm_t comm) { return gather_calls(comm, send, recv, sendcount, raft_type(t), root, rank_, size_, stream); });
  }

  void gatherv(const void* send, void* recv, size_t sendcount, const size_t* counts, const size_t* displs,
               raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "gatherv", [&](ncclComm_t comm) {
      auto const dt = raft_type(t);
      auto const sz = type_size(dt);
      return in_group([&] {
        if (rank_ == root) {
          for (int r = 0; r < size_; ++r) {
            ncclResult_t e = nccl().Recv(static_cast<char*>(recv) + displs[r] * sz, counts[r], dt, r, comm, stream);
            if (e != ncclSuccess) { return e; }
          }
        }
        return nccl().Send(send, sendcount, dt, root, comm, stream);
      });
    });
  }

  void reducescatter(const void* send, void* recv, size_t recvcount, raft::comms::datatype_t t, raft::comms::op_t op,
                     cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "reducescatter", [&](ncclComm_t comm) {
      return nccl().ReduceScatter(send, recv, recvcount, raft_type(t), raft_op(op), comm, stream);
    });
  }

  void device_send(const void* buf, size_t size, int dest, cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "device_send", [&](ncclComm_t comm) { return nccl().Send(buf, size, ncclUint8, dest, comm, stream); });
  }

  void device_recv(void* buf, size_t size, int source, cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "device_recv",
           [&](ncclComm_t comm) { return nccl().Recv(buf, size, ncclUint8, source, comm, stream); });
  }

  void device_sendrecv(const void* sendbuf, size_t sendsize, int dest, void* recvbuf, size_t recvsize, int source,
                       cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "device_sendrecv", [&](ncclComm_t comm) {
      return in_group([&] {
        ncclResult_t e = nccl().Send(sendbuf, sendsize, ncclUint8, dest, comm, stream);
        return e != ncclSuccess ? e : nccl().Recv(recvbuf, recvsize, ncclUint8, source, comm, stream);
      });
    });
  }

  void device_multicast_sendrecv(const void* sendbuf, std::vector<size_t> const& sendsizes, std::vector<size_t> const& sendoffsets,
                                 std::vector<int> const& dests, void* recvbuf, std::vector<size_t> const& recvsizes,
                                 std::vector<size_t> const& recvoffsets, std::vector<int> const& sources,
                                 cudaStream_t stream) const override
  {
    run_op(*cell_, stream, false, "device_multicast_sendrecv", [&](ncclComm_t comm) {
      return in_group([&] {
        for (size_t i = 0; i < sendsizes.size(); ++i) {
          ncclResult_t e =
            nccl().Send(static_cast<const char*>(sendbuf) + sendoffsets[i], sendsizes[i], ncclUint8, dests[i], comm, stream);
          if (e != ncclSuccess) { return e; }
        }
        for (size_t i = 0; i < recvsizes.size(); ++i) {
          ncclResult_t e =
            nccl().Recv(static_cast<char*>(recvbuf) + recvoffsets[i], recvsizes[i], ncclUint8, sources[i], comm, stream);
          if (e != ncclSuccess) { return e; }
        }
        return ncclSuccess;
      });
    });
  }

  void group_start() const override
  {
    check_nccl(nccl().GroupStart(), "group_start");
    ++group_depth;
  }

  void group_end() const override
  {
    --group_depth;
    owners_release release{group_depth == 0 ? 1 : 0, &cell_};
    ncclResult_t r = check_nccl(nccl().GroupEnd(), "group_end");
    if (r == ncclInProgress && group_depth == 0) { wait_ready(*cell_, cell_->timeout_s, "group_end"); }
  }

  /// The grouped calls of allgatherv and gather, shared with the C entry points.
  static ncclResult_t allgatherv_calls(ncclComm_t comm, const void* send, void* recv, const size_t* counts, const size_t* displs,
                                       ncclDataType_t dt, int size, cudaStream_t stream)
  {
    auto const sz = type_size(dt);
    return in_group([&] {
      for (int root = 0; root < size; ++root) {
        ncclResult_t e = nccl().Broadcast(send, static_cast<char*>(recv) + displs[root] * sz, counts[root], dt, root, comm, stream);
        if (e != ncclSuccess) { return e; }
      }
      return ncclSuccess;
    });
  }

  static ncclResult_t gather_calls(ncclComm_t comm, const void* send, void* recv, size_t sendcount, ncclDataType_t dt, int root,
                                   int rank, int size, cudaStream_t stream)
  {
    auto const sz = type_size(dt);
    return in_group([&] {
      if (rank == root) {
        for (int r = 0; r < size; ++r) {
          ncclResult_t e = nccl().Recv(static_cast<char*>(recv) + sendcount * static_cast<size_t>(r) * sz, sendcount, dt, r, comm, stream);
          if (e != ncclSuccess) { return e; }
        }
      }
      return nccl().Send(send, sendcount, dt, root, comm, stream);
    });
  }

 private:
  [[noreturn]] static void host_p2p(char const* what)
  {
    throw raft::logic_error(std::string(what) +
                            ": host-side isend/irecv need UCX, which raft-rs's NCCL comms do not carry; use device_send / "
                            "device_recv / device_sendrecv");
  }

  cell_ptr cell_;
  cudaStream_t stream_;
  bool owned_;
  int rank_{-1};
  int size_{-1};
};

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

raft::resources& as_resources(void* r)
{
  if (r == nullptr) { throw std::invalid_argument("no raft::resources (a null pointer)"); }
  return *static_cast<raft::resources*>(r);
}

ncclConfig_t nonblocking_config()
{
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking     = 0;
  return config;
}

}  // namespace

// ---- the C entry points ---------------------------------------------------------------------------

extern "C" {

const char* raftcomms_last_error(void) { return last_error; }

void raftcomms_clear_error(void) { last_error[0] = '\0'; }

int32_t raftcomms_header_nccl_version(void) { return NCCL_VERSION_CODE; }

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

raftcomms_status raftcomms_comm_init(const uint8_t* id, int32_t nranks, int32_t rank, int32_t device, double timeout_s,
                                     raftcomms_comm** out)
{
  return guard([&] {
    *out = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " of " + std::to_string(nranks));
    }
    ncclUniqueId uid;
    std::memcpy(&uid, id, sizeof(uid));
    auto cell   = new_cell(device, timeout_s);
    auto handle = std::make_unique<raftcomms_comm>(raftcomms_comm{cell});
    std::lock_guard<std::mutex> hold(cell->lock);
    device_scope scope{device};
    ncclConfig_t config = nonblocking_config();
    ncclResult_t r      = nccl().CommInitRankConfig(&cell->comm, nranks, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string what = nccl_message(r, "ncclCommInitRankConfig");
      abort_locked(*cell, what);
      throw nccl_failure(r, what);
    }
    *out = handle.release();
  });
}

raftcomms_status raftcomms_comm_init_clique(int32_t n, const int32_t* devices, double timeout_s, raftcomms_comm** out)
{
  return guard([&] {
    if (n < 1) { throw std::invalid_argument("a clique needs at least one device"); }
    std::vector<cell_ptr> cells;
    for (int32_t i = 0; i < n; ++i) {
      out[i] = nullptr;
    }
    // Until the handles are out, a failure ends (and frees the device objects of) every cell.
    struct on_failure {
      std::vector<cell_ptr>& cells;
      bool armed{true};
      ~on_failure()
      {
        if (!armed) { return; }
        for (auto& c : cells) {
          std::lock_guard<std::mutex> hold(c->lock);
          abort_locked(*c, "initialising the clique failed");
        }
      }
    } cleanup{cells};
    for (int32_t i = 0; i < n; ++i) {
      cells.push_back(new_cell(devices[i], timeout_s));
    }
    ncclUniqueId uid;
    check_nccl(nccl().GetUniqueId(&uid), "making an NCCL unique id");
    ncclConfig_t config = nonblocking_config();
    ncclResult_t first  = ncclSuccess;
    ncclResult_t r      = nccl().GroupStart();
    if (r != ncclSuccess) { throw nccl_failure(r, nccl_message(r, "ncclGroupStart")); }
    for (int32_t i = 0; i < n && first == ncclSuccess; ++i) {
      device_scope scope{devices[i]};
      ncclResult_t e = nccl().CommInitRankConfig(&cells[i]->comm, n, uid, i, &config);
      if (e != ncclSuccess && e != ncclInProgress) { first = e; }
    }
    r = nccl().GroupEnd();
    if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) { first = r; }
    if (first != ncclSuccess) {
      std::string what = nccl_message(first, "initialising the clique (ncclCommInitRankConfig in a group)");
      for (auto& c : cells) {
        std::lock_guard<std::mutex> hold(c->lock);
        abort_locked(*c, what);
      }
      throw nccl_failure(first, what);
    }
    for (int32_t i = 0; i < n; ++i) {
      out[i] = new raftcomms_comm{cells[i]};
    }
    cleanup.armed = false;
  });
}

raftcomms_status raftcomms_comm_split(raftcomms_comm* comm, int32_t color, int32_t key, raftcomms_comm** out)
{
  return guard([&] {
    *out       = nullptr;
    auto child = start_split(cell_of(comm), color, key, "ncclCommSplit");
    *out       = new raftcomms_comm{child};
  });
}

raftcomms_status raftcomms_comm_split_done(raftcomms_comm* child, int32_t* present)
{
  return guard([&] { *present = finish_split(cell_of(child)) ? 1 : 0; });
}

raftcomms_status raftcomms_comm_wait(raftcomms_comm* comm, double timeout_s)
{
  return guard([&] { wait_ready(cell_of(comm), timeout_s, "waiting for the communicator"); });
}

raftcomms_status raftcomms_comm_info(raftcomms_comm* comm, int32_t* rank, int32_t* size, int32_t* device)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    *rank   = c.rank;
    *size   = c.size;
    *device = c.device;
  });
}

raftcomms_status raftcomms_comm_set_timeout(raftcomms_comm* comm, double timeout_s)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    c.timeout_s = timeout_s;
  });
}

raftcomms_status raftcomms_comm_query(raftcomms_comm* comm, void* stream, int32_t* state)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    *state = query_locked(c, as_stream(stream), stream != nullptr, "checking the communicator");
  });
}

raftcomms_status raftcomms_comm_abort(raftcomms_comm* comm, const char* reason)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    ncclResult_t r = abort_locked(c, reason != nullptr ? reason : "aborted");
    if (r != ncclSuccess) { throw nccl_failure(r, nccl_message(r, "ncclCommAbort")); }
  });
}

raftcomms_status raftcomms_comm_finalize(raftcomms_comm* comm)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    live(c, "ncclCommFinalize");
    device_scope scope{c.device};
    ncclResult_t r = nccl().CommFinalize(c.comm);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string what = nccl_message(r, "ncclCommFinalize");
      abort_locked(c, what);
      throw nccl_failure(r, what);
    }
  });
}

raftcomms_status raftcomms_comm_destroy(raftcomms_comm* comm)
{
  return guard([&] {
    auto& c = cell_of(comm);
    std::lock_guard<std::mutex> hold(c.lock);
    if (c.ended) { return; }
    live(c, "ncclCommDestroy");
    device_scope scope{c.device};
    ncclResult_t r = nccl().CommDestroy(c.comm);
    c.comm         = nullptr;
    c.ended        = true;
    c.why          = "was released";
    release_device_objects(c);
    if (r != ncclSuccess) { throw nccl_failure(r, nccl_message(r, "ncclCommDestroy")); }
  });
}

void raftcomms_comm_free(raftcomms_comm* comm) { delete comm; }

raftcomms_status raftcomms_comm_install(raftcomms_comm* comm, void* raft_resources, void* stream)
{
  return guard([&] {
    auto& c = cell_of(comm);
    {
      std::lock_guard<std::mutex> hold(c.lock);
      live(c, "installing the communicator");
    }
    auto iface = std::make_unique<nccl_comms>(comm->cell, as_stream(stream), false);
    raft::resource::set_comms(as_resources(raft_resources), std::make_shared<raft::comms::comms_t>(std::move(iface)));
  });
}

raftcomms_status raftcomms_installed(void* raft_resources, int32_t* present, int32_t* rank, int32_t* size)
{
  return guard([&] {
    auto& res = as_resources(raft_resources);
    *present  = raft::resource::comms_initialized(res) ? 1 : 0;
    *rank     = -1;
    *size     = -1;
    if (*present != 0) {
      auto const& comms = raft::resource::get_comms(res);
      *rank             = comms.get_rank();
      *size             = comms.get_size();
    }
  });
}

raftcomms_status raftcomms_raft_allreduce(void* raft_resources, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                                          void* stream)
{
  return guard([&] {
    auto const& comms = raft::resource::get_comms(as_resources(raft_resources));
    auto s            = as_stream(stream);
    raft::comms::op_t rop;
    switch (op) {
      case RAFTCOMMS_OP_SUM: rop = raft::comms::op_t::SUM; break;
      case RAFTCOMMS_OP_PROD: rop = raft::comms::op_t::PROD; break;
      case RAFTCOMMS_OP_MIN: rop = raft::comms::op_t::MIN; break;
      case RAFTCOMMS_OP_MAX: rop = raft::comms::op_t::MAX; break;
      default: throw std::invalid_argument("unknown reduction " + std::to_string(op));
    }
    switch (dtype) {
      case RAFTCOMMS_DTYPE_U8:
        comms.allreduce(static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv), count, rop, s);
        break;
      case RAFTCOMMS_DTYPE_I32: comms.allreduce(static_cast<const int*>(send), static_cast<int*>(recv), count, rop, s); break;
      case RAFTCOMMS_DTYPE_I64:
        comms.allreduce(static_cast<const int64_t*>(send), static_cast<int64_t*>(recv), count, rop, s);
        break;
      case RAFTCOMMS_DTYPE_F32: comms.allreduce(static_cast<const float*>(send), static_cast<float*>(recv), count, rop, s); break;
      case RAFTCOMMS_DTYPE_F64: comms.allreduce(static_cast<const double*>(send), static_cast<double*>(recv), count, rop, s); break;
      default: throw std::invalid_argument("unknown element type " + std::to_string(dtype));
    }
    if (comms.sync_stream(s) != raft::comms::status_t::SUCCESS) {
      throw std::runtime_error("RAFT's sync_stream after the allreduce did not succeed (the communicator was aborted or failed)");
    }
  });
}

raftcomms_status raftcomms_group_start(void)
{
  return guard([&] {
    check_nccl(nccl().GroupStart(), "ncclGroupStart");
    ++group_depth;
  });
}

raftcomms_status raftcomms_group_end(int32_t n, raftcomms_comm* const* comms, void* const* streams)
{
  return guard([&] {
    --group_depth;
    std::vector<cell_ptr const*> cells;
    if (group_depth == 0) {
      for (int32_t i = 0; i < n; ++i) { cells.push_back(&comms[i]->cell); }
    }
    owners_release release{static_cast<int32_t>(cells.size()), cells.data()};
    ncclResult_t r = nccl().GroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
      // The group's calls may have been launched on some communicators and not others: none of
      // them can be trusted to agree with its peers any more.
      std::string what = nccl_message(r, "ncclGroupEnd");
      for (int32_t i = 0; i < n; ++i) {
        auto& c = cell_of(comms[i]);
        std::lock_guard<std::mutex> hold(c.lock);
        abort_locked(c, what);
      }
      throw nccl_failure(r, what);
    }
    if (group_depth > 0) { return; }
    for (int32_t i = 0; i < n; ++i) {
      try {
        auto& c = cell_of(comms[i]);
        wait_ready(c, c.timeout_s, "ending the group");
        if (streams != nullptr && streams[i] != nullptr) {
          std::lock_guard<std::mutex> hold(c.lock);
          live(c, "ending the group");
          device_scope scope{c.device};
          check_cuda(cudaEventRecord(c.event, as_stream(streams[i])), "recording the communicator's event");
        }
      } catch (std::exception const& e) {
        // The others may still be queuing the group's kernels on their streams, after which
        // the caller is free to drop the arrays: abort every one, so nothing of the group is
        // launched later.
        std::string what = std::string("ending the group failed: ") + e.what();
        for (int32_t j = 0; j < n; ++j) {
          auto& c = cell_of(comms[j]);
          std::lock_guard<std::mutex> hold(c.lock);
          abort_locked(c, what);
        }
        throw;
      }
    }
  });
}

raftcomms_status raftcomms_allreduce(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                                     void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    auto ro = nccl_op(op);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclAllReduce",
           [&](ncclComm_t c) { return nccl().AllReduce(send, recv, count, dt, ro, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_broadcast(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t root,
                                     void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclBroadcast",
           [&](ncclComm_t c) { return nccl().Broadcast(send, recv, count, dt, root, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_reduce(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                                  int32_t root, void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    auto ro = nccl_op(op);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclReduce",
           [&](ncclComm_t c) { return nccl().Reduce(send, recv, count, dt, ro, root, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_allgather(raftcomms_comm* comm, const void* send, void* recv, size_t sendcount, int32_t dtype, void* stream,
                                     int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclAllGather",
           [&](ncclComm_t c) { return nccl().AllGather(send, recv, sendcount, dt, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_allgatherv(raftcomms_comm* comm, const void* send, void* recv, const size_t* counts, const size_t* displs,
                                      int32_t dtype, void* stream, int32_t mark)
{
  return guard([&] {
    auto dt   = nccl_type(dtype);
    auto& c   = cell_of(comm);
    int size  = 0;
    {
      std::lock_guard<std::mutex> hold(c.lock);
      size = c.size;
    }
    if (size > 2048) { throw std::invalid_argument("allgatherv over more than 2048 ranks (one NCCL group per call)"); }
    run_op(c, as_stream(stream), mark != 0, "allgatherv (ncclBroadcast in a group)", [&](ncclComm_t nc) {
      return nccl_comms::allgatherv_calls(nc, send, recv, counts, displs, dt, size, as_stream(stream));
    });
  });
}

raftcomms_status raftcomms_gather(raftcomms_comm* comm, const void* send, void* recv, size_t sendcount, int32_t dtype, int32_t root,
                                  void* stream, int32_t mark)
{
  return guard([&] {
    auto dt  = nccl_type(dtype);
    auto& c  = cell_of(comm);
    int rank = 0;
    int size = 0;
    {
      std::lock_guard<std::mutex> hold(c.lock);
      rank = c.rank;
      size = c.size;
    }
    run_op(c, as_stream(stream), mark != 0, "gather (ncclSend/ncclRecv in a group)", [&](ncclComm_t nc) {
      return nccl_comms::gather_calls(nc, send, recv, sendcount, dt, root, rank, size, as_stream(stream));
    });
  });
}

raftcomms_status raftcomms_reducescatter(raftcomms_comm* comm, const void* send, void* recv, size_t recvcount, int32_t dtype,
                                         int32_t op, void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    auto ro = nccl_op(op);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclReduceScatter",
           [&](ncclComm_t c) { return nccl().ReduceScatter(send, recv, recvcount, dt, ro, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_send(raftcomms_comm* comm, const void* buf, size_t count, int32_t dtype, int32_t peer, void* stream,
                                int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclSend",
           [&](ncclComm_t c) { return nccl().Send(buf, count, dt, peer, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_recv(raftcomms_comm* comm, void* buf, size_t count, int32_t dtype, int32_t peer, void* stream,
                                int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclRecv",
           [&](ncclComm_t c) { return nccl().Recv(buf, count, dt, peer, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_sendrecv(raftcomms_comm* comm, const void* send, size_t sendcount, int32_t dest, void* recv,
                                    size_t recvcount, int32_t source, int32_t dtype, void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    auto s  = as_stream(stream);
    run_op(cell_of(comm), s, mark != 0, "ncclSend/ncclRecv (in a group)", [&](ncclComm_t c) {
      return in_group([&] {
        ncclResult_t e = nccl().Send(send, sendcount, dt, dest, c, s);
        return e != ncclSuccess ? e : nccl().Recv(recv, recvcount, dt, source, c, s);
      });
    });
  });
}

raftcomms_status raftcomms_barrier(raftcomms_comm* comm, void* stream, int32_t mark)
{
  return guard([&] { barrier_op(cell_of(comm), as_stream(stream), mark != 0, "barrier (ncclAllReduce of one int)"); });
}

}  // extern "C"

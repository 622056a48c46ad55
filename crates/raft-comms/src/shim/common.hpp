// raft-comms's C++ shim, what its translation units share: the exception guard every entry
// point runs in, the thread's last error, libnccl's function table, the device scope, the
// communicator cell and the enqueueing path (run_op). Internal to the shim: everything here has
// hidden visibility, so of the shim's own code the shared object exports only the raftcomms_*
// functions of raftcomms.h.
#pragma once

#include "raftcomms.h"

#include <nccl.h>

#include <raft/core/comms.hpp>
#include <raft/core/error.hpp>
#include <raft/core/resource/comms.hpp>

#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#pragma GCC visibility push(hidden)

namespace raftcomms {

// ---- errors ---------------------------------------------------------------------------------

// A plain array, not a std::string: glibc destroys thread-locals before the exit handlers run,
// and an array has no destructor (the same rule as raft-sys's shim).
constexpr std::size_t last_error_size = 2048;

/// Keeps `what` as the thread's last error; returns `status`.
raftcomms_status fail(raftcomms_status status, char const* what) noexcept;

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

void check_cuda(cudaError_t code, char const* doing);
bool says_out_of_memory(char const* what) noexcept;

/// Runs the clique aborts scheduled by `abort_locked` (see `clique`). Called with no cell's lock
/// held; not inside an open NCCL group on this thread (they wait for its end, or for another
/// thread). Never throws.
void abort_scheduled_peers() noexcept;

/// Runs the scheduled clique aborts when it goes out of scope: the first statement of every
/// entry point, C (`guard`) or C++ (`nccl_comms`), and of the paths that may abort (`run_op`,
/// `wait_ready`, splits), so it runs after each of their cell locks was let go.
struct peers_after {
  peers_after() = default;
  ~peers_after() { abort_scheduled_peers(); }
  peers_after(peers_after const&)            = delete;
  peers_after& operator=(peers_after const&) = delete;
};

template <typename F>
raftcomms_status guard(F&& body) noexcept
{
  peers_after after;
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
  } catch (raft::logic_error const& e) {
    // RAFT's ASSERT / RAFT_EXPECTS (a raft::exception, not a std::logic_error: helper 103 found
    // them reported as GENERIC).
    return fail(RAFTCOMMS_STATUS_LOGIC, e.what());
  } catch (std::logic_error const& e) {
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

nccl_library& library();
/// The loaded NCCL's functions; throws nccl_missing when it was not loaded.
nccl_api const& nccl();
std::string nccl_message(ncclResult_t r, char const* doing);
ncclResult_t check_nccl(ncclResult_t r, char const* doing);
bool leaves_comm_usable(ncclResult_t r);

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

driver_ctx const* driver();

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
    if (has_ctx && current == device) {
      if (!saved_ctx_) { return; }
      // The runtime names a context's device, not whether it is the primary one: another
      // library's context of this device (PyCUDA's, `cuCtxCreate`) would have the events and
      // NCCL's calls made in it (the review of the eighteenth audit, as raft-sys's scope).
      // cudaSetDevice binds the device's primary context; when that is the one already current,
      // nothing changed and nothing is put back.
      if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        if (throwing) { throw std::runtime_error("binding the communicator's device's primary context failed"); }
        return;
      }
      void* now = nullptr;
      switched_ = d->get(&now) == 0 && now != ctx_;
      return;
    }
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

/// The calling thread's stream-capture mode set to relaxed for a scope, put back after (as
/// `relaxed_capture` in raft-sys's fence.hpp; this shim is a shared object of its own). In global
/// mode the driver refuses a stream or event query, at once, while any thread of the process
/// captures a stream in global mode (in thread-local mode, while this thread captures), and the
/// refusal invalidates that capture too: a healthy communicator read it as a failure and was
/// aborted, and the capturing thread lost its graph. A relaxed query of a stream that is not
/// itself being captured, or of an event recorded outside every capture, is legal and leaves
/// every capture valid. Made inside the `device_scope`: a runtime call must not bind device 0's
/// context to a thread that has none.
class relaxed_capture {
 public:
  relaxed_capture() noexcept
  {
    swapped_ = cudaThreadExchangeStreamCaptureMode(&before_) == cudaSuccess;
    if (!swapped_) { static_cast<void>(cudaGetLastError()); }
  }
  ~relaxed_capture()
  {
    if (swapped_ && cudaThreadExchangeStreamCaptureMode(&before_) != cudaSuccess) { static_cast<void>(cudaGetLastError()); }
  }
  relaxed_capture(relaxed_capture const&)            = delete;
  relaxed_capture& operator=(relaxed_capture const&) = delete;

 private:
  cudaStreamCaptureMode before_{cudaStreamCaptureModeRelaxed};
  bool swapped_{false};
};

/// Whether `stream` must not be queried because of a capture: it is being captured (active, or
/// invalidated and not ended yet), or the driver cannot say (a failed look counts as a capture).
/// A query of a capturing stream is refused in every capture mode and invalidates the capture.
inline bool capture_forbids_query(cudaStream_t stream) noexcept
{
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

/// The depth of this thread's open groups (`raftcomms_group_start`, `comms_iface::group_start`;
/// a plain int: no destructor).
extern thread_local int group_depth;

/// Whether this thread's NCCL group is open. It is opened lazily, at the first call that reaches
/// NCCL inside the outermost open group (`open_nccl_group`), and ended at that group's end only
/// when it was opened: NCCL 2.28's ncclGroupEnd allocates a job it frees only for a group that
/// held work, so every empty group (a scope whose body queued nothing, or whose calls were all
/// refused before NCCL) leaked 160 bytes (the twentieth audit, helper 98).
extern thread_local bool nccl_group_open;

/// Opens this thread's NCCL group when a group of this shim is open and NCCL's is not yet; before
/// every NCCL call that NCCL may fold into a group (`run_op`, `start_split`).
inline void open_nccl_group()
{
  if (group_depth > 0 && !nccl_group_open) {
    check_nccl(nccl().GroupStart(), "ncclGroupStart");
    nccl_group_open = true;
  }
}

/// At the outermost group's end: ncclGroupEnd when NCCL's group was opened, else ncclSuccess
/// (nothing reached NCCL: nothing to launch).
inline ncclResult_t end_nccl_group()
{
  if (!nccl_group_open) { return ncclSuccess; }
  nccl_group_open = false;
  return nccl().GroupEnd();
}

// ---- communicators -------------------------------------------------------------------------------

struct comm_cell;

/// The ranks of one NCCL communicator that live in this process: made together (a clique), split
/// together from the ranks of one (per color), or initialised here with one unique id. Within a
/// process NCCL's kernels read and write the peers' buffers directly (`NCCL_P2P_DIRECT_DISABLE`
/// describes it): a rank aborted while a peer's kernel still runs would leave its arrays, freed
/// or reused, under that kernel. So an abort of one aborts them all, whoever makes it (the Rust
/// side, the watchdog, RAFT's `sync_stream`, a failed group): `abort_locked` schedules the
/// peers, `abort_scheduled_peers` aborts them once no cell's lock is held.
struct clique {
  std::mutex lock;
  std::vector<std::weak_ptr<comm_cell>> members;
  /// Unique in the process (what keys its splits' cliques; an address could be reused).
  std::uint64_t serial{next_serial()};

  static std::uint64_t next_serial()
  {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
};

/// One NCCL communicator, shared by the Rust handle and every comms_iface installed from it.
/// Always made by `std::make_shared` (`new_cell`): an open group keeps a weak reference to it.
struct comm_cell : std::enable_shared_from_this<comm_cell> {
  std::mutex lock;
  ncclComm_t comm{nullptr};
  /// Set once the communicator was aborted or destroyed; `why` says which and why.
  bool ended{false};
  std::string why;
  int rank{-1};
  int size{-1};
  int device{0};
  /// Written under `lock` (raftcomms_comm_set_timeout), read also outside it (a wait that let go
  /// of the lock, RAFT's interface): atomic, so another thread's new timeout is no data race
  /// (the eighteenth audit).
  std::atomic<double> timeout_s{300.0};
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
  /// Ended while a group held it: its abort, and its clique peers' (whose arrays its kernels may
  /// still reach until then), wait for that group's end (`release_group_owner`).
  bool abort_deferred{false};
  /// Why it was aborted, as given (`why` adds "was aborted: "): what its peers are told.
  std::string abort_reason;
  /// The ranks of this process it is linked with (see `clique`); none when it is the only one.
  /// Set before the cell is shared, never changed.
  std::shared_ptr<clique> peers;
  /// The splits made from it so far (under its lock): every rank splits in the same order, so
  /// the n-th splits of a clique's ranks make one communicator per color.
  int splits{0};
};

using cell_ptr = std::shared_ptr<comm_cell>;

/// Makes `c` (not shared yet) a member of `q`.
void join_clique(cell_ptr const& c, std::shared_ptr<clique> const& q);
/// Makes `c` (not shared yet) a member of the clique registered under `key`, made if none is
/// alive. Under no lock or one cell's (`start_split` holds the parent's): the registry's lock and
/// a clique's are taken after a cell's, never before one.
void join_clique(cell_ptr const& c, std::string const& key);

}  // namespace raftcomms

/// The handle raftcomms.h declares. It keeps that declaration's default visibility, since the
/// exported functions that take it would otherwise be hidden too; its field's type is hidden
/// (C sees only the pointer), which GCC would warn about.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
struct raftcomms_comm {
  raftcomms::cell_ptr cell;
};
#pragma GCC diagnostic pop

namespace raftcomms {

// ---- communicators (communicators.cpp) --------------------------------------------------------

comm_cell& cell_of(raftcomms_comm* h);
void live(comm_cell& c, char const* doing);
ncclResult_t abort_now(comm_cell& c) noexcept;
/// Schedules the abort of `c`'s clique peers (under `c`'s lock), saying that `c` was aborted.
void schedule_peer_aborts(comm_cell& c, std::string const& reason) noexcept;
/// Refuses a communicator another thread's open group holds (`doing` names the call).
void refuse_held_elsewhere(comm_cell const& c, char const* doing);
ncclResult_t abort_locked(comm_cell& c, std::string const& reason) noexcept;
void make_device_objects(comm_cell& c);
cell_ptr new_cell(int device, double timeout_s, bool bare = false);
cell_ptr start_split(comm_cell& parent, int color, int key, char const* doing);
bool finish_split(comm_cell& child);
void backoff(std::chrono::steady_clock::time_point start);
double seconds_since(std::chrono::steady_clock::time_point start);
void wait_ready(comm_cell& c, double timeout_s, char const* doing);
/// What `query_locked` does when the stream it was given is being captured (it never queries it).
enum class on_capture {
  /// Answers from the communicator's event (raftcomms_comm_query): recorded after every marked
  /// call and at a group's end, never inside a capture (the Rust side refuses collectives on a
  /// capturing stream), it covers the collectives queued before the capture.
  event,
  /// Throws std::logic_error, the communicator left as it is (RAFT's sync_stream: its own
  /// collectives are never marked, so the event cannot stand for them).
  refuse,
};
int32_t query_locked(comm_cell& c, cudaStream_t stream, bool use_stream, on_capture capturing, char const* doing);
void close_owned(comm_cell& c) noexcept;
ncclConfig_t nonblocking_config();

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// ---- enqueueing and groups (collectives.cpp) ---------------------------------------------------

ncclDataType_t nccl_type(int32_t dtype);
std::size_t type_size(ncclDataType_t t);
ncclRedOp_t nccl_op(int32_t op);
void release_group_owner(comm_cell& c) noexcept;

/// Under `c`'s lock, inside this thread's open group (`group_depth > 0`), before a call that NCCL
/// may list `c` in that group for: refuses a communicator another thread's open group holds, and
/// makes this thread's group its holder (`group_owner`), released at the group's outermost end
/// whether or not the call succeeds. From then on an abort of `c` waits for that end.
void hold_for_group(comm_cell& c, char const* doing);

/// Releases every communicator this thread's open group holds (`release_group_owner`, which
/// carries out the aborts that waited for it). At the outermost group end, no cell lock held.
void release_group_held() noexcept;

/// Ends every communicator this thread's open group holds, after its ncclGroupEnd failed (the
/// group's calls may have been launched on some and not others); their aborts then happen at
/// the release. No cell lock held.
void abort_group_held(std::string const& what) noexcept;

/// Runs `release_group_held` when it goes out of scope after the outermost group's end (on every
/// path out of it).
struct group_held_release {
  group_held_release() = default;
  ~group_held_release()
  {
    if (group_depth == 0) { release_group_held(); }
  }
  group_held_release(group_held_release const&)            = delete;
  group_held_release& operator=(group_held_release const&) = delete;
};

/// Runs one enqueueing NCCL call (or a group of them: `call` may start and end its own group)
/// on the communicator: under its lock, on its device; waits out ncclInProgress outside a
/// group; aborts the communicator when the failure leaves it unusable; records the event when
/// asked (outside a group).
template <typename F>
void run_op(comm_cell& c, cudaStream_t stream, bool mark, char const* doing, F&& call)
{
  peers_after after;
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard<std::mutex> hold(c.lock);
    live(c, doing);
    refuse_held_elsewhere(c, doing);
    // Held before the call: a call that fails may still have listed the communicator in the
    // group, and an abort (this failure's, a peer's) must then wait for the group's end.
    if (group_depth > 0) { hold_for_group(c, doing); }
    device_scope scope{c.device};
    open_nccl_group();
    r = call(c.comm);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string what = nccl_message(r, doing);
      if (!leaves_comm_usable(r)) { abort_locked(c, what); }
      throw nccl_failure(r, what);
    }
    if (group_depth > 0) { return; }  // deferred to the group's end
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

void barrier_op(comm_cell& c, cudaStream_t stream, bool mark, char const* doing);

/// What a collective moves when this shim answers it without NCCL: `bytes` from `src` to `dst`
/// on one rank (nothing in place), or nothing at all when the call moves no elements.
struct local_answer {
  bool empty;        ///< the call moves no elements on any rank (the counts say so everywhere)
  void* dst;         ///< one rank's result
  const void* src;   ///< one rank's input
  std::size_t bytes; ///< one rank's copy
  int root;          ///< the root named (one rank: only 0 is a rank)
};

/// Answers a collective here when NCCL need not take it: one that moves no elements (nothing to
/// do) or one on a communicator of one rank (a copy on `stream`). NCCL 2.28 runs each such call
/// as a group of its own that gets no task, and never frees that group's job: 176 bytes per call
/// on the H200 (run 219, `comms_groups::collectives_of_one_rank_and_of_no_elements_leave_no_memory_behind`),
/// so a loop of them grew without bound. Under the cell's lock, on its device, with the same
/// checks as `run_op` (ended, an asynchronous error, held by another thread's group; held by
/// this thread's group when one is open); records the event when asked, outside a group. Inside
/// a group the copy is queued at once, not at the group's end as NCCL would: earlier on the same
/// stream, which no NCCL contract orders otherwise. Returns false when NCCL must take the call
/// (elements to move among more ranks, a size not known yet, a communicator still initialising).
bool answer_locally(comm_cell& c, cudaStream_t stream, bool mark, char const* doing, local_answer const& a);

/// `count` elements of `dt` in bytes, refusing a product past size_t.
std::size_t bytes_of(std::size_t count, ncclDataType_t dt);

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

/// The grouped calls of allgatherv and gather, shared by the C entry points and comms_iface.
ncclResult_t allgatherv_calls(ncclComm_t comm, const void* send, void* recv, const size_t* counts, const size_t* displs,
                              ncclDataType_t dt, int size, cudaStream_t stream);
ncclResult_t gather_calls(ncclComm_t comm, const void* send, void* recv, size_t sendcount, ncclDataType_t dt, int root,
                          int rank, int size, cudaStream_t stream);

}  // namespace raftcomms

#pragma GCC visibility pop

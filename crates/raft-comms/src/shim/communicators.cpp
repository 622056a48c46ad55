// raft-comms's C++ shim: communicators (comm_cell) — made (init, a clique in one group, split),
// waited for while NCCL initialises them non-blocking, looked at, aborted, finalized, destroyed.

#include "common.hpp"

#include <algorithm>
#include <cstdint>
#include <thread>

#pragma GCC visibility push(hidden)  // internal to the shim, as in common.hpp

namespace raftcomms {

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

/// Whether the calling thread hands the ends that may wait for the whole device to threads of
/// their own (raftcomms_set_ends_elsewhere: the Rust side's watchdog thread), and how many
/// such ends have not returned yet (raftcomms_ends_in_flight).
thread_local bool ends_elsewhere = false;
std::atomic<int32_t> ends_in_flight{0};

/// ncclCommAbort (or, with `destroy`, ncclCommDestroy after a completed finalize) of `comm` on
/// `device`, waiting for it.
ncclResult_t end_comm(ncclComm_t comm, int device, bool destroy) noexcept
{
  device_scope scope{device, std::nothrow};
  // As every look of the watchdog: another thread's global capture neither fails these calls
  // nor is invalidated by them (run 217: a destroy on its own thread invalidated one).
  relaxed_capture relaxed;
  try {
    return destroy ? nccl().CommDestroy(comm) : nccl().CommAbort(comm);
  } catch (...) {
    return ncclInternalError;
  }
}

/// Destroys `event` of `device` (after the communicator ended).
void destroy_event(cudaEvent_t event, int device) noexcept
{
  device_scope scope{device, std::nothrow};
  relaxed_capture relaxed;
  cudaEventDestroy(event);
  cudaGetLastError();  // a broken context fails it: nothing more to do about it
}

/// Runs `work` on a thread of its own, counted in `ends_in_flight`; false (and nothing run)
/// when no thread could be made.
template <typename Work>
bool run_elsewhere(Work work) noexcept
{
  ends_in_flight.fetch_add(1, std::memory_order_acq_rel);
  try {
    std::thread([work] {
      work();
      ends_in_flight.fetch_sub(1, std::memory_order_acq_rel);
    }).detach();
    return true;
  } catch (...) {
    ends_in_flight.fetch_sub(1, std::memory_order_acq_rel);
    return false;
  }
}

/// Ends the cell's communicator and lets its event go, both taken out of the cell. Under the
/// cell's lock. An abort always runs here: when the call that ends a rank returns, that rank's
/// kernels have stopped, and so have its clique's (`abort_scheduled_peers`) before the entry
/// point returns: a peer still running would reach arrays the caller then frees (the review of
/// the eighteenth audit, helper 85). So it may wait for the device (run 216: 17 s behind a shut
/// stream), holding the cell's lock: docs/RELIABILITY.md, left open. What runs elsewhere, on
/// the watchdog's thread, is what no kernel depends on: the destroy after a completed finalize
/// (every rank's work done; NCCL's `cudaFreeHost` in it waits for the whole device) and the
/// event's destroy (it waits for the driver's lock, which such a `cudaFreeHost` holds: run 217's
/// stacks showed the watchdog there under this cell's lock). The result of an end made here.
ncclResult_t take_and_end(comm_cell& c, bool destroy) noexcept
{
  ncclComm_t const comm   = c.comm;
  cudaEvent_t const event = c.event;
  c.comm                  = nullptr;
  c.event                 = nullptr;
  int const device        = c.device;
  ncclResult_t r          = ncclSuccess;
  if (comm != nullptr) {
    if (!(destroy && ends_elsewhere && run_elsewhere([comm, device] { static_cast<void>(end_comm(comm, device, true)); }))) {
      r = end_comm(comm, device, destroy);
    }
  }
  if (event != nullptr && !(ends_elsewhere && run_elsewhere([event, device] { destroy_event(event, device); }))) {
    destroy_event(event, device);
  }
  return r;
}

/// ncclCommAbort of a cell marked ended (see `take_and_end`). Under the cell's lock.
ncclResult_t abort_now(comm_cell& c) noexcept
{
  return take_and_end(c, false);
}

namespace {

/// A clique abort waiting to run: the peer, and why.
struct scheduled_abort {
  std::weak_ptr<comm_cell> peer;
  std::string why;
};

/// The clique aborts this thread scheduled, run when it leaves the entry point (or the open
/// group) it scheduled them in: an abort has reached the whole clique when the call that made
/// it returns. A plain pointer to a heap vector (no thread-local destructor, which glibc would
/// run before the exit's teardown still aborts), deleted once drained.
std::vector<scheduled_abort>*& queue_of_this_thread();

std::vector<scheduled_abort>& scheduled()
{
  auto*& mine = queue_of_this_thread();
  if (mine == nullptr) { mine = new std::vector<scheduled_abort>; }
  return *mine;
}

/// The cliques of ranks initialised here with one unique id, or split from one clique, by key.
std::mutex& cliques_lock()
{
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::pair<std::string, std::weak_ptr<clique>>>& cliques()
{
  static auto* v = new std::vector<std::pair<std::string, std::weak_ptr<clique>>>;
  return *v;
}

/// Schedules the abort of `c`'s clique peers, saying that `c` was aborted and why. Under `c`'s
/// lock (the clique's lock is taken after a cell's, never the other way round).
void schedule_peers(comm_cell& c, std::string const& reason) noexcept
{
  if (!c.peers) { return; }
  try {
    std::string why = (c.rank >= 0 ? "rank " + std::to_string(c.rank) : std::string("a rank")) + " of its clique was aborted (" +
                      reason + ")";
    std::vector<scheduled_abort> mine;
    {
      std::lock_guard<std::mutex> hold(c.peers->lock);
      for (auto const& w : c.peers->members) {
        auto p = w.lock();
        if (p && p.get() != &c) { mine.push_back(scheduled_abort{w, why}); }
      }
    }
    auto& queue = scheduled();
    for (auto& a : mine) { queue.push_back(std::move(a)); }
  } catch (...) {
    // No memory to schedule them: the peers' own watchdogs and timeouts still end them.
  }
}

/// Aborts scheduled on a thread inside its own open group, which that thread cannot run before
/// the group's end (an abort between ncclGroupStart and ncclGroupEnd): any thread outside a
/// group runs them (a cell that group holds still waits for its end, through `group_owner`).
std::mutex& handed_on_lock()
{
  static auto* m = new std::mutex;
  return *m;
}
std::vector<scheduled_abort>& handed_on()
{
  static auto* v = new std::vector<scheduled_abort>;
  return *v;
}
/// Whether `handed_on` may hold some: every entry point looks, so the lock is taken only then.
std::atomic<bool> handed_on_pending{false};

/// This thread's queue, when it has one (none is made for a thread that never scheduled).
thread_local std::vector<scheduled_abort>* this_threads_queue = nullptr;

std::vector<scheduled_abort>*& queue_of_this_thread() { return this_threads_queue; }

}  // namespace

void schedule_peer_aborts(comm_cell& c, std::string const& reason) noexcept { schedule_peers(c, reason); }

void join_clique(cell_ptr const& c, std::shared_ptr<clique> const& q)
{
  std::lock_guard<std::mutex> hold(q->lock);
  q->members.erase(std::remove_if(q->members.begin(), q->members.end(), [](auto const& w) { return w.expired(); }),
                   q->members.end());
  q->members.push_back(c);
  c->peers = q;
}

void join_clique(cell_ptr const& c, std::string const& key)
{
  std::shared_ptr<clique> q;
  {
    std::lock_guard<std::mutex> hold(cliques_lock());
    auto& all = cliques();
    all.erase(std::remove_if(all.begin(), all.end(), [](auto const& e) { return e.second.expired(); }), all.end());
    for (auto const& [k, w] : all) {
      if (k == key) {
        q = w.lock();
        break;
      }
    }
    if (!q) {
      q = std::make_shared<clique>();
      all.emplace_back(key, q);
    }
  }
  join_clique(c, q);
}

void abort_scheduled_peers() noexcept
{
  try {
    auto* mine = queue_of_this_thread();
    if (group_depth > 0) {
      // Inside this thread's open group an abort would run between ncclGroupStart and
      // ncclGroupEnd: handed on to the threads outside a group (should this group never end,
      // they still run), and run by this one after its group's end.
      if (mine != nullptr && !mine->empty()) {
        std::lock_guard<std::mutex> hold(handed_on_lock());
        auto& on = handed_on();
        on.insert(on.end(), std::make_move_iterator(mine->begin()), std::make_move_iterator(mine->end()));
        mine->clear();
        handed_on_pending.store(true, std::memory_order_release);
      }
      return;
    }
    for (;;) {
      std::vector<scheduled_abort> batch;
      if (mine != nullptr) { batch.swap(*mine); }
      if (handed_on_pending.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> hold(handed_on_lock());
        auto& on = handed_on();
        batch.insert(batch.end(), std::make_move_iterator(on.begin()), std::make_move_iterator(on.end()));
        on.clear();
        handed_on_pending.store(false, std::memory_order_release);
      }
      if (batch.empty()) {
        delete mine;  // drained: a thread that scheduled once keeps no vector for good
        queue_of_this_thread() = nullptr;
        return;
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (auto p = batch[i].peer.lock()) {
          try {
            std::lock_guard<std::mutex> hold(p->lock);
            abort_locked(*p, batch[i].why);  // schedules that peer's own peers: each cell ends once
          } catch (...) {
            // Locking failed (std::system_error, never seen): the rest stays scheduled.
            auto& queue = scheduled();
            queue.insert(queue.end(), std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(i)),
                         std::make_move_iterator(batch.end()));
            return;
          }
          mine = queue_of_this_thread();  // made by the abort's own scheduling, if it was not
        }
      }
    }
  } catch (...) {
    // Out of memory, or a lock that failed (never seen): what was not moved stays where it was.
  }
}

/// Ends the communicator, once; the reason is kept. Under the cell's lock. While an open NCCL
/// group holds calls on it (`group_owner`, on any thread) the ncclCommAbort waits for that group's
/// end: NCCL lists the communicator in the owning thread's group, and an abort now (a clique
/// peer's, the watchdog's, from another thread) would free it under the ncclGroupEnd that walks
/// that list, a use after free. Marked ended at once, so nothing new reaches it; the owner's
/// group end aborts it (`release_group_owner`).
ncclResult_t abort_locked(comm_cell& c, std::string const& reason) noexcept
{
  if (c.ended) {
    // Ended, yet a communicator is left with no group holding it: an abort that waited for a
    // group whose end has passed, or one made before NCCL handed the communicator over.
    if (c.comm != nullptr && c.group_owner == std::thread::id{}) { return abort_now(c); }
    return ncclSuccess;
  }
  c.ended = true;
  try {
    c.why = "was aborted: " + reason;
  } catch (...) {
    // No memory for the reason: `live` says "has ended".
  }
  if (c.group_owner != std::thread::id{}) {
    // Its kernels run until the group's end: its peers, whose arrays they may reach, wait too
    // (a group that never ends keeps them waiting: docs/RELIABILITY.md).
    c.abort_deferred = true;
    try {
      c.abort_reason = reason;
    } catch (...) {
      // No memory for it: the peers are told "".
    }
    return ncclSuccess;
  }
  schedule_peers(c, reason);
  return abort_now(c);
}

/// Creates the cell's event on its device.
void make_device_objects(comm_cell& c)
{
  device_scope scope{c.device};
  check_cuda(cudaEventCreateWithFlags(&c.event, cudaEventDisableTiming), "creating the communicator's event");
}

/// A new cell on `device`, with its event unless `bare` (no NCCL communicator yet).
cell_ptr new_cell(int device, double timeout_s, bool bare)
{
  auto c       = std::make_shared<comm_cell>();
  c->device    = device;
  c->timeout_s = timeout_s;
  if (!bare) { make_device_objects(*c); }
  return c;
}

/// Starts a non-blocking ncclCommSplit of `parent` into a new bare cell (under the parent's
/// lock, taken here). The child has no communicator until `finish_split`, after the parent's
/// state left ncclInProgress. Everything that can throw comes before the split is issued: once
/// it is, NCCL writes a communicator into the child's slot, and a child lost to a failure after
/// that (a `bad_alloc` building the clique's key or joining it) left that communicator to
/// nobody, never aborted, its proxy threads for the process's life.
cell_ptr start_split(comm_cell& parent, int color, int key, char const* doing)
{
  peers_after after;
  auto child           = new_cell(parent.device, parent.timeout_s, true);
  child->split_slot    = new ncclComm_t(nullptr);
  child->split_colored = color >= 0;
  // The slot goes with a split refused before it is issued (an ended parent, another thread's
  // group, a failed device switch: 8 bytes each, for as long as a caller retries; the review of
  // the thirty-fourth session, helper 121). From the call on it is NCCL's, failed or not.
  struct unissued_slot {
    comm_cell& child;
    bool issued = false;
    ~unissued_slot()
    {
      if (!issued) {
        delete child.split_slot;
        child.split_slot = nullptr;
      }
    }
  } slot{*child};
  std::lock_guard<std::mutex> hold(parent.lock);
  live(parent, doing);
  // The n-th split of each rank of the parent's clique, per color: the children's clique. Joined
  // under the parent's lock (its split count is the one this split is issued with) and before
  // the split: a peer aborted from here on ends the child too, and `finish_split` aborts the
  // communicator NCCL hands it. The split is issued all the same, so that the parent's split
  // count stays that of its peers. A split not issued leaves the child to expire from the clique.
  if (parent.peers && color >= 0) {
    join_clique(child, "split " + std::to_string(parent.peers->serial) + " " + std::to_string(parent.splits) + " " +
                           std::to_string(color));
  }
  // Inside a group (split_all) NCCL lists the parent there: an abort must wait for the end.
  if (group_depth > 0) { hold_for_group(parent, doing); }
  device_scope scope{parent.device};
  open_nccl_group();
  slot.issued      = true;
  ncclResult_t r   = nccl().CommSplit(parent.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, child->split_slot, nullptr);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string what = nccl_message(r, doing);
    if (!leaves_comm_usable(r)) { abort_locked(parent, what); }
    throw nccl_failure(r, what);
  }
  // Issued: nothing from here to the caller's owning the child can throw.
  ++parent.splits;
  return child;
}

/// After the parent's wait: takes the new communicator NCCL writes when the split's job ends
/// (waiting for it, bounded by the timeout, should the parent have turned ready first), or none
/// for no color; gives the child its event. Returns whether there is one.
bool finish_split(comm_cell& child)
{
  peers_after after;
  auto start = std::chrono::steady_clock::now();
  // The lock is taken for each look only: a clique abort of the child (from another thread)
  // must not wait out the split's timeout.
  for (;;) {
    {
      std::lock_guard<std::mutex> hold(child.lock);
      if (child.split_slot == nullptr) { return child.comm != nullptr; }
      if (!child.split_colored) {
        child.split_slot = nullptr;  // NCCL writes NULL there: left to it
        child.ended      = true;
        child.why        = "was never made (no color)";
        return false;
      }
      ncclComm_t made = __atomic_load_n(child.split_slot, __ATOMIC_ACQUIRE);
      if (made != nullptr) {
        child.split_slot = nullptr;
        child.comm       = made;
        if (child.ended) {
          // Its clique was aborted before NCCL handed it over: it goes at once, with the reason.
          abort_now(child);
          live(child, "ncclCommSplit");  // throws, saying why
        }
        try {
          make_device_objects(child);
        } catch (...) {
          abort_locked(child, "creating its event failed");
          throw;
        }
        return true;
      }
      if (seconds_since(start) > child.timeout_s) {
        child.split_slot = nullptr;  // left to NCCL's job, which may still write it
        std::string what = "ncclCommSplit gave no communicator within " + std::to_string(child.timeout_s) + " s";
        if (!child.ended) {
          child.ended = true;
          child.why   = "was not made in time by the split";
          schedule_peer_aborts(child, what);
        }
        throw timed_out(what);
      }
    }
    backoff(start);
  }
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
  peers_after after;
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
          // A failure here ends the communicator, as every other failure of this wait does: the
          // callers free a handle whose wait failed without aborting it (`Communicator::init`),
          // which left a ready communicator, its proxy threads and its event, to nobody.
          ncclResult_t read = nccl().CommUserRank(c.comm, &c.rank);
          if (read == ncclSuccess) { read = nccl().CommCount(c.comm, &c.size); }
          if (read != ncclSuccess) {
            c.rank           = -1;
            std::string what = nccl_message(read, "reading the communicator's rank and size");
            abort_locked(c, what);
            throw nccl_failure(read, what);
          }
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

/// One look at a communicator: its asynchronous error, else whether `stream` (or its event) is
/// done. Under the cell's lock. Never a cause to end a healthy communicator because of a CUDA
/// graph capture: the look runs with the thread's capture mode relaxed (another thread's capture
/// in global mode made the driver refuse it, which read as a failure and aborted), and a stream
/// being captured is never queried (that would invalidate the capture and fail): `capturing`
/// says what happens instead.
int32_t query_locked(comm_cell& c, cudaStream_t stream, bool use_stream, on_capture capturing, char const* doing)
{
  live(c, doing);
  ncclResult_t state = ncclSuccess;
  ncclResult_t r     = nccl().CommGetAsyncError(c.comm, &state);
  if (r != ncclSuccess) { state = r; }
  if (state == ncclInProgress) { return RAFTCOMMS_STATE_PENDING; }
  if (state != ncclSuccess) { throw nccl_failure(state, nccl_message(state, doing)); }
  device_scope scope{c.device};  // no runtime call may bind device 0 to a thread without a context
  relaxed_capture relaxed;
  if (use_stream && capture_forbids_query(stream)) {
    if (capturing == on_capture::refuse) {
      throw std::logic_error(std::string(doing) +
                             ": the stream is being captured into a CUDA graph: its work cannot be waited for until the "
                             "capture ends (the communicator is left as it is)");
    }
    use_stream = false;
  }
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
  peers_after after;
  try {
    {
      std::lock_guard<std::mutex> hold(c.lock);
      if (c.ended || c.comm == nullptr || c.group_owner != std::thread::id{}) {
        // Completes an abort left pending; one held by an open group (RAFT's code) is ended
        // and aborted at that group's end instead of finalized under it.
        abort_locked(c, "released");
        return;
      }
      device_scope scope{c.device};
      check_nccl(nccl().CommFinalize(c.comm), "finalizing a split communicator");
    }
    wait_ready(c, c.timeout_s, "finalizing a split communicator");
    std::lock_guard<std::mutex> hold(c.lock);
    if (c.ended || c.comm == nullptr) { return; }
    // After a completed finalize: on its own thread when called from the watchdog's.
    static_cast<void>(take_and_end(c, true));
    c.ended = true;
    c.why   = "was destroyed";
  } catch (...) {
    std::lock_guard<std::mutex> hold(c.lock);
    // A noexcept function: the reason's allocation may not escape it (helper 103).
    try {
      abort_locked(c, "finalizing a split communicator failed");
    } catch (...) {
      abort_locked(c, std::string{});
    }
  }
}

ncclConfig_t nonblocking_config()
{
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking     = 0;
  return config;
}

}  // namespace raftcomms

#pragma GCC visibility pop

using namespace raftcomms;

extern "C" {

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
    // Bare until every step that can throw without ending it is behind it: its event, made
    // first, was never destroyed when the clique's key, the clique or the handle could not be
    // allocated (a cell has no destructor: only `take_and_end` lets its objects go).
    auto cell = new_cell(device, timeout_s, true);
    // The ranks initialised in this process with this id are one clique.
    join_clique(cell, std::string("id ") + std::string(reinterpret_cast<char const*>(id), sizeof(uid)));
    auto handle = std::make_unique<raftcomms_comm>(raftcomms_comm{cell});
    std::lock_guard<std::mutex> hold(cell->lock);
    // A rank of the same id in this process aborted before this one was made: none is made.
    if (cell->ended) { throw std::logic_error("ncclCommInitRankConfig: the communicator " + cell->why); }
    // From here on a failure ends the cell (`abort_locked`), which destroys the event.
    make_device_objects(*cell);
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
          // The reason is a heap string: out of memory it is dropped, not let out of a
          // destructor running during unwinding (std::terminate; helper 103).
          try {
            abort_locked(*c, "initialising the clique failed");
          } catch (...) {
            abort_locked(*c, std::string{});
          }
        }
      }
    } cleanup{cells};
    // Room first: a cell made (its event with it) and then lost to a `push_back` that could not
    // grow was never ended, its event never destroyed.
    cells.reserve(static_cast<std::size_t>(n));
    auto together = std::make_shared<clique>();
    for (int32_t i = 0; i < n; ++i) {
      cells.push_back(new_cell(devices[i], timeout_s));
      join_clique(cells.back(), together);
    }
    ncclUniqueId uid;
    check_nccl(nccl().GetUniqueId(&uid), "making an NCCL unique id");
    ncclConfig_t config = nonblocking_config();
    ncclResult_t first  = ncclSuccess;
    ncclResult_t r      = nccl().GroupStart();
    if (r != ncclSuccess) { throw nccl_failure(r, nccl_message(r, "ncclGroupStart")); }
    try {
      for (int32_t i = 0; i < n && first == ncclSuccess; ++i) {
        device_scope scope{devices[i]};
        ncclResult_t e = nccl().CommInitRankConfig(&cells[i]->comm, n, uid, i, &config);
        if (e != ncclSuccess && e != ncclInProgress) { first = e; }
      }
    } catch (...) {
      // A device switch that failed: the group ends before the cleanup aborts the communicators
      // it holds (the thirteenth audit: left open, the thread's next NCCL call joined it, and
      // its end walked aborted communicators).
      static_cast<void>(nccl().GroupEnd());
      throw;
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
    // Every handle made before any is handed out: one that could not be allocated aborted the
    // clique (`cleanup`) after the earlier ones were written to `out`, which the caller, told
    // of the failure, never frees.
    std::vector<std::unique_ptr<raftcomms_comm>> handles;
    handles.reserve(static_cast<std::size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      handles.push_back(std::make_unique<raftcomms_comm>(raftcomms_comm{cells[i]}));
    }
    for (int32_t i = 0; i < n; ++i) {
      out[i] = handles[static_cast<std::size_t>(i)].release();
    }
    cleanup.armed = false;
  });
}

raftcomms_status raftcomms_comm_split(raftcomms_comm* comm, int32_t color, int32_t key, raftcomms_comm** out)
{
  return guard([&] {
    *out = nullptr;
    // The handle first: once the split is issued, NCCL writes the child's communicator into its
    // slot when the parent's split completes, and a child lost here (the handle's allocation
    // failing after the split) left that communicator to nobody, never aborted.
    auto handle  = std::make_unique<raftcomms_comm>();
    handle->cell = start_split(cell_of(comm), color, key, "ncclCommSplit");
    *out         = handle.release();
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
    *state = query_locked(c, as_stream(stream), stream != nullptr, on_capture::event, "checking the communicator");
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
    // NCCL lists it in that thread's group: finalized (then destroyed) now, it would be freed
    // under the group's end.
    refuse_held_elsewhere(c, "ncclCommFinalize");
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
    if (c.ended) {
      abort_locked(c, "released");  // completes an abort left pending, else nothing
      return;
    }
    live(c, "ncclCommDestroy");
    refuse_held_elsewhere(c, "ncclCommDestroy");
    // After a completed finalize: on its own thread when called from the watchdog's (whose
    // failure is then not seen here: the communicator ended either way).
    ncclResult_t r = take_and_end(c, true);
    c.ended        = true;
    c.why          = "was released";
    if (r != ncclSuccess) { throw nccl_failure(r, nccl_message(r, "ncclCommDestroy")); }
  });
}

void raftcomms_comm_free(raftcomms_comm* comm) { delete comm; }

raftcomms_status raftcomms_set_ends_elsewhere(int32_t on)
{
  return guard([&] { ends_elsewhere = on != 0; });
}

int32_t raftcomms_ends_in_flight(void) { return ends_in_flight.load(std::memory_order_acquire); }

}  // extern "C"

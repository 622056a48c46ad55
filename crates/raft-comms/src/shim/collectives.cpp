// raft-comms's C++ shim: collectives and point-to-point calls on one communicator (run_op, in
// common.hpp, is their shared path), and NCCL groups: the thread's group depth, which thread
// holds a communicator's open group, ncclGroupEnd over several communicators.

#include <algorithm>
#include "common.hpp"

#pragma GCC visibility push(hidden)  // internal to the shim, as in common.hpp

namespace raftcomms {

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

namespace {

/// The communicators this thread's open group holds: a plain pointer to a heap vector (no
/// thread-local destructor, which glibc would run before the exit's handlers), made at the
/// group's first hold and deleted at its outermost end (it was kept, one per thread that ever
/// ended a group: the twentieth audit, helper 98).
thread_local std::vector<std::weak_ptr<comm_cell>>* group_held_list = nullptr;

std::vector<std::weak_ptr<comm_cell>>& group_held()
{
  if (group_held_list == nullptr) { group_held_list = new std::vector<std::weak_ptr<comm_cell>>; }
  return *group_held_list;
}

}  // namespace

void refuse_held_elsewhere(comm_cell const& c, char const* doing)
{
  if (c.group_owner != std::thread::id{} && c.group_owner != std::this_thread::get_id()) {
    throw std::logic_error(std::string(doing) +
                           ": the communicator has calls in an open NCCL group on another thread; call it from that "
                           "thread, or after that group has ended");
  }
}

void hold_for_group(comm_cell& c, char const* doing)
{
  if (c.group_owner == std::this_thread::get_id()) { return; }
  refuse_held_elsewhere(c, doing);
  group_held().push_back(c.weak_from_this());  // first: a failed push leaves no hold behind
  c.group_owner = std::this_thread::get_id();
}

void abort_group_held(std::string const& what) noexcept
{
  try {
    if (group_held_list == nullptr) { return; }
    for (auto const& w : *group_held_list) {
      if (auto c = w.lock()) {
        std::lock_guard<std::mutex> hold(c->lock);
        abort_locked(*c, what);  // held by this group: carried out at the release
      }
    }
  } catch (...) {
    // Locking failed (never seen): the release still releases them.
  }
}

void release_group_held() noexcept
{
  std::unique_ptr<std::vector<std::weak_ptr<comm_cell>>> held(group_held_list);
  group_held_list = nullptr;
  if (!held) { return; }  // nothing was held
  for (auto const& w : *held) {
    if (auto c = w.lock()) { release_group_owner(*c); }
  }
}

/// Ends the calling thread's hold on `c` once its outermost group has ended (ncclGroupEnd
/// returned, or failed and aborted it): until then another thread's call is refused, never
/// folded into this thread's group. An abort that waited for the group's end (`abort_locked`)
/// happens here, on the thread whose group listed the communicator.
void release_group_owner(comm_cell& c) noexcept
{
  try {
    std::lock_guard<std::mutex> hold(c.lock);
    if (c.group_owner == std::this_thread::get_id()) {
      c.group_owner = std::thread::id{};
      if (c.ended && c.comm != nullptr) { abort_now(c); }
      if (c.abort_deferred) {
        // Its kernels stop only now: its clique peers, whose arrays they may reach, follow now.
        c.abort_deferred = false;
        schedule_peer_aborts(c, c.abort_reason);
      }
    }
  } catch (...) {
    // Locking failed (std::system_error, never seen): the hold stays, and other threads' calls
    // keep being refused, the safe side. Called from a destructor: nothing may escape.
  }
}

/// The first half of a barrier on `stream`: an allreduce of one int, in device memory allocated
/// and freed in stream order around it (a free that waits for the device could hang behind
/// another communicator's stuck kernel). Outside a group only: the free must follow the launch.
void barrier_op(comm_cell& c, cudaStream_t stream, bool mark, char const* doing)
{
  if (group_depth > 0) { throw std::logic_error(std::string(doing) + ": a barrier inside a group would wait for itself"); }
  // One rank meets itself: nothing to allocate or reduce.
  if (answer_locally(c, stream, mark, doing, {false, nullptr, nullptr, 0, 0})) { return; }
  int* flag = nullptr;
  {
    device_scope scope{c.device};
    // The stream-ordered allocation and frees below are refused in the thread's global capture
    // mode while another thread captures in global mode, which the refusal invalidates (the
    // thirteenth audit): relaxed, as the communicator's looks are.
    relaxed_capture relaxed;
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
    relaxed_capture relaxed;
    cudaFreeAsync(flag, stream);
    cudaGetLastError();
    throw;
  }
  device_scope scope{c.device};
  relaxed_capture relaxed;
  check_cuda(cudaFreeAsync(flag, stream), "freeing the barrier's int");
}

bool answer_locally(comm_cell& c, cudaStream_t stream, bool mark, char const* doing, local_answer const& a)
{
  peers_after after;  // an abort below schedules the clique's peers: aborted once the lock is let go
  std::lock_guard<std::mutex> hold(c.lock);
  live(c, doing);
  // Elements to move among more ranks (or a size not known yet): NCCL's call, which asks all
  // that follows itself. The common case costs this lock and two reads.
  if (!a.empty && c.size != 1) { return false; }
  // What NCCL asks at every call, no elements or not (and allocates nothing for): a communicator
  // still initialising is left to NCCL (its in-progress path), one that failed is aborted and
  // refused as a call would be (the review, helper 102).
  ncclResult_t state = ncclSuccess;
  ncclResult_t asked = nccl().CommGetAsyncError(c.comm, &state);
  if (asked != ncclSuccess) { state = asked; }
  if (state == ncclInProgress) { return false; }
  if (state != ncclSuccess) {
    std::string what = nccl_message(state, doing);
    abort_locked(c, what);
    throw nccl_failure(state, what);
  }
  // NCCL refuses a root that is not a rank; so does this answer (the size known).
  if (c.size > 0 && (a.root < 0 || a.root >= c.size)) {
    throw std::invalid_argument(std::string(doing) + ": root " + std::to_string(a.root) + " is not a rank of a communicator of " +
                                std::to_string(c.size));
  }
  refuse_held_elsewhere(c, doing);
  if (group_depth > 0) { hold_for_group(c, doing); }
  device_scope scope{c.device};
  if (!a.empty && a.bytes > 0 && a.dst != a.src) {
    check_cuda(cudaMemcpyAsync(a.dst, a.src, a.bytes, cudaMemcpyDefault, stream), "copying one rank's collective");
  }
  if (mark && group_depth == 0) { check_cuda(cudaEventRecord(c.event, stream), "recording the communicator's event"); }
  return true;
}

std::size_t bytes_of(std::size_t count, ncclDataType_t dt)
{
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, type_size(dt), &bytes)) { throw std::invalid_argument("a count whose bytes pass size_t"); }
  return bytes;
}

ncclResult_t allgatherv_calls(ncclComm_t comm, const void* send, void* recv, const size_t* counts, const size_t* displs,
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

ncclResult_t gather_calls(ncclComm_t comm, const void* send, void* recv, size_t sendcount, ncclDataType_t dt, int root,
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

}  // namespace raftcomms

#pragma GCC visibility pop

using namespace raftcomms;

extern "C" {

raftcomms_status raftcomms_group_start(void)
{
  // NCCL's own group is opened at the first call that reaches it (`open_nccl_group`).
  return guard([&] { ++group_depth; });
}

raftcomms_status raftcomms_group_end(int32_t n, raftcomms_comm* const* comms, void* const* streams)
{
  return guard([&] {
    if (group_depth <= 0) { throw std::logic_error("ncclGroupEnd: no group is open on this thread"); }
    --group_depth;
    group_held_release release;  // after the outermost end, on every path out
    if (group_depth > 0) { return; }  // NCCL's group, when open, ends with the outermost
    ncclResult_t r = end_nccl_group();
    if (r != ncclSuccess && r != ncclInProgress) {
      // The group's calls may have been launched on some communicators and not others: none of
      // them can be trusted to agree with its peers any more, listed or only held (a call the
      // group refused may still have put it there).
      std::string what = nccl_message(r, "ncclGroupEnd");
      for (int32_t i = 0; i < n; ++i) {
        auto& c = cell_of(comms[i]);
        std::lock_guard<std::mutex> hold(c.lock);
        abort_locked(c, what);
      }
      abort_group_held(what);
      throw nccl_failure(r, what);
    }
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
    if (answer_locally(cell_of(comm), as_stream(stream), mark != 0, "ncclAllReduce", {count == 0, recv, send, bytes_of(count, dt), 0})) {
      return;
    }
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclAllReduce",
           [&](ncclComm_t c) { return nccl().AllReduce(send, recv, count, dt, ro, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_broadcast(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t root,
                                     void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    if (answer_locally(cell_of(comm), as_stream(stream), mark != 0, "ncclBroadcast", {count == 0, recv, send, bytes_of(count, dt), root})) {
      return;
    }
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
    if (answer_locally(cell_of(comm), as_stream(stream), mark != 0, "ncclReduce", {count == 0, recv, send, bytes_of(count, dt), root})) {
      return;
    }
    run_op(cell_of(comm), as_stream(stream), mark != 0, "ncclReduce",
           [&](ncclComm_t c) { return nccl().Reduce(send, recv, count, dt, ro, root, c, as_stream(stream)); });
  });
}

raftcomms_status raftcomms_allgather(raftcomms_comm* comm, const void* send, void* recv, size_t sendcount, int32_t dtype, void* stream,
                                     int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    if (answer_locally(cell_of(comm), as_stream(stream), mark != 0, "ncclAllGather",
                       {sendcount == 0, recv, send, bytes_of(sendcount, dt), 0})) {
      return;
    }
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
    if (size > 0) {
      bool empty = std::all_of(counts, counts + size, [](size_t n) { return n == 0; });
      if (answer_locally(c, as_stream(stream), mark != 0, "allgatherv",
                         {empty, static_cast<char*>(recv) + displs[0] * type_size(dt), send, bytes_of(counts[0], dt), 0})) {
        return;
      }
    }
    run_op(c, as_stream(stream), mark != 0, "allgatherv (ncclBroadcast in a group)", [&](ncclComm_t nc) {
      return allgatherv_calls(nc, send, recv, counts, displs, dt, size, as_stream(stream));
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
    if (answer_locally(c, as_stream(stream), mark != 0, "gather", {sendcount == 0, recv, send, bytes_of(sendcount, dt), root})) {
      return;
    }
    run_op(c, as_stream(stream), mark != 0, "gather (ncclSend/ncclRecv in a group)", [&](ncclComm_t nc) {
      return gather_calls(nc, send, recv, sendcount, dt, root, rank, size, as_stream(stream));
    });
  });
}

raftcomms_status raftcomms_reducescatter(raftcomms_comm* comm, const void* send, void* recv, size_t recvcount, int32_t dtype,
                                         int32_t op, void* stream, int32_t mark)
{
  return guard([&] {
    auto dt = nccl_type(dtype);
    auto ro = nccl_op(op);
    if (answer_locally(cell_of(comm), as_stream(stream), mark != 0, "ncclReduceScatter",
                       {recvcount == 0, recv, send, bytes_of(recvcount, dt), 0})) {
      return;
    }
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

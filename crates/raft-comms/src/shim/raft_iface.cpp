// raft-comms's C++ shim: RAFT's comms_iface over one NCCL communicator (nccl_comms), what RAFT's
// and cuVS's multi-GPU code reaches through raft::resource::get_comms; and the entry points that
// install it into a raft::resources and call through it.

#include <algorithm>
#include "common.hpp"

#pragma GCC visibility push(hidden)  // internal to the shim, as in common.hpp

namespace raftcomms {

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
    peers_after after;  // an abort of the child below reaches its clique before this returns
    cell_ptr child = start_split(*cell_, color, key, "comm_split");
    wait_ready(*cell_, cell_->timeout_s, "comm_split");  // the split completes with the parent
    if (!finish_split(*child)) { throw raft::logic_error("comm_split: this rank's color gave no communicator"); }
    // The child holds NCCL's communicator and its event from here: until the owning interface
    // exists, a failure ends it. `wait_ready` aborts on its own failures; the interface's
    // allocation (or its lock) failing left a ready communicator to nobody (a cell has no
    // destructor), its proxy threads and memory for the process's life.
    try {
      wait_ready(*child, child->timeout_s, "comm_split");
      return std::make_unique<nccl_comms>(child, stream_, true);
    } catch (...) {
      std::lock_guard<std::mutex> hold(child->lock);
      abort_locked(*child, std::string{});  // ended already: only a communicator left is aborted
      throw;
    }
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
    peers_after after;  // an abort here ends the clique (RAFT's C++ code calls this directly)
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::lock_guard<std::mutex> hold(cell_->lock);
        if (cell_->ended) { return raft::comms::status_t::ABORT; }
        int32_t state = RAFTCOMMS_STATE_PENDING;
        try {
          // A stream being captured is refused (ERROR), never queried nor answered from the
          // event, which this interface's calls never record; the communicator stays as it is.
          state = query_locked(*cell_, stream, true, on_capture::refuse, "sync_stream");
        } catch (nccl_failure const& e) {
          try {
            abort_locked(*cell_, e.what());
          } catch (...) {
            abort_locked(*cell_, std::string{});  // the reason's allocation failed (helper 103)
          }
          return raft::comms::status_t::ABORT;
        } catch (...) {
          return raft::comms::status_t::ERROR;
        }
        if (state == RAFTCOMMS_STATE_DONE) { return raft::comms::status_t::SUCCESS; }
        if (seconds_since(start) > cell_->timeout_s) {
          // The message is built where its allocation cannot skip the abort (helper 103).
          try {
            abort_locked(*cell_, "sync_stream timed out after " + std::to_string(cell_->timeout_s) + " s");
          } catch (...) {
            abort_locked(*cell_, std::string{});
          }
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
    auto const dt = raft_type(t);
    auto const ro = raft_op(op);
    if (answer_locally(*cell_, stream, false, "allreduce", {count == 0, recv, send, bytes_of(count, dt), 0})) { return; }
    run_op(*cell_, stream, false, "allreduce", [&](ncclComm_t comm) { return nccl().AllReduce(send, recv, count, dt, ro, comm, stream); });
  }

  void bcast(void* buff, size_t count, raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    bcast(buff, buff, count, t, root, stream);
  }

  void bcast(const void* send, void* recv, size_t count, raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    if (answer_locally(*cell_, stream, false, "bcast", {count == 0, recv, send, bytes_of(count, dt), root})) { return; }
    run_op(*cell_, stream, false, "bcast", [&](ncclComm_t comm) { return nccl().Broadcast(send, recv, count, dt, root, comm, stream); });
  }

  void reduce(const void* send, void* recv, size_t count, raft::comms::datatype_t t, raft::comms::op_t op, int root,
              cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    auto const ro = raft_op(op);
    if (answer_locally(*cell_, stream, false, "reduce", {count == 0, recv, send, bytes_of(count, dt), root})) { return; }
    run_op(*cell_, stream, false, "reduce", [&](ncclComm_t comm) { return nccl().Reduce(send, recv, count, dt, ro, root, comm, stream); });
  }

  void allgather(const void* send, void* recv, size_t sendcount, raft::comms::datatype_t t, cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    if (answer_locally(*cell_, stream, false, "allgather", {sendcount == 0, recv, send, bytes_of(sendcount, dt), 0})) { return; }
    run_op(*cell_, stream, false, "allgather", [&](ncclComm_t comm) { return nccl().AllGather(send, recv, sendcount, dt, comm, stream); });
  }

  void allgatherv(const void* send, void* recv, const size_t* counts, const size_t* displs, raft::comms::datatype_t t,
                  cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    if (size_ > 0) {
      bool empty = std::all_of(counts, counts + size_, [](size_t n) { return n == 0; });
      if (answer_locally(*cell_, stream, false, "allgatherv",
                         {empty, static_cast<char*>(recv) + displs[0] * type_size(dt), send, bytes_of(counts[0], dt), 0})) {
        return;
      }
    }
    run_op(*cell_, stream, false, "allgatherv",
           [&](ncclComm_t comm) { return allgatherv_calls(comm, send, recv, counts, displs, dt, size_, stream); });
  }

  void gather(const void* send, void* recv, size_t sendcount, raft::comms::datatype_t t, int root,
              cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    if (answer_locally(*cell_, stream, false, "gather", {sendcount == 0, recv, send, bytes_of(sendcount, dt), root})) { return; }
    run_op(*cell_, stream, false, "gather",
           [&](ncclComm_t comm) { return gather_calls(comm, send, recv, sendcount, dt, root, rank_, size_, stream); });
  }

  void gatherv(const void* send, void* recv, size_t sendcount, const size_t* counts, const size_t* displs,
               raft::comms::datatype_t t, int root, cudaStream_t stream) const override
  {
    auto const dt = raft_type(t);
    auto const sz = type_size(dt);
    // One rank only: the others' counts may differ, so a rank sending nothing still takes part.
    // Its root and its one count are checked before `displs` is read (the review, helper 102).
    if (size_ == 1) {
      if (root != 0) { throw std::invalid_argument("gatherv: root " + std::to_string(root) + " is not a rank of a communicator of 1"); }
      if (counts == nullptr || displs == nullptr || counts[0] != sendcount) {
        throw std::invalid_argument("gatherv: the root's count for itself is not what it sends");
      }
      if (answer_locally(*cell_, stream, false, "gatherv",
                         {false, static_cast<char*>(recv) + displs[0] * sz, send, bytes_of(sendcount, dt), root})) {
        return;
      }
    }
    run_op(*cell_, stream, false, "gatherv", [&](ncclComm_t comm) {
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
    auto const dt = raft_type(t);
    auto const ro = raft_op(op);
    if (answer_locally(*cell_, stream, false, "reducescatter", {recvcount == 0, recv, send, bytes_of(recvcount, dt), 0})) { return; }
    run_op(*cell_, stream, false, "reducescatter",
           [&](ncclComm_t comm) { return nccl().ReduceScatter(send, recv, recvcount, dt, ro, comm, stream); });
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
    // NCCL's own group is opened at the first call that reaches it (`open_nccl_group`).
    ++group_depth;
  }

  void group_end() const override
  {
    peers_after after;
    if (group_depth <= 0) { throw raft::logic_error("group_end: no group is open on this thread"); }
    --group_depth;
    group_held_release release;  // after the outermost end, on every path out
    if (group_depth > 0) { return; }  // NCCL's group, when open, ends with the outermost
    ncclResult_t r = end_nccl_group();
    if (r != ncclSuccess && r != ncclInProgress) {
      // As raftcomms_group_end: every communicator the group held is ended.
      std::string what = nccl_message(r, "group_end");
      abort_group_held(what);
      throw nccl_failure(r, what);
    }
    if (r == ncclInProgress) { wait_ready(*cell_, cell_->timeout_s, "group_end"); }
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

raft::resources& as_resources(void* r)
{
  if (r == nullptr) { throw std::invalid_argument("no raft::resources (a null pointer)"); }
  return *static_cast<raft::resources*>(r);
}

}  // namespace raftcomms

#pragma GCC visibility pop

using namespace raftcomms;

extern "C" {

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

}  // extern "C"

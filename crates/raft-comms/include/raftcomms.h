/*
 * raftcomms.h: the C face of raft-comms's C++ shim, NCCL communicators for RAFT's resources.
 *
 * The shim implements RAFT's raft::comms::comms_iface over NCCL alone (no UCX) and installs it
 * into a raft::resources with raft::resource::set_comms. NCCL itself (libnccl.so.2) is opened
 * at run time by raftcomms_nccl_load: the shim, like libnccl, is loaded only when a program
 * first uses a communicator, so a program without NCCL starts and gets an error saying what
 * is missing.
 *
 * Every function is noexcept on the C++ side: a C++ exception becomes a status, with its
 * message kept in a thread-local buffer that the caller reads with raftcomms_last_error() and
 * clears with raftcomms_clear_error() right after the failing call.
 *
 * A communicator (raftcomms_comm) is a handle to a shared cell holding the ncclComm_t: the
 * Rust side holds one handle, each raft::resources it was installed into holds another. Only
 * the owner's calls end the NCCL communicator (abort, or finalize then destroy); after that,
 * every use through any handle fails with a message saying why it ended. Dropping a handle
 * (raftcomms_comm_free) makes no NCCL call. Calls on one communicator are serialised by the
 * cell's lock: NCCL forbids concurrent calls on one communicator.
 */
#ifndef RAFTCOMMS_H
#define RAFTCOMMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */

/** Result of every fallible call: one of the RAFTCOMMS_STATUS_* values (those of raftrs.h). */
typedef int32_t raftcomms_status;

#define RAFTCOMMS_STATUS_OK 0
/** An allocation failed. */
#define RAFTCOMMS_STATUS_OUT_OF_MEMORY 1
/** A CUDA call failed (also NCCL's ncclUnhandledCudaError). */
#define RAFTCOMMS_STATUS_CUDA 2
/** Refused: a bad argument, a communicator already ended, NCCL's ncclInvalidArgument or
 *  ncclInvalidUsage. */
#define RAFTCOMMS_STATUS_LOGIC 3
/** Anything else: NCCL's system, internal and remote errors, a missing libnccl. */
#define RAFTCOMMS_STATUS_GENERIC 4

/** The message of the last failed call on this thread ("" when none), valid until the next
 *  raftcomms_ call on this thread (a plain thread-local array: valid during the exit too). */
const char* raftcomms_last_error(void);
/** Forgets the last message on this thread. */
void raftcomms_clear_error(void);

/* ---- NCCL ---------------------------------------------------------------------------------- */

/** FNV-1a (64 bits) of this header's bytes as the shim was built from it: the Rust side, built
 *  from the same header, refuses a shim that answers otherwise (one of another version, whose
 *  functions may take other arguments). */
uint64_t raftcomms_header_hash(void);

/** NCCL_VERSION_CODE of the nccl.h the shim was compiled against (e.g. 22809). */
int32_t raftcomms_header_nccl_version(void);

/** The stack the shim was compiled against: RAFT's and RMM's versions (major * 10000 + minor *
 *  100 + patch), CCCL_VERSION, CUDART_VERSION, and the GNU build-id (lower-case hex, empty: none)
 *  of the librmm.so of that stack, NUL-terminated in `librmm_build_id` (at most `size` bytes).
 *  The shim runs RAFT's and RMM's inline code on raft-sys's `raft::resources`: the Rust side
 *  refuses a shim whose stack is not raft-sys's. */
void raftcomms_build_info(int32_t* raft, int32_t* rmm, int32_t* cccl, int32_t* cudart, char* librmm_build_id, size_t size);

/** The oldest NCCL the shim accepts at run time (2.18: non-blocking communicators, split). */
#define RAFTCOMMS_MIN_NCCL_VERSION 21800

/** Opens libnccl once per process: `path` (a file) when not NULL, else "libnccl.so.2" by the
 *  dynamic loader's search (LD_LIBRARY_PATH, the shim's RUNPATH, the system's cache). Later
 *  calls return the first outcome. `version` receives ncclGetVersion's code. */
raftcomms_status raftcomms_nccl_load(const char* path, int32_t* version);
/** The file libnccl was opened from (NUL-terminated, truncated to `size`). */
raftcomms_status raftcomms_nccl_path(char* buf, size_t size);

/** sizeof(ncclUniqueId). */
#define RAFTCOMMS_UNIQUE_ID_BYTES 128
/** ncclGetUniqueId into `out` (RAFTCOMMS_UNIQUE_ID_BYTES bytes). Needs no GPU. */
raftcomms_status raftcomms_unique_id(uint8_t* out);

/* ---- element types and reductions ------------------------------------------------------------ */

#define RAFTCOMMS_DTYPE_U8 0
#define RAFTCOMMS_DTYPE_I32 1
#define RAFTCOMMS_DTYPE_I64 2
#define RAFTCOMMS_DTYPE_F32 3
#define RAFTCOMMS_DTYPE_F64 4

#define RAFTCOMMS_OP_SUM 0
#define RAFTCOMMS_OP_PROD 1
#define RAFTCOMMS_OP_MIN 2
#define RAFTCOMMS_OP_MAX 3

/* ---- communicators --------------------------------------------------------------------------- */

typedef struct raftcomms_comm raftcomms_comm;

/** Starts a non-blocking ncclCommInitRankConfig of rank `rank` among `nranks` on `device`, and
 *  returns at once: wait with raftcomms_comm_wait before use. `timeout_s` bounds every later
 *  wait of the shim on this communicator (RAFT's sync_stream and barrier included). */
raftcomms_status raftcomms_comm_init(const uint8_t* id, int32_t nranks, int32_t rank, int32_t device, double timeout_s,
                                     raftcomms_comm** out);
/** One process, `n` devices: a new unique id and ncclCommInitRankConfig for each device inside
 *  ncclGroupStart / ncclGroupEnd, on the calling thread; `out` receives `n` handles (rank i on
 *  devices[i]). Wait for each with raftcomms_comm_wait. */
raftcomms_status raftcomms_comm_init_clique(int32_t n, const int32_t* devices, double timeout_s, raftcomms_comm** out);
/** Starts a non-blocking ncclCommSplit (`color` < 0 is NCCL_SPLIT_NOCOLOR). `out` receives the
 *  child, which has no communicator yet: NCCL writes it from its own thread when the split
 *  completes. Wait for the *parent* (raftcomms_comm_wait, or raftcomms_group_end when split in a
 *  group), then call raftcomms_comm_split_done on the child, then wait for the child. */
raftcomms_status raftcomms_comm_split(raftcomms_comm* comm, int32_t color, int32_t key, raftcomms_comm** out);
/** After the parent's wait succeeded: takes the communicator the split made into the child
 *  (waiting for NCCL's job to write it, bounded by the timeout); `present` 0 when this rank gave
 *  no color (the child is then ended). The 8 bytes NCCL writes into are never freed: nothing
 *  can know when its job has stopped writing them. */
raftcomms_status raftcomms_comm_split_done(raftcomms_comm* child, int32_t* present);
/** Waits until the communicator's state is no longer ncclInProgress (init, split, a deferred
 *  call). On an error or after `timeout_s` the communicator is aborted (ncclCommAbort) and the
 *  call fails saying why. Fills in rank and size once ready. */
raftcomms_status raftcomms_comm_wait(raftcomms_comm* comm, double timeout_s);
/** Rank, size (both -1 before ready) and device. */
raftcomms_status raftcomms_comm_info(raftcomms_comm* comm, int32_t* rank, int32_t* size, int32_t* device);
/** The bound of the shim's own waits (see raftcomms_comm_init). */
raftcomms_status raftcomms_comm_set_timeout(raftcomms_comm* comm, double timeout_s);

/** `state` after raftcomms_comm_query. */
#define RAFTCOMMS_STATE_DONE 0
#define RAFTCOMMS_STATE_PENDING 1

/** One non-blocking look: fails with NCCL's asynchronous error when there is one (the caller
 *  then aborts); else DONE when `stream` (or, when NULL, the communicator's event, recorded
 *  after each marked call) has finished, PENDING when not. A `stream` being captured into a CUDA
 *  graph (or whose capture status cannot be read) is never queried: the event answers instead.
 *  The look runs with the thread's capture mode relaxed, so another thread's capture neither
 *  fails it nor is invalidated by it. */
raftcomms_status raftcomms_comm_query(raftcomms_comm* comm, void* stream, int32_t* state);
/** ncclCommAbort now (never waits for other ranks); `reason` is kept for every later use. A
 *  communicator already ended is left as it is (OK). */
raftcomms_status raftcomms_comm_abort(raftcomms_comm* comm, const char* reason);
/** ncclCommFinalize (non-blocking: wait with raftcomms_comm_wait, then destroy). */
raftcomms_status raftcomms_comm_finalize(raftcomms_comm* comm);
/** ncclCommDestroy, after a finalize that completed. */
raftcomms_status raftcomms_comm_destroy(raftcomms_comm* comm);
/** Drops this handle; no NCCL call (a communicator never ended is leaked with it). */
void raftcomms_comm_free(raftcomms_comm* comm);
/** For the calling thread: whether ncclCommDestroy after a completed finalize and the
 *  communicator's event destroy (both may wait for the whole device; no kernel depends on them)
 *  run on a thread of their own (non-zero) or inside the call (0, the default). ncclCommAbort
 *  always runs inside the call: its rank's kernels have stopped when it returns. Either way the
 *  communicator is ended and unreachable when the call returns. */
raftcomms_status raftcomms_set_ends_elsewhere(int32_t on);
/** The destroys begun on threads of their own that have not returned yet. */
int32_t raftcomms_ends_in_flight(void);

/* ---- RAFT's resources ------------------------------------------------------------------------ */

/** raft::resource::set_comms on `raft_resources` (a raft::resources*) with a comms_t over this
 *  communicator, whose barrier uses `stream` (the resources' stream). */
raftcomms_status raftcomms_comm_install(raftcomms_comm* comm, void* raft_resources, void* stream);
/** What raft::resource::get_comms says: `present` 0 or 1, then rank and size. */
raftcomms_status raftcomms_installed(void* raft_resources, int32_t* present, int32_t* rank, int32_t* size);
/** An allreduce through raft::resource::get_comms(res) on `stream`, then its sync_stream: what
 *  RAFT's and cuVS's C++ algorithms do with an installed communicator. */
raftcomms_status raftcomms_raft_allreduce(void* raft_resources, const void* send, void* recv, size_t count, int32_t dtype,
                                          int32_t op, void* stream);

/* ---- groups ------------------------------------------------------------------------------------ */

/** ncclGroupStart. */
raftcomms_status raftcomms_group_start(void);
/** ncclGroupEnd, then, for each of the `n` communicators used in the group, a wait (bounded by
 *  its timeout) and, where streams[i] is not NULL, the communicator's event recorded on it. */
raftcomms_status raftcomms_group_end(int32_t n, raftcomms_comm* const* comms, void* const* streams);

/* ---- collectives ------------------------------------------------------------------------------ */
/* Counts are in elements of `dtype`; pointers are device addresses of the communicator's
 * device, valid for those counts, with the work ordered on `stream`. None of these checks a
 * count against an allocation: the caller does. `mark` != 0 records the communicator's event
 * on `stream` after the call (outside a group). */

raftcomms_status raftcomms_allreduce(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                                     void* stream, int32_t mark);
raftcomms_status raftcomms_broadcast(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t root,
                                     void* stream, int32_t mark);
raftcomms_status raftcomms_reduce(raftcomms_comm* comm, const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                                  int32_t root, void* stream, int32_t mark);
raftcomms_status raftcomms_allgather(raftcomms_comm* comm, const void* send, void* recv, size_t sendcount, int32_t dtype, void* stream,
                                     int32_t mark);
/** `counts` and `displs` have one entry per rank; rank r's block lands at recv + displs[r]. */
raftcomms_status raftcomms_allgatherv(raftcomms_comm* comm, const void* send, void* recv, const size_t* counts, const size_t* displs,
                                      int32_t dtype, void* stream, int32_t mark);
/** On `root`, recv holds size × sendcount elements; elsewhere recv is not used. */
raftcomms_status raftcomms_gather(raftcomms_comm* comm, const void* send, void* recv, size_t sendcount, int32_t dtype, int32_t root,
                                  void* stream, int32_t mark);
raftcomms_status raftcomms_reducescatter(raftcomms_comm* comm, const void* send, void* recv, size_t recvcount, int32_t dtype,
                                         int32_t op, void* stream, int32_t mark);
raftcomms_status raftcomms_send(raftcomms_comm* comm, const void* buf, size_t count, int32_t dtype, int32_t peer, void* stream,
                                int32_t mark);
raftcomms_status raftcomms_recv(raftcomms_comm* comm, void* buf, size_t count, int32_t dtype, int32_t peer, void* stream,
                                int32_t mark);
/** ncclSend to `dest` and ncclRecv from `source` in one group (no deadlock). */
raftcomms_status raftcomms_sendrecv(raftcomms_comm* comm, const void* send, size_t sendcount, int32_t dest, void* recv,
                                    size_t recvcount, int32_t source, int32_t dtype, void* stream, int32_t mark);
/** The first half of a barrier: an allreduce of one int, allocated and freed in stream order
 *  on `stream` (the caller then waits for `stream`). Refused inside a group. */
raftcomms_status raftcomms_barrier(raftcomms_comm* comm, void* stream, int32_t mark);

#ifdef __cplusplus
}
#endif

#endif /* RAFTCOMMS_H */

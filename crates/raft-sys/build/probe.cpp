// Expanded (not compiled) by build.rs: the version macros of the headers the shim is built with.
#include <cuda/std/version>
#include <cuda_runtime_api.h>
#include <raft/version_config.hpp>
#include <rmm/version_config.hpp>
#include <rmm/detail/export.hpp>

#define RAFTRS_STR2(x) #x
#define RAFTRS_STR(x)  RAFTRS_STR2(x)
raftrs_probe RAFT_VERSION_MAJOR RAFT_VERSION_MINOR RAFT_VERSION_PATCH RMM_VERSION_MAJOR RMM_VERSION_MINOR RMM_VERSION_PATCH CCCL_VERSION CUDART_VERSION RAFTRS_STR(RMM_ABI_NAMESPACE)

//! Which kind of RMM resource a [`MemoryResource`](crate::MemoryResource) is: the shim's numbers,
//! named.
use raft_sys as sys;

/// Which kind of RMM memory resource a [`MemoryResource`](crate::MemoryResource) is.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryResourceKind {
    /// `rmm::mr::cuda_memory_resource`: RMM's initial resource, cudaMalloc/cudaFree.
    Cuda,
    /// `rmm::mr::cuda_async_memory_resource`: a stream-ordered cudaMallocAsync pool.
    CudaAsync,
    /// `rmm::mr::managed_memory_resource`: cudaMallocManaged.
    Managed,
    /// `rmm::mr::statistics_resource_adaptor` over another resource.
    Statistics,
    /// Any other resource a library or the user installed.
    Other,
    /// `rmm::mr::pool_memory_resource`: a coalescing pool over another resource.
    Pool,
    /// `rmm::mr::arena_memory_resource`: per-thread arenas over another resource.
    Arena,
    /// `rmm::mr::binning_memory_resource`: fixed-size bins over another resource.
    Binning,
    /// `rmm::mr::limiting_resource_adaptor`: refuses allocations past a byte limit.
    Limiting,
    /// `rmm::mr::tracking_resource_adaptor`: remembers every live allocation.
    Tracking,
    /// `rmm::mr::logging_resource_adaptor`: RMM's CSV log of every allocation and free.
    Logging,
    /// `rmm::mr::failure_callback_resource_adaptor`: a callback decides whether to retry.
    FailureCallback,
    /// `rmm::mr::thread_safe_resource_adaptor`: a mutex around another resource.
    ThreadSafe,
    /// `rmm::mr::pinned_host_memory_resource`: page-locked host memory the device reaches.
    PinnedHost,
}

impl MemoryResourceKind {
    pub(crate) fn from_raw(v: i32) -> Self {
        match v {
            sys::RAFTRS_MR_CUDA => MemoryResourceKind::Cuda,
            sys::RAFTRS_MR_CUDA_ASYNC => MemoryResourceKind::CudaAsync,
            sys::RAFTRS_MR_MANAGED => MemoryResourceKind::Managed,
            sys::RAFTRS_MR_STATISTICS => MemoryResourceKind::Statistics,
            sys::RAFTRS_MR_POOL => MemoryResourceKind::Pool,
            sys::RAFTRS_MR_ARENA => MemoryResourceKind::Arena,
            sys::RAFTRS_MR_BINNING => MemoryResourceKind::Binning,
            sys::RAFTRS_MR_LIMITING => MemoryResourceKind::Limiting,
            sys::RAFTRS_MR_TRACKING => MemoryResourceKind::Tracking,
            sys::RAFTRS_MR_LOGGING => MemoryResourceKind::Logging,
            sys::RAFTRS_MR_FAILURE_CALLBACK => MemoryResourceKind::FailureCallback,
            sys::RAFTRS_MR_THREAD_SAFE => MemoryResourceKind::ThreadSafe,
            sys::RAFTRS_MR_PINNED_HOST => MemoryResourceKind::PinnedHost,
            _ => MemoryResourceKind::Other,
        }
    }
}

impl std::fmt::Display for MemoryResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemoryResourceKind::Cuda => "rmm::mr::cuda_memory_resource",
            MemoryResourceKind::CudaAsync => "rmm::mr::cuda_async_memory_resource",
            MemoryResourceKind::Managed => "rmm::mr::managed_memory_resource",
            MemoryResourceKind::Statistics => "rmm::mr::statistics_resource_adaptor",
            MemoryResourceKind::Other => "another memory resource",
            MemoryResourceKind::Pool => "rmm::mr::pool_memory_resource",
            MemoryResourceKind::Arena => "rmm::mr::arena_memory_resource",
            MemoryResourceKind::Binning => "rmm::mr::binning_memory_resource",
            MemoryResourceKind::Limiting => "rmm::mr::limiting_resource_adaptor",
            MemoryResourceKind::Tracking => "rmm::mr::tracking_resource_adaptor",
            MemoryResourceKind::Logging => "rmm::mr::logging_resource_adaptor",
            MemoryResourceKind::FailureCallback => "rmm::mr::failure_callback_resource_adaptor",
            MemoryResourceKind::ThreadSafe => "rmm::mr::thread_safe_resource_adaptor",
            MemoryResourceKind::PinnedHost => "rmm::mr::pinned_host_memory_resource",
        })
    }
}

//! RMM memory resources as owned Rust values, RMM's per-device resource, and the default this
//! library installs.
//!
//! RMM's current resource is per device and shared by every library in the process. The first
//! resources made on a device replace RMM's initial `cuda_memory_resource` (cudaMalloc, which
//! synchronises the device) with `cuda_async_memory_resource` (a cudaMallocAsync pool). Any
//! other resource installed, before or after, is left alone; a plain `cuda_memory_resource`
//! installed beforehand equals the initial one and is replaced. A device without memory-pool
//! support keeps the initial resource.
//!
//! Every allocation holds (a shared copy of) the resource that made it: replacing a device's
//! resource, from Rust or from any other library in the process, never invalidates a live
//! [`DeviceVec`](crate::DeviceVec). One limit: a resource another library installs *by
//! reference* (C++ `rmm::mr::set_current_device_resource_ref` with an object it owns, Python
//! `rmm.mr.set_current_device_resource`) is copied as that reference, and the object behind it
//! lives only as long as that library keeps it: it must outlive the arrays allocated from it,
//! as RMM requires of every user of that object.
//!
//! The API is the value: [`MemoryResource`] (made, adapted, asked), [`current`], [`set_current`]
//! and [`reinitialize`]. The names of earlier issues (`current_memory_resource`,
//! `set_memory_resource`, `reset_memory_resource`, `enable_memory_statistics`,
//! `memory_statistics`) stay as deprecated aliases over it.
//!
//! Files, bottom-up: `kind.rs` (the kinds), `resource.rs` (the value, its options and facts, the
//! teardown registration), `options.rs` ([`RmmOptions`]), `current.rs` (the per-device current
//! resource and the default), `deprecated.rs` (the aliases). None names this file.
mod current;
pub(crate) mod deprecated;
mod kind;
mod options;
mod resource;

pub use current::{current, installed_default, reinitialize, rmm_map_address, set_current, trim_retired_pools, RetiredPoolsTrim};
#[allow(deprecated)]
pub use deprecated::{current_memory_resource, enable_memory_statistics, memory_statistics, reset_memory_resource, set_memory_resource};
pub use kind::MemoryResourceKind;
pub use options::{Allocator, Base, RmmOptions};
pub use resource::{
    ArenaOptions, AsyncPoolBytes, AsyncPoolOptions, LimitUsage, MemoryResource, MemoryStatistics, PoolOptions, TrackedAllocations,
    MAX_BIN_EXPONENT,
};

pub(crate) use current::{ensure_default, register_teardown_releasing};

//! cuVS on raft-rs resources: lend a [`DeviceResources`] to cuVS without giving it up.
//!
//! ```no_run
//! # fn main() -> raft_core::Result<()> {
//! use raft_core::{DeviceMatrix, DeviceResources, Layout};
//! use raft_cuvs::{BruteForceIndex, Metric, Neighbors};
//! let res = DeviceResources::new()?;
//! let dataset = DeviceMatrix::from_host(&res, &vec![0.5f32; 1000 * 16], 1000, 16, Layout::RowMajor)?;
//! let queries = DeviceMatrix::from_host(&res, &vec![0.5f32; 10 * 16], 10, 16, Layout::RowMajor)?;
//! let index = BruteForceIndex::build(dataset, Metric::L2Expanded)?; // owns its dataset
//! let Neighbors { neighbors, distances } = index.search(queries.view(), 5)?; // 10 × 5 each
//! assert_eq!((neighbors.rows(), neighbors.cols()), (10, 5));
//! // Your own cuVS calls on the very same resources: the closure's `?`s flow out of `with_cuvs`.
//! let stream = raft_cuvs::with_cuvs(&res, |cuvs| cuvs.stream())?;
//! assert_eq!(stream.cu_stream(), res.stream()?.cu_stream()); // cuVS runs on our stream
//! # let _ = distances; Ok(()) }
//! ```
//!
//! cuVS (vector search: brute force, CAGRA, IVF-Flat, IVF-PQ) runs on RAFT's resources: its C
//! API takes them as `cuvsResources_t`, a `raft::resources*`. This crate lends the very
//! `raft::resources` behind a [`DeviceResources`] to cuVS, for the duration of a call, so cuVS's
//! kernels run on that stream, with those cuBLAS handles and RMM's memory resource of the device
//! (the one raft-rs installs and counts); nothing is copied, and cuVS never destroys them.
//!
//! | item | what |
//! | --- | --- |
//! | [`with_cuvs`], [`CuvsResources`] | the borrowed `cuvsResources_t`, for cuVS calls of your own |
//! | [`brute_force_knn`], [`BruteForceIndex`], [`Neighbors`] | exact k-NN search |
//! | [`CagraIndex`], [`CagraIndexParams`], [`CagraSearchParams`] | CAGRA graph index: build and search |
//! | [`load`], [`version`], [`Version`] | cuVS's library, loaded at run time |
//! | [`sys`] | the raw bindings and the loader |
//!
//! Matrices are raft-core's one matrix model: an index owns its dataset as a [`DeviceMatrix`],
//! queries are a [`MatrixView`] (of a matrix, an array, or a range of its rows), results are
//! matrices. Views are checked against their arrays when made; every call checks the rest before
//! any native call (row-major without gaps, as cuVS reads DLPack tensors; as many columns as the
//! dataset; `1 ≤ k ≤ rows`; the resources' device): cuVS takes DLPack shapes on trust. Arrays are
//! lent to cuVS as DLPack tensors for one call only. Indexes live on their dataset's resources,
//! whose clone they hold.
//!
//! [`DeviceMatrix`]: raft_core::DeviceMatrix
//! [`MatrixView`]: raft_core::MatrixView
//!
//! # Loading cuVS
//! `libcuvs_c.so` is loaded at the first call ([`sys::api`] says where it looks), so a binary
//! built with this crate starts without it, and the first call returns a `Cuda` error that says
//! what is missing. `cargo xtask deps --cuvs` fetches cuVS 26.08.1 and its libraries beside the
//! raft-rs stack, where the build finds them. cuVS 26.08 needs nvJitLink 13.3 or newer, and a
//! process holds one. The pinned stack ships 13.3; for a stack with an older one (13.2) the
//! raft-rs shim, whenever it is loaded, binds cuVS's when it can find it (see [`sys::api`]), so
//! the order of the first calls does not matter. Calling [`load`] first still orders cuVS's
//! static destructors after raft-rs's exit teardown.
//!
mod brute_force;
mod cagra;
mod cagra_kernels;
mod check;
mod distance;
mod dlpack;
mod lent;
mod resources;
mod result;
pub mod sys;
mod version;

pub use brute_force::{brute_force_knn, BruteForceIndex, Neighbors};
pub use cagra::{CagraBuildAlgo, CagraIndex, CagraIndexParams, CagraSearchParams};
pub use cagra_kernels::CagraSearchAlgo;
pub use distance::Metric;
pub use lent::CuvsResources;
pub use raft_core::DeviceResources;
pub use resources::with_cuvs;
pub use version::Version;

/// Loads cuVS now (otherwise the first call does), and says where from.
///
/// Not needed for the nvJitLink cuVS needs (the raft-rs shim binds it whenever it can find it,
/// see [`sys::api`]); called before the first raft call, it also orders cuVS's static
/// destructors after raft-rs's exit teardown, and it is where a missing cuVS shows first.
///
/// # Errors
/// `Cuda` when `libcuvs_c.so` or a library it needs cannot be loaded, with where it looked and
/// what to set.
pub fn load() -> raft_core::Result<&'static std::path::Path> {
    result::api("raft_cuvs::load")?;
    Ok(sys::loaded_from().expect("loaded just above"))
}

/// The version of the loaded cuVS (`cuvsVersionGet`), e.g. 26.08.01.
pub fn version() -> raft_core::Result<Version> {
    result::version("raft_cuvs::version")
}

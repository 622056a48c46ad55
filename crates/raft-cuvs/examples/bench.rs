//! Brute-force search throughput: cuVS on lent raft-rs resources against cuVS's own handle
//! (`cuvsResourcesCreate`, what the `cuvs` crate's `Resources::new()` makes), in the same run.
//!
//! ```text
//! cargo run -p raft-cuvs --example bench --release [-- ROWS DIM QUERIES K ITERS ROUNDS]
//! ```
//! (defaults 100000 128 1000 10 20 7). Three ways, over the same rows, queries and result arrays:
//!
//! | way | handle | stream | per search |
//! | --- | --- | --- | --- |
//! | `lent` | the `raft::resources` of a `DeviceResources`, through `with_cuvs` | the resources' own | `cuvsBruteForceSearch` |
//! | `own` | `cuvsResourcesCreate` | the per-thread default stream | `cuvsBruteForceSearch` |
//! | `safe` | the same `DeviceResources` | the resources' own | `BruteForceIndex::search`: checks, two new result arrays |
//!
//! Each round queues `ITERS` searches of each way, then waits for its stream once; rounds
//! alternate the ways; the median round is reported. The raw calls double as the example of the
//! raw-pointer route (docs/CUVS.md). Without a GPU (or cuVS) it prints why and exits 0; under
//! `RAFT_REQUIRE_GPU=1`, 1.
use raft_core::{DeviceMatrix, DeviceResources, DeviceVec, Layout, Result};
use raft_cuvs::sys::{self, CuvsApi};
use raft_cuvs::{with_cuvs, BruteForceIndex, Metric};
use std::time::{Duration, Instant};

/// A row-major DLPack view of device memory, for the raw calls.
struct Dl {
    tensor: sys::DLManagedTensor,
    shape: Box<[i64; 2]>,
}

impl Dl {
    fn new(data: u64, device: usize, rows: usize, cols: usize, code: sys::DLDataTypeCode, bits: u8) -> Dl {
        let mut shape = Box::new([rows as i64, cols as i64]);
        let tensor = sys::DLManagedTensor {
            dl_tensor: sys::DLTensor {
                data: data as *mut std::ffi::c_void,
                device: sys::DLDevice { device_type: sys::DLDeviceType::kDLCUDA, device_id: device as i32 },
                ndim: 2,
                dtype: sys::DLDataType { code: code.0 as u8, bits, lanes: 1 },
                shape: shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: None,
        };
        Dl { tensor, shape }
    }

    fn ptr(&mut self) -> *mut sys::DLManagedTensor {
        self.tensor.dl_tensor.shape = self.shape.as_mut_ptr();
        &mut self.tensor
    }
}

fn ok(api: &CuvsApi, what: &str, status: sys::cuvsError_t) {
    if status != sys::cuvsError_t::CUVS_SUCCESS {
        // SAFETY: NULL or a thread-local C string valid until the next cuVS call on this thread.
        let text = unsafe {
            let p = api.cuvsGetLastErrorText();
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        panic!("{what} failed: {text}");
    }
}

/// A brute-force index built on `handle` over the `rows × dim` floats at `dataset`.
///
/// # Safety
/// `handle` is a live `cuvsResources_t` of `device`; `dataset` holds `rows × dim` floats of that
/// device, ready on the handle's stream and alive until the index is destroyed.
unsafe fn build(api: &CuvsApi, handle: usize, dataset: u64, device: usize, rows: usize, dim: usize) -> sys::cuvsBruteForceIndex_t {
    let mut index = std::ptr::null_mut();
    // SAFETY: writes a new index through a valid pointer; the build's arguments are the caller's.
    unsafe {
        ok(api, "cuvsBruteForceIndexCreate", api.cuvsBruteForceIndexCreate(&mut index));
        let mut d = Dl::new(dataset, device, rows, dim, sys::DLDataTypeCode::kDLFloat, 32);
        ok(api, "cuvsBruteForceBuild", api.cuvsBruteForceBuild(handle, d.ptr(), sys::cuvsDistanceType::L2Expanded, 0.0, index));
    }
    index
}

/// Raw search arguments: queries in, neighbours and distances out.
struct Io {
    queries: Dl,
    neighbors: Dl,
    distances: Dl,
}

/// Queues `iters` searches on `handle`, waits for its stream, returns the time.
///
/// # Safety
/// `handle` and `index` are live, of one device; the tensors describe live arrays of matching
/// shapes on it.
unsafe fn raw_round(api: &CuvsApi, handle: usize, index: sys::cuvsBruteForceIndex_t, io: &mut Io, iters: usize) -> Duration {
    let filter = sys::cuvsFilter { addr: 0, type_: sys::cuvsFilterType::NO_FILTER };
    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY: the caller's.
        ok(api, "cuvsBruteForceSearch", unsafe {
            api.cuvsBruteForceSearch(handle, index, io.queries.ptr(), io.neighbors.ptr(), io.distances.ptr(), filter)
        });
    }
    // SAFETY: a live handle.
    ok(api, "cuvsStreamSync", unsafe { api.cuvsStreamSync(handle) });
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn uniform(state: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

fn unusable() -> Option<String> {
    // cuVS first, before the first raft call: the raft-rs shim then binds cuVS's nvJitLink.
    if let Err(e) = raft_cuvs::load() {
        return Some(e.to_string());
    }
    match raft_core::device_count() {
        Ok(0) => Some("no CUDA device".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn run(args: &[usize]) -> Result<()> {
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (rows, dim, n_queries, k, iters, rounds) = (arg(0, 100_000), arg(1, 128), arg(2, 1000), arg(3, 10), arg(4, 20), arg(5, 7));
    let api = raft_cuvs::sys::api().map_err(|e| raft_core::Error::logic("bench", e.to_string()))?;
    let res = DeviceResources::new()?;
    let device = res.device();
    let stream = res.stream()?;
    // The own handle is made on the current device: this one.
    res.context().bind_to_thread()?;
    let mut seed = 7;
    let data = uniform(&mut seed, rows * dim);
    let dataset = DeviceVec::from_host(&res, &data)?;
    let queries = DeviceVec::from_host(&res, &uniform(&mut seed, n_queries * dim))?;
    let outputs =
        || -> Result<(DeviceVec<i64>, DeviceVec<f32>)> { Ok((DeviceVec::new(&res, n_queries * k)?, DeviceVec::new(&res, n_queries * k)?)) };
    let (lent_ids, lent_d) = outputs()?;
    let (own_ids, own_d) = outputs()?;
    res.sync()?; // the own handle's stream does not wait for res's: the inputs are ready now
                 // SAFETY (these four): addresses of live arrays, used only while they live (to the end of run).
    let addr = |p: *const std::ffi::c_void| p as u64;
    let (d_addr, q_addr) = unsafe { (addr(dataset.as_raw().cast()), addr(queries.as_raw().cast())) };
    let io = |ids: &DeviceVec<i64>, d: &DeviceVec<f32>| Io {
        queries: Dl::new(q_addr, device, n_queries, dim, sys::DLDataTypeCode::kDLFloat, 32),
        // SAFETY: as above; the searches write the outputs, which nothing else touches meanwhile.
        neighbors: Dl::new(unsafe { addr(ids.as_raw().cast()) }, device, n_queries, k, sys::DLDataTypeCode::kDLInt, 64),
        distances: Dl::new(unsafe { addr(d.as_raw().cast()) }, device, n_queries, k, sys::DLDataTypeCode::kDLFloat, 32),
    };
    let (mut lent_io, mut own_io) = (io(&lent_ids, &lent_d), io(&own_ids, &own_d));

    let mut own: sys::cuvsResources_t = 0;
    // SAFETY: writes a new handle through a valid pointer.
    ok(api, "cuvsResourcesCreate", unsafe { api.cuvsResourcesCreate(&mut own) });
    // SAFETY: a live handle of this device; the dataset is ready (synced above) and lives to the
    // end of run, after the index is destroyed.
    let own_index = unsafe { build(api, own, d_addr, device, rows, dim) };
    let safe_index = BruteForceIndex::build(DeviceMatrix::from_host(&res, &data, rows, dim, Layout::RowMajor)?, Metric::L2Expanded)?;

    // The lent handle is the same `raft::resources*` at every lend; the index built on it is
    // used only inside lends (its buffers are ordered on res's stream).
    // SAFETY: the lent handle is live for the closure; the dataset is ready on its stream.
    let lent_index = with_cuvs(&res, |cuvs| Ok(unsafe { build(api, cuvs.as_raw(), d_addr, device, rows, dim) }))?;
    let (mut lent_t, mut own_t, mut safe_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut safe_last = None;
    // One round each to warm up (cuBLAS handles, kernels), not counted.
    for round in 0..=rounds {
        // SAFETY: live handles and indexes of this device (the lent one only inside the lend);
        // the tensors describe live arrays of the shapes searched.
        let l = with_cuvs(&res, |cuvs| Ok(unsafe { raw_round(api, cuvs.as_raw(), lent_index, &mut lent_io, iters) }))?;
        // SAFETY: as above.
        let o = unsafe { raw_round(api, own, own_index, &mut own_io, iters) };
        let start = Instant::now();
        for _ in 0..iters {
            safe_last = Some(safe_index.search(queries.matrix(n_queries, dim, Layout::RowMajor)?, k)?);
        }
        res.sync()?;
        let s = start.elapsed();
        if round > 0 {
            lent_t.push(l);
            own_t.push(o);
            safe_t.push(s);
        }
    }
    // SAFETY: built on the lent handle, destroyed once, while lent.
    with_cuvs(&res, |_| {
        ok(api, "cuvsBruteForceIndexDestroy", unsafe { api.cuvsBruteForceIndexDestroy(lent_index) });
        Ok(())
    })?;
    // SAFETY: built on `own`, destroyed once; then the handle, which nothing uses any more.
    unsafe {
        ok(api, "cuvsBruteForceIndexDestroy", api.cuvsBruteForceIndexDestroy(own_index));
        ok(api, "cuvsResourcesDestroy", api.cuvsResourcesDestroy(own));
    }

    // The three ways found the same neighbours.
    let (lent_ids, own_ids) = (lent_ids.to_host()?, own_ids.to_host()?);
    let safe_ids = safe_last.map(|found| found.neighbors.to_host()).transpose()?.unwrap_or_default();
    let agree = |a: &[i64], b: &[i64]| a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len().max(1) as f64;
    println!(
        "brute force, {rows}×{dim} f32 rows, {n_queries} queries, k = {k}, {iters} searches per round, median of {rounds} rounds, device {device} (stream {:#x})",
        stream.cu_stream() as usize
    );
    println!("| way | per search | queries/s | vs lent |");
    println!("| --- | --- | --- | --- |");
    let lent_m = median(lent_t);
    for (way, m) in [
        ("lent (with_cuvs, raw calls)", lent_m),
        ("own (cuvsResourcesCreate, raw calls)", median(own_t)),
        ("safe (BruteForceIndex::search)", median(safe_t)),
    ] {
        let per = m.as_secs_f64() / iters as f64;
        println!("| {way} | {:.1} µs | {:.0} | {:.3}x |", per * 1e6, n_queries as f64 / per, m.as_secs_f64() / lent_m.as_secs_f64());
    }
    println!("ids equal to lent's: own {:.4}, safe {:.4}", agree(&lent_ids, &own_ids), agree(&lent_ids, &safe_ids));
    drop(safe_index);
    res.release()
}

fn main() -> std::process::ExitCode {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    if let Some(why) = unusable() {
        println!("bench: skipped: {why}");
        let required = std::env::var("RAFT_REQUIRE_GPU").as_deref() == Ok("1");
        return if required { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS };
    }
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! k-nearest neighbours with cuVS on raft-rs resources: exact (brute force) and approximate
//! (CAGRA) search of the same rows, on one `DeviceResources` lent to cuVS, then the lent handle
//! itself.
//!
//! ```text
//! cargo run -p raft-cuvs --example knn --release
//! ```
//! Without a GPU (or without cuVS) it prints why and exits 0; under `RAFT_REQUIRE_GPU=1`, 1.
use raft_core::{DeviceMatrix, DeviceResources, Layout, Result};
use raft_cuvs::{brute_force_knn, with_cuvs, CagraIndex, CagraIndexParams, CagraSearchParams, Neighbors};

const N_ROWS: usize = 20_000;
const DIM: usize = 64;
const N_QUERIES: usize = 5;
const K: usize = 5;

/// A seeded generator (SplitMix64), uniform in [0, 1).
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

/// Why this machine cannot run the example, if it cannot: cuVS missing, or no GPU.
fn unusable() -> Option<String> {
    // cuVS first, before the first raft call: the raft-rs shim then binds cuVS's nvJitLink.
    let from = match raft_cuvs::load() {
        Ok(from) => from,
        Err(e) => return Some(e.to_string()),
    };
    let version = raft_cuvs::version().ok()?;
    println!("cuVS {version} from {}", from.display());
    match raft_core::device_count() {
        Ok(0) => Some("no CUDA device".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn run() -> Result<()> {
    let res = DeviceResources::new()?;
    let mut seed = 42;
    let rows = uniform(&mut seed, N_ROWS * DIM);
    let dataset = DeviceMatrix::from_host(&res, &rows, N_ROWS, DIM, Layout::RowMajor)?;
    let queries = DeviceMatrix::from_host(&res, &uniform(&mut seed, N_QUERIES * DIM), N_QUERIES, DIM, Layout::RowMajor)?;

    // Exact: cuVS's brute force, on res's stream, cuBLAS handle and memory pool.
    let Neighbors { neighbors: ids, distances } = brute_force_knn(&res, dataset.view(), queries.view(), K)?;
    let (exact_ids, exact_d) = (ids.to_host()?, distances.to_host()?);

    // Approximate: a CAGRA index owning the dataset, searched on the same resources.
    let index = CagraIndex::build(dataset, &CagraIndexParams::default())?;
    let approx_ids = index.search(queries.view(), K, &CagraSearchParams::default())?.neighbors.to_host()?;

    for q in 0..N_QUERIES {
        let row = q * K..(q + 1) * K;
        let found = approx_ids[row.clone()].iter().filter(|i| exact_ids[row.clone()].contains(i)).count();
        println!(
            "query {q}: exact {:?} (squared L2 {:.3}..{:.3}), CAGRA {:?}: {found}/{K}",
            &exact_ids[row.clone()],
            exact_d[row.start],
            exact_d[row.end - 1],
            &approx_ids[row]
        );
    }

    // The lent handle: cuVS's view of these resources is these resources.
    let (stream, device) = with_cuvs(&res, |cuvs| Ok((cuvs.stream()?, cuvs.device_id()?)))?;
    println!(
        "cuVS ran on stream {:#x} of device {device}: res's own stream is {:#x}",
        stream.cu_stream() as usize,
        res.stream()?.cu_stream() as usize
    );
    index.release()?;
    res.release()
}

fn main() -> std::process::ExitCode {
    if let Some(why) = unusable() {
        println!("knn: skipped: {why}");
        let required = std::env::var("RAFT_REQUIRE_GPU").as_deref() == Ok("1");
        return if required { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS };
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("knn: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

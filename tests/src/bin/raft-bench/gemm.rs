//! GEMM through the resources' cuBLAS handle against cudarc's cuBLAS on the same stream.
use crate::measure::measure_turns;
use crate::table::Table;
use cudarc::driver::CudaStream;
use raft::{DeviceResources, DeviceVec, Layout};
use std::sync::Arc;

/// Case 8: GEMM 8192³ fp32 through our handle, and through cudarc's cuBLAS on the same stream.
pub fn rows(t: &mut Table, r: &DeviceResources, stream: &Arc<CudaStream>) {
    let n = 8192usize;
    let flops = 2.0 * (n as f64).powi(3);
    let host: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let a = DeviceVec::from_host(r, &host).unwrap();
    let b = DeviceVec::from_host(r, &host).unwrap();
    let mut c = DeviceVec::<f32>::zeros(r, n * n).unwrap();
    let blas = cudarc::cublas::CudaBlas::new(stream.clone()).unwrap();
    let a_c = stream.clone_htod(&host).unwrap();
    let b_c = stream.clone_htod(&host).unwrap();
    let mut c_c = stream.alloc_zeros::<f32>(n * n).unwrap();
    let cfg = cudarc::cublas::GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: 1.0f32,
        lda: n as i32,
        ldb: n as i32,
        beta: 0.0,
        ldc: n as i32,
    };
    // In turns: one turn of 50 calls each (about a second a side on an H200).
    let [ours, theirs] = measure_turns(
        3,
        50,
        [
            &mut || {
                raft::gemm(
                    1.0f32,
                    a.matrix(n, n, Layout::ColMajor).unwrap(),
                    b.matrix(n, n, Layout::ColMajor).unwrap(),
                    0.0,
                    c.matrix_mut(n, n, Layout::ColMajor).unwrap(),
                )
                .unwrap();
                r.sync().unwrap();
            },
            &mut || {
                // SAFETY: the three buffers hold n×n floats, as the config says.
                unsafe { cudarc::cublas::Gemm::gemm(&blas, cfg, &a_c, &b_c, &mut c_c) }.unwrap();
                stream.synchronize().unwrap();
            },
        ],
    );
    t.add(
        "GEMM 8192³ fp32 (sync included, in turns)",
        "raft::gemm on the resources' handle",
        ours,
        vec![("cudarc CudaBlas::gemm, same stream", theirs)],
        "cudarc CudaBlas::gemm, same stream",
        "~1.0x (same cuBLAS)",
        |a, b| a <= 1.05 * b,
    );
    t.notes.push(format!(
        "GEMM 8192³ fp32: ours {:.1} TFLOP/s, cudarc {:.1} TFLOP/s",
        flops / ours.median_ns / 1e3,
        flops / theirs.median_ns / 1e3
    ));
    drop((a, b, c, a_c, b_c, c_c, blas));
}

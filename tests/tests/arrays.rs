//! Device arrays and real work on the resources: copies, views, GEMM against a CPU reference.
use raft::{gemm, DeviceMatrix, DeviceResources, DeviceVec, ErrorKind, Layout};
use raft_tests::require_gpu;

/// A small deterministic generator (xorshift), so every run draws fresh-looking but reproducible data.
fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// C = A·B on the CPU in f64; A is m×k, B k×n, all row-major.
fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += aip * b[p * n + j];
            }
        }
    }
    c
}

fn to_layout(rm: &[f64], rows: usize, cols: usize, layout: Layout) -> Vec<f64> {
    match layout {
        Layout::RowMajor => rm.to_vec(),
        Layout::ColMajor => (0..rows * cols).map(|idx| rm[(idx % rows) * cols + idx / rows]).collect(),
    }
}

fn rel_error(out: &[f64], reference: &[f64]) -> f64 {
    let num: f64 = out.iter().zip(reference).map(|(o, r)| (o - r).powi(2)).sum();
    let den: f64 = reference.iter().map(|r| r * r).sum();
    (num / den).sqrt()
}

#[test]
fn copies_round_trip_and_zero_fill() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let host: Vec<i32> = (0..100_000).collect();
    let mut v = DeviceVec::from_host(&r, &host).unwrap();
    assert_eq!(v.len(), host.len());
    assert_eq!(v.to_host().unwrap(), host);
    v.fill_zero().unwrap();
    assert!(v.to_host().unwrap().iter().all(|x| *x == 0));
    let empty = DeviceVec::<f32>::zeros(&r, 0).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.to_host().unwrap(), Vec::<f32>::new());
    // A copy as a job: the array travels to the worker and back.
    let (back, v) = v.into_host_job().unwrap().join().unwrap().unwrap();
    assert_eq!(back.len(), host.len());
    assert_eq!(v.resources(), &r);
}

#[test]
fn arrays_keep_their_stream_and_free_in_order_after_release() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let v = DeviceVec::<f32>::zeros(&r, 1 << 20).unwrap();
    let stream = v.stream().cu_stream();
    assert_eq!(stream, r.stream().unwrap().cu_stream());
    r.release().unwrap();
    assert_eq!(v.to_host().unwrap_err().kind(), ErrorKind::Logic);
    drop(v); // frees on the stream it still holds: no crash, no error
}

fn check_gemm<T: raft::GemmScalar + Into<f64> + From<f32>>(m: usize, k: usize, n: usize, la: Layout, lb: Layout, lc: Layout, tol: f64) {
    let r = DeviceResources::new().unwrap();
    let a64 = random(m * k, 1 + m as u64);
    let b64 = random(k * n, 2 + n as u64);
    let cast = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(|x| T::from(x as f32)).collect() };
    let a = DeviceVec::from_host(&r, &cast(to_layout(&a64, m, k, la))).unwrap();
    let b = DeviceVec::from_host(&r, &cast(to_layout(&b64, k, n, lb))).unwrap();
    // Poison C: beta = 0 must overwrite every element.
    let mut c = DeviceVec::from_host(&r, &vec![T::from(f32::NAN); m * n]).unwrap();
    gemm(T::from(1.0), a.matrix(m, k, la).unwrap(), b.matrix(k, n, lb).unwrap(), T::from(0.0), c.matrix_mut(m, n, lc).unwrap()).unwrap();
    r.sync().unwrap();
    let out: Vec<f64> = c.to_host().unwrap().into_iter().map(Into::into).collect();
    // Compare in row-major order against an f64 reference computed on the f32-rounded inputs.
    let a_in: Vec<f64> = a64.iter().map(|x| *x as f32 as f64).collect();
    let b_in: Vec<f64> = b64.iter().map(|x| *x as f32 as f64).collect();
    let want = to_layout(&reference(&a_in, &b_in, m, k, n), m, n, lc);
    assert!(out.iter().all(|x| x.is_finite()), "every element written");
    let err = rel_error(&out, &want);
    assert!(err < tol, "{m}x{k}x{n} {la:?}/{lb:?}/{lc:?}: relative error {err:e}");
    assert!(r.has_handle(raft::HandleKind::Cublas).unwrap(), "the resources' own cuBLAS handle did the work");
}

#[test]
fn sgemm_matches_a_cpu_reference_in_every_layout() {
    require_gpu!();
    for (la, lb, lc) in [
        (Layout::RowMajor, Layout::RowMajor, Layout::RowMajor),
        (Layout::ColMajor, Layout::ColMajor, Layout::ColMajor),
        (Layout::RowMajor, Layout::ColMajor, Layout::ColMajor),
        (Layout::ColMajor, Layout::RowMajor, Layout::RowMajor),
    ] {
        check_gemm::<f32>(67, 45, 31, la, lb, lc, 1e-5);
    }
    check_gemm::<f32>(512, 256, 384, Layout::RowMajor, Layout::RowMajor, Layout::RowMajor, 1e-5);
}

#[test]
fn dgemm_matches_a_cpu_reference() {
    require_gpu!();
    check_gemm::<f64>(129, 70, 33, Layout::RowMajor, Layout::RowMajor, Layout::RowMajor, 1e-12);
    check_gemm::<f64>(33, 70, 129, Layout::ColMajor, Layout::RowMajor, Layout::ColMajor, 1e-12);
}

#[test]
fn gemm_refuses_shapes_that_do_not_chain_and_mixed_resources() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let other = DeviceResources::new().unwrap();
    let a = DeviceVec::<f32>::zeros(&r, 6).unwrap();
    let b = DeviceVec::<f32>::zeros(&r, 6).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&r, 4).unwrap();
    let view = a.matrix(2, 3, Layout::RowMajor).unwrap();
    assert_eq!((view.rows(), view.cols(), view.layout()), (2, 3, Layout::RowMajor));
    assert_eq!((view.offset(), view.ld(), view.is_contiguous()), (0, 3, true), "the whole array, dense");
    assert_eq!(a.matrix(3, 3, Layout::RowMajor).unwrap_err().kind(), ErrorKind::Logic, "a shape that is not the array's");
    let e = gemm(
        1.0,
        a.matrix(2, 3, Layout::RowMajor).unwrap(),
        b.matrix(2, 3, Layout::RowMajor).unwrap(),
        0.0,
        c.matrix_mut(2, 2, Layout::RowMajor).unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    let b2 = DeviceVec::<f32>::zeros(&other, 6).unwrap();
    let e = gemm(
        1.0,
        a.matrix(2, 3, Layout::RowMajor).unwrap(),
        b2.matrix(3, 2, Layout::RowMajor).unwrap(),
        0.0,
        c.matrix_mut(2, 2, Layout::RowMajor).unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(!r.has_handle(raft::HandleKind::Cublas).unwrap(), "refused before reaching the GPU");
}

/// Typed interop: cudarc's copies take a `DeviceVec` directly (`DevicePtr` / `DevicePtrMut`),
/// on the array's own stream and on another one, which is ordered after the array's stream and
/// synchronised before the copy call returns; the raw address is the one cudarc sees.
#[test]
fn cudarc_takes_device_vecs_directly_on_any_stream() {
    require_gpu!();
    use cudarc::driver::DevicePtr;
    let r = DeviceResources::new().unwrap();
    let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let mut v = DeviceVec::from_host(&r, &host).unwrap();
    let own = r.stream().unwrap();
    assert_eq!(own.clone_dtoh(&v).unwrap(), host);
    let other = r.context().new_stream().unwrap();
    assert_eq!(other.clone_dtoh(&v).unwrap(), host);
    let doubled: Vec<f32> = host.iter().map(|x| 2.0 * x).collect();
    other.memcpy_htod(&doubled, &mut v).unwrap();
    assert_eq!(v.to_host().unwrap(), doubled, "a write on another stream is seen on the array's own");
    let theirs = other.clone_htod(&host).unwrap();
    other.memcpy_dtod(&theirs, &mut v).unwrap();
    assert_eq!(v.to_host().unwrap(), host);
    let (address, _guard) = v.device_ptr(&own);
    // SAFETY: only the address is compared; nothing is read or written through it.
    assert_eq!(unsafe { v.as_raw() } as u64, address);
}

/// A GEMM on sub-blocks of larger matrices: each operand reaches cuBLAS with its own offset and
/// leading dimension (the old `gemm` passed the dense one, so a block could not be described),
/// the product matches a CPU reference, and C's elements outside the block are left alone.
#[test]
fn gemm_on_sub_blocks_matches_a_cpu_reference() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let (m, k, n) = (4, 5, 3);
    // A: rows 2..6, columns 3..8 of a row-major 8×10 matrix.
    let big_a = random(8 * 10, 11);
    let a_block: Vec<f64> = (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| big_a[(2 + i) * 10 + 3 + p]).collect();
    // B: rows 1..6, columns 2..5 of a column-major 7×9 matrix.
    let big_b = random(7 * 9, 12);
    let b_block: Vec<f64> = (0..k).flat_map(|p| (0..n).map(move |j| (p, j))).map(|(p, j)| big_b[(2 + j) * 7 + 1 + p]).collect();
    let f = |v: &[f64]| -> Vec<f32> { v.iter().map(|x| *x as f32).collect() };
    let a = DeviceVec::from_host(&r, &f(&big_a)).unwrap();
    let b = DeviceVec::from_host(&r, &f(&big_b)).unwrap();
    // C: rows 1..5, columns 2..5 of a row-major 6×7 matrix filled with a sentinel.
    let mut c = DeviceVec::from_host(&r, &[7.0f32; 6 * 7]).unwrap();
    {
        let av = a.matrix(8, 10, Layout::RowMajor).unwrap().submatrix(2..6, 3..8).unwrap();
        let bv = b.matrix(7, 9, Layout::ColMajor).unwrap().submatrix(1..6, 2..5).unwrap();
        assert_eq!((av.offset(), av.ld(), av.is_contiguous()), (23, 10, false));
        assert_eq!((bv.offset(), bv.ld()), (15, 7));
        let mut whole = c.matrix_mut(6, 7, Layout::RowMajor).unwrap();
        let cv = whole.submatrix_mut(1..5, 2..5).unwrap();
        assert_eq!((cv.offset(), cv.ld(), cv.rows(), cv.cols()), (9, 7, 4, 3));
        gemm(1.0f32, av, bv, 0.0, cv).unwrap();
    }
    let out = c.to_host().unwrap();
    let f32s = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| *x as f32 as f64).collect() };
    let want = reference(&f32s(&a_block), &f32s(&b_block), m, k, n);
    let got: Vec<f64> = (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| out[(1 + i) * 7 + 2 + j] as f64).collect();
    assert!(rel_error(&got, &want) < 1e-5, "the block's product: {got:?} vs {want:?}");
    for (idx, x) in out.iter().enumerate() {
        let (i, j) = (idx / 7, idx % 7);
        if !((1..5).contains(&i) && (2..5).contains(&j)) {
            assert_eq!(*x, 7.0, "element ({i}, {j}) outside the block was written");
        }
    }
}

/// Views are checked against their array (no view reaches past it), and a strided matrix must
/// fit its view: refused as `Logic` before any GPU work.
#[test]
fn views_and_matrices_never_reach_outside_their_array() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let mut v = DeviceVec::from_host(&r, &(0..24).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    for e in [v.slice(20..25).unwrap_err(), v.slice(25..).unwrap_err(), v.split_at(25).unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    }
    let tail = v.slice(8..).unwrap();
    assert_eq!((tail.offset(), tail.len()), (8, 16));
    assert_eq!(tail.slice(4..8).unwrap().offset(), 12);
    assert_eq!(tail.matrix_strided(4, 3, 4, Layout::RowMajor).unwrap().offset(), 8);
    let e = tail.matrix_strided(4, 4, 5, Layout::RowMajor).unwrap_err(); // last element at 8 + 19
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert_eq!(tail.matrix_strided(2, 4, 3, Layout::RowMajor).unwrap_err().kind(), ErrorKind::Logic, "ld below a row");
    assert_eq!(tail.matrix(4, 5, Layout::RowMajor).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(tail.device_address(), v.device_address() + 8 * 4);
    let m = v.matrix(4, 6, Layout::RowMajor).unwrap();
    assert_eq!(m.submatrix(3..5, ..).unwrap_err().kind(), ErrorKind::Logic);
    let span = m.submatrix(1..3, 2..4).unwrap().as_slice();
    assert_eq!((span.offset(), span.len()), (8, 8), "from (1, 2) to (2, 3): the gap between the rows included");
    assert_eq!(v.slice_mut(..).unwrap().split_at_mut(30).unwrap_err().kind(), ErrorKind::Logic);
}

/// Sub-array views work where an array does, through cudarc's `DevicePtr` / `DevicePtrMut`:
/// the two halves of `split_at_mut` are written on two other streams at once and read back on
/// the array's own, which is ordered after both writes.
#[test]
fn split_views_are_written_on_other_streams_and_read_in_order() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let n = 1 << 20;
    let mut v = DeviceVec::<f32>::zeros(&r, 2 * n).unwrap();
    let (s1, s2) = (r.context().new_stream().unwrap(), r.context().new_stream().unwrap());
    let (ones, twos) = (vec![1.0f32; n], vec![2.0f32; n]);
    {
        let (mut left, mut right) = v.split_at_mut(n).unwrap();
        s1.memcpy_htod(&ones, &mut left).unwrap();
        s2.memcpy_htod(&twos, &mut right).unwrap();
        assert_eq!(s1.clone_dtoh(&left.as_view()).unwrap(), ones);
    }
    let back = v.to_host().unwrap();
    assert!(back[..n].iter().all(|x| *x == 1.0) && back[n..].iter().all(|x| *x == 2.0));
    let own = r.stream().unwrap();
    assert_eq!(own.clone_dtoh(&v.slice(n - 2..n + 2).unwrap()).unwrap(), [1.0, 1.0, 2.0, 2.0]);
}

/// An owned matrix keeps its shape: made from a host slice or an array of exactly its size,
/// refused otherwise, and viewed whole.
#[test]
fn a_device_matrix_owns_its_shape() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let m = DeviceMatrix::from_host(&r, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3, Layout::RowMajor).unwrap();
    assert_eq!((m.rows(), m.cols(), m.layout()), (2, 3, Layout::RowMajor));
    let span = m.view().submatrix(1.., 1..).unwrap().as_slice();
    assert_eq!((span.offset(), span.len()), (4, 2));
    assert_eq!(m.to_host().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let e = DeviceMatrix::from_host(&r, &[1.0f32; 5], 2, 3, Layout::RowMajor).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "DeviceMatrix::from_host"));
    let e = DeviceMatrix::from_vec(m.into_vec(), 3, 3, Layout::ColMajor).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert_eq!(DeviceMatrix::<f64>::new(&r, usize::MAX, 2, Layout::RowMajor).unwrap_err().kind(), ErrorKind::Logic);
}

/// Issue 31, `ndarray`: C order comes back row-major, Fortran order column-major, a strided view
/// as its elements in C order; each back on the host equal to the array it came from.
#[test]
fn ndarray_arrays_round_trip_in_c_and_fortran_order_and_strided_views_are_copied() {
    use ndarray::{s, Array2, ShapeBuilder};
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let c = Array2::from_shape_fn((5, 7), |(i, j)| (100 * i + j) as f32);
    let f = Array2::from_shape_vec((5, 7).f(), c.t().iter().copied().collect()).unwrap();
    assert_eq!(f, c);
    let m = DeviceMatrix::from_ndarray(&r, c.view()).unwrap();
    assert_eq!(m.layout(), Layout::RowMajor);
    assert_eq!(m.to_ndarray().unwrap(), c);
    let m = DeviceMatrix::from_ndarray(&r, f.view()).unwrap();
    assert_eq!(m.layout(), Layout::ColMajor);
    let back = m.to_ndarray().unwrap();
    assert_eq!(back, c);
    assert!(back.t().is_standard_layout(), "a column-major matrix comes back in Fortran order");
    let strided = c.slice(s![1..4;2, ..;3]);
    let m = DeviceMatrix::from_ndarray(&r, strided).unwrap();
    assert_eq!((m.rows(), m.cols(), m.layout()), (2, 3, Layout::RowMajor));
    assert_eq!(m.to_ndarray().unwrap(), strided);
}

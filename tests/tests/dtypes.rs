//! Element types beyond f32/f64 (issue 31): f16, bf16, i8, u8, i32, i64 in device and pinned
//! arrays, and GEMM in f16/bf16 with f32 accumulation (cublasGemmEx) against a CPU reference.
use raft::half::{bf16, f16};
use raft::{gemm, DeviceResources, DeviceScalar, DeviceVec, GemmScalar, Layout, PinnedVec};
use raft_tests::require_gpu;

/// A small deterministic generator (xorshift) in [-1, 1).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// Index of element (i, j) of a rows×cols matrix stored in `layout`.
fn at(i: usize, j: usize, rows: usize, cols: usize, layout: Layout) -> usize {
    match layout {
        Layout::RowMajor => i * cols + j,
        Layout::ColMajor => j * rows + i,
    }
}

/// A half type as the test sees it: conversions and the unit roundoff of its rounding.
trait Half: GemmScalar + PartialEq + std::fmt::Debug {
    const EPS: f64;
    fn of(x: f32) -> Self;
    fn f(self) -> f64;
}
impl Half for f16 {
    const EPS: f64 = 1.0 / 2048.0; // 2^-11: 10 stored mantissa bits
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}
impl Half for bf16 {
    const EPS: f64 = 1.0 / 256.0; // 2^-8: 7 stored mantissa bits
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

/// `C = alpha·A·B + beta·C0` in `T`, compared element by element with an f64 reference computed
/// from the very (already rounded) half inputs. Accumulating in f32 errs by at most about
/// k·2^-24·Σ|a·b|, and rounding the result to `T` by EPS·|c|: the tolerance allows twice each.
/// A wrong operand order, transposition, layout or an f16-accumulated sum of 129 terms misses it.
fn check_half<T: Half>(m: usize, k: usize, n: usize, la: Layout, lb: Layout, lc: Layout) {
    let r = DeviceResources::new().unwrap();
    let a: Vec<T> = random(m * k, 11 + m as u64).into_iter().map(T::of).collect();
    let b: Vec<T> = random(k * n, 12 + n as u64).into_iter().map(T::of).collect();
    let c0: Vec<T> = random(m * n, 13).into_iter().map(T::of).collect();
    let (alpha, beta) = (1.5f32, -0.5f32);
    let da = DeviceVec::from_host(&r, &a).unwrap();
    let db = DeviceVec::from_host(&r, &b).unwrap();
    let mut dc = DeviceVec::from_host(&r, &c0).unwrap();
    gemm(T::of(alpha), da.matrix(m, k, la).unwrap(), db.matrix(k, n, lb).unwrap(), T::of(beta), dc.matrix_mut(m, n, lc).unwrap()).unwrap();
    r.sync().unwrap();
    let out = dc.to_host().unwrap();
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut abs) = (0.0f64, 0.0f64);
            for p in 0..k {
                let t = a[at(i, p, m, k, la)].f() * b[at(p, j, k, n, lb)].f();
                sum += t;
                abs += t.abs();
            }
            let c = c0[at(i, j, m, n, lc)].f();
            let want = alpha as f64 * sum + beta as f64 * c;
            let got = out[at(i, j, m, n, lc)].f();
            let tol = 2.0 * T::EPS * want.abs() + 2.0 * (k as f64) * 2f64.powi(-24) * (alpha as f64 * abs + (beta as f64 * c).abs()) + 1e-6;
            assert!(
                got.is_finite() && (got - want).abs() <= tol,
                "{m}x{k}x{n} {la:?}/{lb:?}/{lc:?} ({i},{j}): got {got}, want {want} ± {tol}"
            );
            worst = worst.max((got - want).abs() / tol);
        }
    }
    assert!(r.has_handle(raft::HandleKind::Cublas).unwrap(), "the resources' own cuBLAS handle did the work");
    eprintln!("{} {m}x{k}x{n} {la:?}/{lb:?}/{lc:?}: worst error {worst:.3} of the tolerance", std::any::type_name::<T>());
}

const LAYOUTS: [Layout; 2] = [Layout::RowMajor, Layout::ColMajor];

#[test]
fn f16_gemm_matches_an_f32_reference_in_every_layout() {
    require_gpu!();
    for la in LAYOUTS {
        for lb in LAYOUTS {
            for lc in LAYOUTS {
                check_half::<f16>(67, 129, 35, la, lb, lc);
            }
        }
    }
    check_half::<f16>(256, 512, 128, Layout::RowMajor, Layout::RowMajor, Layout::RowMajor);
}

#[test]
fn bf16_gemm_matches_an_f32_reference_in_every_layout() {
    require_gpu!();
    for la in LAYOUTS {
        for lb in LAYOUTS {
            for lc in LAYOUTS {
                check_half::<bf16>(67, 129, 35, la, lb, lc);
            }
        }
    }
    check_half::<bf16>(256, 512, 128, Layout::ColMajor, Layout::RowMajor, Layout::RowMajor);
}

#[test]
fn half_gemm_accumulates_in_f32() {
    require_gpu!();
    // 4096 products 1·2^-10: summed in f16 the sum stalls at 2 (2^-10 is half an ulp of 2, and
    // the tie rounds to even); accumulated in f32 it is exactly 4, which f16 holds.
    let r = DeviceResources::new().unwrap();
    let k = 4096;
    let a = DeviceVec::from_host(&r, &vec![f16::ONE; k]).unwrap();
    let b = DeviceVec::from_host(&r, &vec![f16::from_f32(1.0 / 1024.0); k]).unwrap();
    let mut c = DeviceVec::from_host(&r, &[f16::NAN]).unwrap();
    gemm(
        f16::ONE,
        a.matrix(1, k, Layout::RowMajor).unwrap(),
        b.matrix(k, 1, Layout::ColMajor).unwrap(),
        f16::ZERO,
        c.matrix_mut(1, 1, Layout::RowMajor).unwrap(),
    )
    .unwrap();
    assert_eq!(c.to_host().unwrap(), vec![f16::from_f32(4.0)], "beta = 0 overwrote the NaN, and the sum kept every term");
}

fn round_trip<T: DeviceScalar + PartialEq + std::fmt::Debug>(r: &DeviceResources, host: Vec<T>) {
    let v = DeviceVec::from_host(r, &host).unwrap();
    assert_eq!(v.to_host().unwrap(), host, "{}", std::any::type_name::<T>());
    let mut pinned = PinnedVec::<T>::new(r, host.len()).unwrap();
    v.copy_to_host(&mut pinned).unwrap();
    assert_eq!(pinned.to_vec(), host, "{} through pinned memory", std::any::type_name::<T>());
    let z = DeviceVec::<T>::zeros(r, 3).unwrap();
    assert_eq!(z.to_host().unwrap(), vec![T::default(); 3]);
}

#[test]
fn every_element_type_round_trips_through_device_and_pinned_memory() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let n = 10_001;
    round_trip(&r, (0..n).map(|i| f16::from_f32(i as f32 * 0.25 - 7.0)).collect::<Vec<_>>());
    round_trip(&r, (0..n).map(|i| bf16::from_f32(i as f32 * 0.5 - 3.0)).collect::<Vec<_>>());
    round_trip(&r, (0..n).map(|i| i as i8).collect::<Vec<_>>());
    round_trip(&r, (0..n).map(|i| (i * 7) as u8).collect::<Vec<_>>());
    round_trip(&r, (0..n).map(|i: i32| i * -3).collect::<Vec<_>>());
    round_trip(&r, (0..n).map(|i| (i as i64) << 33).collect::<Vec<_>>());
    // NaN payloads survive: the copies move bits, not values.
    let nan = f16::from_bits(0x7e01);
    assert_eq!(DeviceVec::from_host(&r, &[nan]).unwrap().to_host().unwrap()[0].to_bits(), 0x7e01);
}

#[test]
fn half_types_are_device_scalars_on_the_cpu_too() {
    // Compile-time facts, checked on every machine: the element types are usable generically.
    fn scalar<T: DeviceScalar>() -> usize {
        std::mem::size_of::<T>()
    }
    fn gemm_scalar<T: GemmScalar>() {}
    assert_eq!((scalar::<f16>(), scalar::<bf16>(), scalar::<i8>(), scalar::<u8>(), scalar::<i32>(), scalar::<i64>()), (2, 2, 1, 1, 4, 8));
    gemm_scalar::<f16>();
    gemm_scalar::<bf16>();
}

/// An element type aligned past RMM's 256 bytes (size equal to its alignment: no padding, so
/// the `unsafe impl` keeps every rule but that one).
#[derive(Clone, Copy, Default, Debug, PartialEq)]
#[repr(C, align(512))]
struct OverAligned([u128; 32]);
// SAFETY: every bit pattern is a value, no padding (512 bytes of integers), nothing owned; its
// alignment is what the contract excludes, which the test checks the library refuses.
unsafe impl DeviceScalar for OverAligned {}

#[test]
fn an_element_type_aligned_past_rmms_alignment_is_refused_before_any_memory_is_made() {
    // The eighteenth audit: RMM's blocks (device and page-locked) are aligned to 256 bytes, so
    // page-locked memory for this type was misaligned and every accessor panicked. Refused
    // before any CUDA call, so the same answer with or without a device.
    let pinned = PinnedVec::<OverAligned>::new(0, 4).unwrap_err();
    assert_eq!((pinned.kind(), pinned.who()), (raft::ErrorKind::Logic, "PinnedVec::new"), "{pinned}");
    assert!(pinned.message().contains("aligned to 512 bytes"), "{pinned}");
    let copied = PinnedVec::from_slice(0, &[OverAligned::default()]).unwrap_err();
    assert_eq!(copied.kind(), raft::ErrorKind::Logic, "{copied}");
    if let Ok(r) = DeviceResources::new() {
        let device = DeviceVec::<OverAligned>::new(&r, 4).unwrap_err();
        assert_eq!((device.kind(), device.who()), (raft::ErrorKind::Logic, "DeviceVec::new"), "{device}");
        let zeros = DeviceVec::<OverAligned>::zeros(&r, 4).unwrap_err();
        assert_eq!(zeros.kind(), raft::ErrorKind::Logic, "{zeros}");
    }
}

//! DLPack tensors that describe a contiguous view of a device array for the duration of one cuVS call: how cuVS's C
//! API takes arrays.
//!
//! A [`Tensor`] borrows its array for its whole life, describes no more elements than the array
//! holds (checked when made), and holds the ordering guard of the array's stream against the
//! stream cuVS runs on: when they differ, that stream first waits for the array's pending work,
//! and when the tensor is dropped an event is recorded after cuVS's work, which the array's
//! stream waits for (on the device) before its next write and its free, so the array can be
//! neither freed nor written under cuVS's kernels. Nothing waits on the host, except where a use
//! cannot be ordered by an event (a context other than the device's primary one, an array used on
//! too many streams): the guard then waits for cuVS's work when dropped, and the array is kept
//! (leaked) rather than freed under a use it cannot order.
use crate::sys;
use cudarc::driver::{CudaStream, SyncOnDrop};
use raft_core::{DeviceScalar, DeviceView, DeviceViewMut, Error, Result};

/// An element type cuVS's C API takes, with its DLPack type code and width.
pub(crate) trait DlElement: DeviceScalar {
    const CODE: sys::DLDataTypeCode;
    const BITS: u8;
}

macro_rules! dl_elements {
    ($($t:ty => $code:ident),*) => {$(
        impl DlElement for $t {
            const CODE: sys::DLDataTypeCode = sys::DLDataTypeCode::$code;
            const BITS: u8 = (std::mem::size_of::<$t>() * 8) as u8;
        }
    )*};
}
dl_elements!(f32 => kDLFloat, i64 => kDLInt, u32 => kDLUInt, i8 => kDLInt, u8 => kDLUInt);

/// A row-major `rows × cols` DLPack view of a contiguous range of a device array, for one call.
pub(crate) struct Tensor<'a> {
    managed: sys::DLManagedTensor,
    /// Boxed so that the address in `managed` stays valid when the tensor moves.
    shape: Box<[i64; 2]>,
    rows: usize,
    cols: usize,
    /// Orders the cuVS stream after the array's stream now, and, when dropped, the array's
    /// stream after cuVS's work (an event; nothing when they are the same stream).
    _ordered: SyncOnDrop<'a>,
}

impl<'a> Tensor<'a> {
    /// An input: cuVS reads it (a contiguous view, `rows × cols` row-major).
    pub(crate) fn input<T: DlElement>(
        who: &'static str,
        v: &'a DeviceView<'_, T>,
        rows: usize,
        cols: usize,
        stream: &'a CudaStream,
    ) -> Result<Self> {
        let (shape, device) = (extent(who, v.len(), rows, cols)?, v.resources().device());
        // Fallible: an array of other resources whose stream is being captured is refused
        // (`Logic`), where cudarc's `DevicePtr` would panic (the fifteenth audit).
        let (ptr, ordered) = v.try_device_ptr(stream).map_err(|e| e.with_who(who))?;
        Ok(Self::new::<T>(ptr, device, shape, rows, cols, ordered))
    }

    /// An output: cuVS writes it (the view is borrowed mutably for the tensor's life).
    pub(crate) fn output<T: DlElement>(
        who: &'static str,
        v: &'a mut DeviceViewMut<'_, T>,
        rows: usize,
        cols: usize,
        stream: &'a CudaStream,
    ) -> Result<Self> {
        let (shape, device) = (extent(who, v.len(), rows, cols)?, v.resources().device());
        let (ptr, ordered) = v.try_device_ptr_mut(stream).map_err(|e| e.with_who(who))?;
        Ok(Self::new::<T>(ptr, device, shape, rows, cols, ordered))
    }

    fn new<T: DlElement>(ptr: u64, device: usize, shape: [i64; 2], rows: usize, cols: usize, ordered: SyncOnDrop<'a>) -> Self {
        let mut shape = Box::new(shape);
        let managed = sys::DLManagedTensor {
            dl_tensor: sys::DLTensor {
                data: ptr as *mut std::ffi::c_void,
                device: sys::DLDevice { device_type: sys::DLDeviceType::kDLCUDA, device_id: device as i32 },
                ndim: 2,
                dtype: sys::DLDataType { code: T::CODE.0 as u8, bits: T::BITS, lanes: 1 },
                shape: shape.as_mut_ptr(),
                // Null strides: C-contiguous (row-major), as DLPack defines.
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            // cuVS never takes ownership of the tensors of these calls: no deleter.
            deleter: None,
        };
        Tensor { managed, shape, rows, cols, _ordered: ordered }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The tensor for a C call: valid while `self` is borrowed.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut sys::DLManagedTensor {
        self.managed.dl_tensor.shape = self.shape.as_mut_ptr();
        &mut self.managed
    }
}

/// The DLPack shape of `rows × cols` over `len` elements: refused unless it is exactly the
/// array (a tensor never describes memory its array does not hold) and fits DLPack's `int64_t`.
pub(crate) fn extent(who: &'static str, len: usize, rows: usize, cols: usize) -> Result<[i64; 2]> {
    if rows.checked_mul(cols) != Some(len) {
        return Err(Error::logic(who, format!("a {rows}×{cols} matrix needs {} elements, the array has {len}", rows.saturating_mul(cols))));
    }
    match (i64::try_from(rows), i64::try_from(cols)) {
        (Ok(r), Ok(c)) => Ok([r, c]),
        _ => Err(Error::logic(who, format!("a {rows}×{cols} matrix does not fit DLPack's 64-bit shape"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_is_the_whole_array_or_refused() {
        assert_eq!(extent("t", 12, 3, 4).unwrap(), [3, 4]);
        let e = extent("t", 12, 4, 4).unwrap_err();
        assert_eq!(e.kind(), raft_core::ErrorKind::Logic);
        assert_eq!(e.to_string(), "t: a 4×4 matrix needs 16 elements, the array has 12");
        assert!(extent("t", 0, usize::MAX, 2).is_err(), "an overflowing shape is refused, not wrapped");
    }

    #[test]
    fn element_codes_are_dlpack_s() {
        assert_eq!((<f32 as DlElement>::CODE, <f32 as DlElement>::BITS), (sys::DLDataTypeCode::kDLFloat, 32));
        assert_eq!((<i64 as DlElement>::CODE, <i64 as DlElement>::BITS), (sys::DLDataTypeCode::kDLInt, 64));
        assert_eq!((<u32 as DlElement>::CODE, <u32 as DlElement>::BITS), (sys::DLDataTypeCode::kDLUInt, 32));
        assert_eq!(sys::DLDeviceType::kDLCUDA.0, 2);
    }
}

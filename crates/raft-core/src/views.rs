//! Sub-array views of a [`DeviceVec`] (`slice`, `split_at` and their `_mut` twins): a range of
//! elements usable wherever an array is read or written (matrix views and so `gemm`, cuVS,
//! cudarc's `DevicePtr` / `DevicePtrMut`), checked against the array so that no view reaches
//! outside it, and ordered against other streams as the array itself is.
use crate::array::DeviceVec;
use crate::error::{Error, Result};
use crate::resources::DeviceResources;
use crate::result::buffer::NativeBuffer;
use crate::result::DeviceScalar;
use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// The address of element `offset` of `buffer` (inside it: every view is checked).
fn address<T>(buffer: &NativeBuffer, offset: usize) -> u64 {
    buffer.address() + (offset * std::mem::size_of::<T>()) as u64
}

/// `[start, end)` of `range` within `len` elements, refused (`Logic`) unless it lies inside.
pub(crate) fn checked_range(who: &'static str, range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(Error::logic(
            who,
            format!("the range {:?}..{:?} is not inside the {len} elements viewed", range.start_bound(), range.end_bound()),
        )),
    }
}

/// A read-only view of elements `offset .. offset + len` of a [`DeviceVec`], made by
/// [`DeviceVec::slice`] / [`split_at`](DeviceVec::split_at) (checked: its fields are private,
/// so safe code cannot describe elements the array does not hold).
///
/// It reads like the array: on the array's stream for raft-rs's operations, and on any stream
/// through cudarc's [`DevicePtr`], with the same ordering (that stream waits for the array's
/// stream, and the array's stream for that use before the array's next write or its free).
///
/// ```compile_fail,E0451
/// # use raft_core::{DeviceVec, DeviceView};
/// # fn lie(v: &DeviceVec<f32>) {
/// let view = DeviceView { vec: v, offset: 4096, len: 4096 };
/// # }
/// ```
///
/// # Thread safety
/// `Send + Sync`, as `&DeviceVec`.
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T: DeviceScalar> {
    vec: &'a DeviceVec<T>,
    offset: usize,
    len: usize,
}

/// A writable view of elements `offset .. offset + len` of a [`DeviceVec`], made by
/// [`DeviceVec::slice_mut`] / [`split_at_mut`](DeviceVec::split_at_mut): views of one array
/// made by `split_at_mut` never overlap, so each may be written (on any stream, through cudarc's
/// [`DevicePtrMut`]) while the other is used. It gives no access to the rest of its array.
///
/// A write through it is ordered after every use of the array on other streams known so far;
/// the array's own record of those uses is cleared only by the array's next exclusive use (its
/// free included), once no view is left, so no free can overtake a use made through a view.
///
/// A read-only view made from it borrows it: it cannot be moved (or written) meanwhile.
///
/// ```compile_fail,E0505
/// # fn f(v: &mut raft_core::DeviceVec<f32>) -> raft_core::Result<()> {
/// let (left, right) = v.split_at_mut(4)?;
/// let seen = left.as_view();
/// let moved = left; // error: `left` is borrowed by `seen`
/// drop((seen, moved, right));
/// # Ok(()) }
/// ```
///
/// # Thread safety
/// `Send + Sync`; writes need `&mut self`.
pub struct DeviceViewMut<'a, T: DeviceScalar> {
    /// Shared, so that two disjoint views of one array can live at once; the exclusive borrow
    /// they came from is held for `'a` by `_exclusive`.
    vec: &'a DeviceVec<T>,
    offset: usize,
    len: usize,
    _exclusive: PhantomData<&'a mut [T]>,
}

static_assertions::assert_impl_all!(DeviceView<'static, f32>: Send, Sync);
static_assertions::assert_impl_all!(DeviceViewMut<'static, f32>: Send, Sync);

impl<T: DeviceScalar> DeviceVec<T> {
    /// The whole array as a [`DeviceView`].
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView { vec: self, offset: 0, len: self.len() }
    }

    /// The whole array as a [`DeviceViewMut`].
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        let len = self.len();
        DeviceViewMut { vec: self, offset: 0, len, _exclusive: PhantomData }
    }

    /// Elements `range` (e.g. `2..10`, `..5`, `3..`) as a [`DeviceView`].
    ///
    /// # Errors
    /// `Logic` when the range is not inside the array (an index past it, start after end).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        self.view().slice_as("DeviceVec::slice", range)
    }

    /// Elements `range` as a [`DeviceViewMut`] (see [`slice`](Self::slice)).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        self.view_mut().slice_mut_as("DeviceVec::slice_mut", range)
    }

    /// Elements `..mid` and `mid..`.
    ///
    /// # Errors
    /// `Logic` when `mid` is past the array's length.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceView<'_, T>, DeviceView<'_, T>)> {
        self.view().split_at_as("DeviceVec::split_at", mid)
    }

    /// Elements `..mid` and `mid..`, each writable while the other is used.
    ///
    /// # Errors
    /// `Logic` when `mid` is past the array's length.
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(DeviceViewMut<'_, T>, DeviceViewMut<'_, T>)> {
        self.view_mut().split_at_mut_as("DeviceVec::split_at_mut", mid)
    }
}

impl<'a, T: DeviceScalar> DeviceView<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the view starts in its array (elements).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The resources of the array viewed.
    pub fn resources(&self) -> &'a DeviceResources {
        self.vec.resources()
    }

    /// The stream the view is ordered on: its array's.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.vec.stream() // raises the capture flag: the handle leaves the library
    }

    /// The device address of the first element, for FFI: a number, so safe to have; reading
    /// through it is the caller's `unsafe`, within [`len`](Self::len) elements, ordered on
    /// [`stream`](Self::stream), while the array lives.
    pub fn device_address(&self) -> u64 {
        address::<T>(self.vec.parts().0, self.offset)
    }

    /// Elements `range` of this view.
    ///
    /// # Errors
    /// `Logic` when the range is not inside the view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'a, T>> {
        self.slice_as("DeviceView::slice", range)
    }

    /// Elements `..mid` and `mid..` of this view.
    ///
    /// # Errors
    /// `Logic` when `mid` is past the view's length.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceView<'a, T>, DeviceView<'a, T>)> {
        self.split_at_as("DeviceView::split_at", mid)
    }

    fn slice_as(&self, who: &'static str, range: impl RangeBounds<usize>) -> Result<DeviceView<'a, T>> {
        let (s, e) = checked_range(who, range, self.len)?;
        Ok(DeviceView { vec: self.vec, offset: self.offset + s, len: e - s })
    }

    fn split_at_as(&self, who: &'static str, mid: usize) -> Result<(DeviceView<'a, T>, DeviceView<'a, T>)> {
        Ok((self.slice_as(who, ..mid)?, self.slice_as(who, mid..)?))
    }

    /// The buffer, for a read on the array's own stream after the writes of other streams.
    pub(crate) fn buffer(&self) -> &'a NativeBuffer {
        self.vec.buf()
    }
}

impl<'a, T: DeviceScalar> DeviceViewMut<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the view starts in its array (elements).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The resources of the array viewed.
    pub fn resources(&self) -> &'a DeviceResources {
        self.vec.resources()
    }

    /// The stream the view is ordered on: its array's.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.vec.stream() // raises the capture flag: the handle leaves the library
    }

    /// The device address of the first element (see [`DeviceView::device_address`]).
    pub fn device_address(&self) -> u64 {
        address::<T>(self.vec.parts().0, self.offset)
    }

    /// A read-only view of the same elements, for as long as this one is borrowed.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView { vec: self.vec, offset: self.offset, len: self.len }
    }

    /// Elements `range` of this view, writable (borrowing this one).
    ///
    /// # Errors
    /// `Logic` when the range is not inside the view.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (s, e) = checked_range("DeviceViewMut::slice_mut", range, self.len)?;
        Ok(DeviceViewMut { vec: self.vec, offset: self.offset + s, len: e - s, _exclusive: PhantomData })
    }

    /// Elements `..mid` and `mid..` of this view, each writable (consuming this one).
    ///
    /// # Errors
    /// `Logic` when `mid` is past the view's length.
    pub fn split_at_mut(self, mid: usize) -> Result<(DeviceViewMut<'a, T>, DeviceViewMut<'a, T>)> {
        self.split_at_mut_as("DeviceViewMut::split_at_mut", mid)
    }

    fn slice_mut_as(self, who: &'static str, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'a, T>> {
        let (s, e) = checked_range(who, range, self.len)?;
        Ok(DeviceViewMut { vec: self.vec, offset: self.offset + s, len: e - s, _exclusive: PhantomData })
    }

    fn split_at_mut_as(self, who: &'static str, mid: usize) -> Result<(DeviceViewMut<'a, T>, DeviceViewMut<'a, T>)> {
        if mid > self.len {
            return Err(Error::logic(who, format!("cannot split {} elements at {mid}", self.len)));
        }
        let left = DeviceViewMut { vec: self.vec, offset: self.offset, len: mid, _exclusive: PhantomData };
        let right = DeviceViewMut { vec: self.vec, offset: self.offset + mid, len: self.len - mid, _exclusive: PhantomData };
        Ok((left, right))
    }

    /// The buffer, for a read on the array's own stream after the writes of other streams.
    pub(crate) fn buffer(&self) -> &'a NativeBuffer {
        self.vec.buf()
    }

    /// The buffer, for a write on the array's own stream after every use of other streams known
    /// so far: waited for, not marked done (only the array's exclusive uses do that), since a
    /// disjoint view may still hold a guard (see `result/foreign.rs`).
    pub(crate) fn buffer_mut(&mut self) -> &'a NativeBuffer {
        let (buffer, foreign) = self.vec.parts();
        if let Err(e) = foreign.wait_all("DeviceViewMut", buffer.stream()) {
            foreign.report(&e);
        }
        buffer
    }
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceView").field("offset", &self.offset).field("len", &self.len).field("of", self.vec).finish()
    }
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceViewMut").field("offset", &self.offset).field("len", &self.len).field("of", self.vec).finish()
    }
}

impl<T: DeviceScalar> DeviceSlice<T> for DeviceView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.vec.stream() // raises the capture flag: the handle leaves the library
    }
}

impl<T: DeviceScalar> DeviceSlice<T> for DeviceViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.vec.stream() // raises the capture flag: the handle leaves the library
    }
}

/// As [`DeviceVec`]'s: `stream` waits for the array's stream, and the guard records an event
/// there that the array's stream waits for before its next write and its free.
impl<T: DeviceScalar> DevicePtr<T> for DeviceView<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        self.try_device_ptr(stream).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: DeviceScalar> DevicePtr<T> for DeviceViewMut<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        self.try_device_ptr(stream).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A write on `stream`: ordered after every known use on other streams, recorded as a write.
impl<T: DeviceScalar> DevicePtrMut<T> for DeviceViewMut<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        self.try_device_ptr_mut(stream).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: DeviceScalar> DeviceView<'_, T> {
    /// [`DevicePtr::device_ptr`] with its refusal as an error, as
    /// [`DeviceVec::try_device_ptr`].
    ///
    /// # Errors
    /// As [`DeviceVec::try_device_ptr`].
    pub fn try_device_ptr<'b>(&'b self, stream: &'b CudaStream) -> Result<(CUdeviceptr, SyncOnDrop<'b>)> {
        let buffer = self.buffer();
        let (_, foreign) = self.vec.parts();
        let guard = foreign.guard("DeviceView::device_ptr", buffer.stream(), self.vec.resources().capture_flag(), stream, false)?;
        Ok((address::<T>(buffer, self.offset), guard))
    }
}

impl<T: DeviceScalar> DeviceViewMut<'_, T> {
    /// [`DevicePtr::device_ptr`] with its refusal as an error, as
    /// [`DeviceVec::try_device_ptr`]: a read.
    ///
    /// # Errors
    /// As [`DeviceVec::try_device_ptr`].
    pub fn try_device_ptr<'b>(&'b self, stream: &'b CudaStream) -> Result<(CUdeviceptr, SyncOnDrop<'b>)> {
        let buffer = self.buffer();
        let (_, foreign) = self.vec.parts();
        let guard = foreign.guard("DeviceViewMut::device_ptr", buffer.stream(), self.vec.resources().capture_flag(), stream, false)?;
        Ok((address::<T>(buffer, self.offset), guard))
    }

    /// [`DevicePtrMut::device_ptr_mut`] with its refusal as an error, as
    /// [`DeviceVec::try_device_ptr_mut`]: a write.
    ///
    /// # Errors
    /// As [`DeviceVec::try_device_ptr`].
    pub fn try_device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> Result<(CUdeviceptr, SyncOnDrop<'b>)> {
        let buffer = self.buffer_mut();
        let (_, foreign) = self.vec.parts();
        let guard = foreign.guard("DeviceViewMut::device_ptr_mut", buffer.stream(), self.vec.resources().capture_flag(), stream, true)?;
        Ok((address::<T>(buffer, self.offset), guard))
    }
}

#[cfg(test)]
mod tests {
    use super::checked_range;

    #[test]
    fn ranges_inside_pass_and_others_are_refused_without_wrapping() {
        assert_eq!(checked_range("t", 2..5, 10).unwrap(), (2, 5));
        assert_eq!(checked_range("t", .., 10).unwrap(), (0, 10));
        assert_eq!(checked_range("t", 3..=9, 10).unwrap(), (3, 10));
        assert_eq!(checked_range("t", 10.., 10).unwrap(), (10, 10), "an empty view at the end");
        for bad in [checked_range("t", 5..11, 10), checked_range("t", 11.., 10), checked_range("t", 0..=usize::MAX, 10)] {
            let e = bad.unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Logic);
        }
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = checked_range("t", 6..5, 10);
        assert!(reversed.is_err(), "start after end");
        use std::ops::Bound;
        assert!(checked_range("t", (Bound::Excluded(usize::MAX), Bound::Unbounded), 10).is_err());
    }
}

//! Device matrices from and to `ndarray` arrays (feature `ndarray`).
//!
//! An array in C order (standard layout) becomes a row-major matrix and one in Fortran order a
//! column-major one, each copied as it is stored. Any other array (a slice with steps, a
//! transposed view of a strided array, negative strides) is **copied** into C order on the host
//! first, then sent: the device matrix is always contiguous, so nothing is refused for its
//! strides. Going back, the `ndarray` array has the matrix's layout (`to_ndarray` of a
//! column-major matrix is in Fortran order).
use crate::error::{Error, Result};
use crate::matrix::{DeviceMatrix, Layout};
use crate::resources::DeviceResources;
use crate::result::DeviceScalar;
use ndarray::{Array2, ArrayView2, ShapeBuilder};
use std::borrow::Cow;

/// The elements of `a` as one contiguous slice and the layout they are in: borrowed when `a` is
/// in C or Fortran order, else copied into C order.
fn host_order<'a, T: Copy>(a: &ArrayView2<'a, T>) -> (Cow<'a, [T]>, Layout) {
    if let Some(s) = a.to_slice() {
        return (Cow::Borrowed(s), Layout::RowMajor);
    }
    if let Some(s) = a.to_slice_memory_order() {
        // Contiguous but not C order: for a 2-D array that is Fortran order (its transpose is C).
        if a.t().is_standard_layout() {
            return (Cow::Borrowed(s), Layout::ColMajor);
        }
    }
    (Cow::Owned(a.iter().copied().collect()), Layout::RowMajor)
}

impl<T: DeviceScalar> DeviceMatrix<T> {
    /// A copy of `a` on `resources`: row-major from C order, column-major from Fortran order,
    /// anything else copied into C order on the host first (see the module). Blocks until the
    /// copy is done, as [`DeviceMatrix::from_host`].
    ///
    /// # Errors
    /// As [`DeviceMatrix::from_host`].
    pub fn from_ndarray(resources: &DeviceResources, a: ArrayView2<'_, T>) -> Result<Self> {
        let (rows, cols) = a.dim();
        let (data, layout) = host_order(&a);
        DeviceMatrix::from_host(resources, &data, rows, cols, layout).map_err(|e| e.with_who("DeviceMatrix::from_ndarray"))
    }

    /// The matrix on the host as an `ndarray` array in its own layout (C order for row-major,
    /// Fortran order for column-major). Blocks until the copy is done.
    ///
    /// # Errors
    /// As [`DeviceMatrix::to_host`].
    pub fn to_ndarray(&self) -> Result<Array2<T>> {
        const WHO: &str = "DeviceMatrix::to_ndarray";
        let v = self.to_host().map_err(|e| e.with_who(WHO))?;
        let shape = (self.rows(), self.cols());
        let made = match self.layout() {
            Layout::RowMajor => Array2::from_shape_vec(shape, v),
            Layout::ColMajor => Array2::from_shape_vec(shape.f(), v),
        };
        made.map_err(|e| Error::logic(WHO, format!("a {}×{} matrix: {e}", shape.0, shape.1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{arr2, s, Array2};

    #[test]
    fn c_order_is_row_major_and_borrowed() {
        let a = arr2(&[[1, 2, 3], [4, 5, 6]]);
        let v = a.view();
        let (data, layout) = host_order(&v);
        assert!(matches!(data, Cow::Borrowed(_)));
        assert_eq!((&*data, layout), (&[1, 2, 3, 4, 5, 6][..], Layout::RowMajor));
    }

    #[test]
    fn fortran_order_is_column_major_and_borrowed() {
        let a = Array2::from_shape_vec((2, 3).f(), vec![1, 4, 2, 5, 3, 6]).unwrap();
        assert_eq!(a, arr2(&[[1, 2, 3], [4, 5, 6]]));
        let v = a.view();
        let (data, layout) = host_order(&v);
        assert!(matches!(data, Cow::Borrowed(_)));
        assert_eq!((&*data, layout), (&[1, 4, 2, 5, 3, 6][..], Layout::ColMajor));
    }

    #[test]
    fn strided_and_reversed_views_are_copied_into_c_order() {
        let a = Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as i32);
        for (name, v) in [
            ("every other column", a.slice(s![.., ..;2])),
            ("rows reversed", a.slice(s![..;-1, ..])),
            ("a block", a.slice(s![1..3, 2..5])),
            ("a transposed block", a.slice(s![1..3, 2..5]).reversed_axes()),
        ] {
            let (data, layout) = host_order(&v);
            assert_eq!(layout, Layout::RowMajor, "{name}");
            let want: Vec<i32> = v.iter().copied().collect();
            assert_eq!(&*data, &want[..], "{name}");
            // Read back as C order, the elements are the view's.
            let back = Array2::from_shape_vec(v.dim(), data.into_owned()).unwrap();
            assert_eq!(back, v, "{name}");
        }
    }

    #[test]
    fn a_transpose_of_a_c_array_is_fortran_order() {
        let a = arr2(&[[1, 2, 3], [4, 5, 6]]);
        let t = a.t();
        let (data, layout) = host_order(&t);
        assert_eq!(layout, Layout::ColMajor);
        let back = Array2::from_shape_vec(t.dim().f(), data.into_owned()).unwrap();
        assert_eq!(back, t);
    }
}

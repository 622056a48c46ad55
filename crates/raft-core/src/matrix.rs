//! The one matrix model: [`DeviceMatrix`] (an owned array with its shape) and its checked views
//! [`MatrixView`] / [`MatrixViewMut`] (rows, columns, layout, an element offset and a leading
//! dimension), which `gemm` and cuVS take. Every view is checked against its array when made,
//! in arithmetic that cannot wrap, so none reaches outside it.
use crate::array::DeviceVec;
use crate::error::{Error, Result};
use crate::resources::DeviceResources;
use crate::result::buffer::NativeBuffer;
use crate::result::DeviceScalar;
use crate::views::{checked_range, DeviceView, DeviceViewMut};
use cudarc::driver::CudaStream;
use std::ops::RangeBounds;
use std::sync::Arc;

/// How a matrix's elements follow each other in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Rows one after another (C order); the leading dimension is the distance between rows.
    RowMajor,
    /// Columns one after another (Fortran order, cuBLAS's own); the leading dimension is the
    /// distance between columns.
    ColMajor,
}

/// A `rows × cols` matrix's place in `len` elements: from `offset`, each row (row-major) or
/// column (column-major) `ld` elements after the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
    layout: Layout,
}

impl Shape {
    /// The elements of one row (row-major) or column (column-major), and how many of them.
    fn inner_outer(rows: usize, cols: usize, layout: Layout) -> (usize, usize) {
        match layout {
            Layout::RowMajor => (cols, rows),
            Layout::ColMajor => (rows, cols),
        }
    }

    /// The leading dimension of a contiguous `rows × cols` matrix (at least 1, as cuBLAS wants).
    fn dense_ld(rows: usize, cols: usize, layout: Layout) -> usize {
        Self::inner_outer(rows, cols, layout).0.max(1)
    }

    /// The shape, refused unless `ld` is at least a row's (column's) length and every element
    /// lies inside `len`: the last is at `offset + (outer - 1) * ld + inner - 1`.
    fn checked(who: &'static str, len: usize, offset: usize, rows: usize, cols: usize, ld: usize, layout: Layout) -> Result<Shape> {
        let (inner, outer) = Self::inner_outer(rows, cols, layout);
        if ld < inner.max(1) {
            return Err(Error::logic(who, format!("leading dimension {ld} is below the {inner} elements of a {layout:?} line")));
        }
        let span = Self::span_of(inner, outer, ld);
        match span.and_then(|s| s.checked_add(offset)) {
            Some(end) if end <= len => Ok(Shape { offset, rows, cols, ld, layout }),
            _ => Err(Error::logic(
                who,
                format!(
                    "a {rows}×{cols} {layout:?} matrix with leading dimension {ld} from element {offset} needs more than the {len} elements viewed"
                ),
            )),
        }
    }

    fn span_of(inner: usize, outer: usize, ld: usize) -> Option<usize> {
        if inner == 0 || outer == 0 {
            return Some(0);
        }
        (outer - 1).checked_mul(ld)?.checked_add(inner)
    }

    /// The elements from the first to the last (checked when made: cannot overflow).
    fn span(&self) -> usize {
        let (inner, outer) = Self::inner_outer(self.rows, self.cols, self.layout);
        Self::span_of(inner, outer, self.ld).unwrap_or(0)
    }

    fn is_contiguous(&self) -> bool {
        let (inner, outer) = Self::inner_outer(self.rows, self.cols, self.layout);
        outer <= 1 || self.ld == inner
    }

    /// Rows `r` and columns `c` of this shape (ranges inside it), with the same `ld`.
    fn sub(&self, who: &'static str, r: impl RangeBounds<usize>, c: impl RangeBounds<usize>) -> Result<Shape> {
        let (r0, r1) = checked_range(who, r, self.rows)?;
        let (c0, c1) = checked_range(who, c, self.cols)?;
        // Inside a checked shape: `r0 < rows` and `c0 < cols` when the result is non-empty, so the
        // element (r0, c0) lies inside; an empty result keeps the offset in range too.
        let first = match self.layout {
            Layout::RowMajor => r0.checked_mul(self.ld).and_then(|n| n.checked_add(c0)),
            Layout::ColMajor => c0.checked_mul(self.ld).and_then(|n| n.checked_add(r0)),
        };
        let (rows, cols) = (r1 - r0, c1 - c0);
        let offset = if rows == 0 || cols == 0 { Some(self.offset) } else { first.and_then(|f| f.checked_add(self.offset)) };
        let offset = offset.ok_or_else(|| Error::logic(who, "the sub-matrix's offset overflows"))?;
        Ok(Shape { offset, rows, cols, ld: self.ld, layout: self.layout })
    }
}

/// A read-only `rows × cols` view of device memory: a whole [`DeviceVec`]
/// ([`DeviceVec::matrix`]), a range of one ([`DeviceView::matrix`]), a [`DeviceMatrix`]
/// ([`DeviceMatrix::view`]), or a block of another view ([`submatrix`](Self::submatrix)), with
/// a leading dimension ([`DeviceView::matrix_strided`]). Made only by those, which check the
/// shape against the array: its fields are private, so safe code cannot describe more elements
/// than the array holds.
///
/// ```compile_fail,E0451
/// # use raft_core::{DeviceVec, Layout, MatrixView};
/// # fn lie(v: &DeviceVec<f32>) {
/// let view = MatrixView { data: v.view(), shape: todo!() };
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MatrixView<'a, T: DeviceScalar> {
    data: DeviceView<'a, T>,
    shape: Shape,
}

/// A writable `rows × cols` view (see [`MatrixView`]): [`DeviceVec::matrix_mut`],
/// [`DeviceViewMut::matrix_mut`], [`DeviceMatrix::view_mut`],
/// [`submatrix_mut`](Self::submatrix_mut).
///
/// ```compile_fail,E0451
/// # use raft_core::{DeviceVec, Layout, MatrixViewMut};
/// # fn lie(v: &mut DeviceVec<f32>) {
/// let view = MatrixViewMut { data: v.view_mut(), shape: todo!() };
/// # }
/// ```
///
/// Two writable sub-matrices of one view never exist at once (they could overlap):
///
/// ```compile_fail,E0499
/// # use raft_core::{DeviceVec, Layout};
/// # fn f(v: &mut DeviceVec<f32>) -> raft_core::Result<()> {
/// let mut m = v.matrix_mut(4, 4, Layout::RowMajor)?;
/// let top = m.submatrix_mut(0..2, ..)?;
/// let bottom = m.submatrix_mut(2..4, ..)?; // error: `m` is borrowed by `top`
/// drop((top, bottom));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MatrixViewMut<'a, T: DeviceScalar> {
    data: DeviceViewMut<'a, T>,
    shape: Shape,
}

static_assertions::assert_impl_all!(MatrixView<'static, f32>: Send, Sync);
static_assertions::assert_impl_all!(MatrixViewMut<'static, f32>: Send, Sync);

impl<T: DeviceScalar> DeviceVec<T> {
    /// The whole array as a contiguous `rows × cols` matrix in `layout`.
    ///
    /// # Errors
    /// `Logic` when `rows × cols` is not the array's length.
    pub fn matrix(&self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixView<'_, T>> {
        self.view().matrix_as("DeviceVec::matrix", rows, cols, layout)
    }

    /// The whole array as a writable matrix (see [`matrix`](Self::matrix)).
    pub fn matrix_mut(&mut self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixViewMut<'_, T>> {
        self.view_mut().matrix_mut_as("DeviceVec::matrix_mut", rows, cols, layout)
    }
}

fn dense_shape(who: &'static str, len: usize, rows: usize, cols: usize, layout: Layout) -> Result<Shape> {
    if rows.checked_mul(cols) != Some(len) {
        return Err(Error::logic(who, format!("a {rows}×{cols} matrix needs {} elements, the array has {len}", rows.saturating_mul(cols))));
    }
    Shape::checked(who, len, 0, rows, cols, Shape::dense_ld(rows, cols, layout), layout)
}

impl<'a, T: DeviceScalar> DeviceView<'a, T> {
    /// The view as a contiguous `rows × cols` matrix in `layout`.
    ///
    /// # Errors
    /// `Logic` when `rows × cols` is not the view's length.
    pub fn matrix(self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixView<'a, T>> {
        self.matrix_as("DeviceView::matrix", rows, cols, layout)
    }

    /// A `rows × cols` matrix in `layout` at the view's start, whose rows (row-major) or
    /// columns (column-major) lie `ld` elements apart: a block of a larger matrix, as BLAS
    /// takes it.
    ///
    /// # Errors
    /// `Logic` when `ld` is below a row's (column's) length, or the last element would lie past
    /// the view.
    pub fn matrix_strided(self, rows: usize, cols: usize, ld: usize, layout: Layout) -> Result<MatrixView<'a, T>> {
        let shape = Shape::checked("DeviceView::matrix_strided", self.len(), 0, rows, cols, ld, layout)?;
        Ok(MatrixView { data: self, shape })
    }

    fn matrix_as(self, who: &'static str, rows: usize, cols: usize, layout: Layout) -> Result<MatrixView<'a, T>> {
        let shape = dense_shape(who, self.len(), rows, cols, layout)?;
        Ok(MatrixView { data: self, shape })
    }
}

impl<'a, T: DeviceScalar> DeviceViewMut<'a, T> {
    /// The view as a contiguous, writable `rows × cols` matrix (see [`DeviceView::matrix`]).
    pub fn matrix_mut(self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixViewMut<'a, T>> {
        self.matrix_mut_as("DeviceViewMut::matrix_mut", rows, cols, layout)
    }

    /// A writable matrix with a leading dimension (see [`DeviceView::matrix_strided`]).
    pub fn matrix_strided_mut(self, rows: usize, cols: usize, ld: usize, layout: Layout) -> Result<MatrixViewMut<'a, T>> {
        let shape = Shape::checked("DeviceViewMut::matrix_strided_mut", self.len(), 0, rows, cols, ld, layout)?;
        Ok(MatrixViewMut { data: self, shape })
    }

    fn matrix_mut_as(self, who: &'static str, rows: usize, cols: usize, layout: Layout) -> Result<MatrixViewMut<'a, T>> {
        let shape = dense_shape(who, self.len(), rows, cols, layout)?;
        Ok(MatrixViewMut { data: self, shape })
    }
}

macro_rules! shape_accessors {
    () => {
        /// Rows.
        pub fn rows(&self) -> usize {
            self.shape.rows
        }
        /// Columns.
        pub fn cols(&self) -> usize {
            self.shape.cols
        }
        /// Order in memory.
        pub fn layout(&self) -> Layout {
            self.shape.layout
        }
        /// The distance, in elements, between the starts of two rows (row-major) or columns
        /// (column-major): BLAS's leading dimension.
        pub fn ld(&self) -> usize {
            self.shape.ld
        }
        /// Where the matrix starts in the array it views, in elements.
        pub fn offset(&self) -> usize {
            self.data.offset() + self.shape.offset
        }
        /// Whether the elements follow each other without gaps (the leading dimension is a row's
        /// length, for row-major, or there is at most one row).
        pub fn is_contiguous(&self) -> bool {
            self.shape.is_contiguous()
        }
        /// The resources of the array viewed.
        pub fn resources(&self) -> &'a DeviceResources {
            self.data.resources()
        }
        /// The stream the matrix is ordered on: its array's.
        pub fn stream(&self) -> &'a Arc<CudaStream> {
            self.data.stream()
        }
    };
}

impl<'a, T: DeviceScalar> MatrixView<'a, T> {
    shape_accessors!();

    /// Rows `rows` and columns `cols` of this matrix (e.g. `1..3, 0..2`), same leading
    /// dimension.
    ///
    /// # Errors
    /// `Logic` when a range is not inside the matrix.
    pub fn submatrix(&self, rows: impl RangeBounds<usize>, cols: impl RangeBounds<usize>) -> Result<MatrixView<'a, T>> {
        let shape = self.shape.sub("MatrixView::submatrix", rows, cols)?;
        Ok(MatrixView { data: self.data, shape })
    }

    /// The elements from the matrix's first to its last, for cudarc or FFI (with the gaps
    /// between rows of a strided matrix).
    pub fn as_slice(&self) -> DeviceView<'a, T> {
        let (s, n) = (self.shape.offset, self.shape.span());
        self.data.slice(s..s + n).expect("a checked matrix lies inside its view")
    }

    /// The buffer and the first element's offset in it, for a read on the array's stream.
    pub(crate) fn read_parts(&self) -> (&'a NativeBuffer, usize) {
        (self.data.buffer(), self.offset())
    }
}

impl<'a, T: DeviceScalar> MatrixViewMut<'a, T> {
    shape_accessors!();

    /// The same matrix, read-only, while this one is borrowed.
    pub fn as_view(&self) -> MatrixView<'_, T> {
        MatrixView { data: self.data.as_view(), shape: self.shape }
    }

    /// Rows `rows` and columns `cols` of this matrix, writable, borrowing this one.
    ///
    /// # Errors
    /// `Logic` when a range is not inside the matrix.
    pub fn submatrix_mut(&mut self, rows: impl RangeBounds<usize>, cols: impl RangeBounds<usize>) -> Result<MatrixViewMut<'_, T>> {
        let shape = self.shape.sub("MatrixViewMut::submatrix_mut", rows, cols)?;
        Ok(MatrixViewMut { data: self.data.slice_mut(..)?, shape })
    }

    /// The elements from the matrix's first to its last, writable (see
    /// [`MatrixView::as_slice`]).
    pub fn as_slice_mut(&mut self) -> DeviceViewMut<'_, T> {
        let (s, n) = (self.shape.offset, self.shape.span());
        self.data.slice_mut(s..s + n).expect("a checked matrix lies inside its view")
    }

    /// The buffer and the first element's offset in it, for a write on the array's stream.
    pub(crate) fn write_parts(&mut self) -> (&'a NativeBuffer, usize) {
        (self.data.buffer_mut(), self.offset())
    }
}

/// An owned `rows × cols` matrix in device memory: a [`DeviceVec`] of exactly `rows × cols`
/// elements, contiguous in `layout`. What cuVS's indexes own (their dataset) and return
/// (neighbours, distances); its views are [`view`](Self::view) and [`view_mut`](Self::view_mut).
///
/// # Thread safety
/// `Send + Sync`, as [`DeviceVec`].
#[derive(Debug)]
pub struct DeviceMatrix<T: DeviceScalar> {
    data: DeviceVec<T>,
    rows: usize,
    cols: usize,
    layout: Layout,
}

static_assertions::assert_impl_all!(DeviceMatrix<f32>: Send, Sync);

impl<T: DeviceScalar> DeviceMatrix<T> {
    /// `rows × cols` elements with unspecified contents, on `resources` (as [`DeviceVec::new`]).
    ///
    /// # Errors
    /// `Logic` when `rows × cols` overflows; otherwise as [`DeviceVec::new`].
    pub fn new(resources: &DeviceResources, rows: usize, cols: usize, layout: Layout) -> Result<Self> {
        const WHO: &str = "DeviceMatrix::new";
        let len = elements(WHO, rows, cols)?;
        let data = DeviceVec::new(resources, len).map_err(|e| e.with_who(WHO))?;
        Ok(DeviceMatrix { data, rows, cols, layout })
    }

    /// A matrix of `data`, which holds its `rows × cols` elements in `layout`.
    ///
    /// # Errors
    /// `Logic` when `rows × cols` is not `data.len()`.
    pub fn from_vec(data: DeviceVec<T>, rows: usize, cols: usize, layout: Layout) -> Result<Self> {
        dense_shape("DeviceMatrix::from_vec", data.len(), rows, cols, layout)?;
        Ok(DeviceMatrix { data, rows, cols, layout })
    }

    /// A copy of `host`, `rows × cols` in `layout`, on `resources` (as [`DeviceVec::from_host`]).
    ///
    /// # Errors
    /// `Logic` when `rows × cols` is not `host.len()`; otherwise as [`DeviceVec::from_host`].
    pub fn from_host(resources: &DeviceResources, host: &[T], rows: usize, cols: usize, layout: Layout) -> Result<Self> {
        const WHO: &str = "DeviceMatrix::from_host";
        dense_shape(WHO, host.len(), rows, cols, layout)?;
        let data = DeviceVec::from_host(resources, host).map_err(|e| e.with_who(WHO))?;
        Ok(DeviceMatrix { data, rows, cols, layout })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Order in memory.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The resources the matrix belongs to.
    pub fn resources(&self) -> &DeviceResources {
        self.data.resources()
    }

    /// The stream the matrix is ordered on (its resources').
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.data.stream()
    }

    /// The whole matrix, read-only.
    pub fn view(&self) -> MatrixView<'_, T> {
        let shape = Shape {
            offset: 0,
            rows: self.rows,
            cols: self.cols,
            ld: Shape::dense_ld(self.rows, self.cols, self.layout),
            layout: self.layout,
        };
        MatrixView { data: self.data.view(), shape }
    }

    /// The whole matrix, writable.
    pub fn view_mut(&mut self) -> MatrixViewMut<'_, T> {
        let shape = Shape {
            offset: 0,
            rows: self.rows,
            cols: self.cols,
            ld: Shape::dense_ld(self.rows, self.cols, self.layout),
            layout: self.layout,
        };
        MatrixViewMut { data: self.data.view_mut(), shape }
    }

    /// The elements, in `layout` order (read-only: the array keeps the matrix's length).
    pub fn as_vec(&self) -> &DeviceVec<T> {
        &self.data
    }

    /// The array, giving up the shape.
    pub fn into_vec(self) -> DeviceVec<T> {
        self.data
    }

    /// The elements on the host, in `layout` order (as [`DeviceVec::to_host`]).
    pub fn to_host(&self) -> Result<Vec<T>> {
        self.data.to_host().map_err(|e| e.with_who("DeviceMatrix::to_host"))
    }
}

impl<'a, T: DeviceScalar> From<&'a DeviceMatrix<T>> for MatrixView<'a, T> {
    fn from(m: &'a DeviceMatrix<T>) -> Self {
        m.view()
    }
}

fn elements(who: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| Error::logic(who, format!("a {rows}×{cols} matrix: the element count overflows")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logic(r: Result<Shape>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Logic);
        e.to_string()
    }

    #[test]
    fn a_strided_shape_fits_its_elements_or_is_refused() {
        // A 2×3 block of a row-major 4×5 matrix, from (1, 1): rows 5 apart.
        let s = Shape::checked("t", 20, 6, 2, 3, 5, Layout::RowMajor).unwrap();
        assert_eq!(s.span(), 8);
        assert!(!s.is_contiguous());
        // The last element at 6 + 5 + 2 = 13 < 20; one row more reaches 18; two more, 23.
        assert!(Shape::checked("t", 20, 6, 3, 3, 5, Layout::RowMajor).is_ok());
        assert_eq!(
            logic(Shape::checked("t", 20, 6, 4, 3, 5, Layout::RowMajor)),
            "t: a 4×3 RowMajor matrix with leading dimension 5 from element 6 needs more than the 20 elements viewed"
        );
        assert_eq!(
            logic(Shape::checked("t", 20, 0, 2, 3, 2, Layout::RowMajor)),
            "t: leading dimension 2 is below the 3 elements of a RowMajor line"
        );
        // Column-major: the leading dimension is measured against the rows.
        assert!(Shape::checked("t", 12, 0, 3, 4, 3, Layout::ColMajor).is_ok());
        logic(Shape::checked("t", 12, 0, 4, 3, 3, Layout::ColMajor));
        assert!(Shape::checked("t", 0, 0, 0, 3, 3, Layout::RowMajor).is_ok(), "an empty matrix needs nothing");
    }

    #[test]
    fn shapes_that_would_wrap_are_refused_not_wrapped() {
        logic(Shape::checked("t", 16, 0, usize::MAX, 2, 2, Layout::RowMajor));
        logic(Shape::checked("t", 16, 0, 3, 2, usize::MAX / 2 + 1, Layout::RowMajor));
        logic(Shape::checked("t", 16, usize::MAX, 1, 1, 1, Layout::RowMajor));
        logic(Shape::checked("t", 16, 15, 1, usize::MAX, usize::MAX, Layout::RowMajor));
        logic(dense_shape("t", 4, 1 << 32, 1 << 32, Layout::RowMajor));
    }

    /// The elements (indices into the array) a shape describes, by (row, column), computed in
    /// u128 from the definition, not from the code under test.
    fn cells(offset: usize, rows: usize, cols: usize, ld: usize, layout: Layout) -> Vec<((usize, usize), u128)> {
        let mut out = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                let (line, within) = match layout {
                    Layout::RowMajor => (r, c),
                    Layout::ColMajor => (c, r),
                };
                out.push(((r, c), offset as u128 + line as u128 * ld as u128 + within as u128));
            }
        }
        out
    }

    /// Every shape of a small domain, exhaustively: a shape is accepted exactly when its leading
    /// dimension covers a line and every element it describes lies inside the array (an empty
    /// one: its offset at most the length), and every block of an accepted shape describes
    /// exactly its parent's elements at those rows and columns. A checker that let one element
    /// out would hand cuBLAS memory past the array (checked to fail with `end <= len + 1`).
    #[test]
    #[cfg_attr(miri, ignore = "pure arithmetic over tens of thousands of cases: Miri adds nothing and takes minutes")]
    fn every_small_shape_is_accepted_exactly_when_its_elements_lie_inside() {
        let mut accepted = 0;
        for layout in [Layout::RowMajor, Layout::ColMajor] {
            for len in 0..=7 {
                for offset in 0..=8 {
                    for rows in 0..=3 {
                        for cols in 0..=3 {
                            for ld in 0..=5 {
                                let (inner, _) = Shape::inner_outer(rows, cols, layout);
                                let all = cells(offset, rows, cols, ld, layout);
                                let fits = if all.is_empty() { offset <= len } else { all.iter().all(|&(_, i)| i < len as u128) };
                                let want = ld >= inner.max(1) && fits;
                                let got = Shape::checked("t", len, offset, rows, cols, ld, layout);
                                assert_eq!(got.is_ok(), want, "len {len} offset {offset} {rows}x{cols} ld {ld} {layout:?}");
                                let Ok(shape) = got else { continue };
                                accepted += 1;
                                for r0 in 0..=rows {
                                    for r1 in r0..=rows {
                                        for c0 in 0..=cols {
                                            for c1 in c0..=cols {
                                                let sub = shape.sub("t", r0..r1, c0..c1).unwrap();
                                                let want: Vec<u128> = all
                                                    .iter()
                                                    .filter(|&&((r, c), _)| (r0..r1).contains(&r) && (c0..c1).contains(&c))
                                                    .map(|&(_, i)| i)
                                                    .collect();
                                                let got: Vec<u128> = cells(sub.offset, sub.rows, sub.cols, sub.ld, sub.layout)
                                                    .into_iter()
                                                    .map(|(_, i)| i)
                                                    .collect();
                                                assert_eq!(got, want, "{shape:?} [{r0}..{r1}, {c0}..{c1}] -> {sub:?}");
                                                assert!(sub.offset <= len && sub.span() + sub.offset <= len, "{sub:?} past {len}");
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(accepted > 1000, "the domain accepted only {accepted} shapes");
    }

    #[test]
    fn a_submatrix_starts_at_its_first_element_and_keeps_the_leading_dimension() {
        let m = Shape::checked("t", 20, 0, 4, 5, 5, Layout::RowMajor).unwrap();
        let s = m.sub("t", 1..3, 1..4).unwrap();
        assert_eq!((s.offset, s.rows, s.cols, s.ld), (6, 2, 3, 5));
        let c = Shape::checked("t", 20, 0, 4, 5, 4, Layout::ColMajor).unwrap();
        let s = c.sub("t", 1..3, 2..).unwrap();
        assert_eq!((s.offset, s.rows, s.cols, s.ld), (9, 2, 3, 4));
        assert!(m.sub("t", 0..5, ..).is_err(), "a row past the matrix");
        assert!(m.sub("t", .., 3..6).is_err(), "a column past the matrix");
        let empty = m.sub("t", 4.., ..).unwrap();
        assert_eq!((empty.rows, empty.span()), (0, 0));
    }
}

//! N-d C-contiguous shapes with checked element counts and byte sizes.
//!
//! A [`Shape`] is validated once, at construction: its element count and its size in bytes
//! for a given element size both fit in `isize::MAX` (Rust's limit for one allocation).

use crate::error::{Error, Result};

/// Shapes of up to this many dimensions are held inline (no allocation).
const INLINE_RANK: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Dims {
    Inline { dims: [usize; INLINE_RANK], rank: usize },
    Heap(Box<[usize]>),
}

/// The dimensions of a buffer, outermost first (C order). Zero dimensions is a scalar, and any
/// dimension may be zero (an empty buffer).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: Dims,
    len: usize,
}

impl Shape {
    /// Checks that `dims` holds `elem_size`-byte elements within one allocation's limit, and
    /// that every dimension fits `isize` (NumPy's `npy_intp`), also when another is 0.
    pub fn new(dims: &[usize], elem_size: usize) -> Result<Shape> {
        let invalid = |reason: String| Error::InvalidShape { dims: dims.to_vec(), reason };
        if let Some(&big) = dims.iter().find(|&&d| d > isize::MAX as usize) {
            return Err(invalid(format!(
                "dimension {big} exceeds {}; expected dimensions that fit isize",
                isize::MAX
            )));
        }
        // As NumPy checks: the dimensions other than 0 must multiply, with the element size,
        // to a size that fits `isize`, also when another dimension makes the array empty (its
        // strides are those products: an empty (0, 2**62, 4) would have none that fit).
        let nonzero = dims.iter().filter(|&&d| d != 0).try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let bytes =
            nonzero.and_then(|n| n.checked_mul(elem_size.max(1))).filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() {
            let dims_text = dims.iter().filter(|&&d| d != 0).map(|d| d.to_string()).collect::<Vec<_>>();
            return Err(invalid(format!(
                "its dimensions other than 0 ({}) times the element size ({elem_size} bytes) exceed the largest \
                 possible allocation ({} bytes); expected a shape whose size fits, as NumPy requires",
                dims_text.join(" x "),
                isize::MAX
            )));
        }
        let len = if dims.contains(&0) { 0 } else { nonzero.unwrap_or(0) };
        let dims = if dims.len() <= INLINE_RANK {
            let mut inline = [0; INLINE_RANK];
            inline[..dims.len()].copy_from_slice(dims);
            Dims::Inline { dims: inline, rank: dims.len() }
        } else {
            Dims::Heap(dims.into())
        };
        Ok(Shape { dims, len })
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        match &self.dims {
            Dims::Inline { dims, rank } => &dims[..*rank],
            Dims::Heap(dims) => dims,
        }
    }

    /// The number of elements (the product of the dimensions; 1 for a scalar).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the shape holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_elements() {
        assert_eq!(Shape::new(&[2, 3, 4], 4).unwrap().len(), 24);
        assert_eq!(Shape::new(&[], 4).unwrap().len(), 1);
        assert!(Shape::new(&[5, 0, 7], 8).unwrap().is_empty());
        let deep = Shape::new(&[1, 2, 1, 2, 1, 3], 4).unwrap();
        assert_eq!((deep.dims(), deep.len()), (&[1, 2, 1, 2, 1, 3][..], 12));
        assert_eq!(Shape::new(&[2, 3], 4).unwrap().dims(), &[2, 3]);
    }

    #[test]
    fn rejects_count_overflow() {
        let err = Shape::new(&[isize::MAX as usize, 3], 1).unwrap_err();
        assert!(err.to_string().contains("exceed the largest possible allocation"), "{err}");
    }

    #[test]
    fn rejects_dimensions_beyond_isize_even_with_a_zero() {
        let err = Shape::new(&[0, 1 << 63], 4).unwrap_err();
        assert!(err.to_string().contains("expected dimensions that fit isize"), "{err}");
        assert!(Shape::new(&[0, isize::MAX as usize], 1).unwrap().is_empty());
    }

    #[test]
    fn an_empty_shape_whose_other_dimensions_overflow_is_refused_as_numpy_refuses_it() {
        // Its strides would not fit (a hostile pass, 2026-11-27: exporting such a buffer
        // overflowed while computing them).
        let err = Shape::new(&[0, 1 << 62, 4], 1).unwrap_err();
        assert!(err.to_string().contains("other than 0 (4611686018427387904 x 4)"), "{err}");
        assert!(Shape::new(&[0, isize::MAX as usize], 4).is_err());
        let fits = Shape::new(&[0, 1 << 61, 2], 1).unwrap();
        assert_eq!((fits.len(), fits.dims()), (0, &[0, 1 << 61, 2][..]));
    }

    #[test]
    fn rejects_byte_overflow() {
        let err = Shape::new(&[usize::MAX / 4], 8).unwrap_err();
        assert!(err.to_string().contains("exceed the largest possible allocation"), "{err}");
        assert!(Shape::new(&[isize::MAX as usize / 4 + 1], 4).is_err());
    }
}

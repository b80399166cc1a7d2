//! A section's shape, held inline: a batch's section table then allocates nothing but its
//! list, which the loader reuses batch after batch.

use std::fmt;
use std::ops::Deref;

/// The most dimensions a section has (`dom_features` `[B, M, F]`).
pub const MAX_SECTION_DIMS: usize = 3;

/// The shape of one section: up to [`MAX_SECTION_DIMS`] sizes, read as a slice.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TensorShape {
    /// The sizes, zero past `ndim`.
    dims: [usize; MAX_SECTION_DIMS],
    ndim: u8,
}

impl TensorShape {
    /// The sizes as a vector (what the Python package hands out).
    pub fn to_vec(&self) -> Vec<usize> {
        self[..].to_vec()
    }

    /// How many values the section holds.
    pub fn elements(&self) -> usize {
        self.iter().product()
    }
}

impl<const N: usize> From<[usize; N]> for TensorShape {
    fn from(sizes: [usize; N]) -> TensorShape {
        const { assert!(N <= MAX_SECTION_DIMS, "a section has at most 3 dimensions") };
        let mut dims = [0; MAX_SECTION_DIMS];
        dims[..N].copy_from_slice(&sizes);
        TensorShape {
            dims,
            ndim: N as u8,
        }
    }
}

impl Deref for TensorShape {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        &self.dims[..usize::from(self.ndim)]
    }
}

impl fmt::Debug for TensorShape {
    /// As the slice of its sizes: `[256, 3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self[..], f)
    }
}

impl PartialEq<[usize]> for TensorShape {
    fn eq(&self, other: &[usize]) -> bool {
        self[..] == *other
    }
}

impl<const N: usize> PartialEq<[usize; N]> for TensorShape {
    fn eq(&self, other: &[usize; N]) -> bool {
        self[..] == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_as_the_sizes_it_was_made_of() {
        let scalar = TensorShape::from([0usize; 0]);
        assert!(scalar.is_empty());
        assert_eq!(scalar.elements(), 1, "a scalar holds one value");
        let flat = TensorShape::from([7]);
        assert_eq!(flat, [7]);
        assert_eq!(flat.to_vec(), vec![7]);
        let cube = TensorShape::from([2, 5, 13]);
        assert_eq!(&cube[..], &[2, 5, 13]);
        assert_eq!(cube.elements(), 130);
        assert_eq!(format!("{cube:?}"), "[2, 5, 13]");
        assert_ne!(TensorShape::from([2, 5]), TensorShape::from([2, 5, 1]));
        assert_ne!(TensorShape::from([0]), TensorShape::from([0usize; 0]));
    }
}

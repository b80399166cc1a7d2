//! Plain numeric element types and their byte views (little-endian hosts only, like the
//! safetensors format itself).

#[cfg(not(target_endian = "little"))]
compile_error!(
    "shardify reads and writes little-endian tensors in place: big-endian hosts are not supported"
);

mod sealed {
    pub trait Sealed {}
}

/// A numeric type with no padding and no invalid bit patterns.
pub trait Pod: sealed::Sealed + Copy + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(impl sealed::Sealed for $t {} impl Pod for $t {})*};
}
pod!(u8, i16, u16, i32, u32, i64, u64, f32, f64);

/// The bytes of a slice of numbers.
pub fn as_bytes<T: Pod>(values: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding, so every byte of the slice is initialised, and
    // the length in bytes is exactly `len * size_of::<T>()`; u8 has alignment 1.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// The bytes of a mutable slice of numbers.
pub fn as_bytes_mut<T: Pod>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; in addition every byte pattern written through the view is
    // a valid `Pod` value, and the view borrows `values` mutably, so nothing else aliases it.
    unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(values),
        )
    }
}

/// Appends the numbers encoded (little-endian) in `bytes` to `out`; `bytes.len()` must be a
/// multiple of the element size.
pub fn extend_from_bytes<T: Pod + Default>(out: &mut Vec<T>, bytes: &[u8]) {
    let n = bytes.len() / std::mem::size_of::<T>();
    let start = out.len();
    out.resize(start + n, T::default());
    as_bytes_mut(&mut out[start..]).copy_from_slice(&bytes[..n * std::mem::size_of::<T>()]);
}

/// Reinterprets bytes as numbers; `None` when misaligned or of a length that is not a
/// multiple of the element size.
pub fn try_cast<T: Pod>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    {
        return None;
    }
    // SAFETY: alignment and length were checked above; every bit pattern is a valid `Pod`
    // value; the returned slice borrows `bytes`, so it cannot outlive the memory.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// Reinterprets mutable bytes as numbers; `None` when misaligned or of a length that is
/// not a multiple of the element size.
pub fn try_cast_mut<T: Pod>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    {
        return None;
    }
    // SAFETY: alignment and length were checked above; every bit pattern is a valid `Pod`
    // value; the result borrows `bytes` mutably, so nothing else aliases it.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size)
    })
}

/// Bytes of a cache line (x86-64, most arm64).
pub const CACHE_LINE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
struct Line([u8; CACHE_LINE]);

/// Owned zeroed bytes starting on a cache line: the system allocator only promises 16
/// bytes of alignment (a 165 KB table it served from `mmap` started 16 bytes past a line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineAligned {
    lines: Vec<Line>,
    len: usize,
}

impl LineAligned {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> LineAligned {
        LineAligned {
            lines: vec![Line([0; CACHE_LINE]); len.div_ceil(CACHE_LINE)],
            len,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is a byte array with no padding (`repr(C)`), so the vector's
        // storage is `lines.len() * CACHE_LINE >= len` initialised bytes, borrowed shared.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably, so nothing else aliases them.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_misalignment() {
        let v: Vec<i64> = vec![1, -2, 3];
        let b = as_bytes(&v);
        assert_eq!(b.len(), 24);
        assert_eq!(try_cast::<i64>(b).unwrap(), &v[..]);
        assert!(try_cast::<i64>(&b[1..9]).is_none());
        assert!(try_cast::<i32>(&b[..6]).is_none());
    }

    #[test]
    fn line_aligned_bytes_start_on_a_line_zeroed() {
        for len in [0, 1, 63, 64, 65, 165_120] {
            let mut bytes = LineAligned::zeroed(len);
            assert_eq!(bytes.bytes().len(), len);
            assert_eq!(
                bytes.bytes().as_ptr() as usize % CACHE_LINE,
                0,
                "{len} bytes"
            );
            assert!(bytes.bytes().iter().all(|&b| b == 0));
            bytes.bytes_mut().iter_mut().for_each(|b| *b = 7);
            assert!(bytes.bytes().iter().all(|&b| b == 7));
        }
    }
}

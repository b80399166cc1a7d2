//! Typed views of columns stored at one of several widths.

use super::pod::{as_bytes, try_cast};
use super::safetensors::Dtype;

/// The bytes of elements `range` of a raw column (its bytes and element type, as
/// [`IntColumn::raw`] and [`FloatColumn::raw`] give them).
pub fn element_range((raw, dtype): (&[u8], Dtype), range: std::ops::Range<usize>) -> &[u8] {
    &raw[range.start * dtype.size()..range.end * dtype.size()]
}

/// An integer column stored at one of several widths.
#[derive(Debug, Clone, Copy)]
pub enum IntColumn<'a> {
    /// Stored as I16.
    I16(&'a [i16]),
    /// Stored as I32.
    I32(&'a [i32]),
    /// Stored as I64.
    I64(&'a [i64]),
}

impl<'a> IntColumn<'a> {
    /// The stored bytes and element type.
    pub fn raw(&self) -> (&'a [u8], Dtype) {
        match *self {
            IntColumn::I16(v) => (as_bytes(v), Dtype::I16),
            IntColumn::I32(v) => (as_bytes(v), Dtype::I32),
            IntColumn::I64(v) => (as_bytes(v), Dtype::I64),
        }
    }

    /// Views `bytes` (aligned, of whole elements) as a column of `dtype`.
    pub fn from_raw(bytes: &'a [u8], dtype: Dtype) -> Option<IntColumn<'a>> {
        Some(match dtype {
            Dtype::I16 => IntColumn::I16(try_cast(bytes)?),
            Dtype::I32 => IntColumn::I32(try_cast(bytes)?),
            Dtype::I64 => IntColumn::I64(try_cast(bytes)?),
            _ => return None,
        })
    }

    /// Element `i`, widened.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            IntColumn::I16(v) => v[i] as i64,
            IntColumn::I32(v) => v[i] as i64,
            IntColumn::I64(v) => v[i],
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            IntColumn::I16(v) => v.len(),
            IntColumn::I32(v) => v.len(),
            IntColumn::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A float column stored at one of several widths.
#[derive(Debug, Clone, Copy)]
pub enum FloatColumn<'a> {
    /// Stored as F32.
    F32(&'a [f32]),
    /// Stored as F64.
    F64(&'a [f64]),
}

impl<'a> FloatColumn<'a> {
    /// The stored bytes and element type.
    pub fn raw(&self) -> (&'a [u8], Dtype) {
        match *self {
            FloatColumn::F32(v) => (as_bytes(v), Dtype::F32),
            FloatColumn::F64(v) => (as_bytes(v), Dtype::F64),
        }
    }

    /// Views `bytes` (aligned, of whole elements) as a column of `dtype`.
    pub fn from_raw(bytes: &'a [u8], dtype: Dtype) -> Option<FloatColumn<'a>> {
        Some(match dtype {
            Dtype::F32 => FloatColumn::F32(try_cast(bytes)?),
            Dtype::F64 => FloatColumn::F64(try_cast(bytes)?),
            _ => return None,
        })
    }

    /// Element `i`, widened (exactly).
    pub fn get(&self, i: usize) -> f64 {
        match self {
            FloatColumn::F32(v) => v[i] as f64,
            FloatColumn::F64(v) => v[i],
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            FloatColumn::F32(v) => v.len(),
            FloatColumn::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

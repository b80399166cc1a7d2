//! The safetensors container: `u64` LE header length, JSON header, contiguous tensors.
//!
//! Our writer orders tensors by descending element size (then name) and pads the header
//! with spaces so the data section starts at a multiple of [`DATA_ALIGN`]: every tensor is
//! then naturally aligned in a memory map. The reader validates every offset, size and
//! shape before anything trusts it, as the reference implementation does.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Map, Value};

/// Where the data section starts: a multiple of this many bytes from the file start.
pub const DATA_ALIGN: usize = 4096;
/// The largest header accepted, as in the reference implementation.
pub const MAX_HEADER_BYTES: usize = 100_000_000;

/// Element types used by shardify.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Dtype {
    /// One byte, 0 or 1.
    BOOL,
    /// Unsigned byte.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE single.
    F32,
    /// IEEE double.
    F64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::BOOL | Dtype::U8 => 1,
            Dtype::I16 => 2,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// The name in the header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I16 => "I16",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
        }
    }

    fn parse(name: &str) -> Option<Dtype> {
        [
            Dtype::BOOL,
            Dtype::U8,
            Dtype::I16,
            Dtype::I32,
            Dtype::I64,
            Dtype::F32,
            Dtype::F64,
        ]
        .into_iter()
        .find(|d| d.name() == name)
    }
}

/// A Rust element type with its safetensors dtype (BOOL is read as `u8`).
pub trait Element: crate::format::pod::Pod {
    /// The dtype whose elements are this type.
    const DTYPE: Dtype;

    /// Whether elements of `dtype` can be read as this type.
    fn reads(dtype: Dtype) -> bool {
        dtype == Self::DTYPE || (Self::DTYPE == Dtype::U8 && dtype == Dtype::BOOL)
    }
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })*};
}
element!(u8 => U8, i16 => I16, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// The bytes of a tensor, produced while writing (so a converted copy never has to exist
/// in memory as a whole).
pub trait TensorBytes {
    /// How many bytes `write_to` writes.
    fn byte_len(&self) -> usize;
    /// Writes the bytes.
    fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()>;
}

/// Bytes already in memory.
pub struct Raw<'a>(pub &'a [u8]);

impl TensorBytes for Raw<'_> {
    fn byte_len(&self) -> usize {
        self.0.len()
    }

    fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        out.write_all(self.0)
    }
}

/// A tensor to write.
pub struct TensorOut<'a> {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Little-endian bytes; their length is the product of `shape` times the element size.
    pub data: &'a dyn TensorBytes,
}

/// Writes a safetensors file; returns the bytes written.
pub fn write(
    out: &mut impl Write,
    metadata: &BTreeMap<String, String>,
    tensors: &[TensorOut],
) -> std::io::Result<u64> {
    let mut order: Vec<&TensorOut> = tensors.iter().collect();
    order.sort_by(|a, b| {
        b.dtype
            .size()
            .cmp(&a.dtype.size())
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!(metadata));
    let mut offset = 0usize;
    for t in &order {
        let len = t.data.byte_len();
        assert_eq!(
            len,
            t.shape.iter().product::<usize>() * t.dtype.size(),
            "tensor {}",
            t.name
        );
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).expect("header serialises");
    let padded = (8 + text.len()).div_ceil(DATA_ALIGN) * DATA_ALIGN - 8;
    text.resize(padded, b' ');
    out.write_all(&(text.len() as u64).to_le_bytes())?;
    out.write_all(&text)?;
    for t in &order {
        t.data.write_to(out)?;
    }
    Ok((8 + text.len() + offset) as u64)
}

/// Where a tensor lies, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte range within the whole file.
    pub range: std::ops::Range<usize>,
}

/// A parsed, validated header.
#[derive(Debug, Clone)]
pub struct Header {
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
}

/// Why a safetensors file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than the 8 bytes of the header length.
    #[error("{file_bytes} bytes is too short for a safetensors file")]
    TooShort {
        /// The file's length.
        file_bytes: usize,
    },
    /// The declared header length exceeds [`MAX_HEADER_BYTES`].
    #[error("header length {declared} exceeds {MAX_HEADER_BYTES}")]
    TooLong {
        /// The declared length.
        declared: u64,
    },
    /// The declared header length runs past the end of the file.
    #[error("header length {declared} runs past the end of the {file_bytes}-byte file")]
    PastEnd {
        /// The declared length.
        declared: u64,
        /// The file's length.
        file_bytes: usize,
    },
    /// The header is not JSON, or not a JSON object.
    #[error("header is not a JSON object: {0}")]
    NotJson(String),
    /// `__metadata__` is not a map of strings to strings.
    #[error("__metadata__ is not a string map: {0}")]
    Metadata(String),
    /// A tensor entry lacks a field or holds one of the wrong kind.
    #[error("tensor `{tensor}`: field `{field}` is missing or malformed")]
    Field {
        /// The tensor.
        tensor: String,
        /// `dtype`, `shape` or `data_offsets`.
        field: &'static str,
    },
    /// A dtype this reader does not know.
    #[error("tensor `{tensor}`: unsupported dtype {dtype}")]
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype's name in the header.
        dtype: String,
    },
    /// `data_offsets` reversed or past the data section.
    #[error("tensor `{tensor}`: data_offsets [{start}, {end}] outside the {data_bytes}-byte data section")]
    OutsideData {
        /// The tensor.
        tensor: String,
        /// First byte (relative to the data section).
        start: usize,
        /// One past the last byte.
        end: usize,
        /// Bytes in the data section.
        data_bytes: usize,
    },
    /// The shape's byte size differs from the span of `data_offsets` (or overflows).
    #[error("tensor `{tensor}`: shape {shape:?} of {dtype:?} does not fill data_offsets spanning {span} bytes")]
    ShapeSpan {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: Dtype,
        /// Bytes between its data offsets.
        span: usize,
    },
    /// Tensors that leave a gap or overlap: the data must be contiguous from offset 0.
    #[error(
        "tensor `{tensor}` starts at data offset {start}, expected {expected} (gap or overlap)"
    )]
    NotContiguous {
        /// The tensor.
        tensor: String,
        /// Where it starts.
        start: usize,
        /// Where the previous tensor ended.
        expected: usize,
    },
    /// Bytes after the last tensor.
    #[error("tensors end at data offset {end} but the data section has {data_bytes} bytes")]
    Trailing {
        /// Where the last tensor ends.
        end: usize,
        /// Bytes in the data section.
        data_bytes: usize,
    },
}

/// Parses and validates the header of a whole safetensors file held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Header, HeaderError> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .ok_or(HeaderError::TooShort {
            file_bytes: bytes.len(),
        })?
        .try_into()
        .expect("8 bytes");
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES as u64 {
        return Err(HeaderError::TooLong { declared: n });
    }
    let data_start = 8 + n as usize;
    let text = bytes.get(8..data_start).ok_or(HeaderError::PastEnd {
        declared: n,
        file_bytes: bytes.len(),
    })?;
    let value: Value =
        serde_json::from_slice(text).map_err(|e| HeaderError::NotJson(e.to_string()))?;
    let Value::Object(entries) = value else {
        return Err(HeaderError::NotJson("not an object".into()));
    };
    let data_len = bytes.len() - data_start;
    let mut header = Header {
        metadata: BTreeMap::new(),
        tensors: BTreeMap::new(),
    };
    let mut spans = Vec::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            header.metadata =
                serde_json::from_value(entry).map_err(|e| HeaderError::Metadata(e.to_string()))?;
            continue;
        }
        let info = parse_entry(&name, &entry, data_len)?;
        spans.push((info.range.start, info.range.end, name.clone()));
        header.tensors.insert(
            name,
            TensorInfo {
                range: data_start + info.range.start..data_start + info.range.end,
                ..info
            },
        );
    }
    spans.sort();
    let mut expected = 0;
    for (start, end, name) in spans {
        if start != expected {
            return Err(HeaderError::NotContiguous {
                tensor: name,
                start,
                expected,
            });
        }
        expected = end;
    }
    if expected != data_len {
        return Err(HeaderError::Trailing {
            end: expected,
            data_bytes: data_len,
        });
    }
    Ok(header)
}

fn parse_entry(name: &str, entry: &Value, data_len: usize) -> Result<TensorInfo, HeaderError> {
    let malformed = |field| HeaderError::Field {
        tensor: name.to_string(),
        field,
    };
    let dtype_name = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("dtype"))?;
    let dtype = Dtype::parse(dtype_name).ok_or_else(|| HeaderError::UnknownDtype {
        tensor: name.to_string(),
        dtype: dtype_name.to_string(),
    })?;
    let numbers = |field: &'static str| -> Result<Vec<usize>, HeaderError> {
        entry
            .get(field)
            .and_then(Value::as_array)
            .ok_or_else(|| malformed(field))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|x| usize::try_from(x).ok())
                    .ok_or_else(|| malformed(field))
            })
            .collect()
    };
    let shape = numbers("shape")?;
    let offsets = numbers("data_offsets")?;
    let [start, end] = offsets[..] else {
        return Err(malformed("data_offsets"));
    };
    if start > end || end > data_len {
        return Err(HeaderError::OutsideData {
            tensor: name.to_string(),
            start,
            end,
            data_bytes: data_len,
        });
    }
    let bytes = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    if bytes != Some(end - start) {
        return Err(HeaderError::ShapeSpan {
            tensor: name.to_string(),
            shape,
            dtype,
            span: end - start,
        });
    }
    Ok(TensorInfo {
        dtype,
        shape,
        range: start..end,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn elements_know_their_dtype() {
        assert!(<i64 as Element>::reads(Dtype::I64) && !<i64 as Element>::reads(Dtype::F64));
        assert!(<u8 as Element>::reads(Dtype::BOOL) && <u8 as Element>::reads(Dtype::U8));
        assert!(!<i32 as Element>::reads(Dtype::I16));
        assert_eq!(<f32 as Element>::DTYPE.size(), 4);
    }

    use super::*;
    use crate::format::pod::as_bytes;

    fn sample() -> Vec<u8> {
        let a: Vec<i64> = vec![1, 2, 3];
        let b: Vec<u8> = vec![1, 0];
        let c: Vec<f32> = vec![0.5; 4];
        let tensors = [
            TensorOut {
                name: "b".into(),
                dtype: Dtype::BOOL,
                shape: vec![2],
                data: &Raw(&b),
            },
            TensorOut {
                name: "a".into(),
                dtype: Dtype::I64,
                shape: vec![3],
                data: &Raw(as_bytes(&a)),
            },
            TensorOut {
                name: "c".into(),
                dtype: Dtype::F32,
                shape: vec![2, 2],
                data: &Raw(as_bytes(&c)),
            },
        ];
        let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let mut out = Vec::new();
        write(&mut out, &meta, &tensors).unwrap();
        out
    }

    #[test]
    fn writes_aligned_and_parses_back() {
        let bytes = sample();
        let h = parse(&bytes).unwrap();
        assert_eq!(h.metadata["k"], "v");
        let a = &h.tensors["a"];
        assert_eq!(a.range.start % DATA_ALIGN, 0, "data section page-aligned");
        assert_eq!(&bytes[a.range.clone()], as_bytes(&[1i64, 2, 3]));
        assert_eq!(h.tensors["c"].shape, vec![2, 2]);
        assert_eq!(h.tensors["b"].range.end, bytes.len(), "no trailer");
    }

    #[test]
    fn rejects_damage() {
        let bytes = sample();
        assert!(matches!(
            parse(&bytes[..bytes.len() - 1]).unwrap_err(),
            HeaderError::OutsideData { ref tensor, .. } if tensor == "b"
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            parse(&long).unwrap_err(),
            HeaderError::Trailing { data_bytes, .. } if data_bytes == 3 * 8 + 4 * 4 + 2 + 1
        ));
        let mut huge = bytes.clone();
        huge[..8].copy_from_slice(&(u64::MAX).to_le_bytes());
        assert_eq!(
            parse(&huge).unwrap_err(),
            HeaderError::TooLong { declared: u64::MAX }
        );
        assert_eq!(
            parse(&bytes[..5]).unwrap_err(),
            HeaderError::TooShort { file_bytes: 5 }
        );
    }

    /// A file with `header` (JSON text) and `data`, unpadded.
    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn every_header_rejection_is_typed() {
        let ok = r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#;
        assert!(parse(&file(ok, &[0; 8])).is_ok());
        let mut past = file(ok, &[0; 8]);
        past[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(
            parse(&past).unwrap_err(),
            HeaderError::PastEnd {
                declared: 1000,
                file_bytes: past.len()
            }
        );
        assert!(matches!(
            parse(&file("{not json", &[])).unwrap_err(),
            HeaderError::NotJson(_)
        ));
        assert!(matches!(
            parse(&file("[1,2]", &[])).unwrap_err(),
            HeaderError::NotJson(_)
        ));
        assert!(matches!(
            parse(&file(r#"{"__metadata__":{"k":1}}"#, &[])).unwrap_err(),
            HeaderError::Metadata(_)
        ));
        let field = |tensor: &str, field| HeaderError::Field {
            tensor: tensor.into(),
            field,
        };
        for (header, expected) in [
            (
                r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#,
                field("a", "dtype"),
            ),
            (
                r#"{"a":{"dtype":"I32","data_offsets":[0,8]}}"#,
                field("a", "shape"),
            ),
            (
                r#"{"a":{"dtype":"I32","shape":[-2],"data_offsets":[0,8]}}"#,
                field("a", "shape"),
            ),
            (
                r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0]}}"#,
                field("a", "data_offsets"),
            ),
            (
                r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8,9]}}"#,
                field("a", "data_offsets"),
            ),
        ] {
            assert_eq!(
                parse(&file(header, &[0; 8])).unwrap_err(),
                expected,
                "{header}"
            );
        }
        assert_eq!(
            parse(&file(
                r#"{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}"#,
                &[0; 8]
            ))
            .unwrap_err(),
            HeaderError::UnknownDtype {
                tensor: "a".into(),
                dtype: "C64".into()
            }
        );
        assert_eq!(
            parse(&file(
                r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[8,0]}}"#,
                &[0; 8]
            ))
            .unwrap_err(),
            HeaderError::OutsideData {
                tensor: "a".into(),
                start: 8,
                end: 0,
                data_bytes: 8
            }
        );
        assert_eq!(
            parse(&file(
                r#"{"a":{"dtype":"I32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8]
            ))
            .unwrap_err(),
            HeaderError::ShapeSpan {
                tensor: "a".into(),
                shape: vec![3],
                dtype: Dtype::I32,
                span: 8
            }
        );
        let overflow = format!(
            r#"{{"a":{{"dtype":"I64","shape":[{},{}],"data_offsets":[0,8]}}}}"#,
            u64::MAX / 2,
            4
        );
        assert!(matches!(
            parse(&file(&overflow, &[0; 8])).unwrap_err(),
            HeaderError::ShapeSpan { .. }
        ));
        let gap = r#"{"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}}"#;
        assert_eq!(
            parse(&file(gap, &[0; 12])).unwrap_err(),
            HeaderError::NotContiguous {
                tensor: "b".into(),
                start: 8,
                expected: 4
            }
        );
        let overlap = r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(
            parse(&file(overlap, &[0; 8])).unwrap_err(),
            HeaderError::NotContiguous { .. }
        ));
        let late = r#"{"a":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}"#;
        assert_eq!(
            parse(&file(late, &[0; 8])).unwrap_err(),
            HeaderError::NotContiguous {
                tensor: "a".into(),
                start: 4,
                expected: 0
            }
        );
    }
}

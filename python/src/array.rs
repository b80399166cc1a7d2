//! Host arrays the library owns or maps, as DLPack producers: a shard's tensors straight
//! from its memory map (how a resident loader copies the dataset to its device without an
//! intermediate copy) and an epoch's plan (vectors computed by the library). The DLPack
//! export shared with the batch sections lives here too.

use std::ffi::c_void;
use std::sync::Arc;

use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use dlpark::python::{export_dlpack, DlpackExporter, ExportAbi, ExportRequest};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase, OpaqueContext};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use shardify::batch::Sections;
use shardify::dataset::Dataset;
use shardify::device::staging::{HostMemory, PlainMemory};
use shardify::format::safetensors::Dtype;

/// A section's numpy dtype name.
pub fn numpy_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::BOOL => "bool",
        Dtype::U8 => "uint8",
        Dtype::I16 => "int16",
        Dtype::I32 => "int32",
        Dtype::I64 => "int64",
        Dtype::F32 => "float32",
        Dtype::F64 => "float64",
    }
}

fn dlpack_type(dtype: Dtype) -> DLDataType {
    match dtype {
        Dtype::BOOL => DLDataType::BOOL,
        Dtype::U8 => DLDataType::U8,
        Dtype::I16 => DLDataType::I16,
        Dtype::I32 => DLDataType::I32,
        Dtype::I64 => DLDataType::I64,
        Dtype::F32 => DLDataType::F32,
        Dtype::F64 => DLDataType::F64,
    }
}

/// What a DLPack capsule describes: a compact tensor of `shape` and `dtype` at `data` on
/// `device`.
pub struct Described<'a> {
    /// First byte.
    pub data: *mut c_void,
    /// Shape (compact, row-major).
    pub shape: &'a [usize],
    /// Element type.
    pub dtype: Dtype,
    /// Where the bytes are.
    pub device: DLDevice,
    /// Whether consumers must not write through it.
    pub read_only: bool,
}

/// A managed DLPack tensor for `described`, owning `owner` until the consumer frees it.
///
/// # Safety
/// `described.data` must address `shape.product() * dtype.size()` bytes on
/// `described.device` that stay valid and unmoved for as long as `owner` lives, and writable
/// unless `read_only` is set.
pub unsafe fn export_tensor<M: ManagedTensorBase>(
    owner: impl OpaqueContext,
    described: Described<'_>,
) -> PyResult<Managed<M>> {
    let mut tensor = Dynamic::compact(described.shape)
        .initialize_as::<M>(owner)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    tensor
        .set_data(described.data)
        .set_device(described.device)
        .set_dtype(dlpack_type(described.dtype))
        .set_byte_offset(0);
    if described.read_only {
        tensor
            .set_flags(DlpackFlags::READ_ONLY)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    }
    // SAFETY: the caller guarantees the data pointer, its size, lifetime and mutability;
    // shape and compact strides describe exactly those bytes in that dtype.
    Ok(unsafe { tensor.finish() })
}

/// What keeps a [`PyHostArray`]'s bytes alive.
enum Backing {
    /// A shard of this dataset, memory-mapped (or read) by it and never unmapped while the
    /// dataset lives.
    Dataset { _mapped: Arc<Dataset> },
    /// A vector the library computed.
    Owned { _values: Vec<i64> },
    /// Columns the library gathered into host memory.
    Gathered { _memory: PlainMemory },
    /// A copy of another array's bytes, in words so that every dtype is aligned, made for a
    /// consumer that cannot be told the original is read-only (see [`PyHostArray`]).
    Copied { _words: Vec<u64> },
}

/// Read-only host memory the library owns or maps, as a DLPack producer.
///
/// A consumer of the legacy DLPack ABI (it passes no `max_version`: numpy before 2.1, torch
/// before 2.9) cannot be told that an array is read-only; it gets a writable copy of its
/// own, as the protocol allows unless it passes `copy=False`. Writing through a view of a
/// shard's read-only mapping would crash the process, and writing into the library's own
/// vectors would change what it hands out next.
#[pyclass(name = "HostArray", module = "shardify._native", frozen)]
pub struct PyHostArray {
    backing: Arc<Backing>,
    address: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Whether consumers must not write through it (every array but a copy).
    read_only: bool,
}

impl PyHostArray {
    /// `bytes` (a tensor of `dtype` and `shape` inside a shard of `dataset`), kept mapped by
    /// the array.
    pub fn in_dataset(
        dataset: Arc<Dataset>,
        bytes: &[u8],
        dtype: Dtype,
        shape: Vec<usize>,
    ) -> Self {
        debug_assert_eq!(bytes.len(), shape.iter().product::<usize>() * dtype.size());
        PyHostArray {
            address: bytes.as_ptr() as usize,
            backing: Arc::new(Backing::Dataset { _mapped: dataset }),
            dtype,
            shape,
            read_only: true,
        }
    }

    /// One array per section of `memory` (laid out by `sections`), sharing it: (name,
    /// array), in buffer order.
    pub fn sections(sections: Sections, memory: PlainMemory) -> Vec<(String, PyHostArray)> {
        let base = memory.bytes().as_ptr() as usize;
        let backing = Arc::new(Backing::Gathered { _memory: memory });
        sections
            .list
            .into_iter()
            .map(|s| {
                let array = PyHostArray {
                    backing: backing.clone(),
                    address: base + s.offset,
                    dtype: s.dtype,
                    shape: s.shape.to_vec(),
                    read_only: true,
                };
                (s.name.to_string(), array)
            })
            .collect()
    }

    /// A one-dimensional int64 array owning `values`.
    pub fn owned(values: Vec<i64>) -> Self {
        PyHostArray {
            address: values.as_ptr() as usize,
            shape: vec![values.len()],
            backing: Arc::new(Backing::Owned { _values: values }),
            dtype: Dtype::I64,
            read_only: true,
        }
    }

    /// The array's bytes.
    fn bytes(&self) -> &[u8] {
        let len = self.shape.iter().product::<usize>() * self.dtype.size();
        // SAFETY: `address` points to `len` bytes that `backing`, held by `self`, keeps
        // valid and unmoved (see `export`); nothing writes to them while an array views them.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, len) }
    }

    /// A writable copy of the array, of its own.
    fn copied(&self) -> PyHostArray {
        let bytes = self.bytes();
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        shardify::format::pod::as_bytes_mut(&mut words)[..bytes.len()].copy_from_slice(bytes);
        PyHostArray {
            address: words.as_ptr() as usize,
            backing: Arc::new(Backing::Copied { _words: words }),
            dtype: self.dtype,
            shape: self.shape.clone(),
            read_only: false,
        }
    }

    fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let described = Described {
            data: self.address as *mut c_void,
            shape: &self.shape,
            dtype: self.dtype,
            device: DLDevice::CPU,
            read_only: self.read_only,
        };
        // SAFETY: `address` points into memory `backing` owns (a vector or a gathered buffer
        // never touched again, a shard mapped as long as its dataset lives, or a copy of
        // its own), holding exactly `shape` elements of `dtype`; the capsule owns a clone of
        // `backing`; the export is read-only unless the array is a copy, which nothing else
        // views.
        unsafe { export_tensor(self.backing.clone(), described) }
    }
}

impl DlpackExporter for PyHostArray {
    fn device(&self) -> DLDevice {
        DLDevice::CPU
    }

    fn flags(&self) -> DlpackFlags {
        if self.read_only {
            DlpackFlags::READ_ONLY
        } else {
            DlpackFlags::empty()
        }
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl PyHostArray {
    /// The DLPack protocol: a read-only capsule viewing the array (kept alive until the
    /// consumer frees it); for a consumer of the legacy ABI, which cannot be told so, a
    /// writable copy of its own (unless it asks for no copy: an error then).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
        if request.abi() == ExportAbi::Legacy && request.copy().is_none() {
            return export_dlpack(&self.copied(), py, request);
        }
        export_dlpack(self, py, request)
    }

    /// The DLPack protocol: (device type, device id): the host.
    fn __dlpack_device__(&self) -> (u32, i32) {
        (DLDevice::CPU.device_type.0, DLDevice::CPU.device_id)
    }

    /// Its shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// Its numpy dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        numpy_name(self.dtype)
    }

    fn __repr__(&self) -> String {
        format!(
            "shardify HostArray {:?} {}",
            self.shape,
            numpy_name(self.dtype)
        )
    }
}

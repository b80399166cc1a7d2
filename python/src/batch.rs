//! A delivered batch's sections as DLPack producers: torch, numpy (and any DLPack
//! consumer) wrap them without copying.

use std::sync::{Arc, Mutex};

use dlpark::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::python::{export_dlpack, CudaStreamRequest, DlpackExporter, ExportRequest};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use pyo3::prelude::*;
use shardify::batch::Section;
use shardify::pipeline::Batch;

use crate::array::{export_tensor, numpy_name, Described};
use crate::errors::{forked, to_py};
use crate::exchange::TensorExchange;
use crate::process::ProcessBound;

/// One delivered batch, shared by the sections (and so the tensors) over it: dropping the
/// last returns its buffers to the loader's pools.
pub struct Delivered {
    /// The batch (locked only to make a consumer stream wait for its device copy).
    batch: Mutex<Batch>,
    /// Where its bytes are: the host buffer, or the device copy's address and device.
    memory: Memory,
}

#[derive(Clone, Copy)]
enum Memory {
    Host(*const u8),
    Cuda { address: u64, ordinal: i32 },
}

// SAFETY: `Memory` holds addresses of buffers the `Batch` beside it owns and keeps still
// until it drops; they are only read (to fill DLPack descriptors), never dereferenced here.
unsafe impl Send for Memory {}
// SAFETY: as above; the addresses are plain values.
unsafe impl Sync for Memory {}

/// A batch shared across threads: DLPack deleters run on any thread, often without the
/// GIL, and touch nothing but this (Rust) state.
pub type SharedBatch = Arc<ProcessBound<Delivered>>;

impl Delivered {
    /// Takes ownership of `batch`; `ordinal` is its CUDA device when it was copied there.
    pub fn new(batch: Batch, ordinal: Option<usize>) -> Delivered {
        let memory = match (batch.device(), ordinal) {
            (Some(copy), Some(ordinal)) => Memory::Cuda {
                address: copy.device_address(),
                ordinal: ordinal as i32,
            },
            _ => Memory::Host(batch.bytes().as_ptr()),
        };
        Delivered {
            batch: Mutex::new(batch),
            memory,
        }
    }

    /// A copy of its section list (names, dtypes, shapes, offsets).
    pub fn sections(&self) -> Vec<Section> {
        let batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        batch.sections().list.clone()
    }

    fn device(&self) -> DLDevice {
        match self.memory {
            Memory::Host(_) => DLDevice::CPU,
            Memory::Cuda { ordinal, .. } => DLDevice::cuda(ordinal),
        }
    }

    fn address(&self, section: &Section) -> *mut std::ffi::c_void {
        match self.memory {
            Memory::Host(base) => base.wrapping_add(section.offset) as *mut _,
            Memory::Cuda { address, .. } => (address + section.offset as u64) as *mut _,
        }
    }

    /// Makes the consumer's stream (DLPack's `stream` argument) wait for the copy; the
    /// device buffer is then reused only after the work queued on that stream before the
    /// batch's last tensor is freed.
    fn order_after_copy(&self, request: CudaStreamRequest) -> PyResult<()> {
        let handle = match request {
            CudaStreamRequest::NoSync => return Ok(()),
            // The protocol's legacy behaviour for an omitted stream: the default stream.
            CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => 0,
            CudaStreamRequest::PerThreadDefault => 2,
            CudaStreamRequest::Pointer(address) => address,
        };
        let mut batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: DLPack hands the consumer's live stream on this device (or a sentinel
        // the driver knows: null is the legacy default stream, 2 CU_STREAM_PER_THREAD);
        // framework streams live as long as the framework, beyond this batch.
        unsafe { batch.wait_on_borrowed(handle as cudarc::driver::sys::CUstream) }.map_err(to_py)
    }
}

/// One section of a delivered batch, a DLPack producer (`__dlpack__`,
/// `__dlpack_device__`): `torch.from_dlpack(section)` and `numpy.from_dlpack(section)`
/// view the batch's buffer without copying, and keep it alive.
#[pyclass(name = "Section", module = "shardify._native", frozen)]
pub struct PySection {
    batch: SharedBatch,
    section: Section,
}

impl PySection {
    /// The section `section` of `batch`.
    pub fn new(batch: SharedBatch, section: Section) -> PySection {
        PySection { batch, section }
    }

    fn delivered(&self) -> PyResult<&Delivered> {
        self.batch.get().map_err(forked)
    }

    fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        export_section(&self.batch, self.delivered()?, &self.section)
    }
}

/// The managed tensor of `section` of `delivered`, the batch `shared` holds (already
/// checked to belong to this process: the check is a `getpid` system call, 0.5 µs here).
fn export_section<M: ManagedTensorBase>(
    shared: &SharedBatch,
    delivered: &Delivered,
    section: &Section,
) -> PyResult<Managed<M>> {
    let described = Described {
        data: delivered.address(section),
        shape: &section.shape,
        dtype: section.dtype,
        device: delivered.device(),
        read_only: false,
    };
    // SAFETY: the data pointer addresses `section.len` bytes of the batch's buffer (its own,
    // writable memory), which the context (a clone of the shared batch) keeps alive and
    // unmoved until the consumer calls the deleter; `section.shape` in `section.dtype` is
    // exactly those bytes.
    unsafe { export_tensor(shared.clone(), described) }
}

/// Managed DLPack tensors (legacy or versioned, `M`) of the sections of `shared` that
/// `hands_out` names, in buffer order, each with its section's name: what a consumer turns
/// into tensors with one call each, where `__dlpack__` and `__dlpack_device__` per section
/// cost three times as much (48 against 17 µs per batch of ten sections, measured). The
/// batch is checked to belong to this process once, not three times per section (`getpid`
/// costs 0.5 µs on these machines), and its sections are read in place (no `Section`
/// object, no copy of their shapes). On CUDA, `stream` (the consumer's, as DLPack passes
/// it) is made to wait for the batch's copy once, for all its sections.
fn managed_sections<M: ManagedTensorBase>(
    shared: &SharedBatch,
    hands_out: impl Fn(&str) -> bool,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(&'static str, Managed<M>)>> {
    let delivered = shared.get().map_err(forked)?;
    if let Memory::Cuda { .. } = delivered.memory {
        let request = ExportRequest::parse(stream, None, None, None)?;
        delivered.order_after_copy(request.cuda_stream()?)?;
    }
    // The tensors are made under the lock, the Python objects after it (by the caller):
    // making one may run the garbage collector, and with it any DLPack deleter.
    let batch = delivered.batch.lock().unwrap_or_else(|e| e.into_inner());
    batch
        .sections()
        .list
        .iter()
        .filter(|s| hands_out(s.name))
        .map(|s| Ok((s.name, export_section::<M>(shared, delivered, s)?)))
        .collect()
}

/// Legacy DLPack capsules of the sections of `shared` that `hands_out` names (see
/// [`managed_sections`]).
pub fn capsules(
    py: Python<'_>,
    shared: &SharedBatch,
    hands_out: impl Fn(&str) -> bool,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(&'static str, Py<PyAny>)>> {
    managed_sections::<DLManagedTensor>(shared, hands_out, stream)?
        .into_iter()
        .map(|(name, tensor)| Ok((name, tensor.into_pyobject(py)?.into_any().unbind())))
        .collect()
}

/// The sections of `shared` that `hands_out` names (see [`managed_sections`]) as tensors
/// of the library `exchange` belongs to, made through its DLPack C exchange API.
pub fn exchanged<'py>(
    py: Python<'py>,
    shared: &SharedBatch,
    hands_out: impl Fn(&str) -> bool,
    stream: Option<&Bound<'_, PyAny>>,
    exchange: TensorExchange,
) -> PyResult<Vec<(&'static str, Bound<'py, PyAny>)>> {
    managed_sections::<DLManagedTensorVersioned>(shared, hands_out, stream)?
        .into_iter()
        .map(|(name, tensor)| Ok((name, exchange.tensor(py, tensor)?)))
        .collect()
}

impl DlpackExporter for PySection {
    fn device(&self) -> DLDevice {
        self.batch.get().map_or(DLDevice::CPU, Delivered::device)
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        let delivered = self.delivered()?;
        match delivered.memory {
            Memory::Host(_) => Ok(()),
            Memory::Cuda { .. } => delivered.order_after_copy(request.cuda_stream()?),
        }
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl PySection {
    /// The DLPack protocol: a capsule viewing this section (the batch stays alive until the
    /// consumer frees it). On CUDA, `stream` is made to wait for the batch's copy.
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
        export_dlpack(self, py, request)
    }

    /// The DLPack protocol: (device type, device id).
    fn __dlpack_device__(&self) -> PyResult<(u32, i32)> {
        let device = self.delivered()?.device();
        Ok((device.device_type.0, device.device_id))
    }

    /// The section's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.section.name
    }

    /// Its shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.section.shape.to_vec()
    }

    /// Its numpy dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        numpy_name(self.section.dtype)
    }

    fn __repr__(&self) -> String {
        format!(
            "shardify Section {} {:?} {}",
            self.section.name,
            self.section.shape,
            numpy_name(self.section.dtype)
        )
    }
}

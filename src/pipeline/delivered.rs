//! What the consumer gets: a batch guard with host views and, on a GPU, device views and
//! the event to wait on.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, CudaView};

use super::workers::Filled;
use crate::batch::{BatchLayout, BatchShape, PackedView, PaddedView, Sections};
use crate::device::staging::{BatchVectors, StagingBuffer, StagingPool};
use crate::device::transfer::DeviceCopy;
use crate::error::{Error, Result};
use crate::format::safetensors::{Dtype, Element};
use crate::sampler::BatchPlan;

/// One delivered batch; dropping it returns its buffers (host staging, and on a GPU the
/// device buffer, reused after the consumer's queued work on it).
///
/// On a GPU the bytes are on the device *and* in the host staging buffer, so the host
/// views ([`Batch::packed`], [`Batch::padded`], [`Batch::plan`]) work on both paths; call
/// [`Batch::wait_on`] with the stream that computes on the device bytes before using them.
pub struct Batch {
    // Dropped first: the device buffer goes back before the staging buffer.
    device: Option<DeviceCopy>,
    buffer: Option<StagingBuffer>,
    pool: Arc<StagingPool>,
    sections: Sections,
    plan: BatchPlan,
    shape: BatchShape,
    gather_seconds: f64,
    gathered_while_waiting: bool,
    buffer_wait_seconds: f64,
    permit_wait_seconds: f64,
    planning_seconds: f64,
    layout: BatchLayout,
}

/// One section of a batch on the device: raw bytes with their element type and shape
/// (what a framework needs to wrap them as a tensor, e.g. through DLPack).
pub struct DeviceSection<'a> {
    /// The bytes (64-byte aligned on the device).
    pub bytes: CudaView<'a, u8>,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: &'a [usize],
}

impl<'a> DeviceSection<'a> {
    /// The section as a typed device view; `None` when `T` is not its element type (the
    /// stored-dtype sections, such as `pulse_time`, are I32 or I64 depending on the data:
    /// match on [`DeviceSection::dtype`]).
    pub fn typed<T: Element + cudarc::driver::DeviceRepr>(&self) -> Option<CudaView<'a, T>> {
        if !T::reads(self.dtype) {
            return None;
        }
        let len = self.bytes.len() / std::mem::size_of::<T>();
        // SAFETY: the bytes are `len` values of `T`'s dtype, written by the gather and
        // copied unchanged; the section starts 64-byte aligned in the device buffer.
        unsafe { self.bytes.transmute::<T>(len) }
    }
}

impl Batch {
    pub(super) fn new(
        filled: Filled,
        device: Option<DeviceCopy>,
        pool: Arc<StagingPool>,
        layout: BatchLayout,
    ) -> Batch {
        Batch {
            device,
            buffer: Some(filled.buffer),
            pool,
            sections: filled.sections,
            plan: filled.plan,
            shape: filled.shape,
            gather_seconds: filled.gather_seconds,
            gathered_while_waiting: filled.gathered_while_waiting,
            buffer_wait_seconds: filled.buffer_wait_seconds,
            permit_wait_seconds: filled.permit_wait_seconds,
            planning_seconds: filled.planning_seconds,
            layout,
        }
    }

    /// Whether the batch was copied to a GPU.
    pub fn is_on_device(&self) -> bool {
        self.device.is_some()
    }

    /// The copy on the device (`None` on the CPU path): its bytes, the event recorded
    /// after the copy, and the copy's timing.
    pub fn device(&self) -> Option<&DeviceCopy> {
        self.device.as_ref()
    }

    /// Makes `stream` wait for the batch's copy and records it as a consumer, so the
    /// device buffer is reused only after the work queued on `stream` before this batch
    /// is dropped. An error on the CPU path.
    pub fn wait_on(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.device_copy_mut()?.wait_on(stream)
    }

    /// As [`Batch::wait_on`] for a stream owned by another library (see
    /// [`DeviceCopy::wait_on_borrowed`]).
    ///
    /// # Safety
    /// `stream` must be a valid stream of the loader's device context, alive until this
    /// batch is dropped.
    pub unsafe fn wait_on_borrowed(&mut self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        let copy = self.device_copy_mut()?;
        // SAFETY: forwarded from the caller.
        unsafe { copy.wait_on_borrowed(stream) }
    }

    /// The device copy, or the error for a batch in host memory.
    fn device_copy_mut(&mut self) -> Result<&mut DeviceCopy> {
        self.device
            .as_mut()
            .ok_or_else(|| Error::Device("this batch is in host memory".into()))
    }

    /// The event consumers wait on before reading the device bytes (`None` on the CPU).
    pub fn ready_event(&self) -> Option<&CudaEvent> {
        self.device.as_ref().map(|d| d.ready())
    }

    /// A section on the device, by name (see [`crate::batch::sections`]); `None` on the
    /// CPU path or for a section this layout does not have.
    pub fn device_section(&self, name: &str) -> Option<DeviceSection<'_>> {
        let device = self.device.as_ref()?;
        let s = self.sections.get(name)?;
        Some(DeviceSection {
            bytes: device.bytes().slice(s.offset..s.offset + s.len),
            dtype: s.dtype,
            shape: &s.shape,
        })
    }

    /// The host buffer's bytes (sections at their offsets).
    pub fn bytes(&self) -> &[u8] {
        &self
            .buffer
            .as_ref()
            .expect("buffer held until drop")
            .bytes()[..self.sections.total]
    }

    /// The section table.
    pub fn sections(&self) -> &Sections {
        &self.sections
    }

    /// Which events, in order, and the batch's global number in the epoch.
    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    /// Seconds spent gathering this batch, by a worker or by the thread that waited for it
    /// (shard reads through the memory map included).
    pub fn gather_seconds(&self) -> f64 {
        self.gather_seconds
    }

    /// Whether the thread that waited for this batch gathered it, not a worker
    /// ([`LoaderConfig::consumer_gathers`](super::LoaderConfig::consumer_gathers)).
    pub fn gathered_while_waiting(&self) -> bool {
        self.gathered_while_waiting
    }

    /// Seconds the worker that gathered this batch was blocked for a free staging buffer
    /// before it (zero when the waiting thread gathered it): every buffer was being
    /// gathered, held back behind an earlier batch still being gathered (batches leave in
    /// order), being uploaded, or held by the consumer. A diagnostic of why workers fall
    /// idle, which shardbench sums per batch.
    pub fn buffer_wait_seconds(&self) -> f64 {
        self.buffer_wait_seconds
    }

    /// Seconds the worker that gathered this batch then waited for a gathering permit
    /// (zero when the waiting thread gathered it): as many threads as the loader has
    /// permits were gathering, the waiting thread among them in a worker's place (see
    /// [`Loader::most_gathering_at_once`](super::Loader::most_gathering_at_once)). Summed
    /// per batch by shardbench.
    pub fn permit_wait_seconds(&self) -> f64 {
        self.permit_wait_seconds
    }

    /// Seconds the thread that gathered this batch spent planning batches as it took this
    /// one's plan, before gathering it: the loader's threads plan 16 at a time, so most
    /// batches carry zero and about one in 16 the time of a chunk. Summed over an epoch,
    /// the loader's time in the sampler (which shardbench sets beside the sampler's time
    /// alone).
    pub fn planning_seconds(&self) -> f64 {
        self.planning_seconds
    }

    /// Events, DOMs and pulses in the batch.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The layout.
    pub fn layout(&self) -> BatchLayout {
        self.layout
    }

    /// The packed view; `None` for a padded batch.
    pub fn packed(&self) -> Option<PackedView<'_>> {
        PackedView::of(&self.sections, self.bytes())
    }

    /// The padded view; `None` for a packed batch.
    pub fn padded(&self) -> Option<PaddedView<'_>> {
        PaddedView::of(&self.sections, self.bytes())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let copy_done = match self.device.take() {
            // The staging buffer is reused only once the copy out of it is over.
            Some(copy) => copy
                .wait_for_copy()
                .inspect_err(|e| tracing::warn!("staging buffer not reused: {e}"))
                .is_ok(),
            None => true,
        };
        if let Some(mut buffer) = self.buffer.take() {
            buffer.keep_vectors(BatchVectors {
                events: std::mem::take(&mut self.plan.events),
                sections: std::mem::take(&mut self.sections),
            });
            if copy_done {
                self.pool.return_lent(buffer);
            } else {
                // A failed copy may still be reading it: keep the memory alive.
                std::mem::forget(buffer);
            }
        }
    }
}

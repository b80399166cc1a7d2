//! Host-to-device copies: a small set of device buffers ("slots") that batches are copied
//! into on the device's copy stream, each guarded by CUDA events.
//!
//! ```text
//! copy stream:     wait(released[A]) copy n+1 -> A  record(copied[A]) ...
//! consumer stream: wait(copied[B])   work on n in B ... record(released[B]) at guard drop
//! ```
//! A slot goes back to the free list when its [`DeviceCopy`] guard is dropped, with an
//! event recorded on every stream the consumer declared ([`DeviceCopy::wait_on`]); the
//! next copy into it makes the copy stream wait on those events, so a device buffer is
//! overwritten only after the consumer's queued work on it, without blocking the host.
//! With two slots the copy of batch n+1 runs while the consumer computes on batch n. The
//! loader's uploader thread waits for a free slot ([`DeviceSlots::upload_when_free`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use super::cuda::{driver_error, elapsed_ms, CudaDevice};
use crate::error::{Error, Result};

/// One device buffer and the events that guard it.
struct DeviceSlot {
    memory: Option<CudaSlice<u8>>,
    len: usize,
    /// Recorded just before the copy, only when copies are timed.
    copy_started: Option<CudaEvent>,
    copied: CudaEvent,
    released: Vec<CudaEvent>,
    /// Release events already waited on, reused by the next release (no event is created
    /// per batch in the steady state).
    spare: Vec<CudaEvent>,
}

/// What [`DeviceSlots::upload_when_free`] waits on.
struct SlotState {
    free: Vec<DeviceSlot>,
    made: usize,
    /// The consumer is blocked waiting for its next batch.
    consumer_waiting: bool,
    stopping: bool,
}

/// The device buffers of one loader.
pub struct DeviceSlots {
    device: Arc<CudaDevice>,
    state: Mutex<SlotState>,
    changed: Condvar,
    target: usize,
    timed: bool,
    allocations: AtomicU64,
}

impl DeviceSlots {
    /// Up to `target` slots, made on first use; more only when the consumer holds all of
    /// them. Fewer than 2 would serialise copies and compute ([`crate::pipeline::LoaderConfig::validate`]
    /// rejects that). With `timed`, every copy is bracketed by timing events
    /// ([`DeviceCopy::copy_ms`]); that costs host time per copy (timing events are far
    /// dearer to record than plain ones), so loaders leave it off unless asked.
    pub fn new(device: Arc<CudaDevice>, target: usize, timed: bool) -> Arc<DeviceSlots> {
        Arc::new(DeviceSlots {
            device,
            state: Mutex::new(SlotState {
                free: Vec::new(),
                made: 0,
                consumer_waiting: false,
                stopping: false,
            }),
            changed: Condvar::new(),
            target,
            timed,
            allocations: AtomicU64::new(0),
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The number of slots the loader keeps busy ahead of the consumer.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Tells a waiting [`DeviceSlots::upload_when_free`] whether the consumer is blocked
    /// on its next batch (then, with nothing ready for it, it holds every slot).
    pub fn set_consumer_waiting(&self, waiting: bool) {
        self.lock().consumer_waiting = waiting;
        self.changed.notify_all();
    }

    /// Ends every wait in [`DeviceSlots::upload_when_free`] (the loader is going away).
    pub fn stop(&self) {
        self.lock().stopping = true;
        self.changed.notify_all();
    }

    /// Device allocations so far (constant in the steady state).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // A panic while holding the lock cannot leave the state inconsistent (each
        // change is a single push, pop or assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn give_back(&self, slot: DeviceSlot) {
        self.lock().free.push(slot);
        self.changed.notify_all();
    }

    /// A free slot, else a new one. With `wait_for_free`, a new one only below the target
    /// or when the consumer waits with `nothing_ready()` (it holds every slot: waiting
    /// would deadlock); otherwise it waits for a slot to come back, and gives `None` once
    /// stopped. Without it, never `None`.
    fn take_slot(&self, wait_for_free: Option<&dyn Fn() -> bool>) -> Result<Option<DeviceSlot>> {
        let mut state = self.lock();
        loop {
            if state.stopping && wait_for_free.is_some() {
                return Ok(None);
            }
            if let Some(slot) = state.free.pop() {
                return Ok(Some(slot));
            }
            let grow = wait_for_free.is_none_or(|nothing_ready| {
                state.made < self.target || (state.consumer_waiting && nothing_ready())
            });
            if grow {
                state.made += 1;
                drop(state);
                return self.new_slot().map(Some);
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn new_slot(&self) -> Result<DeviceSlot> {
        Ok(DeviceSlot {
            memory: None,
            len: 0,
            copy_started: match self.timed {
                true => Some(self.device.new_event(true)?),
                false => None,
            },
            copied: self.device.new_event(self.timed)?,
            released: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// Queues the copy of `bytes` (pinned memory, which must stay untouched until
    /// [`DeviceCopy::wait_for_copy`]) into a free slot, or a new one if none is free.
    pub fn upload(self: &Arc<Self>, bytes: &[u8]) -> Result<DeviceCopy> {
        let slot = self.take_slot(None)?.expect("only a wait ends at a stop");
        self.upload_into(slot, bytes)
    }

    /// As [`DeviceSlots::upload`], but waits for a free slot while the loader's target
    /// number is in use (see [`DeviceSlots::set_consumer_waiting`]); `None` once stopped.
    pub fn upload_when_free(
        self: &Arc<Self>,
        bytes: &[u8],
        nothing_ready: &dyn Fn() -> bool,
    ) -> Option<Result<DeviceCopy>> {
        match self.take_slot(Some(nothing_ready)) {
            Ok(Some(slot)) => Some(self.upload_into(slot, bytes)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Copies `bytes` into `slot`. On an [`Error::CopyInFlight`] the slot is leaked (the
    /// copy may still write it) and the caller must not reuse `bytes` either.
    fn upload_into(self: &Arc<Self>, mut slot: DeviceSlot, bytes: &[u8]) -> Result<DeviceCopy> {
        match self.copy_into(&mut slot, bytes) {
            Ok(()) => Ok(DeviceCopy {
                slot: Some(slot),
                slots: self.clone(),
                consumers: Vec::new(),
            }),
            Err(e @ Error::CopyInFlight(_)) => {
                std::mem::forget(slot);
                Err(e)
            }
            Err(e) => {
                self.give_back(slot);
                Err(e)
            }
        }
    }

    /// Queues the copy of `bytes` into `slot` and records its events. A failure after the
    /// copy was queued waits for the copy stream; when even that fails, the copy may still
    /// be running and the error is [`Error::CopyInFlight`].
    fn copy_into(&self, slot: &mut DeviceSlot, bytes: &[u8]) -> Result<()> {
        let stream = self.device.copy_stream();
        for released in slot.released.drain(..) {
            stream
                .wait(&released)
                .map_err(|e| driver_error("copy stream cannot wait for the consumer", e))?;
            // Re-recording it later does not affect the wait just queued.
            slot.spare.push(released);
        }
        if slot.memory.as_ref().is_none_or(|m| m.len() < bytes.len()) {
            // The old buffer is freed on the copy stream, after the waits above.
            slot.memory = None;
            let capacity = (bytes.len() + bytes.len() / 4).max(1);
            // SAFETY: the memory is written by the copy below before any view exposes it,
            // and a view never reaches past `slot.len`, the bytes copied.
            let memory = unsafe { stream.alloc::<u8>(capacity) }.map_err(|e| {
                driver_error(&format!("cannot allocate {capacity} device bytes"), e)
            })?;
            slot.memory = Some(memory);
            self.allocations.fetch_add(1, Ordering::Relaxed);
        }
        let DeviceSlot {
            memory,
            copy_started,
            copied,
            ..
        } = slot;
        let memory = memory.as_mut().expect("allocated above");
        // Everything but the copy itself is issued before `copy_started` is recorded: on an
        // idle stream the event completes at once, so host calls between it and the copy
        // (cudarc's stream waits, each an ioctl) would be timed as copy time.
        let (target, _written) = memory.device_ptr_mut(stream);
        self.device
            .context()
            .bind_to_thread()
            .map_err(|e| driver_error("cannot bind the context", e))?;
        let record = |event: &CudaEvent| {
            event
                .record(stream)
                .map_err(|e| driver_error("cannot record a copy event", e))
        };
        if let Some(started) = copy_started {
            record(started)?;
        }
        // SAFETY: `target` is a device allocation of at least `bytes.len()` bytes made on
        // this stream; `bytes` is pinned staging memory that the loader keeps alive and
        // unmodified until the `copied` event below has completed.
        unsafe { cudarc::driver::result::memcpy_htod_async(target, bytes, stream.cu_stream()) }
            .map_err(|e| driver_error("host-to-device copy failed", e))?;
        if let Err(e) = record(copied) {
            // Nothing will tell when the queued copy is over: wait for the whole stream.
            return Err(match stream.synchronize() {
                Ok(()) => e,
                Err(_) => match e {
                    Error::Device(problem) => Error::CopyInFlight(problem),
                    other => other,
                },
            });
        }
        slot.len = bytes.len();
        Ok(())
    }
}

/// A batch's bytes on the device; dropping it hands the device buffer back for reuse
/// after the work queued on the consumer's streams.
pub struct DeviceCopy {
    slot: Option<DeviceSlot>,
    slots: Arc<DeviceSlots>,
    consumers: Vec<Arc<CudaStream>>,
}

impl DeviceCopy {
    fn slot(&self) -> &DeviceSlot {
        self.slot.as_ref().expect("held until drop")
    }

    /// Makes `stream` wait until the copy is done, and records it as a consumer: the
    /// device buffer is reused only after the work queued on it before this guard drops.
    /// Call it before launching work on the batch (cudarc operations on the views also
    /// order themselves after the copy, but raw pointers handed to other code do not).
    pub fn wait_on(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream
            .wait(&self.slot().copied)
            .map_err(|e| driver_error("stream cannot wait for the copy", e))?;
        // By handle: wrappers of one borrowed stream are distinct `Arc`s.
        if !self
            .consumers
            .iter()
            .any(|s| s.cu_stream() == stream.cu_stream())
        {
            self.consumers.push(stream.clone());
        }
        Ok(())
    }

    /// As [`DeviceCopy::wait_on`] for a stream created by another library (a framework's
    /// current stream, e.g. the `stream` argument of DLPack's `__dlpack__`): a null
    /// handle is the legacy default stream.
    ///
    /// # Safety
    /// `stream` must be a valid stream of this device's context (a framework's streams on
    /// the same device share the primary context), alive until this copy is dropped.
    pub unsafe fn wait_on_borrowed(&mut self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        // SAFETY: the caller guarantees the handle is a live stream of this context.
        let stream = unsafe { self.slots.device().context().wrap_borrowed_stream(stream) };
        self.wait_on(&stream)
    }

    /// The device address of the batch's first byte (for frameworks that wrap device
    /// memory themselves, e.g. through DLPack); valid until this copy is dropped. Wait on
    /// the copy ([`DeviceCopy::wait_on`]) before reading it.
    pub fn device_address(&self) -> u64 {
        let bytes = self.bytes();
        let (address, read_record) = bytes.device_ptr(self.slots.device().copy_stream());
        // The consumer's reads are ordered by `wait_on` and the slot's release events, not
        // by cudarc's per-buffer tracking: do not record a read on the copy stream.
        std::mem::forget(read_record);
        address
    }

    /// The event recorded after the copy: consumers wait on it.
    pub fn ready(&self) -> &CudaEvent {
        &self.slot().copied
    }

    /// The event recorded just before the copy (for timing and overlap checks); `None`
    /// unless copies are timed.
    pub fn copy_started(&self) -> Option<&CudaEvent> {
        self.slot().copy_started.as_ref()
    }

    /// Milliseconds the copy took on the copy stream (waits for it); `None` unless copies
    /// are timed. On an idle stream this includes the host's latency issuing the copy.
    pub fn copy_ms(&self) -> Result<Option<f32>> {
        let slot = self.slot();
        slot.copy_started
            .as_ref()
            .map(|started| elapsed_ms(started, &slot.copied))
            .transpose()
    }

    /// The batch's bytes on the device (`len` as on the host).
    pub fn bytes(&self) -> CudaView<'_, u8> {
        let slot = self.slot();
        slot.memory
            .as_ref()
            .expect("a copied slot has memory")
            .slice(..slot.len)
    }

    /// Blocks the host until the copy is done (the staging buffer may then be reused).
    pub fn wait_for_copy(&self) -> Result<()> {
        self.slot()
            .copied
            .synchronize()
            .map_err(|e| driver_error("copy failed", e))
    }
}

impl Drop for DeviceCopy {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        for stream in &self.consumers {
            let event = match slot.spare.pop() {
                Some(event) => event.record(stream).map(|()| event),
                None => stream.record_event(None),
            };
            match event {
                Ok(event) => slot.released.push(event),
                Err(e) => {
                    // Cannot track the consumer's work: wait for it instead.
                    tracing::warn!("{}", Error::Device(format!("{:?}", e.0)));
                    let _ = stream.synchronize();
                }
            }
        }
        self.slots.give_back(slot);
    }
}

//! A CUDA device through cudarc's driver API, loaded at run time.
//!
//! cudarc panics on the first driver call when libcuda cannot be loaded, so
//! [`CudaDevice::open`] probes the library first ([`driver_present`]) and every driver error
//! is reported by its code (`DriverError`'s `Display` calls into libcuda itself).
//!
//! Staging buffers for a device are pinned with `cuMemHostAlloc(flags = 0)`: page-locked,
//! so copies are truly asynchronous, and *not* write-combined (cudarc's `alloc_pinned`
//! default), which would make the workers' reads and the consumer's host views very slow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError, PinnedHostSlice,
};

use super::staging::{Allocator, HostMemory, PlainMemory};
use crate::error::{Error, Result};

/// Whether the CUDA driver library can be loaded (probed once per process).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to load the library with `libloading` and
    // drops it; it calls no CUDA function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A driver error as a library error, by its code (no call into libcuda to format it).
pub(crate) fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Device(format!("{what}: {:?}", e.0))
}

/// An opened CUDA device with the stream that all host-to-device copies go on.
pub struct CudaDevice {
    context: Arc<CudaContext>,
    copy_stream: Arc<CudaStream>,
    name: String,
    pinned_fallbacks: AtomicU64,
}

impl CudaDevice {
    /// Opens device `ordinal`; a clear error when there is no driver or no such device.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        if !driver_present() {
            return Err(Error::Device(
                "no CUDA driver: libcuda could not be loaded".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| driver_error("cannot initialise the driver", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::Device(format!(
                "no device cuda:{ordinal}: the driver sees {count} device(s)"
            )));
        }
        let context = CudaContext::new(ordinal)
            .map_err(|e| driver_error(&format!("cannot open cuda:{ordinal}"), e))?;
        let name = context
            .name()
            .map_err(|e| driver_error("cannot read the device name", e))?;
        let copy_stream = context
            .new_stream()
            .map_err(|e| driver_error("cannot create the copy stream", e))?;
        Ok(Arc::new(CudaDevice {
            context,
            copy_stream,
            name,
            pinned_fallbacks: AtomicU64::new(0),
        }))
    }

    /// The device's number.
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    /// The device's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The context (primary context of the device), for the consumer's own streams.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The stream the loader's copies run on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
    }

    /// A new non-blocking stream on this device (for the consumer's work).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.context
            .new_stream()
            .map_err(|e| driver_error("cannot create a stream", e))
    }

    /// Staging memory for this device: pinned, or plain pageable memory (still correct,
    /// only slower to copy) when the driver refuses to pin more, which is counted in
    /// [`CudaDevice::pinned_fallbacks`] and logged.
    pub fn staging_allocator(self: &Arc<Self>) -> Allocator {
        let device = self.clone();
        Arc::new(
            move |bytes| match PinnedMemory::new(&device.context, bytes) {
                Ok(memory) => Box::new(memory) as Box<dyn HostMemory>,
                Err(e) => {
                    device.pinned_fallbacks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("pageable staging buffer of {bytes} bytes: {e}");
                    Box::new(PlainMemory::new(bytes))
                }
            },
        )
    }

    /// Staging buffers that could not be pinned (0 in a healthy run).
    pub fn pinned_fallbacks(&self) -> u64 {
        self.pinned_fallbacks.load(Ordering::Relaxed)
    }

    /// A new event; with `timing`, one that can be used with [`elapsed_ms`].
    pub fn new_event(&self, timing: bool) -> Result<CudaEvent> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.context
            .new_event(Some(flags))
            .map_err(|e| driver_error("cannot create an event", e))
    }
}

/// Milliseconds from `start` to `end` (negative when `end` came first); waits for both.
pub fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
    start
        .elapsed_ms(end)
        .map_err(|e| driver_error("cannot time events", e))
}

/// Page-locked host memory that is not write-combined.
pub struct PinnedMemory {
    // Owns the allocation (freed on drop); its own event is never recorded, since the
    // loader guards reuse with the copy's event instead.
    _allocation: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is the allocation's own, which `PinnedHostSlice` (Send) owns; the
// memory is only reached through `&self`/`&mut self`, so moving it across threads is sound.
unsafe impl Send for PinnedMemory {}

impl PinnedMemory {
    /// At least `bytes` bytes (rounded up to 64), zeroed.
    pub fn new(context: &Arc<CudaContext>, bytes: usize) -> Result<PinnedMemory> {
        let len = bytes.max(1).div_ceil(64) * 64;
        // SAFETY: flags 0 asks for plain page-locked memory; the contents are uninitialised
        // until the `write_bytes` below, and nothing reads them before it.
        let mut allocation = unsafe { context.alloc_pinned_with_flags::<u8>(len, 0) }
            .map_err(|e| driver_error(&format!("cannot pin {len} bytes"), e))?;
        let ptr = allocation
            .as_mut_ptr()
            .map_err(|e| driver_error("cannot reach pinned memory", e))?;
        // SAFETY: `ptr` points to `len` writable bytes just allocated, used by no one else.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedMemory {
            _allocation: allocation,
            ptr,
            len,
        })
    }
}

impl HostMemory for PinnedMemory {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) owned by `self`, borrowed
        // mutably; the loader never lends a buffer while a copy out of it is pending.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`, borrowed shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn is_pinned(&self) -> bool {
        true
    }
}

/// Host-to-device copies of one piece size from pinned (or, with `pinned = false`,
/// pageable) memory, timed on the copy stream: the bound the loader's copy stage is
/// measured against. Made once (buffers allocated, link and copy engine warmed up),
/// measured as often as wanted.
#[doc(hidden)]
pub struct H2dProbe<'d> {
    device: &'d CudaDevice,
    source: Box<dyn HostMemory>,
    target: CudaSlice<u8>,
    bytes: usize,
    repeats: usize,
    pinned: bool,
}

impl<'d> H2dProbe<'d> {
    /// Pieces of `bytes`, `repeats` per measurement, after as many untimed (an idle link
    /// and copy engine start slower).
    pub fn new(
        device: &'d CudaDevice,
        bytes: usize,
        repeats: usize,
        pinned: bool,
    ) -> Result<H2dProbe<'d>> {
        let source: Box<dyn HostMemory> = if pinned {
            Box::new(PinnedMemory::new(device.context(), bytes)?)
        } else {
            Box::new(PlainMemory::new(bytes))
        };
        // SAFETY: the device memory is only written (by the copies) before it is freed.
        let target = unsafe { device.copy_stream().alloc::<u8>(bytes) }
            .map_err(|e| driver_error(&format!("cannot allocate {bytes} device bytes"), e))?;
        let mut probe = H2dProbe {
            device,
            source,
            target,
            bytes,
            repeats: repeats.max(1),
            pinned,
        };
        probe.copies()?;
        device
            .copy_stream()
            .synchronize()
            .map_err(|e| driver_error("host-to-device copy failed", e))?;
        Ok(probe)
    }

    /// GB/s of one timed pass (event time for pinned copies; wall time for pageable
    /// ones, which the driver stages on the host thread).
    pub fn gb_per_s(&mut self) -> Result<f64> {
        let stream = self.device.copy_stream();
        let (start, end) = (self.device.new_event(true)?, self.device.new_event(true)?);
        let wall = Instant::now();
        start
            .record(stream)
            .map_err(|e| driver_error("cannot record an event", e))?;
        self.copies()?;
        end.record(stream)
            .map_err(|e| driver_error("cannot record an event", e))?;
        let ms = elapsed_ms(&start, &end)?;
        let seconds = if self.pinned {
            f64::from(ms) / 1e3
        } else {
            wall.elapsed().as_secs_f64()
        };
        Ok((self.bytes * self.repeats) as f64 / seconds.max(1e-12) / 1e9)
    }

    fn copies(&mut self) -> Result<()> {
        let source = &self.source.bytes()[..self.bytes];
        for _ in 0..self.repeats {
            self.device
                .copy_stream()
                .memcpy_htod(source, &mut self.target)
                .map_err(|e| driver_error("host-to-device copy failed", e))?;
        }
        Ok(())
    }
}

/// Stand-in for a model's GPU work: clears a scratch buffer on a stream, a fixed amount
/// of device-memory traffic per call. Used by tests, the bench and the example to show
/// that copies overlap compute.
#[doc(hidden)]
pub struct BusyWork {
    scratch: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl BusyWork {
    /// Work of `bytes` per call, queued on `stream`.
    pub fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<BusyWork> {
        let scratch = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| driver_error(&format!("cannot allocate {bytes} device bytes"), e))?;
        Ok(BusyWork {
            scratch,
            stream: stream.clone(),
        })
    }

    /// Queues `times` passes over the scratch buffer.
    pub fn run(&mut self, times: usize) -> Result<()> {
        for _ in 0..times {
            self.stream
                .memset_zeros(&mut self.scratch)
                .map_err(|e| driver_error("memset failed", e))?;
        }
        Ok(())
    }
}

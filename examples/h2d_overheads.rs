//! Where a host-to-device copy's time goes: the same pinned pieces copied back to back on
//! one stream, with each driver call of the loader's copy path added in turn, so the
//! cost of every call per copy shows as GB/s lost against the bare copy.
//!
//! ```text
//! cargo run --release --example h2d_overheads -- [PIECE_BYTES] [COPIES] [cuda:N]
//! ```
//! Needs a CUDA device; prints why and exits non-zero without one.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use shardify::device::cuda::{elapsed_ms, CudaDevice, PinnedMemory};
use shardify::device::staging::HostMemory;
use shardify::device::transfer::DeviceSlots;
use shardify::device::{DeviceChoice, Placement};

type Step<'a> = Box<dyn FnMut(&[u8]) -> anyhow::Result<()> + 'a>;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let piece: usize = args.get(1).map_or(Ok(436_480), |a| a.parse())?;
    let copies: usize = args.get(2).map_or(Ok(4096), |a| a.parse())?;
    let choice: DeviceChoice = args
        .get(3)
        .map_or(Ok(DeviceChoice::Cuda(0)), |a| a.parse())?;
    let placement = Placement::resolve(choice)?;
    let device = placement
        .cuda()
        .ok_or_else(|| anyhow::anyhow!("no CUDA device: {}", placement.describe()))?
        .clone();
    let stream = device.copy_stream().clone();
    let source = PinnedMemory::new(device.context(), piece)?;
    let source = &source.bytes()[..piece];
    // SAFETY: the device memory is only written by the copies below before it is freed.
    let mut target: CudaSlice<u8> = unsafe { stream.alloc::<u8>(piece) }?;
    let raw = {
        let (ptr, _guard) = target.device_ptr_mut(&stream);
        ptr
    };
    println!("{copies} copies of {piece} B from pinned memory on one stream, back to back");
    println!("{:<52} {:>9} {:>14}", "per copy", "GB/s", "host us/copy");
    let raw_copy = |bytes: &[u8]| -> anyhow::Result<()> {
        // SAFETY: `raw` is `target`'s device address, `piece` bytes, alive for all of
        // `main`; `bytes` is pinned memory that outlives the stream's synchronisation at
        // the end of each measurement.
        unsafe { cudarc::driver::result::memcpy_htod_async(raw, bytes, stream.cu_stream()) }?;
        Ok(())
    };
    // A cold link and copy engine run the first ~second of copies slower: warm them up
    // before the first variant, or it alone pays for it.
    for _ in 0..copies {
        raw_copy(source)?;
    }
    stream.synchronize()?;
    let timed = (device.new_event(true)?, device.new_event(true)?);
    let plain = device.new_event(false)?;
    // SAFETY: as `target`.
    let mut tracked = unsafe { stream.alloc::<u8>(piece) }?;
    let slots = DeviceSlots::new(device.clone(), 2, false);
    let variants: Vec<(&str, Step)> = vec![
        (
            "cudarc memcpy_htod (the bench's bound)",
            Box::new(|b| Ok(stream.memcpy_htod(b, &mut tracked)?)),
        ),
        ("raw cuMemcpyHtoDAsync", Box::new(raw_copy)),
        (
            "raw + 2 timing events",
            Box::new(|b| {
                timed.0.record(&stream)?;
                raw_copy(b)?;
                Ok(timed.1.record(&stream)?)
            }),
        ),
        (
            "raw + 1 event without timing",
            Box::new(|b| {
                raw_copy(b)?;
                Ok(plain.record(&stream)?)
            }),
        ),
        (
            "raw + bind context",
            Box::new(|b| {
                device.context().bind_to_thread()?;
                raw_copy(b)
            }),
        ),
        (
            "the loader's DeviceSlots::upload",
            Box::new(|b| {
                drop(slots.upload(b)?);
                Ok(())
            }),
        ),
    ];
    for (name, mut step) in variants {
        let (gb, host_us) = measure(&device, &stream, copies, piece, || step(source))?;
        println!("{name:<52} {gb:>9.2} {host_us:>14.2}");
    }
    Ok(())
}

/// GB/s between the first and last copy on the stream, and host microseconds per copy
/// spent issuing.
fn measure(
    device: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    copies: usize,
    piece: usize,
    mut step: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    for _ in 0..16 {
        step()?;
    }
    stream.synchronize()?;
    let (start, end) = (device.new_event(true)?, device.new_event(true)?);
    start.record(stream)?;
    let issued = Instant::now();
    for _ in 0..copies {
        step()?;
    }
    let host_us = issued.elapsed().as_secs_f64() * 1e6 / copies as f64;
    end.record(stream)?;
    let ms = f64::from(elapsed_ms(&start, &end)?);
    let bytes = (copies * piece) as f64;
    Ok((bytes / (ms / 1e3) / 1e9, host_us))
}

//! The CUDA path. Without a driver these tests check the fallback (never a panic, a clear
//! error for `cuda:N`) and report the GPU checks as skipped; with one they check that a
//! whole epoch on the device is byte-identical to the CPU path, that a device buffer is
//! never overwritten while the consumer's queued work still reads it, that copies overlap
//! the consumer's work, that the steady state allocates nothing, that a loader dropped
//! mid-epoch with copies in flight stops and one resumed from its state finishes the epoch
//! identically, and that a damaged shard is an error naming it on the GPU path too.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use shardify::batch::BatchLayout;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::cuda::{driver_present, elapsed_ms, BusyWork, CudaDevice};
use shardify::device::{DeviceChoice, Placement};
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};
use shardify::Error;

fn dataset(dir: &Path, events: u64) -> Arc<Dataset> {
    let (src, _) = synthetic_source(dir, events, 3, 11);
    let out = dir.join("ds");
    convert_all(&src, "train", &out, &options(5, 2)).unwrap();
    Arc::new(Dataset::open(&out, ChecksumPolicy::Full).unwrap())
}

fn config(layout: BatchLayout, device: DeviceChoice) -> LoaderConfig {
    LoaderConfig {
        sampler: SamplerConfig {
            seed: 21,
            block_events: 64,
            window_blocks: 4,
            run_events: 4,
            batching: Batching::Pulses {
                max_pulses: 4000,
                max_events: Some(64),
                pulse_cap: None,
            },
            ..SamplerConfig::default()
        },
        layout,
        workers: 2,
        prefetch: Some(3),
        device,
        device_buffers: 2,
        time_copies: true,
        dom_positions: true,
        ..LoaderConfig::default()
    }
}

const START: SamplerState = SamplerState::start(0);

/// The CUDA device, or `None` after saying why the test is skipped.
fn gpu(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::open(0) {
        Ok(device) => Some(device),
        Err(e) => {
            eprintln!("SKIPPED {test}: no usable GPU ({e})");
            None
        }
    }
}

fn host_epoch(ds: &Arc<Dataset>, layout: BatchLayout) -> Vec<Vec<u8>> {
    Loader::new(ds.clone(), config(layout, DeviceChoice::Cpu), START)
        .unwrap()
        .map(|b| b.unwrap().bytes().to_vec())
        .collect()
}

#[test]
fn without_a_driver_auto_runs_on_the_cpu_and_cuda_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 300);
    if driver_present() {
        let e = Placement::resolve(DeviceChoice::Cuda(999))
            .expect_err("no machine has 1000 GPUs")
            .to_string();
        assert!(e.contains("no device cuda:999"), "{e}");
        eprintln!("driver present: the no-driver fallback is checked on machines without one");
        return;
    }
    let auto = Placement::resolve(DeviceChoice::Auto).unwrap();
    assert!(auto.cuda().is_none());
    assert!(auto.describe().contains("libcuda"), "{}", auto.describe());
    for choice in [DeviceChoice::Cuda(0), DeviceChoice::Cuda(3)] {
        let e = Loader::new(ds.clone(), config(BatchLayout::Packed, choice), START)
            .err()
            .expect("no GPU here");
        assert!(matches!(e, Error::Device(_)), "{e:?}");
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
    }
    let mut loader = Loader::new(
        ds.clone(),
        config(BatchLayout::Packed, DeviceChoice::Auto),
        START,
    )
    .unwrap();
    assert!(loader.placement().cuda().is_none());
    let batch = loader.next().unwrap().unwrap();
    assert!(!batch.is_on_device() && batch.device().is_none());
    assert!(batch.device_section("pulse_time").is_none());
    assert!(batch.ready_event().is_none());
    assert!(batch.packed().is_some(), "host views work");
    let bytes: Vec<Vec<u8>> = std::iter::once(batch.bytes().to_vec())
        .chain(loader.map(|b| b.unwrap().bytes().to_vec()))
        .collect();
    assert_eq!(bytes, host_epoch(&ds, BatchLayout::Packed));
}

/// Copies a device section to a fresh device buffer on `stream` the way a raw consumer
/// (a framework given the pointer) would: cudarc's own use tracking is bypassed, so only
/// the loader's events keep the slot from being overwritten too early.
fn raw_consumer_copy(stream: &Arc<CudaStream>, source: u64, len: usize) -> CudaSlice<u8> {
    // SAFETY: written by the copy below before it is read.
    let mut target = unsafe { stream.alloc::<u8>(len.max(1)) }.unwrap();
    {
        let (to, _record) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut target, stream);
        // SAFETY: both ranges are device allocations of at least `len` bytes; the source
        // is kept alive by the loader's slot until the released event passes.
        unsafe { cudarc::driver::result::memcpy_dtod_async(to, source, len, stream.cu_stream()) }
            .unwrap();
    }
    target
}

#[test]
fn a_gpu_epoch_is_byte_identical_to_the_cpu_path_even_with_a_slow_raw_consumer() {
    let Some(device) = gpu("gpu_epoch_byte_identical") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 3000);
    let stream = device.new_stream().unwrap();
    let mut work = BusyWork::new(&stream, 64 << 20).unwrap();
    for layout in [
        BatchLayout::Packed,
        BatchLayout::Padded {
            max_doms: 24,
            pulses_per_dom: 3,
        },
    ] {
        let expected = host_epoch(&ds, layout);
        let placement = Placement::Cuda(device.clone());
        let mut loader = Loader::on(
            ds.clone(),
            config(layout, DeviceChoice::Cuda(0)),
            START,
            placement,
        )
        .unwrap();
        let mut copies = Vec::new();
        for batch in loader.by_ref() {
            let mut batch = batch.unwrap();
            assert!(batch.is_on_device());
            batch.wait_on(&stream).unwrap();
            // Slow consumer: the copy below runs long after the guard is dropped.
            work.run(4).unwrap();
            let view = batch.device().unwrap().bytes();
            let (source, record) = view.device_ptr(&stream);
            std::mem::forget(record); // bypass cudarc's tracking, as a raw consumer would
            copies.push(raw_consumer_copy(&stream, source, batch.bytes().len()));
            let ids = batch.device_section("event_id").unwrap();
            assert_eq!(
                ids.bytes.len(),
                batch.sections().get("event_id").unwrap().len
            );
            assert!(ids.typed::<f32>().is_none(), "event_id is I64");
            let host_ids = match batch.packed() {
                Some(v) => v.event_id.to_vec(),
                None => batch.padded().unwrap().event_id.to_vec(),
            };
            let ids = stream.clone_dtoh(&ids.typed::<i64>().unwrap()).unwrap();
            assert_eq!(ids, host_ids, "typed device view of event_id");
        }
        stream.synchronize().unwrap();
        assert_eq!(copies.len(), expected.len(), "{layout:?}");
        for (i, (copy, host)) in copies.iter().zip(&expected).enumerate() {
            let back = stream.clone_dtoh(copy).unwrap();
            assert!(
                &back[..host.len()] == host.as_slice(),
                "{layout:?}: batch {i} differs"
            );
        }
        eprintln!(
            "{layout:?}: {} batches identical; device allocations {}, pinned fallbacks {}",
            copies.len(),
            loader.device_allocations(),
            device.pinned_fallbacks()
        );
        assert_eq!(device.pinned_fallbacks(), 0, "staging buffers are pinned");
    }
}

#[test]
fn copies_overlap_the_consumers_work_and_the_steady_state_allocates_nothing() {
    let Some(device) = gpu("copies_overlap") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 3000);
    let stream = device.new_stream().unwrap();
    let mut work = BusyWork::new(&stream, 256 << 20).unwrap();
    let mut config = config(BatchLayout::Packed, DeviceChoice::Cuda(0));
    config.sampler.batching = Batching::Events(32);
    let mut loader = Loader::on(ds, config, START, Placement::Cuda(device.clone())).unwrap();
    let (mut pairs, mut overlapped, mut copy_ms) = (0, 0, 0.0);
    let mut previous_end = None;
    let mut allocations_at_half = 0;
    let mut batches = 0;
    let total = 3000 / 32;
    while let Some(batch) = loader.next() {
        let mut batch = batch.unwrap();
        if let Some(end) = previous_end.take() {
            // Did this batch's copy start before the consumer's work on the last one ended?
            pairs += 1;
            if elapsed_ms(batch.device().unwrap().copy_started().unwrap(), &end).unwrap() > 0.0 {
                overlapped += 1;
            }
        }
        copy_ms += batch.device().unwrap().copy_ms().unwrap().unwrap();
        batch.wait_on(&stream).unwrap();
        work.run(8).unwrap();
        previous_end = Some(device.new_event(true).unwrap());
        previous_end.as_ref().unwrap().record(&stream).unwrap();
        batches += 1;
        if batches == total / 2 {
            allocations_at_half = loader.device_allocations() + loader.staging_allocations();
        }
    }
    stream.synchronize().unwrap();
    eprintln!(
        "{overlapped}/{pairs} copies started during the previous batch's work; \
         mean copy {:.3} ms",
        copy_ms / batches as f32
    );
    assert!(pairs >= 20, "{pairs} batches");
    assert!(
        overlapped * 10 >= pairs * 8,
        "{overlapped}/{pairs} overlapped"
    );
    let late = loader.device_allocations() + loader.staging_allocations() - allocations_at_half;
    eprintln!(
        "device allocations {}, staging allocations {}, {late} in the second half",
        loader.device_allocations(),
        loader.staging_allocations()
    );
    // Buffers grow (by a quarter more than asked) only when a batch is larger than any
    // before it in that buffer: never per batch, and rarely once warm.
    assert!(
        late <= 4,
        "{late} allocations in the second half of {batches} batches"
    );
    assert!(loader.device_allocations() <= 8);
}

/// A batch's bytes as the device holds them.
fn device_bytes(batch: &mut shardify::pipeline::Batch, stream: &Arc<CudaStream>) -> Vec<u8> {
    batch.wait_on(stream).unwrap();
    stream.clone_dtoh(&batch.device().unwrap().bytes()).unwrap()
}

#[test]
fn on_the_gpu_a_loader_dropped_mid_epoch_stops_and_a_resumed_one_finishes_identically() {
    let Some(device) = gpu("gpu_drop_and_resume") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 3000);
    let expected = host_epoch(&ds, BatchLayout::Packed);
    let config = config(BatchLayout::Packed, DeviceChoice::Cuda(0));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    {
        let (ds, config, device) = (ds.clone(), config.clone(), device.clone());
        std::thread::spawn(move || {
            let stream = device.new_stream().unwrap();
            let mut loader = Loader::on(ds, config, START, Placement::Cuda(device)).unwrap();
            // Four batches held at once, twice the device buffers: the uploader must make
            // more slots rather than wait for one forever.
            let mut four: Vec<_> = (0..4).map(|_| loader.next().unwrap().unwrap()).collect();
            let mut taken: Vec<Vec<u8>> =
                four.iter_mut().map(|b| device_bytes(b, &stream)).collect();
            drop(four);
            taken.extend(
                (0..3).map(|_| device_bytes(&mut loader.next().unwrap().unwrap(), &stream)),
            );
            // Held across the drop, with the next copy queued behind it.
            let mut held = loader.next().unwrap().unwrap();
            taken.push(device_bytes(&mut held, &stream));
            let state = loader.state();
            drop(loader);
            drop(held);
            done_tx.send((taken, state)).unwrap();
        });
    }
    let (mut taken, state) = done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the GPU loader shut down instead of hanging");
    assert_eq!(state.position.batches_taken, 8);
    let stream = device.new_stream().unwrap();
    for batch in Loader::resume(ds, config, &state).unwrap() {
        let mut batch = batch.unwrap();
        assert!(batch.is_on_device());
        taken.push(device_bytes(&mut batch, &stream));
    }
    assert_eq!(taken.len(), expected.len());
    assert!(
        taken == expected,
        "dropped + resumed epoch differs from the CPU path"
    );
    eprintln!(
        "{} batches: 8 before the drop, the rest resumed, identical",
        taken.len()
    );
}

#[test]
fn on_the_gpu_a_damaged_shard_is_an_error_naming_it() {
    if gpu("gpu_damaged_shard").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 3000);
    let file = ds.manifest().shards[1].file.clone();
    let path = dir.path().join("ds").join(&file);
    drop(ds);
    flip_last_byte(&path);
    let ds = Arc::new(Dataset::open(&dir.path().join("ds"), ChecksumPolicy::Lazy).unwrap());
    let config = config(BatchLayout::Packed, DeviceChoice::Cuda(0));
    let (err, ended) = first_error(Loader::new(ds, config, START).unwrap());
    assert!(err.contains(&file) && err.contains("checksum"), "{err}");
    assert!(ended, "the error ends the epoch");
}

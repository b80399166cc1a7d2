//! A training loop over a converted dataset:
//! `cargo run --release --example train_loop -- DATASET [EPOCHS] [auto|cpu|cuda:N] [lazy|full|off]`.
//!
//! The last argument is the checksum policy: `lazy` (the default) checks each shard the
//! first time a worker touches it, so epoch 0 pays for hashing every shard; `full` checks
//! them all when the dataset is opened (timed on its own line) and epoch 0 runs at full
//! speed; `off` trusts the files.
//!
//! On the CPU each step reads a packed batch (two-level CSR) through the host views and
//! computes a stand-in "model": the mean charge-weighted DOM height per event, against the
//! zenith label. On a GPU each step makes its compute stream wait for the batch's copy,
//! queues stand-in GPU work on the device bytes, and every 50 steps copies the device bytes
//! back to check them against the host view. The loader state is saved every 10 steps, as
//! a checkpoint would, and printed at the end: resuming from it with `Loader::resume`
//! continues with exactly the next batch.

use std::sync::Arc;
use std::time::Instant;

use shardify::batch::{BatchLayout, PackedView};
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::cuda::BusyWork;
use shardify::device::{DeviceChoice, Placement};
use shardify::pipeline::{Batch, Loader, LoaderConfig, LoaderState};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};

/// The CPU stand-in model's squared error summed over the batch.
fn host_loss(v: &PackedView<'_>) -> f64 {
    let mut loss = 0.0;
    let positions = v
        .dom_position
        .expect("the loader keeps dom_position by default");
    for b in 0..v.event_id.len() {
        let doms = v.event_dom_offsets[b] as usize..v.event_dom_offsets[b + 1] as usize;
        let (mut weighted_z, mut total) = (0.0, 0.0);
        for d in doms {
            let pulses = v.dom_pulse_offsets[d] as usize..v.dom_pulse_offsets[d + 1] as usize;
            let q: f64 = pulses.map(|p| v.pulse_charge.get(p)).sum();
            weighted_z += q * positions.get(3 * d + 2);
            total += q;
        }
        let prediction = (weighted_z / total.max(1e-9) / 500.0)
            .clamp(-1.0, 1.0)
            .acos();
        if v.event_zenith[b].is_finite() {
            loss += (prediction - v.event_zenith[b]).powi(2);
        }
    }
    loss
}

/// Copies the device bytes back and compares them with the host staging bytes.
fn check_device_bytes(
    batch: &Batch,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> Result<(), Box<dyn std::error::Error>> {
    let device = batch.device().ok_or("not on the device")?;
    let back = stream
        .clone_dtoh(&device.bytes())
        .map_err(|e| format!("{:?}", e.0))?;
    if back != batch.bytes() {
        return Err("device bytes differ from the host batch".into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: train_loop DATASET [EPOCHS] [DEVICE] [lazy|full|off]")?;
    let epochs: u64 = args.next().map(|e| e.parse()).transpose()?.unwrap_or(2);
    let device: DeviceChoice = args
        .next()
        .map(|d| d.parse())
        .transpose()?
        .unwrap_or_default();
    let policy = match args.next().as_deref() {
        None | Some("lazy") => ChecksumPolicy::Lazy,
        Some("full") => ChecksumPolicy::Full,
        Some("off") => ChecksumPolicy::Off,
        Some(other) => return Err(format!("checksum policy `{other}`: lazy, full or off").into()),
    };
    let placement = Placement::resolve(device)?;
    println!("device: {}", placement.describe());
    let mut gpu = match placement.cuda() {
        Some(cuda) => {
            let stream = cuda.new_stream()?;
            let model = BusyWork::new(&stream, 64 << 20)?;
            Some((stream, model))
        }
        None => None,
    };
    let opened = Instant::now();
    let dataset = Arc::new(Dataset::open(dir.as_ref(), policy)?);
    println!(
        "opened with checksum policy {policy:?} in {:.3} s",
        opened.elapsed().as_secs_f64()
    );
    let config = LoaderConfig {
        sampler: SamplerConfig {
            seed: 42,
            batching: Batching::Pulses {
                max_pulses: 64 * 1024,
                max_events: Some(512),
                pulse_cap: None,
            },
            ..SamplerConfig::default()
        },
        layout: BatchLayout::Packed,
        workers: 2,
        device,
        ..LoaderConfig::default()
    };
    let mut checkpoint: Option<LoaderState> = None;
    for epoch in 0..epochs {
        let started = Instant::now();
        let mut loader = Loader::on(
            dataset.clone(),
            config.clone(),
            SamplerState::start(epoch),
            placement.clone(),
        )?;
        let (mut events, mut loss, mut steps) = (0usize, 0.0f64, 0u64);
        while let Some(batch) = loader.next() {
            let mut batch = batch?;
            if let Some((stream, model)) = &mut gpu {
                batch.wait_on(stream)?;
                model.run(1)?;
                if steps % 50 == 0 {
                    check_device_bytes(&batch, stream)?;
                }
            } else {
                loss += host_loss(&batch.packed().expect("packed layout"));
            }
            events += batch.plan().events.len();
            steps += 1;
            if steps % 10 == 0 {
                checkpoint = Some(loader.state());
            }
        }
        if let Some((stream, _)) = &gpu {
            stream.synchronize().map_err(|e| format!("{:?}", e.0))?;
        }
        let secs = started.elapsed().as_secs_f64();
        let loss = match gpu {
            Some(_) => "on GPU (stand-in work, bytes checked every 50 steps)".to_string(),
            None => format!("{:.4}", loss / events.max(1) as f64),
        };
        println!(
            "epoch {epoch}: {steps} steps, {events} events, mean loss {loss}, {:.0} events/s",
            events as f64 / secs
        );
    }
    if let Some(state) = checkpoint {
        println!("last checkpoint: {}", serde_json::to_string(&state)?);
    }
    Ok(())
}

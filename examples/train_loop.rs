//! A training loop over a converted dataset: `cargo run --release --example train_loop -- DATASET [EPOCHS]`.
//!
//! Each step reads a packed batch (two-level CSR) and computes a stand-in "model": the mean
//! charge-weighted DOM height per event, against the zenith label. The loader state is
//! saved every 10 steps, as a checkpoint would, and printed at the end: resuming from it
//! with `Loader::resume` continues with exactly the next batch.

use std::sync::Arc;
use std::time::Instant;

use shardify::batch::BatchLayout;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::pipeline::{Loader, LoaderConfig, LoaderState};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: train_loop DATASET [EPOCHS]")?;
    let epochs: u64 = args.next().map(|e| e.parse()).transpose()?.unwrap_or(2);
    let dataset = Arc::new(Dataset::open(dir.as_ref(), ChecksumPolicy::Lazy)?);
    let config = LoaderConfig {
        sampler: SamplerConfig {
            seed: 42,
            batching: Batching::Pulses {
                max_pulses: 64 * 1024,
                max_events: Some(512),
            },
            ..SamplerConfig::default()
        },
        layout: BatchLayout::Packed,
        workers: 2,
        prefetch: 4,
    };
    let mut checkpoint: Option<LoaderState> = None;
    for epoch in 0..epochs {
        let started = Instant::now();
        let mut loader = Loader::new(
            dataset.clone(),
            config.clone(),
            SamplerState {
                epoch,
                batches_taken: 0,
            },
        )?;
        let (mut events, mut loss, mut steps) = (0usize, 0.0f64, 0u64);
        while let Some(batch) = loader.next() {
            let batch = batch?;
            let v = batch.packed().expect("packed layout");
            for b in 0..v.event_id.len() {
                let doms = v.event_dom_offsets[b] as usize..v.event_dom_offsets[b + 1] as usize;
                let (mut weighted_z, mut total) = (0.0, 0.0);
                for d in doms {
                    let pulses =
                        v.dom_pulse_offsets[d] as usize..v.dom_pulse_offsets[d + 1] as usize;
                    let q: f64 = pulses.map(|p| v.pulse_charge.get(p)).sum();
                    weighted_z += q * v.dom_position.get(3 * d + 2);
                    total += q;
                }
                let prediction = (weighted_z / total.max(1e-9) / 500.0)
                    .clamp(-1.0, 1.0)
                    .acos();
                if v.event_zenith[b].is_finite() {
                    loss += (prediction - v.event_zenith[b]).powi(2);
                }
            }
            events += v.event_id.len();
            steps += 1;
            if steps % 10 == 0 {
                checkpoint = Some(loader.state());
            }
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "epoch {epoch}: {steps} steps, {events} events, mean loss {:.4}, {:.0} events/s",
            loss / events.max(1) as f64,
            events as f64 / secs
        );
    }
    if let Some(state) = checkpoint {
        println!("last checkpoint: {}", serde_json::to_string(&state)?);
    }
    Ok(())
}

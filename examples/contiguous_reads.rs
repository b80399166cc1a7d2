//! What a layout with each event's pieces side by side would save on the gather's reads:
//! `cargo run --release --example contiguous_reads -- DATASET [WINDOW] [ROUNDS] [THREADS]`.
//!
//! Plans epoch 0 at WINDOW blocks (64 by default; batches and blocks of 256 events), then
//! lays every event's stored pieces (id, labels, sensor ids, DOM offsets, pulse times,
//! charges and auxiliary flags: 8 places in the shards) one after the other in one
//! buffer in huge pages, in storage order. THREADS threads (1 by default), taking turns
//! over the batches, then read every cache line of each batch's pieces, prefetched 6
//! events ahead as the gather prefetches, from the shards (8 pieces an event) and from
//! that buffer (1 piece an event), alternated for ROUNDS rounds (15 by default); and copy
//! them into a batch-sized buffer each the same way. Prints the median nanoseconds per
//! event and thread of each. The buffer holds a copy of every event's pieces: run it on
//! a dataset that fits in memory twice.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use shardify::bench::median;
use shardify::bench::stages::{event_pieces, shard_views};
use shardify::dataset::{ChecksumPolicy, Dataset, DatasetSizes, View};
use shardify::device::staging::{HostMemory, PlainMemory};
use shardify::format::StoredView;
use shardify::prefetch::{prefetch_into, visit_prefetching, PrefetchLevel};
use shardify::sampler::{BatchOrder, Batching, EpochBatches, SamplerConfig, SamplerState};

/// Events ahead whose pieces are prefetched (the gather's `PREFETCH_AHEAD` runs).
const AHEAD_EVENTS: usize = 6;

/// The stored pieces of event `i` of `v`, in the order the gather reads them.
fn pieces<'a>(v: &StoredView<'a>, i: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(8);
    event_pieces(v, i, &mut out);
    out
}

/// Reads every line of every batch's pieces (`batches`: per batch, per event, its
/// pieces), prefetching `AHEAD_EVENTS` events ahead into the caches the gather prefetches
/// into on this machine; with `copy`, copies them into it.
fn pass<'a>(batches: impl Iterator<Item = &'a Vec<Vec<&'a [u8]>>>, copy: Option<&mut [u8]>) {
    let mut sum = 0u64;
    let mut dst = copy;
    let level = PrefetchLevel::for_this_machine();
    for events in batches {
        let mut at = 0;
        let ahead = |event: &Vec<&[u8]>| event.iter().for_each(|p| prefetch_into(p, level));
        visit_prefetching(events, AHEAD_EVENTS, ahead, |event| {
            for piece in event {
                match dst.as_deref_mut() {
                    Some(dst) => {
                        dst[at..at + piece.len()].copy_from_slice(piece);
                        at += piece.len();
                    }
                    None => {
                        for line in piece.chunks(64) {
                            sum = sum.wrapping_add(u64::from(line[0]));
                        }
                    }
                }
            }
        });
        std::hint::black_box(&dst);
    }
    std::hint::black_box(sum);
}

/// Seconds for `threads` threads to take turns over the batches, each with a batch-sized
/// buffer of its own when `copy`.
fn timed(batches: &[Vec<Vec<&[u8]>>], threads: usize, copy: bool, largest: usize) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut dst = copy.then(|| PlainMemory::new(largest));
                pass(
                    batches.iter().skip(t).step_by(threads),
                    dst.as_mut().map(|d| d.bytes_mut()),
                );
            });
        }
    });
    started.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: contiguous_reads DATASET [WINDOW] [ROUNDS] [THREADS]")?;
    let window: usize = args.get(1).map_or(Ok(64), |w| w.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(15), |r| r.parse())?;
    let threads: usize = args.get(3).map_or(Ok(1), |t| t.parse())?;
    let dataset = Arc::new(Dataset::open(
        std::path::Path::new(path),
        ChecksumPolicy::Full,
    )?);
    let views = shard_views(&dataset)?;
    let sampler = SamplerConfig {
        seed: 0,
        block_events: 256,
        window_blocks: window,
        run_events: 1,
        batching: Batching::Events(256),
        batch_order: BatchOrder::Stored,
        ..SamplerConfig::default()
    };
    let view = View::from(dataset.clone());
    let sizes = DatasetSizes::without_read_ahead(&view);
    let mut plans = Vec::new();
    for mut plan in EpochBatches::new(&sizes, &sampler, SamplerState::start(0)) {
        view.locate_plan(&mut plan);
        plan.events.sort_unstable();
        plans.push(plan);
    }
    // Every event's pieces side by side, events in storage order (shard, then index).
    let mut place = Vec::with_capacity(views.len());
    let mut total = 0usize;
    for v in &views {
        let mut at = Vec::with_capacity(v.events());
        for i in 0..v.events() {
            let len: usize = pieces(v, i).iter().map(|p| p.len()).sum();
            at.push((total, len));
            total += len;
        }
        place.push(at);
    }
    let mut together = PlainMemory::new(total);
    {
        let bytes = together.bytes_mut();
        for (v, at) in views.iter().zip(&place) {
            for (i, &(start, len)) in at.iter().enumerate() {
                let mut offset = start;
                for piece in pieces(v, i) {
                    bytes[offset..offset + piece.len()].copy_from_slice(piece);
                    offset += piece.len();
                }
                debug_assert_eq!(offset, start + len);
            }
        }
    }
    let together = together.bytes();
    let scattered: Vec<Vec<Vec<&[u8]>>> = plans
        .iter()
        .map(|p| {
            p.events
                .iter()
                .map(|e| pieces(&views[e.shard as usize], e.index as usize))
                .collect()
        })
        .collect();
    let joined: Vec<Vec<Vec<&[u8]>>> = plans
        .iter()
        .map(|p| {
            p.events
                .iter()
                .map(|e| {
                    let (start, len) = place[e.shard as usize][e.index as usize];
                    vec![&together[start..start + len]]
                })
                .collect()
        })
        .collect();
    let events: usize = plans.iter().map(|p| p.events.len()).sum();
    let largest = scattered
        .iter()
        .map(|b| b.iter().flatten().map(|p| p.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut times = [(); 4].map(|_| Vec::new());
    for round in 0..rounds {
        let order: [usize; 4] = if round % 2 == 0 {
            [0, 1, 2, 3]
        } else {
            [1, 0, 3, 2]
        };
        for which in order {
            let batches = if which % 2 == 0 { &scattered } else { &joined };
            let seconds = timed(batches, threads, which >= 2, largest);
            times[which].push(seconds * 1e9 * threads as f64 / events as f64);
        }
    }
    let [read_8, read_1, copy_8, copy_1] = times.map(|t| median(&t));
    println!(
        "window {window}, {events} events, {} bytes of pieces, {rounds} rounds, {threads} thread(s), ns per event and thread (median):",
        total
    );
    println!(
        "  read every line:  8 places {read_8:.0}, side by side {read_1:.0} ({:+.0}%)",
        100.0 * (read_1 / read_8 - 1.0)
    );
    println!(
        "  copy into a buffer: 8 places {copy_8:.0}, side by side {copy_1:.0} ({:+.0}%)",
        100.0 * (copy_1 / copy_8 - 1.0)
    );
    Ok(())
}

//! What the loader's gather would cost with each event's pieces side by side in its shard
//! (a record per event, as a format after v2 could store them), against today's gather on
//! the same batches: `cargo run --release --example side_by_side_gather -- DATASET
//! [WINDOWS] [ROUNDS] [THREADS]`.
//!
//! Plans epoch 0 at each window (`1,4,16,64` by default; batches and blocks of 256 events,
//! stored order), then writes every event's record into one buffer in huge pages, in
//! storage order: id, labels, sensor ids, its DOMs' pulse offsets counted from its first
//! pulse, pulse times, charges and flags, with an index of (start, DOMs, pulses) per
//! event. A gather over those records (locating through the index, then per event one
//! prefetched record copied piece by piece into the packed sections, offsets rebased) must
//! produce byte for byte the batches of [`Gatherer`] without positions (checked for every
//! batch); then THREADS threads (1 by default; 2 take alternate batches) time both,
//! alternated, for ROUNDS rounds (9 by default). Prints the median nanoseconds per event
//! and thread of each: locating and copying, without positions (the lookups cost the same
//! in both, from the batch's own sensor ids). The records hold a copy of every event's
//! pieces: run it on a dataset that fits in memory twice. Needs labels.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use shardify::batch::{plan_sections, sections, BatchLayout, BatchShape, Gatherer, Sections};
use shardify::bench::median;
use shardify::bench::stages::{event_pieces, shard_views};
use shardify::dataset::{ChecksumPolicy, Dataset, DatasetSizes, View};
use shardify::device::staging::{HostMemory, PlainMemory};
use shardify::format::{ShardView, StorageTypes};
use shardify::prefetch::{prefetch, visit_prefetching};
use shardify::sampler::{
    BatchOrder, BatchPlan, Batching, EpochBatches, EventRef, SamplerConfig, SamplerState,
};

/// Events ahead whose records are prefetched (the gather's `PREFETCH_AHEAD` runs).
const AHEAD: usize = 6;

/// Events ahead whose index entries are prefetched while locating (`LOCATE_AHEAD`).
const LOCATE_AHEAD: usize = 32;

/// Where an event's record is, and its sizes.
#[derive(Clone, Copy)]
struct Entry {
    start: u64,
    doms: u32,
    pulses: u32,
}

/// Every event's record side by side, and per shard the index of its events.
struct Records {
    bytes: PlainMemory,
    index: Vec<Vec<Entry>>,
    /// Bytes per sensor id, time and charge.
    sizes: (usize, usize, usize),
}

impl Records {
    fn new(views: &[ShardView]) -> Result<Records, Box<dyn Error>> {
        let v0 = views.first().ok_or("no shards")?;
        let sizes = (
            v0.dom_sensor_id.raw().1.size(),
            v0.pulse_time.raw().1.size(),
            v0.pulse_charge.raw().1.size(),
        );
        let mut index = Vec::with_capacity(views.len());
        let mut total = 0;
        for v in views {
            if v.event_azimuth.is_none() || v.event_zenith.is_none() {
                return Err("the dataset needs labels".into());
            }
            let entries: Vec<Entry> = (0..v.event_id.len())
                .map(|i| {
                    let (doms, pulses) = (v.dom_range(i).len(), v.event_pulse_range(i).len());
                    let entry = Entry {
                        start: total as u64,
                        doms: doms as u32,
                        pulses: pulses as u32,
                    };
                    total += 24 + doms * (sizes.0 + 4) + pulses * (sizes.1 + sizes.2 + 1);
                    entry
                })
                .collect();
            index.push(entries);
        }
        let mut bytes = PlainMemory::new(total.max(1));
        let out = bytes.bytes_mut();
        let mut pieces = Vec::new();
        for (v, entries) in views.iter().zip(&index) {
            for (i, entry) in entries.iter().enumerate() {
                pieces.clear();
                event_pieces(v, i, &mut pieces);
                let first_pulse = v.event_pulse_range(i).start as i32;
                let mut at = entry.start as usize;
                for (k, piece) in pieces.iter().enumerate() {
                    if k == 4 {
                        // The DOMs' ends, counted from the event's first pulse: each DOM's
                        // start but the first, then the event's pulse count.
                        let starts = piece.chunks_exact(4).skip(1);
                        let ends = starts
                            .map(|s| i32::from_le_bytes(s.try_into().unwrap()) - first_pulse)
                            .chain([entry.pulses as i32]);
                        for end in ends {
                            out[at..at + 4].copy_from_slice(&end.to_le_bytes());
                            at += 4;
                        }
                        continue;
                    }
                    out[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                }
            }
        }
        Ok(Records {
            bytes,
            index,
            sizes,
        })
    }

    /// The batch of `plan` gathered from the records into `buffer`, as the packed layout
    /// without positions lays it out.
    fn gather(
        &self,
        plan: &BatchPlan,
        types: &StorageTypes,
        places: &mut Vec<(Entry, usize, usize)>,
        buffer: &mut [u8],
    ) -> Sections {
        let entry = |e: &EventRef| self.index[e.shard as usize][e.index as usize];
        places.clear();
        let mut shape = BatchShape {
            events: plan.events.len(),
            ..BatchShape::default()
        };
        for (k, e) in plan.events.iter().enumerate() {
            if let Some(ahead) = plan.events.get(k + LOCATE_AHEAD) {
                prefetch(std::slice::from_ref(
                    &self.index[ahead.shard as usize][ahead.index as usize].start,
                ));
            }
            let entry = entry(e);
            places.push((entry, shape.doms, shape.pulses));
            shape.doms += entry.doms as usize;
            shape.pulses += entry.pulses as usize;
            shape.max_doms = shape.max_doms.max(entry.doms as usize);
        }
        let s = plan_sections(BatchLayout::Packed, shape, types, false);
        let at = |name: &str| s.get(name).expect("packed section").offset;
        let (ids, azimuth, zenith) = (
            at(sections::EVENT_ID),
            at(sections::EVENT_AZIMUTH),
            at(sections::EVENT_ZENITH),
        );
        let (event_doms, dom_pulses) = (
            at(sections::EVENT_DOM_OFFSETS),
            at(sections::DOM_PULSE_OFFSETS),
        );
        let (sensor, time, charge, aux) = (
            at(sections::DOM_SENSOR_ID),
            at(sections::PULSE_TIME),
            at(sections::PULSE_CHARGE),
            at(sections::PULSE_AUXILIARY),
        );
        // The alignment gaps, as the gather zeroes them.
        let mut end = 0;
        for section in &s.list {
            buffer[end..section.offset].fill(0);
            end = section.offset + section.len;
        }
        buffer[event_doms..event_doms + 4].fill(0);
        buffer[dom_pulses..dom_pulses + 4].fill(0);
        let records = self.bytes.bytes();
        let (ss, ts, cs) = self.sizes;
        let record = |entry: &Entry| {
            let len = 24 + entry.doms as usize * (ss + 4) + entry.pulses as usize * (ts + cs + 1);
            &records[entry.start as usize..entry.start as usize + len]
        };
        let ahead = |place: &(Entry, usize, usize)| prefetch(record(&place.0));
        let mut k = 0;
        visit_prefetching(places, AHEAD, ahead, |&(entry, dom_at, pulse_at)| {
            let (d, p) = (entry.doms as usize, entry.pulses as usize);
            // The record's pieces in order, each taken off its front.
            let mut rest = record(&entry);
            let mut take = |bytes: usize| {
                let (piece, tail) = rest.split_at(bytes);
                rest = tail;
                piece
            };
            // (section, bytes per element, elements, first element in the section)
            let before_offsets = [
                (ids, 8, 1, k),
                (azimuth, 8, 1, k),
                (zenith, 8, 1, k),
                (sensor, ss, d, dom_at),
            ];
            for (section, size, n, out_at) in before_offsets {
                buffer[section + out_at * size..][..n * size].copy_from_slice(take(n * size));
            }
            let ends = take(4 * d);
            let out = &mut buffer[dom_pulses + 4 * (dom_at + 1)..][..4 * d];
            for (dst, end) in out.chunks_exact_mut(4).zip(ends.chunks_exact(4)) {
                let end = i32::from_le_bytes(end.try_into().unwrap()) + pulse_at as i32;
                dst.copy_from_slice(&end.to_le_bytes());
            }
            for (section, size) in [(time, ts), (charge, cs), (aux, 1)] {
                buffer[section + pulse_at * size..][..p * size].copy_from_slice(take(p * size));
            }
            let doms_end = ((dom_at + d) as i32).to_le_bytes();
            buffer[event_doms + 4 * (k + 1)..event_doms + 4 * (k + 2)].copy_from_slice(&doms_end);
            k += 1;
        });
        s
    }
}

/// Nanoseconds per event and thread for `threads` threads taking alternate batches, each
/// gathering with `gather` into a buffer of its own.
fn timed<G: Send>(
    plans: &[BatchPlan],
    threads: usize,
    largest: usize,
    make: impl Fn() -> G + Sync,
    gather: impl Fn(&mut G, &BatchPlan, &mut [u8]) + Sync,
) -> f64 {
    let events: usize = plans.iter().map(|p| p.events.len()).sum();
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (make, gather) = (&make, &gather);
            s.spawn(move || {
                let mut state = make();
                let mut buffer = PlainMemory::new(largest);
                for plan in plans.iter().skip(t).step_by(threads) {
                    gather(&mut state, plan, buffer.bytes_mut());
                }
                std::hint::black_box(buffer.bytes());
            });
        }
    });
    started.elapsed().as_secs_f64() * 1e9 * threads as f64 / events as f64
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: side_by_side_gather DATASET [WINDOWS] [ROUNDS] [THREADS]")?;
    let windows: Vec<usize> = args
        .get(1)
        .map_or("1,4,16,64", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let rounds: usize = args.get(2).map_or(Ok(9), |r| r.parse())?;
    let threads: usize = args.get(3).map_or(Ok(1), |t| t.parse())?;
    let dataset = Arc::new(Dataset::open(
        std::path::Path::new(path),
        ChecksumPolicy::Full,
    )?);
    let types = dataset.manifest().schema.types;
    let views = shard_views(&dataset)?;
    let records = Records::new(&views)?;
    println!(
        "{} events, records {} bytes; {rounds} rounds, {threads} thread(s); ns per event and \
         thread (median), positions left out of both",
        dataset.manifest().totals.events,
        records.bytes.bytes().len()
    );
    let view = View::from(dataset.clone());
    for window in windows {
        let sampler = SamplerConfig {
            seed: 0,
            block_events: 256,
            window_blocks: window,
            batching: Batching::Events(256),
            batch_order: BatchOrder::Stored,
            ..SamplerConfig::default()
        };
        let sizes = DatasetSizes::without_read_ahead(&view);
        let plans: Vec<BatchPlan> = EpochBatches::new(&sizes, &sampler, SamplerState::start(0))
            .map(|mut plan| {
                view.locate_plan(&mut plan);
                plan
            })
            .collect();
        // The largest batch, and every batch of the records' gather against the gatherer's.
        let mut gatherer = Gatherer::new(&dataset);
        let mut largest = 0;
        for plan in &plans {
            let shape = gatherer.shape(plan)?;
            largest = largest.max(plan_sections(BatchLayout::Packed, shape, &types, false).total);
        }
        let (mut a, mut b) = (PlainMemory::new(largest), PlainMemory::new(largest));
        let mut places = Vec::new();
        for plan in &plans {
            let s = records.gather(plan, &types, &mut places, b.bytes_mut());
            let shape = gatherer.shape(plan)?;
            let expected = plan_sections(BatchLayout::Packed, shape, &types, false);
            assert_eq!(s, expected, "batch {}: sections", plan.global_index);
            gatherer.gather(plan, BatchLayout::Packed, &expected, a.bytes_mut())?;
            assert!(
                a.bytes()[..s.total] == b.bytes()[..s.total],
                "batch {}: the records' gather differs from the gatherer's",
                plan.global_index
            );
        }
        let today = || Gatherer::new(&dataset);
        let gather_today = |g: &mut Gatherer, plan: &BatchPlan, buffer: &mut [u8]| {
            let shape = g.shape(plan).expect("located");
            let s = plan_sections(BatchLayout::Packed, shape, &types, false);
            g.gather(plan, BatchLayout::Packed, &s, buffer)
                .expect("gathered");
        };
        let side_by_side = Vec::new;
        let gather_records = |places: &mut Vec<_>, plan: &BatchPlan, buffer: &mut [u8]| {
            records.gather(plan, &types, places, buffer);
        };
        // Today's gather, then the records', and the other way round every other round.
        let mut times = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                times[which].push(match which {
                    0 => timed(&plans, threads, largest, today, gather_today),
                    _ => timed(&plans, threads, largest, side_by_side, gather_records),
                });
            }
        }
        let [v2, v3] = times.map(|t| median(&t));
        println!(
            "window {window:>3}: {} batches identical; today's gather {v2:.0}, side by side \
             {v3:.0} ({:+.0}%)",
            plans.len(),
            100.0 * (v3 / v2 - 1.0)
        );
    }
    Ok(())
}

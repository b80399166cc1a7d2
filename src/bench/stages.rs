//! What a bench's consumer does with each batch, and the bounds per stage measured in the
//! same run: sequential shard reads through the memory map, and on a GPU pinned (and
//! pageable) host-to-device copies of batch-sized pieces.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use serde::Serialize;

use super::median_of;
use crate::batch::{plan_sections, BatchLayout, ColumnsPasses, Gatherer, Sections};
use crate::dataset::huge_pages::mapped_bytes;
use crate::dataset::{Dataset, DatasetSizes, View};
use crate::device::cuda::{elapsed_ms, BusyWork, CudaDevice, H2dProbe, PinnedMemory};
use crate::device::staging::{HostMemory, PlainMemory, StagingPool};
use crate::device::transfer::DeviceSlots;
use crate::device::Placement;
use crate::error::Result;
use crate::format::columns::element_range;
use crate::format::StoredView;
use crate::pipeline::Batch;
use crate::prefetch::{prefetch_into, visit_prefetching, PrefetchLevel};
use crate::sampler::{EpochBatches, SamplerConfig, SamplerState};

/// GB/s of one sequential pass over every shard's bytes through the memory map (the shard
/// read stage on its own: page cache, or disk when the shards are not cached).
pub fn shard_read_gb_per_s(dataset: &Dataset) -> Result<(f64, f64)> {
    let started = Instant::now();
    let mut bytes = 0usize;
    let mut sum = 0u64;
    for i in 0..dataset.shard_count() {
        let shard = dataset.shard(i)?;
        let data = shard.bytes();
        for chunk in data.chunks(8) {
            sum = sum.wrapping_add(chunk[0] as u64);
        }
        bytes += data.len();
    }
    std::hint::black_box(sum);
    let seconds = started.elapsed().as_secs_f64();
    Ok((super::gb_per_s(bytes as u64, seconds), seconds))
}

/// One timed copy of scattered pieces.
#[derive(Debug, Clone, Copy)]
pub struct ScatteredCopy {
    /// Seconds the copy took (the median of `SCATTERED_COPY_PASSES` timed passes).
    pub seconds: f64,
    /// Bytes copied: the pieces' bytes as stored.
    pub bytes: usize,
}

impl ScatteredCopy {
    /// Stored bytes per second, GB/s.
    pub fn gb_per_s(&self) -> f64 {
        super::gb_per_s(self.bytes as u64, self.seconds)
    }
}

/// How the loader under measurement gathers, which its bounds copy: the caches its
/// prefetches fill and the passes it copies a columns shard in (a loader's
/// `prefetch_level` and `columns_passes`, resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherWay {
    /// The caches the prefetches fill.
    pub level: PrefetchLevel,
    /// The passes over a columns shard's runs.
    pub passes: ColumnsPasses,
}

impl GatherWay {
    /// A gatherer over `dataset` that gathers this way.
    fn gatherer(self, dataset: &Dataset) -> Gatherer<'_> {
        Gatherer::with_prefetch(dataset, self.level).with_columns_passes(self.passes)
    }
}

/// Events ahead of the one being copied or read whose pieces are prefetched, as the
/// gather prefetches six runs ahead in each of its passes.
const PREFETCH_EVENTS: usize = 6;

/// One of the gather's passes over a batch's runs, in the order it makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// From a columns shard the events' ids and labels and their DOMs' sensor ids and
    /// pulse offsets; from a records shard each whole record.
    DomLevel,
    /// From a columns shard the pulses' times, charges and auxiliary flags; nothing from a
    /// records shard.
    PulseLevel,
}

impl Pass {
    /// Every pass, in order.
    pub const ALL: [Pass; 2] = [Pass::DomLevel, Pass::PulseLevel];
}

/// A batch's stored pieces, per pass of the gather.
struct BatchPieces<'a> {
    /// Per pass ([`Pass::ALL`]'s order), each event's pieces of that pass, event by event
    /// in storage order (for a gather that copies a columns shard in one pass, every piece
    /// in the first: [`batch_pieces`]).
    passes: [Vec<&'a [u8]>; Pass::ALL.len()],
    /// Events in the batch.
    events: usize,
}

impl BatchPieces<'_> {
    /// Every piece, in the order the gather reads them.
    fn all(&self) -> impl Iterator<Item = &[u8]> {
        self.passes.iter().flatten().copied()
    }

    /// Calls `visit` on each piece in that order, keeping [`PREFETCH_EVENTS`] events'
    /// pieces of the same pass prefetched ahead into the caches of `level`.
    fn visit_prefetched(&self, level: PrefetchLevel, mut visit: impl FnMut(&[u8])) {
        for pieces in &self.passes {
            let ahead = (PREFETCH_EVENTS * pieces.len()).div_ceil(self.events.max(1));
            let prefetch = |p: &&[u8]| prefetch_into(p, level);
            visit_prefetching(pieces, ahead, prefetch, |p| visit(p));
        }
    }
}

/// Per batch of `plans`, the pieces of shard columns its events hold, in the order a
/// gather copying a columns shard in `passes` reads them: per pass ([`pass_pieces`]) in
/// two, else all of an event's pieces in the first ([`event_pieces`]); event by event in
/// the batch's storage order.
fn batch_pieces<'a>(
    views: &'a [StoredView<'a>],
    plans: &[crate::sampler::BatchPlan],
    passes: ColumnsPasses,
) -> Vec<BatchPieces<'a>> {
    let two_passes = passes == ColumnsPasses::Two;
    let mut batches = Vec::with_capacity(plans.len());
    for plan in plans {
        let mut events = plan.events.clone();
        events.sort_unstable();
        let passes = Pass::ALL.map(|pass| {
            let mut pieces = Vec::with_capacity(events.len() * 8);
            for e in &events {
                let (v, i) = (&views[e.shard as usize], e.index as usize);
                match (two_passes, pass) {
                    (true, _) => pass_pieces(v, i, pass, &mut pieces),
                    (false, Pass::DomLevel) => event_pieces(v, i, &mut pieces),
                    (false, Pass::PulseLevel) => {}
                }
            }
            pieces
        });
        batches.push(BatchPieces {
            passes,
            events: events.len(),
        });
    }
    batches
}

/// Appends to `pieces` the stored pieces of event `i` of `v` that a packed batch holds, in
/// the order the gather reads them: its pieces of each pass in turn ([`pass_pieces`]).
pub fn event_pieces<'a>(v: &StoredView<'a>, i: usize, pieces: &mut Vec<&'a [u8]>) {
    for pass in Pass::ALL {
        pass_pieces(v, i, pass, pieces);
    }
}

/// Appends to `pieces` the stored pieces of event `i` of `v` that the gather's `pass`
/// reads, in its order (see [`Pass`]).
pub fn pass_pieces<'a>(v: &StoredView<'a>, i: usize, pass: Pass, pieces: &mut Vec<&'a [u8]>) {
    use crate::format::pod::as_bytes;
    match (v, pass) {
        (StoredView::Columns(v), Pass::DomLevel) => {
            let doms = v.dom_range(i);
            pieces.push(as_bytes(&v.event_id[i..=i]));
            for labels in [v.event_azimuth, v.event_zenith].into_iter().flatten() {
                pieces.push(as_bytes(&labels[i..=i]));
            }
            pieces.push(element_range(v.dom_sensor_id.raw(), doms.clone()));
            pieces.push(as_bytes(&v.dom_pulse_offsets[doms]));
        }
        (StoredView::Columns(v), Pass::PulseLevel) => {
            let pulses = v.event_pulse_range(i);
            pieces.push(element_range(v.pulse_time.raw(), pulses.clone()));
            pieces.push(element_range(v.pulse_charge.raw(), pulses.clone()));
            pieces.push(&v.pulse_auxiliary[pulses]);
        }
        (StoredView::Records(v), Pass::DomLevel) => {
            pieces.push(&v.records[v.record_bytes(i..i + 1)])
        }
        (StoredView::Records(_), Pass::PulseLevel) => {}
    }
}

/// Every shard's validated view.
pub fn shard_views(dataset: &Dataset) -> Result<Vec<StoredView<'_>>> {
    (0..dataset.shard_count())
        .map(|i| dataset.shard(i)?.stored())
        .collect()
}

/// Timed passes of [`scattered_copy`], after one untimed pass: over two shardbench runs
/// (2-core Zen 5) the first of three passes took 1.20-1.42 times the other two's median in
/// six windows of eight, so the median of three moved with it.
const SCATTERED_COPY_PASSES: usize = 5;

/// Copies, with `threads` threads, exactly the pieces of shard columns the batches `plans`
/// hold (each event's id, labels, sensor ids, DOM offsets and pulse columns), prefetching
/// the pieces ahead as a gather of `way` does (its passes, into its caches), into one batch-sized
/// buffer per thread: the least any gather of these batches does, so its time bounds the
/// loader's, where [`super::memcpy_gb_per_s`] copies bytes in batch-sized sequential
/// pieces. It leaves out what the gather computes (offsets rebased, positions looked up
/// and written). The buffers are allocated and written once before any pass (no page
/// faults timed), one pass warms up untimed, and the figure is the median of
/// `SCATTERED_COPY_PASSES` passes.
pub fn scattered_copy(
    dataset: &Dataset,
    plans: &[crate::sampler::BatchPlan],
    threads: usize,
    way: GatherWay,
) -> Result<ScatteredCopy> {
    let views = shard_views(dataset)?;
    let batches = batch_pieces(&views, plans, way.passes);
    let level = way.level;
    let largest = batches
        .iter()
        .map(|b| b.all().map(<[u8]>::len).sum::<usize>())
        .max()
        .unwrap_or(0);
    let total: usize = batches
        .iter()
        .flat_map(BatchPieces::all)
        .map(<[u8]>::len)
        .sum();
    let threads = threads.max(1);
    let mut buffers: Vec<Vec<u8>> = (0..threads).map(|_| vec![1u8; largest]).collect();
    let mut pass = || {
        let started = Instant::now();
        std::thread::scope(|s| {
            for (t, dst) in buffers.iter_mut().enumerate() {
                let batches = &batches;
                s.spawn(move || {
                    for batch in batches.iter().skip(t).step_by(threads) {
                        let mut at = 0;
                        batch.visit_prefetched(level, |piece| {
                            dst[at..at + piece.len()].copy_from_slice(piece);
                            at += piece.len();
                        });
                        std::hint::black_box(&dst);
                    }
                });
            }
        });
        Ok::<_, crate::Error>(started.elapsed().as_secs_f64())
    };
    pass()?;
    median_of(SCATTERED_COPY_PASSES, pass).map(|seconds| ScatteredCopy {
        seconds,
        bytes: total,
    })
}

/// The loader's gather without its pipeline: as many threads as it has workers, each
/// with a [`Gatherer`] of its own (kept from pass to pass), gathering alternate batches of
/// an epoch (as the loader's threads take them in turn), locating and laying each out as
/// the loader does, into the loader's own staging buffers, taken as its workers take them.
/// No planning, no hand-offs, no thread waiting for batches: the gather is the whole of its
/// work, so it bounds the loader with those threads from above, where [`scattered_copy`]
/// leaves the gather's computing out. shardbench runs one pass after each measured epoch,
/// so the bound shares the epochs' moments and placement as the memcpy between them does.
pub struct BareGather<'a> {
    gatherers: Vec<Gatherer<'a>>,
    types: crate::format::StorageTypes,
    dom_positions: bool,
}

/// One pass of a [`BareGather`].
#[derive(Debug, Clone, Copy)]
pub struct BarePass {
    /// Seconds the pass took, its threads' start and end included.
    pub seconds: f64,
    /// Batches its threads gathered, all of them together.
    pub batches: usize,
    /// Bytes of the packed batches' sections they wrote (padding left out): what a loader
    /// delivers for them.
    pub bytes: usize,
}

impl<'a> BareGather<'a> {
    /// `threads` (at least 1) gatherers over `dataset` gathering the `way` given, laying
    /// batches out with `dom_positions` or not.
    pub fn new(
        dataset: &'a Dataset,
        threads: usize,
        dom_positions: bool,
        way: GatherWay,
    ) -> BareGather<'a> {
        BareGather {
            gatherers: (0..threads.max(1)).map(|_| way.gatherer(dataset)).collect(),
            types: dataset.manifest().schema.types,
            dom_positions,
        }
    }

    /// Gathers `plans` (located, as a loader delivered them) once: thread `t` gathers
    /// batches `t`, `t + threads`, ..., each into a free buffer of `pool` taken as a worker
    /// takes one ([`StagingPool::take_free`]: one its CPU filled last, where there is one),
    /// marked as gathered on its CPU and given back at once. A buffer too small for a
    /// batch is an error, and so is a pool with fewer free buffers than threads.
    pub fn pass(
        &mut self,
        plans: &[crate::sampler::BatchPlan],
        pool: &StagingPool,
    ) -> Result<BarePass> {
        let threads = self.gatherers.len();
        if pool.free().len() < threads {
            return Err(crate::Error::config(
                "staging pool",
                format!(
                    "the bare gather needs a free staging buffer for each of its {threads} threads"
                ),
            ));
        }
        let (types, dom_positions) = (self.types, self.dom_positions);
        let started = Instant::now();
        let gathered: Vec<Result<(usize, usize)>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .gatherers
                .iter_mut()
                .enumerate()
                .map(|(t, gatherer)| {
                    s.spawn(move || {
                        let (mut batches, mut bytes) = (0, 0);
                        for plan in plans.iter().skip(t).step_by(threads) {
                            let shape = gatherer.shape(plan)?;
                            let sections =
                                plan_sections(BatchLayout::Packed, shape, &types, dom_positions);
                            // Each thread holds one at a time, so one is free unless
                            // another user of the pool took it meanwhile.
                            let mut buffer = pool.take_free().ok_or_else(|| {
                                crate::Error::config(
                                    "staging pool",
                                    "the bare gather found no free staging buffer",
                                )
                            })?;
                            gatherer.gather(
                                plan,
                                BatchLayout::Packed,
                                &sections,
                                buffer.bytes_mut(),
                            )?;
                            buffer.mark_gathered_here();
                            batches += 1;
                            bytes += sections.payload_bytes();
                        }
                        Ok((batches, bytes))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        let mut pass = BarePass {
            seconds,
            batches: 0,
            bytes: 0,
        };
        for thread in gathered {
            let (batches, bytes) = thread?;
            pass.batches += batches;
            pass.bytes += bytes;
        }
        Ok(pass)
    }
}

/// One thread planning one epoch as the loader's workers plan it (each batch under their
/// lock, then located in its shards): the part of their time outside the gather that the
/// sampler takes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Planning {
    /// Batches planned.
    pub batches: usize,
    /// Events in them.
    pub events: usize,
    /// Seconds for the epoch (the median of five passes).
    pub seconds: f64,
}

impl Planning {
    /// Nanoseconds per event.
    pub fn ns_per_event(&self) -> f64 {
        self.seconds * 1e9 / self.events.max(1) as f64
    }

    /// Seconds per batch.
    pub fn seconds_per_batch(&self) -> f64 {
        self.seconds / self.batches.max(1) as f64
    }
}

/// Measures [`Planning`] for epoch `epoch` of `sampler` over `dataset`, with the loader's
/// read-ahead hints (one rank's batches, as the sampler deals them).
pub fn planning(dataset: &Arc<Dataset>, sampler: &SamplerConfig, epoch: u64) -> Result<Planning> {
    let view = View::from(dataset.clone());
    let sizes = DatasetSizes::new(&view);
    let (mut batches, mut events) = (0, 0);
    let seconds = median_of(5, || {
        (batches, events) = (0, 0);
        let started = Instant::now();
        for mut plan in EpochBatches::new(&sizes, sampler, SamplerState::start(epoch)) {
            view.locate_plan(&mut plan);
            batches += 1;
            events += plan.events.len();
            std::hint::black_box(&plan);
        }
        let seconds = started.elapsed().as_secs_f64();
        match sizes.take_error() {
            Some(e) => Err(e),
            None => Ok(seconds),
        }
    })?;
    Ok(Planning {
        batches,
        events,
        seconds,
    })
}

/// One thread's seconds on each part of gathering one epoch's batches, the same batches
/// the loader delivered, in the same run (each the median of three passes): where a
/// gather's time goes, against the least its reads alone cost.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GatherStages {
    /// Batches gathered in each pass.
    pub batches: usize,
    /// Events gathered.
    pub events: usize,
    /// DOMs gathered.
    pub doms: usize,
    /// Locating every batch ([`Gatherer::shape`]: sorting its events into runs and reading
    /// their offsets).
    pub locate_seconds: f64,
    /// Copying the columns and rebasing the offsets: a gather without `dom_position`,
    /// less locating.
    pub columns_seconds: f64,
    /// Looking every DOM's position up in the sensor table and writing it: the whole
    /// gather less the gather without positions (`None` when batches carry none).
    pub positions_seconds: Option<f64>,
    /// The whole gather (locating included) as the loader runs it, into one buffer: the
    /// batch's stores find their lines in cache from the batch before.
    pub gather_seconds: f64,
    /// The same gather into `rotation` buffers in turn, as a loader's staging pool hands
    /// its buffers out: each written again only after the others, its lines gone from the
    /// caches closest to the thread, so every store first fetches its line. The difference
    /// to [`GatherStages::gather_seconds`] is what those misses cost.
    pub rotated_gather_seconds: f64,
    /// Buffers in that rotation (the loader's staging buffers).
    pub rotation: usize,
    /// The share of those buffers the kernel maps in huge pages, as the loader's staging
    /// buffers are asked for (`None` where it cannot tell): in small pages, the scattered
    /// stores of a batch miss the TLB too.
    pub rotation_huge_fraction: Option<f64>,
    /// Reading every cache line of the pieces the batches hold, prefetched as the gather
    /// prefetches, writing nothing: a floor no gather of these batches goes under.
    pub read_floor_seconds: f64,
}

impl GatherStages {
    /// Nanoseconds per event of a stage's `seconds`.
    pub fn ns_per_event(&self, seconds: f64) -> f64 {
        seconds * 1e9 / self.events.max(1) as f64
    }
}

/// Measures [`GatherStages`] over `plans` (located batches, as a loader delivered them),
/// in the packed layout, with positions when `dom_positions`, the rotated gather into
/// `rotation` buffers (at least one), every gather and the read floor the `way` given.
pub fn gather_stages(
    dataset: &Dataset,
    plans: &[crate::sampler::BatchPlan],
    dom_positions: bool,
    rotation: usize,
    way: GatherWay,
) -> Result<GatherStages> {
    let types = dataset.manifest().schema.types;
    let level = way.level;
    let mut gatherer = way.gatherer(dataset);
    let shapes = plans
        .iter()
        .map(|p| gatherer.shape(p))
        .collect::<Result<Vec<_>>>()?;
    let sections = |positions| -> Vec<Sections> {
        shapes
            .iter()
            .map(|&shape| plan_sections(BatchLayout::Packed, shape, &types, positions))
            .collect()
    };
    let (with, without) = (sections(dom_positions), sections(false));
    let doms = shapes.iter().map(|s| s.doms).sum();
    let largest = with.iter().map(|s| s.total).max().unwrap_or(0);
    let rotation = rotation.max(1);
    let mut buffers: Vec<PlainMemory> = (0..rotation)
        .map(|_| PlainMemory::new(largest.max(1)))
        .collect();
    let rotation_huge_fraction = {
        let regions: Vec<&[u8]> = buffers.iter().map(|b| b.bytes()).collect();
        mapped_bytes(&regions).and_then(|m| m.huge_fraction())
    };
    // Batch `i` into buffer `i % turn`.
    let mut gather_all = |gatherer: &mut Gatherer<'_>, sections: &[Sections], turn: usize| {
        median_of(3, || {
            let started = Instant::now();
            for (i, (plan, s)) in plans.iter().zip(sections).enumerate() {
                gatherer.shape(plan)?;
                let buffer = buffers[i % turn].bytes_mut();
                gatherer.gather(plan, BatchLayout::Packed, s, buffer)?;
            }
            std::hint::black_box(&buffers);
            Ok::<_, crate::Error>(started.elapsed().as_secs_f64())
        })
    };
    let gather_seconds = gather_all(&mut gatherer, &with, 1)?;
    let without_positions = gather_all(&mut gatherer, &without, 1)?;
    let rotated_gather_seconds = gather_all(&mut gatherer, &with, rotation)?;
    let locate_seconds = median_of(3, || {
        let started = Instant::now();
        for plan in plans {
            std::hint::black_box(gatherer.shape(plan)?);
        }
        Ok::<_, crate::Error>(started.elapsed().as_secs_f64())
    })?;
    let views = shard_views(dataset)?;
    let batches = batch_pieces(&views, plans, way.passes);
    let read_floor_seconds = median_of(3, || {
        let started = Instant::now();
        let mut sum = 0u64;
        for batch in &batches {
            batch.visit_prefetched(level, |piece| {
                for line in piece.chunks(64) {
                    sum = sum.wrapping_add(u64::from(line[0]));
                }
            });
        }
        std::hint::black_box(sum);
        Ok::<_, crate::Error>(started.elapsed().as_secs_f64())
    })?;
    Ok(GatherStages {
        batches: plans.len(),
        events: plans.iter().map(|p| p.events.len()).sum(),
        doms,
        locate_seconds,
        columns_seconds: (without_positions - locate_seconds).max(0.0),
        positions_seconds: dom_positions.then(|| (gather_seconds - without_positions).max(0.0)),
        gather_seconds,
        rotated_gather_seconds,
        rotation,
        rotation_huge_fraction,
        read_floor_seconds,
    })
}

/// The largest batch (bytes of its packed sections) the loader delivers in `epochs` at
/// `sampler` (one rank's, as the sampler deals them), with `dom_positions` or not: sizes
/// only, from the shards' offsets, nothing gathered.
pub fn largest_batch_bytes(
    dataset: &Arc<Dataset>,
    sampler: &SamplerConfig,
    dom_positions: bool,
    epochs: &[u64],
) -> Result<usize> {
    let view = View::from(dataset.clone());
    let sizes = DatasetSizes::without_read_ahead(&view);
    let types = dataset.manifest().schema.types;
    let mut gatherer = Gatherer::new(dataset);
    let mut largest = 0;
    for &epoch in epochs {
        for mut plan in EpochBatches::new(&sizes, sampler, SamplerState::start(epoch)) {
            view.locate_plan(&mut plan);
            let shape = gatherer.shape(&plan)?;
            let sections = plan_sections(BatchLayout::Packed, shape, &types, dom_positions);
            largest = largest.max(sections.total);
        }
        if let Some(e) = sizes.take_error() {
            return Err(e);
        }
    }
    Ok(largest)
}

/// GB/s of one cold sequential read of every shard file (evicted from the page cache
/// first), in 8 MiB reads: the disk's bound on a cold epoch. Returns it and its seconds.
pub fn cold_read_gb_per_s(dataset: &Dataset) -> Result<(f64, f64)> {
    use std::io::Read;
    dataset.evict_from_page_cache()?;
    let mut buffer = vec![0u8; 8 << 20];
    let started = Instant::now();
    let mut bytes = 0u64;
    for entry in &dataset.manifest().shards {
        let path = dataset.dir().join(&entry.file);
        let mut file = std::fs::File::open(&path).map_err(|e| crate::Error::io(&path, e))?;
        loop {
            let n = file
                .read(&mut buffer)
                .map_err(|e| crate::Error::io(&path, e))?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((super::gb_per_s(bytes, seconds), seconds))
}

/// Host-to-device bounds of one run.
#[derive(Debug, Clone, Serialize)]
pub struct GpuBounds {
    /// The device.
    pub device: String,
    /// Pinned host-to-device copies of batch-sized pieces, GB/s.
    pub pinned_h2d_gb_per_s: f64,
    /// Pageable host-to-device copies of the same pieces, GB/s (what a loader without
    /// pinned staging gets).
    pub pageable_h2d_gb_per_s: f64,
    /// Piece size, bytes.
    pub chunk_bytes: usize,
}

impl GpuBounds {
    /// Measures both bounds with pieces of `chunk` bytes (about 1 GiB copied each, after
    /// as much warm-up, once per bound; the pinned one as the median of three passes).
    pub fn measure(device: &CudaDevice, chunk: usize) -> Result<GpuBounds> {
        let chunk = chunk.max(4096);
        let repeats = ((1usize << 30) / chunk).clamp(8, 8192);
        let mut pinned = H2dProbe::new(device, chunk, repeats, true)?;
        let pinned_h2d_gb_per_s = median_of(3, || pinned.gb_per_s())?;
        drop(pinned);
        Ok(GpuBounds {
            device: format!("cuda:{} ({})", device.ordinal(), device.name()),
            pinned_h2d_gb_per_s,
            pageable_h2d_gb_per_s: H2dProbe::new(device, chunk, repeats / 4, false)?.gb_per_s()?,
            chunk_bytes: chunk,
        })
    }
}

/// The loader's copy stage on its own: batches of `sizes` bytes copied back to back from
/// pinned staging memory through the loader's own device slots (the same events, waits
/// and copy calls as in a run), without a consumer. Returns (GB/s, seconds) between the
/// first copy's start and the last copy's end on the copy stream, so per-copy issue costs
/// count, but the consumer's pace does not.
pub fn copy_stage_gb_per_s(device: &Arc<CudaDevice>, sizes: &[usize]) -> Result<(f64, f64)> {
    let largest = sizes.iter().copied().max().unwrap_or(0).max(1);
    // Two staging buffers, alternated as the loader's pool does.
    let staging = [
        PinnedMemory::new(device.context(), largest)?,
        PinnedMemory::new(device.context(), largest)?,
    ];
    let slots = DeviceSlots::new(device.clone(), 2, false);
    // Warm-up: the slots' device memory is allocated here, not in the timed loop, and an
    // untimed pass wakes the link and copy engine (a cold first pass runs ~25% slower).
    for memory in &staging {
        drop(slots.upload(&memory.bytes()[..largest])?);
    }
    let pass = || -> Result<()> {
        for (i, &size) in sizes.iter().enumerate() {
            drop(slots.upload(&staging[i % 2].bytes()[..size])?);
        }
        Ok(())
    };
    pass()?;
    let stream = device.copy_stream();
    let mut seconds = median_of(3, || {
        let (start, end) = (device.new_event(true)?, device.new_event(true)?);
        start.record(stream).map_err(time_error)?;
        pass()?;
        end.record(stream).map_err(time_error)?;
        Ok(f64::from(elapsed_ms(&start, &end)?) / 1e3)
    })?;
    seconds = seconds.max(1e-12);
    let bytes: usize = sizes.iter().sum();
    Ok((bytes as f64 / seconds / 1e9, seconds))
}

/// The training step a bench runs per batch: a sleep on the CPU, memory-bound work on the
/// GPU's compute stream (calibrated to the requested milliseconds).
pub enum Consumer {
    /// Host batches.
    Host {
        /// The step (zero: none).
        step: Duration,
    },
    /// Device batches.
    Device(DeviceConsumer),
}

/// The GPU side of [`Consumer`].
pub struct DeviceConsumer {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    work: BusyWork,
    passes: usize,
    steps: u64,
    /// Plain events after the last two steps: the host waits on the older one.
    done: [CudaEvent; 2],
    /// Timing events around sampled steps: (end of the step before, start, end).
    samples: Vec<(CudaEvent, CudaEvent, CudaEvent)>,
    /// The timing event recorded after a step whose successor is sampled.
    before_sample: Option<CudaEvent>,
}

/// One step in this many is timed: timing events cost the host microseconds each to
/// record (see `examples/h2d_overheads.rs`), too much to put around every short step.
const SAMPLE_EVERY: u64 = 8;

/// Device memory the GPU stand-in step clears per pass.
const WORK_BYTES: usize = 64 << 20;

impl Consumer {
    /// A consumer for `placement` with steps of `compute_ms`.
    pub fn new(placement: &Placement, compute_ms: f64) -> Result<Consumer> {
        let Some(device) = placement.cuda() else {
            return Ok(Consumer::Host {
                step: Duration::from_secs_f64(compute_ms / 1e3),
            });
        };
        let stream = device.new_stream()?;
        let mut work = BusyWork::new(&stream, WORK_BYTES)?;
        let passes = if compute_ms > 0.0 {
            let (start, end) = (device.new_event(true)?, device.new_event(true)?);
            work.run(2)?;
            start.record(&stream).map_err(time_error)?;
            work.run(20)?;
            end.record(&stream).map_err(time_error)?;
            let per_pass = f64::from(elapsed_ms(&start, &end)?) / 20.0;
            (compute_ms / per_pass.max(1e-6)).round().max(1.0) as usize
        } else {
            0
        };
        Ok(Consumer::Device(DeviceConsumer {
            device: device.clone(),
            stream,
            work,
            passes,
            steps: 0,
            done: [device.new_event(false)?, device.new_event(false)?],
            samples: Vec::new(),
            before_sample: None,
        }))
    }

    /// One step on `batch`; returns host seconds spent in it.
    pub fn consume(&mut self, batch: &mut Batch) -> Result<f64> {
        let started = Instant::now();
        match self {
            Consumer::Host { step } => {
                if !step.is_zero() {
                    std::thread::sleep(*step);
                }
            }
            Consumer::Device(d) => d.step(batch)?,
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Waits for the queued GPU work; returns (GPU ms idle before sampled steps, GPU ms
    /// busy in them), `None` on the CPU.
    pub fn finish(&mut self) -> Result<Option<(f64, f64)>> {
        match self {
            Consumer::Host { .. } => Ok(None),
            Consumer::Device(d) => {
                d.stream.synchronize().map_err(time_error)?;
                let (mut idle, mut busy) = (0.0, 0.0);
                for (before, start, end) in d.samples.drain(..) {
                    idle += f64::from(elapsed_ms(&before, &start)?).max(0.0);
                    busy += f64::from(elapsed_ms(&start, &end)?);
                }
                Ok(Some((idle, busy)))
            }
        }
    }
}

impl DeviceConsumer {
    /// Waits for the batch's copy on the compute stream and queues the step. The host
    /// runs at most one step ahead of the GPU (as a training loop that reads its loss
    /// does): once this step is queued it waits until the previous one has finished.
    /// One step in [`SAMPLE_EVERY`] is bracketed by timing events, with one after the
    /// step before it, to estimate how long the GPU sits idle waiting for data.
    fn step(&mut self, batch: &mut Batch) -> Result<()> {
        batch.wait_on(&self.stream)?;
        let sample = self.before_sample.take();
        let start = match sample {
            Some(_) => Some(self.timing_event()?),
            None => None,
        };
        self.work.run(self.passes)?;
        if let (Some(before), Some(start)) = (sample, start) {
            let end = self.timing_event()?;
            self.samples.push((before, start, end));
        }
        if (self.steps + 1).is_multiple_of(SAMPLE_EVERY) {
            self.before_sample = Some(self.timing_event()?);
        }
        let n = self.steps as usize;
        self.done[n % 2].record(&self.stream).map_err(time_error)?;
        if n > 0 {
            self.done[(n + 1) % 2].synchronize().map_err(time_error)?;
        }
        self.steps += 1;
        Ok(())
    }

    /// A timing event recorded on the consumer's stream now.
    fn timing_event(&self) -> Result<CudaEvent> {
        let event = self.device.new_event(true)?;
        event.record(&self.stream).map_err(time_error)?;
        Ok(event)
    }
}

fn time_error(e: cudarc::driver::DriverError) -> crate::Error {
    crate::device::cuda::driver_error("cannot record a timing event", e)
}

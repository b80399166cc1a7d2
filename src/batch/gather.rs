//! The gather: fills a batch buffer from memory-mapped shards.
//!
//! A plan lists its events in delivery order: stored order by default
//! ([`crate::sampler::BatchOrder::Stored`]), else the random order the shuffle drew. The
//! gather first *locates* the batch: it visits the events in storage order (by shard, then
//! index) and groups those that follow each other both in the shard and in the batch into
//! runs, then reads each run's first and last offsets (and its largest DOM count). Then it
//! copies run by run, each column of a run in one piece, to its place in the batch (from a
//! columns shard in one pass or, where that measured faster, in two: the event- and
//! DOM-level columns, then the pulse columns; [`ColumnsPasses`]), and last looks every
//! DOM's position up from the batch's own sensor ids, in one pass. In stored order a batch
//! drawn from whole blocks (window 1, blocks the size of a batch) is one run: a handful of
//! memcpys. In drawn order, runs are single events; copied in storage order their reads
//! climb through each shard, which the hardware prefetcher follows, and for a batch drawn
//! from few blocks sweep those blocks almost as a memcpy would. A batch whose events are
//! spread out gains nothing on its reads that way and loses on its scattered writes, so
//! its runs are copied in delivery order instead ([`DENSE_EXTENT`]).
//!
//! From a records shard ([`crate::format::records`]) locating reads each run's ends in
//! the DOM and pulse offsets of its events, and copying takes each event's record apart
//! into the sections ([`super::from_records`]): three streams of reads per event (its two
//! offsets, then its record) where a columns shard has nine.

use super::from_records::{copy_records, ColumnsEvent, PaddedSource};
use super::passes::ColumnsPasses;
use super::positions::look_up_positions;
use super::{features_per_dom, sections, split_sections, typed, BatchLayout, BatchShape};
use super::{Sections, SECTION_ALIGN};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::safetensors::Dtype;
use crate::format::{IntColumn, RecordView, ShardLayout, ShardView, StoredView};
use crate::prefetch::{prefetch_into, visit_prefetching, PrefetchLevel};
use crate::sampler::{BatchPlan, EventRef};

/// A batch whose events span at most this many times as many indexes as it holds is
/// copied in storage order (its reads then sweep the shard), else in delivery order (its
/// writes then fill the batch front to back). At window 1 a batch spans 1x (one block), or
/// about 2x when the block size is not a multiple of the batch size (the shuffled ends of
/// two blocks), at window 2 about 2-3x, at window 4 about 4x. In drawn order, storage order
/// gathered those window-1 batches 10% faster, random events 3% slower.
const DENSE_EXTENT: usize = 3;

/// The most one step between events in storage order adds to a batch's extent.
const MAX_STEP: usize = 16;

/// Runs ahead of the one being read whose memory is prefetched.
const PREFETCH_AHEAD: usize = 6;

/// The same while locating, where each run costs a few nanoseconds.
const LOCATE_AHEAD: usize = 32;

/// Gathers batches from a dataset's shards, caching one validated view per shard.
pub struct Gatherer<'a> {
    views: Views<'a>,
    located: Located,
    /// The caches its prefetches fill.
    level: PrefetchLevel,
    /// How it copies runs from a columns shard.
    passes: ColumnsPasses,
}

/// The validated view of each shard touched so far.
struct Views<'a> {
    dataset: &'a Dataset,
    views: Vec<Option<StoredView<'a>>>,
}

impl<'a> Views<'a> {
    /// Validates shard `shard` (and, with a lazy checksum policy, checks it) on first use.
    fn open(&mut self, shard: u32) -> Result<()> {
        let slot = &mut self.views[shard as usize];
        if slot.is_none() {
            *slot = Some(self.dataset.shard(shard as usize)?.stored()?);
        }
        Ok(())
    }

    /// An opened shard's view.
    fn get(&self, shard: u32) -> &StoredView<'a> {
        self.views[shard as usize]
            .as_ref()
            .expect("located batches open their shards first")
    }

    /// An opened shard's view, of a dataset in the columns layout.
    fn columns(&self, shard: u32) -> &ShardView<'a> {
        match self.get(shard) {
            StoredView::Columns(v) => v,
            StoredView::Records(_) => unreachable!("a shard opens only in its dataset's layout"),
        }
    }

    /// An opened shard's view, of a dataset in the records layout.
    fn records(&self, shard: u32) -> &RecordView<'a> {
        match self.get(shard) {
            StoredView::Records(v) => v,
            StoredView::Columns(_) => unreachable!("a shard opens only in its dataset's layout"),
        }
    }
}

/// Events consecutive both in one shard and in the batch, copied column by column at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Run {
    shard: u32,
    /// Index of its first event in the shard.
    pub(super) index: usize,
    /// Position of its first event in the batch.
    pub(super) at: usize,
    /// Events.
    pub(super) len: usize,
    /// Its DOMs in the shard (`start..end`).
    pub(super) doms: (usize, usize),
    /// Its pulses in the shard.
    pub(super) pulses: (usize, usize),
    /// Its first DOM in the batch.
    pub(super) dom_at: usize,
    /// Its first pulse in the batch.
    pub(super) pulse_at: usize,
}

/// A located batch: what [`Gatherer::shape`] works out and [`Gatherer::gather`] reuses.
#[derive(Debug, Default)]
struct Located {
    /// The plan's events (to tell whether a plan is the one located).
    events: Vec<EventRef>,
    /// In copy order: storage order for a dense batch, else delivery order.
    runs: Vec<Run>,
    shape: BatchShape,
    /// Scratch: events with their batch position ([`storage_key`]), sorted.
    sorted: Vec<u128>,
    /// Scratch: per batch position, the DOMs (then the DOMs before) of the run starting
    /// there.
    doms_at: Vec<usize>,
    /// Scratch: the same for pulses.
    pulses_at: Vec<usize>,
    /// Scratch: the runs while they are put in delivery order.
    spare_runs: Vec<Run>,
}

impl Run {
    /// The run's events in its shard.
    pub(super) fn events(&self) -> std::ops::Range<usize> {
        self.index..self.index + self.len
    }
}

/// A batch's event ids and labels.
pub(super) struct Headers<'b> {
    pub(super) ids: &'b mut [i64],
    pub(super) azimuth: &'b mut [f64],
    pub(super) zenith: &'b mut [f64],
}

/// A packed batch's sections, each of its events' columns.
pub(super) struct PackedOut<'b> {
    pub(super) headers: Headers<'b>,
    /// `[B+1]`, its first entry 0.
    pub(super) event_doms: &'b mut [i32],
    /// `[D+1]`, its first entry 0.
    pub(super) dom_pulses: &'b mut [i32],
    /// `[D]` sensor ids, in the stored dtype.
    pub(super) sensor: &'b mut [u8],
    /// `[P]` times, in the stored dtype.
    pub(super) time: &'b mut [u8],
    /// `[P]` charges, in the stored dtype.
    pub(super) charge: &'b mut [u8],
    /// `[P]` auxiliary flags.
    pub(super) aux: &'b mut [u8],
}

/// A shard's event ids and labels (when stored).
type EventColumns<'v> = (&'v [i64], Option<&'v [f64]>, Option<&'v [f64]>);

impl Headers<'_> {
    /// Copies the ids and labels of `run` from its shard's (NaN without labels).
    fn copy_from(&mut self, (ids, azimuth, zenith): EventColumns, run: &Run) {
        let (events, out) = (run.events(), run.at..run.at + run.len);
        copy_run(&mut self.ids[out.clone()], &ids[events.clone()]);
        let labels = [(azimuth, &mut *self.azimuth), (zenith, &mut *self.zenith)];
        for (labels, dst) in labels {
            match labels {
                Some(labels) => copy_run(&mut dst[out.clone()], &labels[events.clone()]),
                None => dst[out.clone()].fill(f64::NAN),
            }
        }
    }
}

impl<'a> Gatherer<'a> {
    /// A gatherer over `dataset`, prefetching into the caches that suit this machine
    /// ([`PrefetchLevel::for_this_machine`]) and copying from columns shards in this
    /// machine's passes ([`ColumnsPasses::for_this_machine`]).
    pub fn new(dataset: &'a Dataset) -> Gatherer<'a> {
        Gatherer::with_prefetch(dataset, PrefetchLevel::for_this_machine())
    }

    /// A gatherer over `dataset` whose prefetches fill the caches of `level` (copying in
    /// this machine's passes).
    pub fn with_prefetch(dataset: &'a Dataset, level: PrefetchLevel) -> Gatherer<'a> {
        Gatherer {
            views: Views {
                dataset,
                views: (0..dataset.shard_count()).map(|_| None).collect(),
            },
            located: Located::default(),
            level,
            passes: ColumnsPasses::for_this_machine(),
        }
    }

    /// The same gatherer copying runs from a columns shard in `passes` (the batches are
    /// the same bytes either way; a records shard is copied as before).
    pub fn with_columns_passes(self, passes: ColumnsPasses) -> Gatherer<'a> {
        Gatherer { passes, ..self }
    }

    /// The shape of the batch `plan` describes. Locating it here is work
    /// [`Gatherer::gather`] then reuses for the same plan.
    pub fn shape(&mut self, plan: &BatchPlan) -> Result<BatchShape> {
        if self.located.events != plan.events {
            self.locate(plan)?;
        }
        Ok(self.located.shape)
    }

    fn locate(&mut self, plan: &BatchPlan) -> Result<()> {
        let level = self.level;
        let prefetch = |values: &[i32]| prefetch_into(values, level);
        let Located {
            events,
            runs,
            shape,
            sorted,
            doms_at,
            pulses_at,
            spare_runs,
        } = &mut self.located;
        events.clear();
        sorted.clear();
        sorted.extend(plan.events.iter().zip(0..).map(storage_key));
        // Linear when the plan is already in stored order (`BatchOrder::Stored`).
        sorted.sort_unstable();
        runs.clear();
        // Index distance covered in storage order, each step capped (a jump to another
        // block is one step, wherever the block is): about the batch size when its events
        // are packed together (a small window), several times it when they are spread out.
        let mut extent = 0usize;
        let mut previous: Option<EventRef> = None;
        for (e, at) in sorted.iter().map(|&k| from_storage_key(k)) {
            extent += match previous {
                Some(p) if p.shard == e.shard => ((e.index - p.index) as usize).min(MAX_STEP),
                _ => 1,
            };
            match runs.last_mut() {
                Some(run)
                    if run.shard == e.shard
                        && run.index + run.len == e.index as usize
                        && run.at + run.len == at =>
                {
                    run.len += 1
                }
                _ => {
                    if previous.is_none_or(|p| p.shard != e.shard) {
                        self.views.open(e.shard)?;
                    }
                    runs.push(Run {
                        shard: e.shard,
                        index: e.index as usize,
                        at,
                        len: 1,
                        ..Run::default()
                    })
                }
            }
            previous = Some(e);
        }
        // Each run's DOMs (prefetching the event offsets of runs ahead), then its pulses.
        *shape = BatchShape {
            events: plan.events.len(),
            ..BatchShape::default()
        };
        for r in 0..runs.len() {
            if let Some(ahead) = runs.get(r + LOCATE_AHEAD) {
                let events = ahead.index..=ahead.index + ahead.len;
                let event_doms = self.views.get(ahead.shard).event_tensors().dom_offsets;
                prefetch(&event_doms[events.clone()]);
                if let StoredView::Records(v) = self.views.get(ahead.shard) {
                    prefetch(&v.event_pulse_offsets[events]);
                }
            }
            let run = &mut runs[r];
            let view = self.views.get(run.shard);
            let offsets = &view.event_tensors().dom_offsets[run.index..=run.index + run.len];
            run.doms = (offsets[0] as usize, offsets[run.len] as usize);
            let most = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            shape.max_doms = shape.max_doms.max(most as usize);
            match view {
                StoredView::Columns(v) => {
                    // The ends of its pulse offsets, read in the next pass: asked for as
                    // soon as they are known, the whole batch's are in cache before that
                    // pass starts.
                    prefetch(&v.dom_pulse_offsets[run.doms.0..=run.doms.0]);
                    prefetch(&v.dom_pulse_offsets[run.doms.1..=run.doms.1]);
                }
                StoredView::Records(v) => {
                    let pulses = &v.event_pulse_offsets;
                    run.pulses = (
                        pulses[run.index] as usize,
                        pulses[run.index + run.len] as usize,
                    );
                }
            }
        }
        for run in runs.iter_mut() {
            if let StoredView::Columns(v) = self.views.get(run.shard) {
                run.pulses = (
                    v.dom_pulse_offsets[run.doms.0] as usize,
                    v.dom_pulse_offsets[run.doms.1] as usize,
                );
            }
        }
        // Where each run goes: the DOMs and pulses of the runs before it in the batch.
        doms_at.clear();
        doms_at.resize(plan.events.len(), 0);
        pulses_at.clear();
        pulses_at.resize(plan.events.len(), 0);
        for run in runs.iter() {
            doms_at[run.at] = run.doms.1 - run.doms.0;
            pulses_at[run.at] = run.pulses.1 - run.pulses.0;
        }
        for (d, p) in doms_at.iter_mut().zip(pulses_at.iter_mut()) {
            (*d, shape.doms) = (shape.doms, shape.doms + *d);
            (*p, shape.pulses) = (shape.pulses, shape.pulses + *p);
        }
        for run in runs.iter_mut() {
            (run.dom_at, run.pulse_at) = (doms_at[run.at], pulses_at[run.at]);
        }
        if extent > DENSE_EXTENT * plan.events.len() && !runs.is_sorted_by_key(|run| run.at) {
            // Spread out: storage order saves no cache misses on the reads, and the scattered
            // writes into the batch then cost more (see DENSE_EXTENT). A batch in stored
            // order is in delivery order already.
            // `doms_at` has been read into the runs: free to hold their positions.
            into_delivery_order(runs, doms_at, spare_runs);
        }
        events.extend_from_slice(&plan.events);
        Ok(())
    }

    /// Fills `buffer` (at least `sections.total` bytes, aligned to [`SECTION_ALIGN`]) with
    /// the batch `plan` in `layout`.
    pub fn gather(
        &mut self,
        plan: &BatchPlan,
        layout: BatchLayout,
        sections: &Sections,
        buffer: &mut [u8],
    ) -> Result<()> {
        if buffer.len() < sections.total
            || !(buffer.as_ptr() as usize).is_multiple_of(SECTION_ALIGN)
        {
            return Err(Error::config(
                "buffer",
                "batch buffer too small or misaligned",
            ));
        }
        self.shape(plan)?.check_fits(layout)?;
        let mut parts = split_sections(&mut buffer[..sections.total], sections);
        let mut next = || parts.next().expect("one part per section");
        let mut headers = Headers {
            ids: typed::<i64>(next()),
            azimuth: typed::<f64>(next()),
            zenith: typed::<f64>(next()),
        };
        match layout {
            BatchLayout::Packed => {
                let positions = sections.get(sections::DOM_POSITION).is_some();
                let columns = 6 + usize::from(positions);
                let mut rest: [&mut [u8]; 7] =
                    std::array::from_fn(|i| if i < columns { next() } else { &mut [] });
                self.gather_packed(headers, &mut rest[..columns]);
            }
            BatchLayout::Padded { pulses_per_dom, .. } => {
                self.gather_headers(&mut headers);
                let m = sections
                    .get(sections::DOM_MASK)
                    .expect("padded layout")
                    .shape[1];
                let (features, mask) = (typed::<f32>(next()), next());
                self.gather_padded(m, pulses_per_dom, features, mask);
            }
        }
        debug_assert!(parts.next().is_none(), "every section written");
        Ok(())
    }

    /// Event ids and labels alone, run by run (the packed layout copies them with each
    /// run's columns).
    fn gather_headers(&self, headers: &mut Headers) {
        let runs = &self.located.runs;
        let columns = |run: &Run| {
            let events = self.views.get(run.shard).event_tensors();
            (events.id, events.azimuth, events.zenith)
        };
        let ahead = |run: &Run| prefetch_headers(columns(run), run, self.level);
        visit_prefetching(runs, PREFETCH_AHEAD, ahead, |run| {
            headers.copy_from(columns(run), run)
        });
    }

    /// `parts`: the packed sections after the headers, `dom_position` among them or not.
    /// Each run's headers are copied with its columns (from a columns shard, with its
    /// DOM-level ones): a pass of their own cost the loader 1-3% of its rate at windows 16
    /// and 64, and saved it about 1% at window 1 (2-core Zen 5, docs/results.md).
    fn gather_packed(&self, headers: Headers, parts: &mut [&mut [u8]]) {
        let (event_doms, dom_pulses, sensor, position, time, charge, aux) = match parts {
            [a, b, c, p, t, q, x] => (a, b, c, Some(p), t, q, x),
            [a, b, c, t, q, x] => (a, b, c, None, t, q, x),
            _ => unreachable!("six or seven packed sections"),
        };
        let table = self.views.dataset.sensor_table();
        let mut out = PackedOut {
            headers,
            event_doms: typed::<i32>(event_doms),
            dom_pulses: typed::<i32>(dom_pulses),
            sensor,
            time,
            charge,
            aux,
        };
        out.event_doms[0] = 0;
        out.dom_pulses[0] = 0;
        let runs = &self.located.runs;
        // One loop per layout (every shard has the dataset's).
        match self.views.dataset.manifest().schema.layout {
            ShardLayout::Columns => {
                let view = |run: &Run| self.views.columns(run.shard);
                match self.passes {
                    ColumnsPasses::One => {
                        let ahead = |run: &Run| {
                            prefetch_dom_level(view(run), run, self.level);
                            prefetch_pulse_level(view(run), run, self.level);
                        };
                        visit_prefetching(runs, PREFETCH_AHEAD, ahead, |run| {
                            copy_dom_level(view(run), run, &mut out);
                            copy_pulse_level(view(run), run, &mut out);
                        });
                    }
                    ColumnsPasses::Two => {
                        // Each pass prefetches only what it reads: the DOM level, then the
                        // pulse level (see `copy_pulse_level`).
                        let ahead = |run: &Run| prefetch_dom_level(view(run), run, self.level);
                        visit_prefetching(runs, PREFETCH_AHEAD, ahead, |run| {
                            copy_dom_level(view(run), run, &mut out)
                        });
                        let ahead = |run: &Run| prefetch_pulse_level(view(run), run, self.level);
                        visit_prefetching(runs, PREFETCH_AHEAD, ahead, |run| {
                            copy_pulse_level(view(run), run, &mut out)
                        });
                    }
                }
            }
            ShardLayout::Records => {
                let view = |run: &Run| self.views.records(run.shard);
                let ahead = |run: &Run| {
                    let v = view(run);
                    prefetch_into(&v.records[v.record_bytes(run.events())], self.level)
                };
                visit_prefetching(runs, PREFETCH_AHEAD, ahead, |run| {
                    copy_records(view(run), run, &mut out, self.level)
                });
            }
        }
        if let Some(position) = position {
            // One pass over the batch's own sensor ids, just written and still in cache: a
            // tight loop (the lookups between the runs' copies waited behind their reads:
            // 15 ms of a 71 ms epoch at window 16, 10 ms this way).
            let doms = self.located.shape.doms;
            let dtype = self.views.dataset.manifest().schema.types.sensor_id;
            let sensors = IntColumn::from_raw(&out.sensor[..doms * dtype.size()], dtype)
                .expect("the sensor section holds the shards' integer sensor ids, aligned");
            look_up_positions(sensors, 0..doms, table, position);
        }
    }

    fn gather_padded(&self, m: usize, k: usize, features: &mut [f32], mask: &mut [u8]) {
        let f = features_per_dom(k);
        let positions = self.views.dataset.sensor_table().column();
        features.fill(0.0);
        mask.fill(0);
        for run in &self.located.runs {
            let view = self.views.get(run.shard);
            for (b, e) in (run.at..).zip(run.events()) {
                let rows = &mut features[b * m * f..(b + 1) * m * f];
                let present = &mut mask[b * m..(b + 1) * m];
                match view {
                    StoredView::Columns(v) => {
                        let event = ColumnsEvent::new(v, e);
                        fill_padded(&event, &positions, k, rows, present)
                    }
                    StoredView::Records(v) => {
                        fill_padded(&v.record(e), &positions, k, rows, present)
                    }
                }
            }
        }
    }
}

/// Prefetches what [`copy_dom_level`] reads of a run: its ids, labels, sensor ids and DOM
/// offsets (its event offsets are in cache since locating read them).
fn prefetch_dom_level(v: &ShardView, run: &Run, level: PrefetchLevel) {
    prefetch_headers((v.event_id, v.event_azimuth, v.event_zenith), run, level);
    let (d0, d1) = run.doms;
    prefetch_into(element_bytes(sized(v.dom_sensor_id.raw()), d0, d1), level);
    // Locating read only the ends of the DOM offsets; rebasing reads them all.
    prefetch_into(&v.dom_pulse_offsets[d0..=d1], level);
}

/// Prefetches what [`copy_pulse_level`] reads of a run: its pulse columns.
fn prefetch_pulse_level(v: &ShardView, run: &Run, level: PrefetchLevel) {
    let (p0, p1) = run.pulses;
    prefetch_into(element_bytes(sized(v.pulse_time.raw()), p0, p1), level);
    prefetch_into(element_bytes(sized(v.pulse_charge.raw()), p0, p1), level);
    prefetch_into(element_bytes((v.pulse_auxiliary, 1), p0, p1), level);
}

/// Prefetches the ids and labels of a run.
fn prefetch_headers((ids, azimuth, zenith): EventColumns, run: &Run, level: PrefetchLevel) {
    let events = run.events();
    prefetch_into(&ids[events.clone()], level);
    for labels in [azimuth, zenith].into_iter().flatten() {
        prefetch_into(&labels[events.clone()], level);
    }
}

/// Fills an event's rows of the padded features (`rows`: `M` rows of `4 + 3K` features)
/// and its mask (`present`) with its first `M` DOMs and their first `k` pulses.
fn fill_padded(
    event: &impl PaddedSource,
    positions: &crate::format::FloatColumn,
    k: usize,
    rows: &mut [f32],
    present: &mut [u8],
) {
    let f = features_per_dom(k);
    for (slot, (row, present)) in rows.chunks_exact_mut(f).zip(present).enumerate() {
        if slot >= event.doms() {
            break;
        }
        let pulses = event.pulses(slot);
        let row_of = 3 * event.sensor(slot) as usize;
        for (k, x) in row[..3].iter_mut().enumerate() {
            *x = positions.get(row_of + k) as f32;
        }
        row[3] = pulses.len() as f32;
        for (j, p) in pulses.take(k).enumerate() {
            row[4 + 3 * j] = event.time(p) as f32;
            row[5 + 3 * j] = event.charge(p) as f32;
            row[6 + 3 * j] = event.auxiliary(p) as f32;
        }
        *present = 1;
    }
}

/// Copies a run's event- and DOM-level data from a columns shard: its headers, its sensor
/// ids in one copy, and its offsets rebased.
fn copy_dom_level(v: &ShardView, run: &Run, out: &mut PackedOut) {
    let headers = (v.event_id, v.event_azimuth, v.event_zenith);
    out.headers.copy_from(headers, run);
    let ((d0, d1), p0) = (run.doms, run.pulses.0);
    let (d_out, p_out, events) = (run.dom_at, run.pulse_at, run.events());
    copy_elements(sized(v.dom_sensor_id.raw()), d0, d1, out.sensor, d_out);
    rebase(
        &v.dom_pulse_offsets[d0 + 1..=d1],
        p_out as i32 - p0 as i32,
        &mut out.dom_pulses[d_out + 1..=d_out + d1 - d0],
    );
    rebase(
        &v.event_dom_offsets[events.start + 1..=events.end],
        d_out as i32 - d0 as i32,
        &mut out.event_doms[run.at + 1..=run.at + run.len],
    );
}

/// Copies a run's pulse columns from a columns shard, each in one copy: right after
/// [`copy_dom_level`] ([`ColumnsPasses::One`]), or in a pass of their own after its
/// ([`ColumnsPasses::Two`]), where each run has three pieces to read and write instead of
/// seven: on a 2-core Zen 4 the loader then delivered 2-4% more events a second at window
/// 4, 3-5% at 16 and 5-7% at 64 (no change at window 1; docs/results.md, "The columns
/// copied in two passes"), on a 2-core Zen 5 2-3% fewer ("One pass on the Zen 5").
fn copy_pulse_level(v: &ShardView, run: &Run, out: &mut PackedOut) {
    let ((p0, p1), p_out) = (run.pulses, run.pulse_at);
    copy_elements(sized(v.pulse_time.raw()), p0, p1, out.time, p_out);
    copy_elements(sized(v.pulse_charge.raw()), p0, p1, out.charge, p_out);
    copy_elements((v.pulse_auxiliary, 1), p0, p1, out.aux, p_out);
}

/// Copies a run's values: one event's as a plain move (most runs at wide windows), more
/// with `copy_from_slice` (a call to memcpy, dear for one element).
fn copy_run<T: Copy>(dst: &mut [T], src: &[T]) {
    match (dst, src) {
        ([d], [s]) => *d = *s,
        (dst, src) => dst.copy_from_slice(src),
    }
}

/// Writes `offsets` shifted by `shift` (a run's offsets rebased to its place in the batch).
fn rebase(offsets: &[i32], shift: i32, dst: &mut [i32]) {
    for (dst, &o) in dst.iter_mut().zip(offsets) {
        *dst = o + shift;
    }
}

/// Puts `runs` (each starting at a batch position of its own, below `positions.len()`) in
/// delivery order, in two linear passes through `positions` (scratch, overwritten) and
/// `spare` (scratch): in drawn order at wide windows, where every run is one event, a
/// comparison sort of a 256-event batch's runs took about 4 µs, 16 ns an event.
fn into_delivery_order(runs: &mut Vec<Run>, positions: &mut [usize], spare: &mut Vec<Run>) {
    const NONE: usize = usize::MAX;
    positions.fill(NONE);
    for (r, run) in runs.iter().enumerate() {
        positions[run.at] = r;
    }
    spare.clear();
    spare.extend(positions.iter().filter(|&&r| r != NONE).map(|&r| runs[r]));
    std::mem::swap(runs, spare);
}

/// Sorts events by shard, then index, then batch position.
fn storage_key((e, at): (&EventRef, usize)) -> u128 {
    (u128::from(e.shard) << 96) | (u128::from(e.index) << 64) | at as u128
}

fn from_storage_key(key: u128) -> (EventRef, usize) {
    let event = EventRef {
        shard: (key >> 96) as u32,
        index: (key >> 64) as u32,
    };
    (event, key as u64 as usize)
}

/// The bytes of elements `from..to` of a column.
fn element_bytes((src, size): (&[u8], usize), from: usize, to: usize) -> &[u8] {
    &src[from * size..to * size]
}

/// Copies elements `from..to` of a raw column of `size`-byte elements into `dst` at
/// element `at`.
fn copy_elements((src, size): (&[u8], usize), from: usize, to: usize, dst: &mut [u8], at: usize) {
    dst[at * size..(at + to - from) * size].copy_from_slice(element_bytes((src, size), from, to));
}

fn sized((bytes, dtype): (&[u8], Dtype)) -> (&[u8], usize) {
    (bytes, dtype.size())
}

#[cfg(test)]
mod tests {
    use super::{into_delivery_order, Run};
    use crate::rng::Rng;

    /// Runs of 1-3 events covering a batch, as locating makes them (each with its own
    /// first batch position), shuffled into another order.
    fn shuffled_runs(events: usize, seed: u64) -> Vec<Run> {
        let mut rng = Rng::new(seed);
        let (mut runs, mut at) = (Vec::new(), 0);
        while at < events {
            let len = (1 + rng.below(3) as usize).min(events - at);
            let index = rng.below(1 << 20) as usize;
            runs.push(Run {
                shard: rng.below(4) as u32,
                index,
                at,
                len,
                doms: (index * 5, index * 5 + len * 5),
                pulses: (index * 40, index * 40 + len * 40),
                dom_at: at * 5,
                pulse_at: at * 40,
            });
            at += len;
        }
        rng.shuffle(&mut runs);
        runs
    }

    #[test]
    fn runs_come_back_in_delivery_order_unchanged() {
        let (mut positions, mut spare) = (Vec::new(), Vec::new());
        for (events, seed) in [(1, 0), (16, 1), (256, 2), (256, 3), (1000, 4)] {
            let mut runs = shuffled_runs(events, seed);
            let mut expected = runs.clone();
            expected.sort_by_key(|run| run.at);
            // Scratch left from a larger batch, as the gatherer's is.
            positions.resize(events, 7);
            spare.push(Run::default());
            into_delivery_order(&mut runs, &mut positions, &mut spare);
            assert_eq!(runs, expected, "{events} events");
            assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), events);
        }
    }
}

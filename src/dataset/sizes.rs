//! The sampler's view of a dataset (or of a [`View`] of it): events per shard and pulses
//! per event, read straight from the memory-mapped shards' offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::View;
use crate::error::Error;
use crate::format::StoredView;
use crate::prefetch::prefetch;
use crate::sampler::{EventLength, EventRef, EventSizes};

/// [`EventSizes`] of a [`View`]: its events, numbered as the view numbers them. A shard
/// that fails to open counts 0 pulses per event; its error is kept for the caller
/// ([`DatasetSizes::take_error`]), which must check it before trusting a plan.
pub struct DatasetSizes<'a> {
    view: &'a View,
    /// Each shard's view once opened; `None` when it failed to open.
    views: Vec<OnceLock<Option<StoredView<'a>>>>,
    /// The first shard that failed to open, handed once to the plan that needed it.
    error: Mutex<Option<Error>>,
    /// Whether `error` was ever set: read for every plan the loader's threads take, so
    /// that they pass no lock's cache line between their cores to learn that no shard
    /// failed.
    failed: AtomicBool,
    /// Whether the sampler's read-ahead hints reach the kernel (a streaming loader reads
    /// the shards next; a plan made for data already in memory does not).
    read_ahead: bool,
    /// Per shard, whether it was out of the page cache (in part) when first hinted: only
    /// then do hints reach the kernel. For a shard in the page cache, asking to read it
    /// ahead costs the kernel a walk over its pages for nothing: 8.6% of the workers' time
    /// at window 16 on warm 320k-event data.
    cold: Vec<OnceLock<bool>>,
}

/// A shard with at least this fraction of its pages in the page cache is not read ahead.
const WARM_FRACTION: f64 = 0.99;

impl<'a> DatasetSizes<'a> {
    /// The sizes of `view`, passing the sampler's read-ahead hints to the kernel.
    pub fn new(view: &'a View) -> Self {
        DatasetSizes {
            view,
            views: (0..view.dataset().shard_count())
                .map(|_| OnceLock::new())
                .collect(),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            read_ahead: true,
            cold: (0..view.dataset().shard_count())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// The sizes of `view`, ignoring the sampler's read-ahead hints.
    pub fn without_read_ahead(view: &'a View) -> Self {
        DatasetSizes {
            read_ahead: false,
            ..DatasetSizes::new(view)
        }
    }

    /// Shard `shard`'s view, opened at the first call; `None` when it failed to open (its
    /// error kept for [`DatasetSizes::take_error`]).
    fn shard_view(&self, shard: u32) -> Option<&StoredView<'a>> {
        let dataset = self.view.dataset();
        self.views[shard as usize]
            .get_or_init(
                || match dataset.shard(shard as usize).and_then(|s| s.stored()) {
                    Ok(v) => Some(v),
                    Err(err) => {
                        self.error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(err);
                        self.failed.store(true, Ordering::Release);
                        None
                    }
                },
            )
            .as_ref()
    }

    /// The first shard that failed to open, if one did.
    pub fn take_error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl EventSizes for DatasetSizes<'_> {
    fn shard_events(&self) -> Vec<usize> {
        self.view
            .shard_counts()
            .iter()
            .map(|s| s.events as usize)
            .collect()
    }

    fn pulses(&self, e: EventRef) -> usize {
        self.length(e, EventLength::Pulses)
    }

    fn doms(&self, e: EventRef) -> usize {
        self.length(e, EventLength::Doms)
    }

    /// Event `e`'s `length`, from its shard's offsets (0 when the shard failed to open).
    fn length(&self, e: EventRef, length: EventLength) -> usize {
        let e = self.view.locate(e);
        (self.shard_view(e.shard)).map_or(0, |v| Lengths::of(v, length).at(e.index as usize))
    }

    /// As [`DatasetSizes::pulses`] or [`DatasetSizes::doms`] for each, a run of
    /// consecutive events of one shard (a window's events come in runs of a block) through
    /// one look-up of the shard: the pulses of every event of 320k with the real statistics
    /// took 22-24 ns an event asked one by one, 10-14 ns in runs, as a bare loop over the
    /// offsets (2-core Zen 4). A split's run is located by one search
    /// ([`KeptEvents::locate_run`](super::KeptEvents::locate_run)).
    ///
    /// Events asked alone (a wide window's drawn order) are read in three passes, each
    /// prefetching what the next reads: the events found, their offsets read, then the
    /// items' offsets those point at, so that the cache misses of many events overlap
    /// where each event's two were waited for in turn.
    fn lengths_into(&self, events: &[EventRef], length: EventLength, out: &mut Vec<usize>) {
        out.reserve(events.len());
        let mut located = Vec::new();
        // Per event asked alone: its place in `out`, its shard's offsets, and its index
        // there, then its own offsets once read.
        let mut alone: Vec<(usize, Lengths<'_>, usize, (i32, i32))> = Vec::new();
        let mut rest = events;
        while let Some(&first) = rest.first() {
            let run = EventRef::run_len(rest);
            let lengths = self.shard_view(first.shard).map(|v| Lengths::of(v, length));
            match (lengths, self.view.kept(first.shard as usize)) {
                (None, _) => out.extend(std::iter::repeat_n(0, run)),
                (Some(lengths), kept) if run == 1 => {
                    let e = kept.map_or(first.index, |kept| kept.get(first.index)) as usize;
                    prefetch(&lengths.events[e..e + 2]);
                    alone.push((out.len(), lengths, e, (0, 0)));
                    out.push(0);
                }
                (Some(lengths), None) => out.extend(lengths.run(first.index as usize, run)),
                (Some(lengths), Some(kept)) => {
                    located.clear();
                    located.resize(run, 0);
                    kept.locate_run(first.index, located.iter_mut());
                    out.extend(located.iter().map(|&e| lengths.at(e as usize)))
                }
            }
            rest = &rest[run..];
        }
        for (_, lengths, e, offsets) in alone.iter_mut() {
            *offsets = (lengths.events[*e], lengths.events[*e + 1]);
            lengths.prefetch_between(offsets.0, offsets.1);
        }
        for (at, lengths, _, (start, end)) in alone {
            out[at] = lengths.between(start, end);
        }
    }

    fn read_ahead(&self, shard: u32, events: std::ops::Range<u32>) {
        if !self.read_ahead {
            return;
        }
        if events.is_empty() {
            return;
        }
        // In the shard's numbering: from the first event's to past the last one's.
        let (first, last) = (
            self.view.locate(EventRef {
                shard,
                index: events.start,
            }),
            self.view.locate(EventRef {
                shard,
                index: events.end - 1,
            }),
        );
        // A hint only: a shard that fails to open is reported by the gather that reads it.
        if let Ok(opened) = self.view.dataset().shard(shard as usize) {
            let cold = self.cold[shard as usize]
                .get_or_init(|| opened.resident_fraction() < WARM_FRACTION);
            if !*cold {
                return;
            }
            let events = first.index as usize..last.index as usize + 1;
            if let Err(e) = opened.read_ahead(events) {
                tracing::debug!("read-ahead skipped: {e}");
            }
        }
    }
}

/// The offsets an event's length is read from in one shard.
#[derive(Clone, Copy)]
struct Lengths<'v> {
    /// Per event, where its items start (an event's DOMs, or its pulses in records).
    events: &'v [i32],
    /// For the pulses of a columns shard, where each DOM's pulses start (`events` then
    /// counts DOMs).
    dom_pulses: Option<&'v [i32]>,
}

impl<'v> Lengths<'v> {
    fn of(view: &StoredView<'v>, length: EventLength) -> Lengths<'v> {
        let (events, dom_pulses) = match (view, length) {
            (_, EventLength::Doms) => (view.event_tensors().dom_offsets, None),
            (StoredView::Columns(v), EventLength::Pulses) => {
                (v.event_dom_offsets, Some(v.dom_pulse_offsets))
            }
            (StoredView::Records(v), EventLength::Pulses) => (v.event_pulse_offsets, None),
        };
        Lengths { events, dom_pulses }
    }

    /// The length of the items from `start` to `end` of `events`' level.
    fn between(&self, start: i32, end: i32) -> usize {
        match self.dom_pulses {
            None => (end - start) as usize,
            Some(pulses) => (pulses[end as usize] - pulses[start as usize]) as usize,
        }
    }

    /// Hints the CPU to bring in what [`Lengths::between`] reads for `start` and `end`.
    fn prefetch_between(&self, start: i32, end: i32) {
        if let Some(pulses) = self.dom_pulses {
            prefetch(&pulses[start as usize..start as usize + 1]);
            prefetch(&pulses[end as usize..end as usize + 1]);
        }
    }

    /// Event `e`'s length.
    fn at(&self, e: usize) -> usize {
        self.between(self.events[e], self.events[e + 1])
    }

    /// The lengths of `len` consecutive events from `start`, their offsets read in one
    /// sweep.
    fn run(self, start: usize, len: usize) -> impl Iterator<Item = usize> + 'v {
        (self.events[start..=start + len].windows(2)).map(move |o| self.between(o[0], o[1]))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::convert::Silent;
    use crate::dataset::copy::copy_dataset;
    use crate::dataset::{small_shards_fixture, ChecksumPolicy, Dataset};
    use crate::format::ShardLayout;

    /// Every event of `view` in runs as a window asks for them: blocks of `block`
    /// consecutive events, in a scrambled order, some crossing into the next shard (of 1,
    /// each event asked alone, as a wide window's drawn order asks them).
    fn windowed(sizes: &DatasetSizes<'_>, block: usize) -> Vec<EventRef> {
        let all: Vec<EventRef> = sizes
            .shard_events()
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| {
                (0..n as u32).map(move |index| EventRef {
                    shard: s as u32,
                    index,
                })
            })
            .collect();
        let mut blocks: Vec<&[EventRef]> = all.chunks(block).collect();
        blocks.reverse();
        blocks.concat()
    }

    #[test]
    fn lengths_into_equals_pulses_and_doms_one_by_one_in_either_layout_and_in_a_split() {
        let dir = tempfile::tempdir().unwrap();
        let columns = small_shards_fixture(dir.path());
        let records_dir = dir.path().join("records");
        copy_dataset(
            columns.dir(),
            &records_dir,
            Some(ShardLayout::Records),
            &Silent,
        )
        .unwrap();
        let records = Dataset::open(&records_dir, ChecksumPolicy::Lazy).unwrap();
        for dataset in [columns, records] {
            let whole = View::from(Arc::new(dataset));
            // Views that mark their events a bit each, list what they leave out, and list
            // what they keep (shard by shard, as their shards' shares fall).
            let (part, _) = whole.split(0.3, 1).unwrap();
            let (most, few) = whole.split(0.02, 1).unwrap();
            let views = [&whole, &part, &most, &few];
            for (view, block) in views.iter().flat_map(|&v| [(v, 7), (v, 1)]) {
                let sizes = DatasetSizes::without_read_ahead(view);
                let events = windowed(&sizes, block);
                for length in [EventLength::Pulses, EventLength::Doms] {
                    // Each event on its own, through the methods the sampler's other
                    // callers use.
                    let one = |e| match length {
                        EventLength::Pulses => sizes.pulses(e),
                        EventLength::Doms => sizes.doms(e),
                    };
                    let one_by_one: Vec<usize> = events.iter().map(|&e| one(e)).collect();
                    let mut runs = vec![3];
                    sizes.lengths_into(&events, length, &mut runs);
                    assert_eq!(runs[0], 3, "appended");
                    assert_eq!(runs[1..], one_by_one[..], "{length}");
                    let totals = view.totals();
                    let total = match length {
                        EventLength::Pulses => totals.pulses,
                        EventLength::Doms => totals.doms,
                    };
                    assert_eq!(one_by_one.iter().sum::<usize>() as u64, total, "{length}");
                    assert!(total > 20, "{length}");
                }
                assert!(sizes.take_error().is_none());
            }
        }
    }
}

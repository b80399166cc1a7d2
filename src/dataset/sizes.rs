//! The sampler's view of a dataset (or of a [`View`] of it): events per shard and pulses
//! per event, read straight from the memory-mapped shards' offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::View;
use crate::error::Error;
use crate::format::StoredView;
use crate::sampler::{EventRef, EventSizes};

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
        let e = self.view.locate(e);
        let dataset = self.view.dataset();
        let view = self.views[e.shard as usize].get_or_init(|| {
            match dataset.shard(e.shard as usize).and_then(|s| s.stored()) {
                Ok(v) => Some(v),
                Err(err) => {
                    self.error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(err);
                    self.failed.store(true, Ordering::Release);
                    None
                }
            }
        });
        view.as_ref().map_or(0, |v| {
            let e = e.index as usize;
            v.pulse_range(e..e + 1).len()
        })
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

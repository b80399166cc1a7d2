//! Views of a dataset: all its events, or a part of them chosen by a hash of each event's id,
//! such as a validation split made without converting again.
//!
//! A loader reads a [`View`] wherever it reads a dataset (`Arc<Dataset>` converts into the
//! view of every event). The sampler sees the view's events only, numbered inside each shard
//! (`EventRef { shard, index }` with `index` among the events the view keeps), and
//! [`View::locate`] finds the shard event behind each before it is read.
//!
//! ```no_run
//! # fn main() -> shardify::Result<()> {
//! use std::sync::Arc;
//! use shardify::dataset::{ChecksumPolicy, Dataset, View};
//!
//! let dataset = Arc::new(Dataset::open("ds".as_ref(), ChecksumPolicy::Lazy)?);
//! let (train, validation) = View::from(dataset).split(0.01, 0)?;
//! assert_eq!(train.totals().events + validation.totals().events, 1_000_000);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use super::kept::KeptEvents;
use super::Dataset;
use crate::error::{Error, Result};
use crate::format::checksum;
use crate::format::order::shuffle_key;
use crate::sampler::{BatchPlan, EventRef};

/// Mixed into the split seed, so that a split never follows the stored order (which sorts
/// events by the same hash under the conversion's seed).
const SPLIT_STREAM: u64 = 0x5b11_7e5e_ed00_0001;

/// The top bits of a split key that name its bucket in the search for the split's
/// threshold: a count per bucket (512 KiB), then the keys of the one bucket that holds the
/// threshold (about events / 65536 of them), where holding every key took 8 bytes an event.
const KEY_BUCKET_BITS: u32 = 16;

/// Events, DOMs and pulses of (a part of) a dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events.
    pub events: u64,
    /// DOMs.
    pub doms: u64,
    /// Pulses.
    pub pulses: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.events += other.events;
        self.doms += other.doms;
        self.pulses += other.pulses;
    }
}

/// The events a view keeps, shard by shard.
#[derive(Debug)]
struct Subset {
    /// Per shard, the kept events.
    kept: Vec<KeptEvents>,
    /// Per shard, what the kept events hold.
    counts: Vec<Counts>,
    /// XXH3-64 of `kept` (see [`Subset::sealed`]).
    digest: u64,
}

/// All the events of a dataset, or a part of them.
#[derive(Clone)]
pub struct View {
    dataset: Arc<Dataset>,
    /// `None`: every event.
    subset: Option<Arc<Subset>>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("dataset", &self.dataset.dir())
            .field("whole", &self.is_whole())
            .field("totals", &self.totals())
            .finish()
    }
}

impl From<Arc<Dataset>> for View {
    fn from(dataset: Arc<Dataset>) -> View {
        View {
            dataset,
            subset: None,
        }
    }
}

impl View {
    /// The dataset the view is of.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// Whether the view holds every event of its dataset.
    pub fn is_whole(&self) -> bool {
        self.subset.is_none()
    }

    /// What each shard's kept events hold, in manifest order.
    pub fn shard_counts(&self) -> Vec<Counts> {
        match &self.subset {
            Some(subset) => subset.counts.clone(),
            None => self
                .dataset
                .manifest()
                .shards
                .iter()
                .map(|s| Counts {
                    events: s.events,
                    doms: s.doms,
                    pulses: s.pulses,
                })
                .collect(),
        }
    }

    /// What the view holds in all.
    pub fn totals(&self) -> Counts {
        let mut totals = Counts::default();
        for counts in self.shard_counts() {
            totals += counts;
        }
        totals
    }

    /// Which events the view holds, as 16 hex digits: its dataset's
    /// [`Manifest::order_identity`](crate::format::Manifest::order_identity), and for a
    /// part of it the indexes it keeps. What a saved loader position refers to: equal for
    /// the same events of the same conversion (a copy at any path, in either layout),
    /// different for another conversion, source, shard size or split.
    pub fn identity(&self) -> String {
        let manifest = self.dataset.manifest();
        match &self.subset {
            None => manifest.identity(),
            Some(subset) => {
                let both = [manifest.order_identity(), subset.digest]
                    .map(u64::to_le_bytes)
                    .concat();
                checksum::of_bytes(&both)
            }
        }
    }

    /// Refuses, naming the `dataset` field, a loader position saved on events of another
    /// identity (`saved`, a [`View::identity`]) than this view's: resumed here, the
    /// position would not be a place in the same order.
    pub fn check_identity(&self, saved: &str) -> Result<()> {
        let ours = self.identity();
        if saved == ours {
            return Ok(());
        }
        let part = if self.is_whole() { "" } else { "a part of " };
        Err(Error::config(
            "dataset",
            format!(
                "the saved state was made reading other events (identity {saved}) than this \
                 loader reads, {part}{} (identity {ours}): another conversion, source, shard \
                 size or split orders other events. Resume on the dataset and split the \
                 state was saved on",
                self.dataset.dir().display()
            ),
        ))
    }

    /// The events of shard `shard` the view keeps; `None` when it keeps them all.
    pub fn kept(&self, shard: usize) -> Option<&KeptEvents> {
        self.subset.as_ref().map(|s| &s.kept[shard])
    }

    /// The shard event behind the view's event `e` (`e.index` counts the view's events of
    /// that shard).
    pub fn locate(&self, e: EventRef) -> EventRef {
        match self.kept(e.shard as usize) {
            Some(kept) => EventRef {
                shard: e.shard,
                index: kept.get(e.index),
            },
            None => e,
        }
    }

    /// `events` (numbered as the view numbers them) replaced by the shard events behind
    /// them, each run of consecutive events (a block's) located by one search.
    pub fn locate_all(&self, events: &mut [EventRef]) {
        let Some(subset) = &self.subset else {
            return;
        };
        let mut rest = events;
        while !rest.is_empty() {
            let (run, tail) = rest.split_at_mut(EventRef::run_len(rest));
            let kept = &subset.kept[run[0].shard as usize];
            kept.locate_run(run[0].index, run.iter_mut().map(|e| &mut e.index));
            rest = tail;
        }
    }

    /// `plan` (events numbered as the view numbers them) with the shard events behind them.
    pub fn locate_plan(&self, plan: &mut BatchPlan) {
        self.locate_all(&mut plan.events);
    }

    /// Splits the view in two disjoint views that together hold all its events: the second
    /// holds `round(fraction * events)` of them, those with the smallest
    /// `xxh3_64(event_id, seed)` (mixed with a constant, so never the stored order; ties by
    /// event id), the first the rest. Only the event ids decide: the split is the same
    /// whatever seed or shard size the dataset was converted with. Reads every kept event's
    /// id and offsets (each shard opened, and checksummed under the dataset's policy).
    pub fn split(&self, fraction: f64, seed: u64) -> Result<(View, View)> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::config(
                "fraction",
                format!("{fraction}: expected a fraction of the events, from 0 to 1"),
            ));
        }
        let seed = seed ^ SPLIT_STREAM;
        let mut chosen = self.smallest_keys(seed, fraction)?;
        if chosen.tied_ids.is_some() {
            // Two distinct ids with one 64-bit key at the threshold (about one split in a
            // thousand on the whole Kaggle set): the smallest ids of those are chosen.
            let mut ids = Vec::new();
            self.for_each_id(|id| {
                if chosen.at(shuffle_key(seed, id)) {
                    ids.push(id);
                }
            })?;
            ids.sort_unstable();
            ids.truncate(chosen.ties_wanted);
            chosen.tied_ids = Some(ids);
        }
        let shards = self.dataset.shard_count();
        let mut parts = [Subset::with_capacity(shards), Subset::with_capacity(shards)];
        for shard in 0..shards {
            // Each part's events of the shard, a bit each (a split of a split leaves out of
            // both the events its view does not keep).
            let shard_events = self.dataset.manifest().shards[shard].events as u32;
            let mut marks = [(); 2].map(|_| vec![0u64; (shard_events as usize).div_ceil(64)]);
            let mut counts = [Counts::default(); 2];
            self.for_each_event_of(shard, |index, id, doms, pulses| {
                let part = usize::from(chosen.contains(shuffle_key(seed, id), id));
                marks[part][index as usize / 64] |= 1 << (index % 64);
                counts[part] += Counts {
                    events: 1,
                    doms,
                    pulses,
                };
            })?;
            for ((part, marks), counts) in parts.iter_mut().zip(marks).zip(counts) {
                part.kept.push(KeptEvents::marked(shard_events, marks));
                part.counts.push(counts);
            }
        }
        let [rest, chosen_part] = parts;
        let view = |subset: Subset| View {
            dataset: self.dataset.clone(),
            subset: Some(Arc::new(subset.sealed())),
        };
        Ok((view(rest), view(chosen_part)))
    }

    /// Which events hold the smallest `round(fraction * events)` of the view's keys under
    /// `seed`: two passes over the ids, the first counting keys per bucket of their top
    /// [`KEY_BUCKET_BITS`] bits, the second keeping the keys of the bucket where the last
    /// of them falls.
    fn smallest_keys(&self, seed: u64, fraction: f64) -> Result<Chosen> {
        let bucket_of = |key: u64| (key >> (u64::BITS - KEY_BUCKET_BITS)) as usize;
        let mut counts = vec![0u64; 1 << KEY_BUCKET_BITS];
        self.for_each_id(|id| counts[bucket_of(shuffle_key(seed, id))] += 1)?;
        let wanted = (fraction * counts.iter().sum::<u64>() as f64).round() as u64;
        if wanted == 0 {
            return Ok(Chosen::smallest(&mut [], 0));
        }
        let (mut bucket, mut before) = (0, 0);
        while before + counts[bucket] < wanted {
            before += counts[bucket];
            bucket += 1;
        }
        let mut keys = Vec::with_capacity(counts[bucket] as usize);
        self.for_each_id(|id| {
            let key = shuffle_key(seed, id);
            if bucket_of(key) == bucket {
                keys.push(key);
            }
        })?;
        Ok(Chosen::smallest(&mut keys, (wanted - before) as usize))
    }

    /// Calls `visit(event_id)` for every kept event, in stored order.
    fn for_each_id(&self, mut visit: impl FnMut(i64)) -> Result<()> {
        for shard in 0..self.dataset.shard_count() {
            let view = self.dataset.shard(shard)?.stored()?;
            let ids = view.event_tensors().id;
            match self.kept(shard) {
                Some(kept) => kept.iter().for_each(|i| visit(ids[i as usize])),
                None => ids.iter().copied().for_each(&mut visit),
            }
        }
        Ok(())
    }

    /// Calls `visit(index, event_id, doms, pulses)` for every kept event of shard
    /// `shard`, in stored order.
    fn for_each_event_of(
        &self,
        shard: usize,
        mut visit: impl FnMut(u32, i64, u64, u64),
    ) -> Result<()> {
        let view = self.dataset.shard(shard)?.stored()?;
        let events = view.event_tensors();
        let (ids, event_doms) = (events.id, events.dom_offsets);
        let mut one = |i: u32| {
            let e = i as usize;
            let doms = event_doms[e + 1] - event_doms[e];
            let pulses = view.pulse_range(e..e + 1);
            visit(i, ids[e], doms as u64, pulses.len() as u64);
        };
        match self.kept(shard) {
            Some(kept) => kept.iter().for_each(&mut one),
            None => (0..view.events() as u32).for_each(&mut one),
        }
        Ok(())
    }
}

impl Subset {
    fn with_capacity(shards: usize) -> Subset {
        Subset {
            kept: Vec::with_capacity(shards),
            counts: Vec::with_capacity(shards),
            digest: 0,
        }
    }

    /// The subset with its digest: each shard's count of kept events, then their indexes
    /// (see [`KeptEvents::digest_into`]).
    fn sealed(mut self) -> Subset {
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        for kept in &self.kept {
            kept.digest_into(&mut hash);
        }
        self.digest = hash.digest();
        self
    }
}

/// Which events a split chooses: the keys below `threshold`, and of the events whose key is
/// the threshold, `ties_wanted` (all of them, unless `tied_ids` lists the chosen ones).
struct Chosen {
    threshold: Option<u64>,
    ties_wanted: usize,
    /// `Some` when more events than wanted share the threshold key: the ids chosen among
    /// them, ascending (filled by the caller, empty until then).
    tied_ids: Option<Vec<i64>>,
}

impl Chosen {
    /// The `wanted` smallest of `keys` (reordered in the search).
    fn smallest(keys: &mut [u64], wanted: usize) -> Chosen {
        if wanted == 0 {
            return Chosen {
                threshold: None,
                ties_wanted: 0,
                tied_ids: None,
            };
        }
        let (_, &mut threshold, _) = keys.select_nth_unstable(wanted - 1);
        let below = keys.iter().filter(|&&k| k < threshold).count();
        let at = keys.iter().filter(|&&k| k == threshold).count();
        Chosen {
            threshold: Some(threshold),
            ties_wanted: wanted - below,
            tied_ids: (at > wanted - below).then(Vec::new),
        }
    }

    fn at(&self, key: u64) -> bool {
        self.threshold == Some(key)
    }

    /// Whether the event `id` with key `key` is chosen.
    fn contains(&self, key: u64, id: i64) -> bool {
        match self.threshold {
            Some(t) if key < t => true,
            Some(t) if key == t => self
                .tied_ids
                .as_ref()
                .is_none_or(|ids| ids.binary_search(&id).is_ok()),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_at_the_threshold_are_broken_by_event_id() {
        let mut keys = vec![5, 9, 9, 9, 1, 12];
        let mut chosen = Chosen::smallest(&mut keys, 3);
        assert_eq!((chosen.threshold, chosen.ties_wanted), (Some(9), 1));
        assert!(
            chosen.tied_ids.is_some(),
            "three events share the threshold, one is wanted"
        );
        chosen.tied_ids = Some(vec![40]);
        assert!(chosen.contains(5, 7) && chosen.contains(1, 99));
        assert!(chosen.contains(9, 40) && !chosen.contains(9, 41) && !chosen.contains(12, 1));
        let mut distinct = vec![3, 1, 2];
        let all = Chosen::smallest(&mut distinct, 3);
        assert!(all.tied_ids.is_none() && all.contains(3, 0));
        assert!(!Chosen::smallest(&mut distinct, 0).contains(1, 0));
    }
}

//! A window's events: one place per event while the window is small enough to stay in
//! cache, else only the first event of each of its blocks (8 bytes a block, where a window
//! over the whole dataset of 132M events held 1 GB of places).

use super::stored_order::StoredOrder;
use super::{EventLength, EventRef, EventSizes};

/// Events whose lengths are asked of [`EventSizes::lengths_into`] at once.
const LENGTHS_CHUNK: usize = 1 << 16;

/// The most events a window lists one by one (2 MiB of places, a core's L2 cache): a listed
/// place is one load, where finding an event from its block's first cost the order 12% more
/// at windows 1 and 64 of 256-event blocks (4.7 and 7.0 ns an event against 4.1 and 6.3,
/// `cargo bench --bench plan`); past this size the list misses cache as much as the search
/// does, and only costs memory.
const LISTED_EVENTS: usize = 1 << 18;

/// A window's events in rotated order (its blocks sorted by start): in stored order but
/// for at most one wrap from the last shard to the first. Event `i` is event
/// `i % block_events` of the window's block `i / block_events`: every block but the
/// epoch's last holds `block_events` events, and the last, when shorter, comes last in any
/// window (its start is the greatest).
#[derive(Debug)]
pub(super) struct WindowEvents {
    /// The epoch's order the blocks are cut from.
    pub(super) stored: StoredOrder,
    /// The first event of each block, in window order.
    firsts: Vec<EventRef>,
    /// Every event, in window order, where the window lists them (`None` where it does not).
    places: Option<Vec<EventRef>>,
    /// Events in a block (but the epoch's last).
    block_events: u32,
    /// Events in all blocks.
    len: usize,
}

impl WindowEvents {
    /// No window yet, over `stored` cut into blocks of `block_events`, for windows of at
    /// most `window_events` events.
    pub(super) fn new(stored: StoredOrder, block_events: usize, window_events: usize) -> Self {
        Self::listing(stored, block_events, window_events <= LISTED_EVENTS)
    }

    /// As [`WindowEvents::new`], listing every event or not as `listed` says.
    pub(super) fn listing(stored: StoredOrder, block_events: usize, listed: bool) -> Self {
        WindowEvents {
            stored,
            firsts: Vec::new(),
            places: listed.then(Vec::new),
            block_events: block_events as u32,
            len: 0,
        }
    }

    /// Events in the window.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Empties the window.
    pub(super) fn clear(&mut self) {
        self.firsts.clear();
        if let Some(places) = &mut self.places {
            places.clear();
        }
        self.len = 0;
    }

    /// Appends the block of `len` events at (rotated) position `start`: of `block_events`
    /// events, unless it is the epoch's last.
    pub(super) fn push_block(&mut self, start: u64, len: u64) {
        debug_assert!(
            self.len.is_multiple_of(self.block_events as usize),
            "only the epoch's last block is short, and it comes last"
        );
        self.firsts.push(self.stored.event_at(start));
        if let Some(places) = &mut self.places {
            self.stored.extend(start, start + len, places);
        }
        self.len += len as usize;
    }

    /// Event `i` of the window: its place in the list, or found from its block's first
    /// event (a division, and where the block crosses a shard's end a search of the shard
    /// starts). Keeping the run the last event lay in saved no time there: a batch of 256
    /// drawn from a window of more than 2^18 events has about one event a block.
    #[inline]
    pub(super) fn get(&self, i: u32) -> EventRef {
        match &self.places {
            Some(places) => places[i as usize],
            None => {
                let block = i / self.block_events;
                let ahead = i - block * self.block_events;
                self.stored
                    .event_after(self.firsts[block as usize], ahead as u64)
            }
        }
    }

    /// Whether the window lists its events one by one (it is at most [`LISTED_EVENTS`]).
    pub(super) fn listed(&self) -> bool {
        self.places.is_some()
    }

    /// Each event's `length` from `sizes`, in window order, at most `cap` (as `u32`: a
    /// shard's offsets are 32-bit): asked a run of blocks at a time, in stored order,
    /// where the offsets are read sequentially.
    pub(super) fn lengths(
        &self,
        sizes: &dyn EventSizes,
        length: EventLength,
        cap: u32,
    ) -> Vec<u32> {
        let mut lengths = Vec::with_capacity(self.len);
        self.lengths_into(sizes, length, cap, &mut lengths);
        lengths
    }

    /// As [`WindowEvents::lengths`], into `lengths` (emptied first, its memory reused).
    pub(super) fn lengths_into(
        &self,
        sizes: &dyn EventSizes,
        length: EventLength,
        cap: u32,
        lengths: &mut Vec<u32>,
    ) {
        lengths.clear();
        lengths.reserve(self.len);
        let (mut places, mut counts) = (Vec::new(), Vec::new());
        for start in (0..self.len).step_by(LENGTHS_CHUNK) {
            let end = (start + LENGTHS_CHUNK).min(self.len);
            places.clear();
            places.extend((start as u32..end as u32).map(|i| self.get(i)));
            counts.clear();
            sizes.lengths_into(&places, length, &mut counts);
            lengths.extend(counts.iter().map(|&n| n.min(cap as usize) as u32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The events of blocks `(start, len)`, as the stored order lists them one by one.
    fn listed_events(stored: &StoredOrder, blocks: &[(u64, u64)]) -> Vec<EventRef> {
        let mut events = Vec::new();
        for &(start, len) in blocks {
            stored.extend(start, start + len, &mut events);
        }
        events
    }

    proptest! {
        /// Every event of a window, looked up from its block's first event, is the one the
        /// stored order lists at its place: across shard ends, empty shards, the wrap from
        /// the last shard to the first, and the epoch's short last block.
        #[test]
        fn each_event_is_the_one_the_stored_order_lists_there(
            shards in proptest::collection::vec(0usize..40, 1..8),
            rotation in any::<u64>(),
            block in 1u64..50,
            picks in proptest::collection::vec(any::<u32>(), 1..12),
            listed in any::<bool>(),
        ) {
            let stored = StoredOrder::new(&shards, |total| rotation % total);
            let total = stored.total();
            prop_assume!(total > 0);
            let count = total.div_ceil(block);
            // Some of the epoch's blocks, sorted by start as a window holds them.
            let mut starts: Vec<u64> = picks.iter().map(|&p| p as u64 % count * block).collect();
            starts.sort_unstable();
            starts.dedup();
            let blocks: Vec<(u64, u64)> =
                starts.iter().map(|&s| (s, block.min(total - s))).collect();
            let mut window = WindowEvents::listing(stored.clone(), block as usize, listed);
            for &(start, len) in &blocks {
                window.push_block(start, len);
            }
            let expected = listed_events(&stored, &blocks);
            prop_assert_eq!(window.len(), expected.len());
            for (i, &event) in expected.iter().enumerate() {
                prop_assert_eq!(window.get(i as u32), event, "event {}", i);
            }
            window.clear();
            prop_assert_eq!(window.len(), 0);
        }
    }

    /// Lengths are asked in window order, a chunk at a time, and come back as `u32`.
    #[test]
    fn lengths_are_each_events_in_window_order() {
        struct Sizes(Vec<usize>);
        impl EventSizes for Sizes {
            fn shard_events(&self) -> Vec<usize> {
                self.0.clone()
            }
            fn pulses(&self, event: EventRef) -> usize {
                event.shard as usize * 1000 + event.index as usize
            }
            fn doms(&self, event: EventRef) -> usize {
                event.index as usize
            }
        }
        let sizes = Sizes(vec![70_000, 0, 3]);
        let stored = StoredOrder::new(&sizes.0, |_| 69_990);
        let mut window = WindowEvents::new(stored.clone(), 7, 21);
        assert!(window.places.is_some(), "a small window lists its events");
        let blocks = [(0, 7), (7, 7), (70_000, 3)];
        for &(start, len) in &blocks {
            window.push_block(start, len);
        }
        let expected: Vec<u32> = listed_events(&stored, &blocks)
            .iter()
            .map(|&e| sizes.pulses(e) as u32)
            .collect();
        assert_eq!(
            window.lengths(&sizes, EventLength::Pulses, u32::MAX),
            expected
        );
        let capped: Vec<u32> = expected.iter().map(|&n| n.min(2_000)).collect();
        assert!(capped != expected, "the cap takes some");
        assert_eq!(window.lengths(&sizes, EventLength::Pulses, 2_000), capped);
        let whole = (0..70_003 / 7 + 1).map(|b| (b * 7, 7.min(70_003 - b * 7)));
        let mut window = WindowEvents::new(stored.clone(), 7, 70_003 + LISTED_EVENTS);
        assert!(
            window.places.is_none(),
            "a big window lists only its blocks"
        );
        let blocks: Vec<(u64, u64)> = whole.collect();
        for &(start, len) in &blocks {
            window.push_block(start, len);
        }
        let expected: Vec<u32> = listed_events(&stored, &blocks)
            .iter()
            .map(|&e| e.index)
            .collect();
        assert_eq!(
            window.lengths(&sizes, EventLength::Doms, u32::MAX),
            expected
        );
    }
}

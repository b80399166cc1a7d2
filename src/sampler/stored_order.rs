//! The stored order of a dataset's events (its shards concatenated in manifest order),
//! rotated by an epoch's offset.

use super::EventRef;

/// The stored order, rotated: position `p` is the event at stored position
/// `(p + rotation) % total`.
#[derive(Debug, Clone)]
pub(super) struct StoredOrder {
    /// Stored position of each shard's first event, and the total at the end.
    shard_starts: Vec<u64>,
    pub(super) rotation: u64,
}

impl StoredOrder {
    /// The order of shards of `shard_events` events each, rotated by `rotation(total)`
    /// (0 when there are no events).
    pub(super) fn new(shard_events: &[usize], rotation: impl FnOnce(u64) -> u64) -> StoredOrder {
        let mut shard_starts = Vec::with_capacity(shard_events.len() + 1);
        let mut total = 0u64;
        shard_starts.push(0);
        for &n in shard_events {
            total += n as u64;
            shard_starts.push(total);
        }
        let rotation = if total == 0 { 0 } else { rotation(total) };
        StoredOrder {
            shard_starts,
            rotation,
        }
    }

    /// Events in all shards.
    pub(super) fn total(&self) -> u64 {
        *self.shard_starts.last().expect("at least the total")
    }

    /// The event at (rotated) position `position` (below the total).
    pub(super) fn event_at(&self, position: u64) -> EventRef {
        let stored = (position + self.rotation) % self.total();
        let shard = self.shard_at(stored);
        EventRef {
            shard: shard as u32,
            index: (stored - self.shard_starts[shard]) as u32,
        }
    }

    /// The shard stored position `stored` (below the total) lies in: the last one starting
    /// at or before it, empty shards skipped.
    fn shard_at(&self, stored: u64) -> usize {
        self.shard_starts.partition_point(|&s| s <= stored) - 1
    }

    /// Events of `event`'s shard from it to the shard's end, itself included.
    fn events_left_in_shard(&self, event: EventRef) -> u64 {
        let shard = event.shard as usize;
        self.shard_starts[shard + 1] - self.shard_starts[shard] - event.index as u64
    }

    /// The event `ahead` positions after `first`, an event at some (rotated) position:
    /// where both lie in `first`'s shard, with no search.
    pub(super) fn event_after(&self, first: EventRef, ahead: u64) -> EventRef {
        if ahead < self.events_left_in_shard(first) {
            return EventRef {
                shard: first.shard,
                index: first.index + ahead as u32,
            };
        }
        let shard = first.shard as usize;
        let stored = self.shard_starts[shard] + first.index as u64;
        let total = self.total();
        // Rotated position of `first`, then the one `ahead` past it.
        let rotated = (stored + total - self.rotation) % total;
        self.event_at(rotated + ahead)
    }

    /// Appends the events at (rotated) positions `start..end` to `out`.
    pub(super) fn extend(&self, start: u64, end: u64, out: &mut Vec<EventRef>) {
        self.pieces(start, end, |shard, indexes| {
            out.extend(indexes.map(|index| EventRef { shard, index }))
        });
    }

    /// Calls `piece` with each shard's run of the events at (rotated) positions
    /// `start..end`, in order.
    pub(super) fn pieces(
        &self,
        start: u64,
        end: u64,
        mut piece: impl FnMut(u32, std::ops::Range<u32>),
    ) {
        // Rotated position `wrap` is stored position 0.
        let wrap = self.total() - self.rotation;
        if start < wrap {
            let (a, b) = (start + self.rotation, end.min(wrap) + self.rotation);
            self.stored_pieces(a, b, &mut piece);
        }
        if end > wrap {
            self.stored_pieces(start.max(wrap) - wrap, end - wrap, &mut piece);
        }
    }

    /// As [`StoredOrder::pieces`], for stored positions `start..end` (`end <= total`).
    fn stored_pieces(
        &self,
        start: u64,
        end: u64,
        piece: &mut impl FnMut(u32, std::ops::Range<u32>),
    ) {
        let mut shard = self.shard_at(start);
        let mut position = start;
        while position < end {
            let shard_end = self.shard_starts[shard + 1];
            let stop = end.min(shard_end);
            let first = position - self.shard_starts[shard];
            piece(shard as u32, first as u32..(first + stop - position) as u32);
            position = stop;
            shard += 1;
        }
    }
}

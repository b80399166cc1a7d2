//! Gathered batches back in plan order: workers finish out of order.

use std::collections::BTreeMap;

use crossbeam_channel::Receiver;

use super::workers::Filled;
use crate::error::Result;

/// The workers' numbered results, handed on in sequence.
pub(crate) struct InOrder {
    results: Receiver<(u64, Result<Filled>)>,
    pending: BTreeMap<u64, Result<Filled>>,
    next_seq: u64,
}

impl InOrder {
    pub(crate) fn new(results: Receiver<(u64, Result<Filled>)>) -> InOrder {
        InOrder {
            results,
            pending: BTreeMap::new(),
            next_seq: 0,
        }
    }

    /// The next batch in order, waiting for it; `None` once every worker is done.
    pub(crate) fn next(&mut self) -> Option<Result<Filled>> {
        loop {
            if let Some(result) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Some(result);
            }
            let (seq, result) = self.results.recv().ok()?;
            self.pending.insert(seq, result);
        }
    }

    /// Drops what arrived and what is waiting in the channel (workers blocked on sending
    /// can then see their stop signal).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        while self.results.try_recv().is_ok() {}
    }
}

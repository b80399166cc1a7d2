//! Gathered batches back in plan order: workers finish out of order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::helping::Lending;
use super::workers::Filled;
use crate::error::Result;

/// What a wait with a deadline found.
pub enum Arrival<T> {
    /// The next item.
    Ready(T),
    /// The deadline passed first; ask again.
    NotYet,
    /// Nothing more will come.
    Finished,
}

/// The workers' numbered results, handed on in sequence; while the next one is not there,
/// the thread asking gathers the epoch's next batch itself when the workers lend it their
/// plans ([`Lending`]).
pub(crate) struct InOrder {
    results: Receiver<(u64, Result<Filled>)>,
    pending: BTreeMap<u64, Result<Filled>>,
    next_seq: u64,
    lending: Arc<Lending>,
}

impl InOrder {
    pub(crate) fn new(results: Receiver<(u64, Result<Filled>)>, lending: Arc<Lending>) -> InOrder {
        InOrder {
            results,
            pending: BTreeMap::new(),
            next_seq: 0,
            lending,
        }
    }

    /// The next batch in order, waiting for it; `None` once every worker is done.
    pub(crate) fn next(&mut self) -> Option<Result<Filled>> {
        match self.next_until(None) {
            Arrival::Ready(result) => Some(result),
            Arrival::Finished | Arrival::NotYet => None,
        }
    }

    /// The next batch in order, waiting for it until `deadline` (forever without one). A
    /// gather of its own started before the deadline may end after it (by one batch's
    /// gather); none starts after it.
    pub(crate) fn next_until(&mut self, deadline: Option<Instant>) -> Arrival<Result<Filled>> {
        loop {
            if let Some(result) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Arrival::Ready(result);
            }
            if let Ok((seq, result)) = self.results.try_recv() {
                self.pending.insert(seq, result);
                continue;
            }
            // No gather is started past the deadline (one started before may end after it).
            if deadline.is_none_or(|d| Instant::now() < d) {
                if let Some((seq, result)) = self.lending.gather_next() {
                    self.pending.insert(seq, result);
                    continue;
                }
            }
            let received = match deadline {
                None => self
                    .results
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
                Some(deadline) => self.results.recv_deadline(deadline),
            };
            match received {
                Ok((seq, result)) => self.pending.insert(seq, result),
                Err(RecvTimeoutError::Timeout) => return Arrival::NotYet,
                Err(RecvTimeoutError::Disconnected) => return Arrival::Finished,
            };
        }
    }

    /// Drops what arrived and what is waiting in the channel: their staging buffers go
    /// back to the pool at once.
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        while self.results.try_recv().is_ok() {}
    }
}

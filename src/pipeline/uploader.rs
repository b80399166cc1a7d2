//! On a GPU: the thread that queues each gathered batch's copy onto the device, in order,
//! as soon as a device buffer is free, so that the consumer's thread makes no copy calls.

use std::sync::Arc;

use crossbeam_channel::{SendError, Sender};

use super::in_order::InOrder;
use super::workers::Filled;
use crate::device::transfer::{DeviceCopy, DeviceSlots};
use crate::error::{Error, Result};

/// A batch whose copy is queued (or the error that ends the epoch).
pub(crate) type Uploaded = Result<(Filled, DeviceCopy)>;

/// Uploads batches in order until the epoch ends, an error (passed on, then the end), or
/// [`DeviceSlots::stop`]. `ready` is unbounded, but never holds more batches than there
/// are device slots: each holds one.
pub(crate) fn upload_batches(mut order: InOrder, slots: Arc<DeviceSlots>, ready: Sender<Uploaded>) {
    while let Some(filled) = order.next() {
        let uploaded = match filled {
            Ok(filled) => {
                if !filled.buffer.is_pinned() {
                    tracing::debug!(
                        "batch {} is copied from pageable memory",
                        filled.plan.global_index
                    );
                }
                let bytes = &filled.buffer.bytes()[..filled.sections.total];
                match slots.upload_when_free(bytes, &|| ready.is_empty()) {
                    Some(Ok(copy)) => Ok((filled, copy)),
                    Some(Err(e @ Error::CopyInFlight(_))) => {
                        // A copy may still read the staging buffer: never reuse it (as
                        // `Batch::drop` does when a copy cannot be waited for).
                        std::mem::forget(filled);
                        Err(e)
                    }
                    Some(Err(e)) => Err(e),
                    None => return, // stopped: this batch was not copied
                }
            }
            Err(e) => Err(e),
        };
        let failed = uploaded.is_err();
        match ready.send(uploaded) {
            Ok(()) if !failed => {}
            Ok(()) => return,
            Err(SendError(unsent)) => {
                // Nobody will take it: its staging buffer is freed once the copy is over.
                if let Ok((_, copy)) = &unsent {
                    let _ = copy.wait_for_copy();
                }
                return;
            }
        }
    }
}

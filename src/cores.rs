//! The cores this process may run on, which size its thread pools when the caller does not:
//! the converter's threads ([`crate::convert::ConvertOptions`]) and the batches a loader
//! prepares ahead ([`crate::pipeline::default_prefetch`]).

/// The cores this process may run on (its CPU affinity and cgroup quota; 1 when unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

//! The cores this process may run on, which size its thread pools when the caller does not:
//! the converter's threads ([`crate::convert::ConvertOptions`]) and the batches a loader
//! prepares ahead ([`crate::pipeline::default_prefetch`]); and the core a thread runs on,
//! which a staging buffer remembers ([`crate::device::staging::StagingPool::take_free`]).

/// The cores this process may run on (its CPU affinity and cgroup quota; 1 when unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPU the calling thread runs on right now (it may move on at any time), `None` where
/// the system does not say.
pub fn current_cpu() -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` takes no arguments and touches no memory of ours.
        let cpu = unsafe { libc::sched_getcpu() };
        if let Ok(cpu) = u32::try_from(cpu) {
            return Some(cpu);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{available_cores, current_cpu};

    #[test]
    fn the_current_cpu_is_one_of_the_machine() {
        let cores = available_cores();
        assert!(cores >= 1);
        if cfg!(target_os = "linux") {
            let cpu = current_cpu().expect("Linux says which CPU a thread runs on");
            // An affinity mask may skip CPUs, so the number is not below `cores`; it is
            // below the machine's count of configured CPUs.
            // SAFETY: `sysconf` reads a system constant.
            let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
            assert!(
                i64::from(cpu) < configured as i64,
                "cpu {cpu} of {configured}"
            );
        }
    }
}

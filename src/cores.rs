//! The cores this process may run on, which size its thread pools when the caller does not:
//! the converter's threads ([`crate::convert::ConvertOptions`]) and the batches a loader
//! prepares ahead ([`crate::pipeline::default_prefetch`]); and the core a thread runs on,
//! which a staging buffer remembers ([`crate::device::staging::StagingPool::take_free`]);
//! and the CPU time the process used, which shardbench sets beside the cores it had; and
//! [`OwnLines`], which keeps what one core writes off the cache lines another core reads.

/// A value on cache lines of its own (128 bytes: two lines, which x86 cores fetch in
/// pairs), so that writes to its neighbours never take its lines away from the cores that
/// read it, nor its writes theirs.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct OwnLines<T>(pub T);

impl<T> std::ops::Deref for OwnLines<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

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

/// The CPU time all threads of this process have used so far, in seconds (ended threads
/// included); `None` where the system does not say.
pub fn process_cpu_seconds() -> Option<f64> {
    #[cfg(unix)]
    {
        clock_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The time of `clock` in seconds; `None` when the system refuses it.
#[cfg(unix)]
fn clock_seconds(clock: libc::clockid_t) -> Option<f64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec`, which `now` is.
    let rc = unsafe { libc::clock_gettime(clock, &mut now) };
    (rc == 0).then_some(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
}

#[cfg(test)]
mod tests {
    use super::{available_cores, current_cpu, process_cpu_seconds};

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

    #[test]
    fn process_cpu_time_counts_every_thread_busy() {
        let before = process_cpu_seconds();
        if cfg!(not(unix)) {
            assert_eq!(before, None);
            return;
        }
        let before = before.expect("Unix systems say");
        // Two threads each spinning until it has used 20 ms of CPU itself (however busy
        // the machine): the process used at least the 40 ms.
        let spin = 0.020;
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(move || {
                    let started = thread_cpu_seconds();
                    while thread_cpu_seconds() - started < spin {
                        std::hint::spin_loop();
                    }
                });
            }
        });
        let used = process_cpu_seconds().unwrap() - before;
        assert!(used >= 2.0 * spin, "{used} s of CPU");
    }

    /// The calling thread's CPU time, in seconds.
    fn thread_cpu_seconds() -> f64 {
        #[cfg(unix)]
        {
            super::clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID).expect("a thread's CPU clock")
        }
        #[cfg(not(unix))]
        {
            unreachable!("process_cpu_seconds is None off Unix")
        }
    }
}

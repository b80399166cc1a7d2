//! How much memory this process can have: what settings that hold memory (the converter's
//! `--memory-limit`, a loader's staging buffers) are checked against, so that a setting
//! the machine cannot hold is an error or a warning naming it, not a process the kernel
//! kills.

/// The memory this process can have, and what sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryAvailable {
    /// Bytes.
    pub bytes: u64,
    /// What sets it: "this machine's memory" or "this cgroup's memory limit".
    pub limited_by: &'static str,
}

/// The smaller of the machine's memory (`MemTotal`) and this process's cgroup limit
/// (`memory.max` under cgroup v2, `memory.limit_in_bytes` under v1: what a Slurm job's
/// `--mem` or a container sets); `None` where `/proc/meminfo` cannot be read (not Linux).
pub fn available() -> Option<MemoryAvailable> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let machine = line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroups.lines().find_map(|line| {
        // `hierarchy:controllers:path`; cgroup v2's line names no controllers.
        let (_, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        let file = match controllers {
            "" => format!("/sys/fs/cgroup{path}/memory.max"),
            c if c.split(',').any(|c| c == "memory") => {
                format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
            }
            _ => return None,
        };
        // "max" (v2) or a number beyond any machine (v1) when there is no limit.
        std::fs::read_to_string(file)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    });
    Some(match cgroup {
        Some(limit) if limit < machine => MemoryAvailable {
            bytes: limit,
            limited_by: "this cgroup's memory limit",
        },
        _ => MemoryAvailable {
            bytes: machine,
            limited_by: "this machine's memory",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_reports_memory_no_larger_than_the_machine() {
        let Some(available) = available() else {
            return; // not Linux: nothing to read
        };
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let total_kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert!(available.bytes > 0 && available.bytes <= total_kib * 1024);
        let by_machine = available.bytes == total_kib * 1024;
        assert_eq!(
            available.limited_by,
            if by_machine {
                "this machine's memory"
            } else {
                "this cgroup's memory limit"
            }
        );
    }
}

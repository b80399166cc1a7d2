//! The machine a report's figures were taken on.
//!
//! Figures differ by CPU far more than by run, and a virtual machine's model name often
//! hides which CPU it is: the 2-core machines these benchmarks ran on reported `Intel(R)
//! Xeon(R) Processor` both for an Ice Lake (family 6 model 106, 48 MiB of L3) and for a
//! newer Xeon (model 167, 480 MiB of L3) whose loader ran at other ratios to memcpy. So a
//! report names the CPU's signature (vendor, family, model, stepping) and its last-level
//! cache beside the model name.

use serde::Serialize;

use crate::cores::available_cores;

/// The machine the figures were taken on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs available.
    pub cpus: usize,
    /// The CPU's model name as the kernel reports it (`/proc/cpuinfo`); `None` where it
    /// does not.
    pub cpu_model: Option<String>,
    /// Vendor, family, model and stepping (`GenuineIntel family 6 model 167 stepping 1`),
    /// which tell CPUs apart where the model name does not; `None` where the kernel does
    /// not report them (Linux on x86 does).
    pub cpu_signature: Option<String>,
    /// The largest cache level of CPU 0 as the kernel describes it; `None` where it does not.
    pub last_level_cache: Option<Cache>,
    /// Operating system.
    pub os: &'static str,
    /// Architecture.
    pub arch: &'static str,
    /// Device the batches were delivered to (and, on the CPU, why).
    pub device: String,
}

/// One level of the CPU's caches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cache {
    /// Its level (3 for an L3).
    pub level: u8,
    /// Its size in bytes.
    pub bytes: u64,
    /// The CPUs that share it, as the kernel lists them (`0-1`).
    pub shared_by: String,
}

impl Machine {
    /// This machine's facts, with `device` the placement the report ran on.
    pub fn probe(device: String) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpus: available_cores(),
            cpu_model: cpu_model(&cpuinfo),
            cpu_signature: cpu_signature(&cpuinfo),
            last_level_cache: last_level_cache(std::path::Path::new(CPU0_CACHES)),
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            device,
        }
    }

    /// How the report's first line names the CPU: `Intel(R) Xeon(R) Processor; GenuineIntel
    /// family 6 model 167 stepping 1; L3 480 MiB shared by CPUs 0-1`.
    pub fn describe_cpu(&self) -> String {
        let mut parts = vec![self
            .cpu_model
            .clone()
            .unwrap_or_else(|| "CPU model unknown".into())];
        parts.extend(self.cpu_signature.clone());
        parts.extend(self.last_level_cache.as_ref().map(Cache::describe));
        parts.join("; ")
    }
}

impl Cache {
    /// `L3 480 MiB shared by CPUs 0-1`.
    pub fn describe(&self) -> String {
        format!(
            "L{} {} shared by CPUs {}",
            self.level,
            size_in_binary_units(self.bytes),
            self.shared_by
        )
    }
}

/// Where the kernel describes CPU 0's caches, one `indexN` directory per cache.
const CPU0_CACHES: &str = "/sys/devices/system/cpu/cpu0/cache";

/// The first `model name` line of `cpuinfo` (x86 Linux), else its first `Model` line (ARM
/// Linux).
fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Model"]
        .iter()
        .find_map(|key| first_value(cpuinfo, key))
}

/// `<vendor_id> family <cpu family> model <model> stepping <stepping>` from the first CPU
/// of `cpuinfo`, where all four are there (Linux on x86).
fn cpu_signature(cpuinfo: &str) -> Option<String> {
    let field = |key| first_value(cpuinfo, key);
    Some(format!(
        "{} family {} model {} stepping {}",
        field("vendor_id")?,
        field("cpu family")?,
        field("model")?,
        field("stepping")?
    ))
}

/// The non-empty value of the first `key : value` line of `cpuinfo` whose key is exactly
/// `key`.
fn first_value(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        (name.trim() == key && !value.is_empty()).then(|| value.to_string())
    })
}

/// The highest-level data or unified cache described under `caches` (a CPU's
/// `cache` directory in sysfs), skipping entries it cannot read.
fn last_level_cache(caches: &std::path::Path) -> Option<Cache> {
    let read = |dir: &std::path::Path, file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|s| s.trim().to_string())
    };
    std::fs::read_dir(caches)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|entry| {
            let dir = entry.path();
            if read(&dir, "type")? == "Instruction" {
                return None;
            }
            Some(Cache {
                level: read(&dir, "level")?.parse().ok()?,
                bytes: parse_cache_size(&read(&dir, "size")?)?,
                shared_by: read(&dir, "shared_cpu_list")?,
            })
        })
        .max_by_key(|cache| cache.level)
}

/// Bytes of a sysfs cache size (`48K`, `491520K`, `2M`, or plain bytes).
fn parse_cache_size(size: &str) -> Option<u64> {
    let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => size.split_at(at),
        None => (size, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// `bytes` in the largest binary unit that divides it into at least 1 (`480 MiB`,
/// `1.25 MiB`, `48 KiB`), with at most two decimals.
fn size_in_binary_units(bytes: u64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    let Some(&(scale, unit)) = units.iter().find(|(scale, _)| bytes >= *scale) else {
        return format!("{bytes} B");
    };
    let value = format!("{:.2}", bytes as f64 / scale as f64);
    let value = value.trim_end_matches('0').trim_end_matches('.');
    format!("{value} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of the 2-core Zen 5's and the newer Xeon's `/proc/cpuinfo`.
    const ZEN5: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n\
        model\t\t: 2\nmodel name\t: AMD EPYC\nstepping\t: 1\ncache size\t: 1024 KB\n\
        \nprocessor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n";
    const XEON: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
        model\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\n";
    /// An ARM machine's: a `Model` line, no vendor or family.
    const ARM: &str = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n\
        \nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n";

    #[test]
    fn the_signature_and_model_come_from_the_first_cpu_and_need_every_field() {
        assert_eq!(
            cpu_signature(ZEN5).as_deref(),
            Some("AuthenticAMD family 26 model 2 stepping 1")
        );
        assert_eq!(cpu_model(ZEN5).as_deref(), Some("AMD EPYC"));
        assert_eq!(
            cpu_signature(XEON).as_deref(),
            Some("GenuineIntel family 6 model 167 stepping 1")
        );
        // `model name` is not `model`, nor `model` `model name`.
        assert_eq!(
            cpu_model(XEON).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(cpu_signature(ARM), None);
        assert_eq!(
            cpu_model(ARM).as_deref(),
            Some("Raspberry Pi 4 Model B Rev 1.4")
        );
        assert_eq!(cpu_model(""), None);
    }

    #[test]
    fn cache_sizes_parse_in_every_unit_and_print_in_the_largest() {
        assert_eq!(parse_cache_size("48K"), Some(48 << 10));
        assert_eq!(parse_cache_size("491520K"), Some(480 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("1024"), Some(1024));
        assert_eq!(parse_cache_size("12X"), None);
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(size_in_binary_units(480 << 20), "480 MiB");
        assert_eq!(size_in_binary_units(1280 << 10), "1.25 MiB");
        assert_eq!(size_in_binary_units(48 << 10), "48 KiB");
        assert_eq!(size_in_binary_units(32 << 30), "32 GiB");
        assert_eq!(size_in_binary_units(100), "100 B");
    }

    /// Writes a sysfs-like cache directory: one `indexN` per (level, type, size, shared).
    fn caches(entries: &[(&str, &str, &str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (i, (level, kind, size, shared)) in entries.iter().enumerate() {
            let index = dir.path().join(format!("index{i}"));
            std::fs::create_dir(&index).unwrap();
            for (file, value) in [
                ("level", level),
                ("type", kind),
                ("size", size),
                ("shared_cpu_list", shared),
            ] {
                std::fs::write(index.join(file), format!("{value}\n")).unwrap();
            }
        }
        std::fs::write(dir.path().join("uevent"), "").unwrap();
        dir
    }

    #[test]
    fn the_last_level_is_the_highest_data_or_unified_cache() {
        let dir = caches(&[
            ("1", "Data", "48K", "0"),
            ("1", "Instruction", "64K", "0"),
            ("3", "Unified", "491520K", "0-1"),
            ("2", "Unified", "2048K", "0"),
        ]);
        let cache = last_level_cache(dir.path()).unwrap();
        assert_eq!(
            cache,
            Cache {
                level: 3,
                bytes: 480 << 20,
                shared_by: "0-1".into()
            }
        );
        assert_eq!(cache.describe(), "L3 480 MiB shared by CPUs 0-1");
        // An instruction cache is never the answer, even at the highest level listed.
        let dir = caches(&[("1", "Data", "32K", "0"), ("2", "Instruction", "1M", "0")]);
        assert_eq!(last_level_cache(dir.path()).unwrap().bytes, 32 << 10);
        // No caches described, or no directory: nothing to say.
        assert_eq!(last_level_cache(caches(&[]).path()), None);
        assert_eq!(last_level_cache(std::path::Path::new("/no/such/dir")), None);
    }

    #[test]
    fn the_description_joins_what_is_known() {
        let mut machine = Machine::probe("cpu".into());
        machine.cpu_model = Some("Intel(R) Xeon(R) Processor".into());
        machine.cpu_signature = cpu_signature(XEON);
        machine.last_level_cache = Some(Cache {
            level: 3,
            bytes: 480 << 20,
            shared_by: "0-1".into(),
        });
        assert_eq!(
            machine.describe_cpu(),
            "Intel(R) Xeon(R) Processor; GenuineIntel family 6 model 167 stepping 1; \
             L3 480 MiB shared by CPUs 0-1"
        );
        machine.cpu_model = None;
        machine.cpu_signature = None;
        machine.last_level_cache = None;
        assert_eq!(machine.describe_cpu(), "CPU model unknown");
    }
}

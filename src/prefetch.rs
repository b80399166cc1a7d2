//! Software prefetch: random reads (events in shuffled order, from shards or from a
//! bucket's records) start each column with a cache miss; asking for the memory of the
//! events a few steps ahead lets those misses overlap instead of stalling one by one.
//!
//! Which caches the gather's prefetches fill is this machine's choice
//! ([`PrefetchLevel::for_this_machine`]): on a Zen 4, filling L2 only (`prefetcht1`) let
//! the loader deliver 22-28% more events a second at windows 4-64 than filling L1
//! (`prefetcht0`), while on a Zen 5 and an Ice Lake L2 alone was 0-5% slower
//! (docs/results.md, "Prefetches into L2 on the Zen 4").

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::pod::{as_bytes, Pod};

/// Most bytes prefetched from one slice (the hardware prefetcher follows a long copy once
/// it has started). At 512, one thread gathered an epoch of 320k real-profile events at
/// window 16 in 67-69 ms; at 2 KiB in 58-60 (a mean event's pulse columns hold about 600
/// bytes each, with a heavy tail).
const PREFETCH_BYTES: usize = 2048;

/// The environment variable that overrides this machine's [`PrefetchLevel`] where a
/// loader's configuration leaves it open: `l1` or `l2`.
pub const PREFETCH_LEVEL_VAR: &str = "SHARDIFY_PREFETCH_LEVEL";

/// The caches a software prefetch fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefetchLevel {
    /// Every level down to L1 (`prefetcht0`).
    L1,
    /// L2 and the levels below it, not L1 (`prefetcht1`).
    L2,
}

impl PrefetchLevel {
    /// Its name in settings: `l1` or `l2`.
    pub fn name(self) -> &'static str {
        match self {
            PrefetchLevel::L1 => "l1",
            PrefetchLevel::L2 => "l2",
        }
    }

    /// The instruction that prefetches to it on this architecture (`none` where the
    /// gather prefetches nothing: other architectures than x86-64 and AArch64).
    pub fn instruction(self) -> &'static str {
        if cfg!(target_arch = "x86_64") {
            match self {
                PrefetchLevel::L1 => "prefetcht0",
                PrefetchLevel::L2 => "prefetcht1",
            }
        } else if cfg!(target_arch = "aarch64") {
            match self {
                PrefetchLevel::L1 => "prfm pldl1keep",
                PrefetchLevel::L2 => "prfm pldl2keep",
            }
        } else {
            "none"
        }
    }

    /// The level that gathers fastest on this CPU, as measured: L2 on AMD's family 25
    /// (Zen 3 and Zen 4; measured on a Zen 4, model 17), L1 everywhere else (measured on
    /// Zen 5 and on Intel's Ice Lake).
    pub fn for_this_machine() -> PrefetchLevel {
        static LEVEL: OnceLock<PrefetchLevel> = OnceLock::new();
        *LEVEL.get_or_init(|| for_this_cpu(PrefetchLevel::for_cpu, PrefetchLevel::L1))
    }

    /// The level for a CPU of `vendor` (its CPUID vendor string) and `family` (CPUID's
    /// family, the extended family added in).
    pub fn for_cpu(vendor: &str, family: u32) -> PrefetchLevel {
        match (vendor, family) {
            ("AuthenticAMD", 25) => PrefetchLevel::L2,
            _ => PrefetchLevel::L1,
        }
    }

    /// The level a loader uses: `configured` when set, else [`PREFETCH_LEVEL_VAR`] when
    /// set, else [`PrefetchLevel::for_this_machine`]. A variable holding anything but
    /// `l1` or `l2` is an error naming it.
    pub fn resolve(configured: Option<PrefetchLevel>) -> Result<PrefetchLevel> {
        let from_env = std::env::var(PREFETCH_LEVEL_VAR).ok();
        PrefetchLevel::resolve_with(configured, from_env.as_deref(), Self::for_this_machine)
    }

    /// [`PrefetchLevel::resolve`] with the variable's value given (`None`: not set).
    pub fn resolve_with(
        configured: Option<PrefetchLevel>,
        variable: Option<&str>,
        machine: impl FnOnce() -> PrefetchLevel,
    ) -> Result<PrefetchLevel> {
        let variable = (PREFETCH_LEVEL_VAR, variable);
        resolve_setting(configured, variable, PrefetchLevel::named, machine)
    }

    /// The level `name` names (`l1` or `l2`, any case, spaces around ignored); another
    /// name is an error about `field`.
    fn named(field: &'static str, name: &str) -> Result<PrefetchLevel> {
        match name.trim().to_ascii_lowercase().as_str() {
            "l1" => Ok(PrefetchLevel::L1),
            "l2" => Ok(PrefetchLevel::L2),
            _ => Err(Error::config(
                field,
                format!("must be l1 or l2, not {name:?}"),
            )),
        }
    }
}

impl std::str::FromStr for PrefetchLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<PrefetchLevel> {
        PrefetchLevel::named("prefetch_level", s)
    }
}

impl std::fmt::Display for PrefetchLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A per-machine setting of the gather, resolved as a loader resolves it: `configured` when
/// set, else the environment variable `var` when set (its `value`, parsed by `named`, an
/// error naming the variable when it names nothing), else `machine()`.
pub(crate) fn resolve_setting<T>(
    configured: Option<T>,
    (var, value): (&'static str, Option<&str>),
    named: impl FnOnce(&'static str, &str) -> Result<T>,
    machine: impl FnOnce() -> T,
) -> Result<T> {
    match (configured, value) {
        (Some(setting), _) => Ok(setting),
        (None, Some(value)) => named(var, value),
        (None, None) => Ok(machine()),
    }
}

/// `choose` given this CPU's vendor string and family, or `otherwise` where they cannot be
/// read (other architectures than x86-64): how the gather's per-CPU choices are made.
pub(crate) fn for_this_cpu<T>(choose: impl FnOnce(&str, u32) -> T, otherwise: T) -> T {
    match cpu_signature() {
        Some((vendor, family)) => choose(&vendor, family),
        None => otherwise,
    }
}

/// This CPU's vendor string and family (`None` on other architectures than x86-64).
fn cpu_signature() -> Option<(String, u32)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86-64 CPU; leaves 0 and 1 always do.
        #[allow(unused_unsafe)]
        let (vendor, signature) = unsafe { (__cpuid(0), __cpuid(1)) };
        let bytes: Vec<u8> = [vendor.ebx, vendor.edx, vendor.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        let base = (signature.eax >> 8) & 0xf;
        let family = match base {
            0xf => base + ((signature.eax >> 20) & 0xff),
            _ => base,
        };
        Some((String::from_utf8_lossy(&bytes).into_owned(), family))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Hints the CPU to bring the first 2 KiB of `values` into every cache down to L1
/// ([`prefetch_into`] at [`PrefetchLevel::L1`]).
#[inline]
pub fn prefetch<T: Pod>(values: &[T]) {
    prefetch_into(values, PrefetchLevel::L1)
}

/// Hints the CPU to bring the first 2 KiB of `values` into the caches of `level`: every
/// cache line they touch, the partial first and last ones included (prefetching 64-byte
/// steps from an unaligned start missed the last line). Does nothing on other
/// architectures than x86-64 and AArch64.
#[inline]
pub fn prefetch_into<T: Pod>(values: &[T], level: PrefetchLevel) {
    let bytes = as_bytes(values);
    if bytes.is_empty() {
        return;
    }
    let start = bytes.as_ptr() as usize;
    visit_lines(start, start + bytes.len().min(PREFETCH_BYTES), |line| {
        prefetch_line(line, level)
    });
}

/// Hints the CPU to bring `item` (every line it touches) into every cache down to L1:
/// for items of any type, whose bytes are not read.
#[inline]
pub fn prefetch_item<T>(item: &T) {
    let start = item as *const T as usize;
    visit_lines(start, start + std::mem::size_of::<T>().max(1), |line| {
        prefetch_line(line, PrefetchLevel::L1)
    });
}

/// Calls `visit` with the address of every 64-byte line that `start..end` touches (none
/// when it is empty).
#[inline(always)]
fn visit_lines(start: usize, end: usize, mut visit: impl FnMut(usize)) {
    let mut line = start & !63;
    while line < end {
        visit(line);
        line += 64;
    }
}

/// Prefetches the cache line at `line` into `level`.
#[inline(always)]
fn prefetch_line(line: usize, level: PrefetchLevel) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: a prefetch is only a hint: it never faults and has no visible effect.
        #[allow(unused_unsafe)]
        unsafe {
            match level {
                PrefetchLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(line as *const i8),
                PrefetchLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(line as *const i8),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is only a hint: it never faults (not even on an unmapped address),
    // reads nothing into a register and writes nothing.
    unsafe {
        match level {
            PrefetchLevel::L1 => std::arch::asm!(
                "prfm pldl1keep, [{line}]",
                line = in(reg) line,
                options(nostack, preserves_flags, readonly)
            ),
            PrefetchLevel::L2 => std::arch::asm!(
                "prfm pldl2keep, [{line}]",
                line = in(reg) line,
                options(nostack, preserves_flags, readonly)
            ),
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (line, level);
}

/// At most this many bytes are claimed by one [`prefetch_for_writing`]: 64 lines, about
/// as many misses as a core keeps in flight.
const PREFETCH_FOR_WRITING_BYTES: usize = 4096;

/// Hints the CPU to take the first 4 KiB of `region` into this core's L1 for writing
/// (`prefetchw` on x86-64, `prfm pstl1keep` on AArch64): lines another core holds are
/// claimed all at once, where the stores that follow would each wait for their own.
/// Memory about to be overwritten, so `region` may be uninitialised. Does nothing on x86
/// CPUs without the instruction (CPUID's PRFCHW flag) and on other architectures. Returns
/// how many bytes of `region` it claimed (0 where it did nothing): an empty region claims
/// nothing.
#[inline]
pub fn prefetch_for_writing<T>(region: &[std::mem::MaybeUninit<T>]) -> usize {
    let claimed = std::mem::size_of_val(region).min(PREFETCH_FOR_WRITING_BYTES);
    if claimed == 0 || !prefetch_for_writing_supported() {
        return 0;
    }
    let start = region.as_ptr() as usize;
    visit_lines(start, start + claimed, claim_line);
    claimed
}

/// Takes the cache line at `line` into this core's L1 for writing; only called where
/// [`prefetch_for_writing_supported`].
#[inline(always)]
fn claim_line(line: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults (not even on an unmapped
    // address), reads nothing into a register and writes nothing; this CPU has the
    // instruction (the caller checked).
    unsafe {
        std::arch::asm!(
            "prefetchw [{line}]",
            line = in(reg) line,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is only a hint: it never faults (not even on an unmapped address),
    // reads nothing into a register and writes nothing.
    unsafe {
        std::arch::asm!(
            "prfm pstl1keep, [{line}]",
            line = in(reg) line,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = line;
}

/// Whether this CPU prefetches for writing: on x86-64 where it has `prefetchw` (CPUID leaf
/// 0x8000_0001, ECX bit 8, PRFCHW, which the standard library's feature detection does not
/// name; asked once), on every AArch64 CPU (PRFM is in the base instruction set).
fn prefetch_for_writing_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *SUPPORTED.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __get_cpuid_max};
            // The extended leaf is read only when the highest extended leaf reaches it.
            __get_cpuid_max(0x8000_0000).0 >= 0x8000_0001
                && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    cfg!(target_arch = "aarch64")
}

/// Visits `items` in order, keeping `ahead` of them prefetched: first asks
/// `prefetch_item` for the first `ahead` items, then, before visiting each, for the one
/// `ahead` places after it. Every item is asked for once, `ahead` visits before its own
/// (the first ones before any visit: a loop that starts prefetching at item `ahead`
/// leaves the first `ahead` to stall one by one).
#[inline]
pub fn visit_prefetching<T>(
    items: &[T],
    ahead: usize,
    mut prefetch_item: impl FnMut(&T),
    mut visit: impl FnMut(&T),
) {
    items.iter().take(ahead).for_each(&mut prefetch_item);
    for (k, item) in items.iter().enumerate() {
        if let Some(next) = items.get(k + ahead) {
            prefetch_item(next);
        }
        visit(item);
    }
}

#[cfg(test)]
mod tests {
    use super::{visit_prefetching, PrefetchLevel, PREFETCH_LEVEL_VAR};
    use crate::error::Error;

    #[test]
    fn zen_3_and_4_prefetch_into_l2_every_other_cpu_into_l1() {
        let cases = [
            ("AuthenticAMD", 25, PrefetchLevel::L2), // Zen 3, Zen 4
            ("AuthenticAMD", 26, PrefetchLevel::L1), // Zen 5
            ("AuthenticAMD", 23, PrefetchLevel::L1), // Zen 1, Zen 2
            ("GenuineIntel", 6, PrefetchLevel::L1),
            ("HygonGenuine", 24, PrefetchLevel::L1),
        ];
        for (vendor, family, level) in cases {
            assert_eq!(
                PrefetchLevel::for_cpu(vendor, family),
                level,
                "{vendor} {family}"
            );
        }
        // Whatever this CPU is, asking twice gives one answer.
        assert_eq!(
            PrefetchLevel::for_this_machine(),
            PrefetchLevel::for_this_machine()
        );
    }

    #[test]
    fn a_configured_level_beats_the_variable_which_beats_the_cpu() {
        let cpu = || PrefetchLevel::L2;
        let resolve = PrefetchLevel::resolve_with;
        let l1 = Some(PrefetchLevel::L1);
        assert_eq!(resolve(l1, Some("l2"), cpu).unwrap(), PrefetchLevel::L1);
        assert_eq!(resolve(l1, Some("bad"), cpu).unwrap(), PrefetchLevel::L1);
        assert_eq!(resolve(None, Some("L1"), cpu).unwrap(), PrefetchLevel::L1);
        assert_eq!(
            resolve(None, Some(" l1\n"), cpu).unwrap(),
            PrefetchLevel::L1
        );
        assert_eq!(resolve(None, None, cpu).unwrap(), PrefetchLevel::L2);
        for bad in ["", "l3", "t0", "1"] {
            match resolve(None, Some(bad), cpu) {
                Err(Error::Config { field, problem }) => {
                    assert_eq!(field, PREFETCH_LEVEL_VAR);
                    assert!(problem.contains(&format!("{bad:?}")), "{problem}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn levels_read_back_from_their_names_and_serialize_as_them() {
        for level in [PrefetchLevel::L1, PrefetchLevel::L2] {
            assert_eq!(level.name().parse::<PrefetchLevel>().unwrap(), level);
            assert_eq!(level.to_string(), level.name());
            let json = serde_json::to_string(&level).unwrap();
            assert_eq!(json, format!("\"{}\"", level.name()));
            assert_eq!(serde_json::from_str::<PrefetchLevel>(&json).unwrap(), level);
        }
        let instructions = (
            PrefetchLevel::L1.instruction(),
            PrefetchLevel::L2.instruction(),
        );
        if cfg!(target_arch = "x86_64") {
            assert_eq!(instructions, ("prefetcht0", "prefetcht1"));
        } else if cfg!(target_arch = "aarch64") {
            assert_eq!(instructions, ("prfm pldl1keep", "prfm pldl2keep"));
        }
    }

    /// The calls `visit_prefetching` makes over `n` items: `(true, i)` for a prefetch of
    /// item `i`, `(false, i)` for its visit.
    fn calls(n: usize, ahead: usize) -> Vec<(bool, usize)> {
        let items: Vec<usize> = (0..n).collect();
        let log = std::cell::RefCell::new(Vec::new());
        visit_prefetching(
            &items,
            ahead,
            |&i| log.borrow_mut().push((true, i)),
            |&i| log.borrow_mut().push((false, i)),
        );
        log.into_inner()
    }

    #[test]
    fn every_item_is_prefetched_once_ahead_visits_before_it_and_visited_once_in_order() {
        for (n, ahead) in [(0, 6), (3, 6), (6, 6), (7, 6), (40, 6), (40, 1), (5, 0)] {
            let log = calls(n, ahead);
            let visits: Vec<usize> = log.iter().filter(|c| !c.0).map(|c| c.1).collect();
            assert_eq!(visits, (0..n).collect::<Vec<_>>(), "n {n}, ahead {ahead}");
            let prefetches: Vec<usize> = log.iter().filter(|c| c.0).map(|c| c.1).collect();
            assert_eq!(
                prefetches, visits,
                "each once, in order: n {n}, ahead {ahead}"
            );
            for i in 0..n {
                let at = |call| log.iter().position(|&c| c == call).unwrap();
                let visits_before = log[..at((true, i))].iter().filter(|c| !c.0).count();
                // The first `ahead` before any visit, the rest `ahead` visits early.
                assert_eq!(
                    visits_before,
                    i.saturating_sub(ahead),
                    "n {n}, ahead {ahead}, item {i}"
                );
                assert!(at((true, i)) < at((false, i)));
            }
        }
    }

    #[test]
    fn writing_prefetches_are_detected_as_the_kernel_sees_them_and_claim_any_region() {
        // Linux names CPUID's PRFCHW bit `3dnowprefetch` among each CPU's flags (and adds
        // it on AMD CPUs whose CPUID leaves it out, since every 64-bit AMD CPU has it).
        #[cfg(target_arch = "x86_64")]
        if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") {
            let flags = cpuinfo
                .lines()
                .find(|line| line.starts_with("flags"))
                .unwrap_or("");
            let listed = flags.split_whitespace().any(|f| f == "3dnowprefetch");
            assert!(
                !super::prefetch_for_writing_supported() || listed,
                "{flags}"
            );
        }
        #[cfg(target_arch = "aarch64")]
        assert!(
            super::prefetch_for_writing_supported(),
            "PRFM is in every AArch64 CPU"
        );
        // Empty, unaligned, uninitialised and past the 4 KiB it claims: a hint, never a fault.
        let mut memory: Vec<u64> = Vec::with_capacity(1 << 12);
        assert_eq!(
            super::prefetch_for_writing(&memory.spare_capacity_mut()[..0]),
            0
        );
        let claimed = super::prefetch_for_writing(&memory.spare_capacity_mut()[3..]);
        let expected = if super::prefetch_for_writing_supported() {
            4096
        } else {
            0
        };
        assert_eq!(claimed, expected);
        memory.extend(0..1 << 12);
        assert_eq!(memory.iter().sum::<u64>(), (1 << 12) * ((1 << 12) - 1) / 2);
    }
}

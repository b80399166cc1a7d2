//! What the converter asks of the C allocator (glibc's) so that its peak RSS stays within
//! `--memory-limit`: the memory bank counts what the units hold, the allocator decides
//! what of the rest the process keeps.

/// Allocations of this many bytes and more are mapped on their own, and unmapped when
/// freed.
pub const MAPPED_ALLOCATION_BYTES: usize = 4 << 20;

/// Fixes glibc's mmap threshold at [`MAPPED_ALLOCATION_BYTES`] for the process (a call
/// that cannot be made is skipped: the limit is then held less tightly).
///
/// By default the threshold rises with every mapped block freed, up to 32 MiB, and the
/// heap's trim threshold with it to 64 MiB: after the first bucket's buffers were freed,
/// later ones came from the heaps, where each thread's arena kept up to 64 MiB it had
/// freed until the unit's end. With many threads the peak went far past the limit: over
/// 1M events, 16 threads under 64 MiB peaked at 159.7 MiB and 8 under 128 MiB at 152.6;
/// with the threshold fixed, 61.0 and 105.6, and 1008-1010 MiB against 1118-1128 under
/// 2 GiB on 2 threads, as fast. Lower, decoded batches would be mapped and faulted in
/// afresh each time (128 KiB made the scatter 1.7x slower); a fixed trim threshold alone
/// does the same, since it too fixes the mmap threshold at its default.
pub fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tuning parameter of the allocator; it is thread-safe.
    unsafe {
        libc::mallopt(
            libc::M_MMAP_THRESHOLD,
            MAPPED_ALLOCATION_BYTES as libc::c_int,
        );
    }
}

/// Hands freed memory back to the operating system: glibc keeps freed heap memory for
/// reuse otherwise, so peak RSS would be the sum of the phases rather than the larger one,
/// and grow with each gathered bucket. Called after the scatter and after each unit
/// (measured on 15M pulses under a 64 MiB limit on 2 threads: peak RSS 73-76 MiB without
/// the per-unit call, 59-62 MiB with it).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

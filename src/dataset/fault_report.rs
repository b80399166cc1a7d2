//! A last word that names the file when a mapped shard faults.
//!
//! Shards are read through memory maps. A file made shorter while mapped (truncated, or
//! rewritten in place: `cp` over a dataset a job is reading opens each file with
//! `O_TRUNC`), or whose storage fails to read, faults its reader with SIGBUS, and the
//! process ends with a bare "Bus error" that names nothing. No reader can go on from there
//! (the bytes are gone), but it can say what happened: [`report_faults_on_mapped_files`]
//! installs, once a process, a SIGBUS handler that finds the faulting address's file and
//! offset in `/proc/self/maps`, writes one line to stderr, and hands the fault on to the
//! action installed before it (Python's `faulthandler`, Rust's stack-overflow check, or
//! the default, which ends the process). It allocates nothing and takes no lock: it only
//! opens, reads and writes.
//!
//! Several threads often fault at once (every worker reads the cut file). One hands its
//! fault on at a time while the others wait: each one's report and the action before
//! would otherwise run together, two `faulthandler` dumps interleaved on stderr and one
//! reinstalling `faulthandler` after the other had put the default back, so that the
//! faults went round and the process could end by SIGSEGV instead.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};

/// The SIGBUS action before ours, to which ours hands every fault on.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Bytes of a `/proc/self/maps` line kept: its fields and a path of up to 4 KiB.
const LINE_BYTES: usize = 4096 + 256;

/// Installs the SIGBUS report (once a process; later calls do nothing). Called when a
/// shard is first mapped.
pub fn report_faults_on_mapped_files() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: all-zero is a valid `sigaction` (no handler, empty mask, no flags), and
        // both structures are filled before the kernel reads them.
        let (mut ours, mut previous): (libc::sigaction, libc::sigaction) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        ours.sa_sigaction = on_bus_error as *const () as usize;
        // On the faulting thread's own stack (a read of a mapped file, not an overflow,
        // faults with SIGBUS): an alternate signal stack, where a thread has one, holds
        // 8 KiB, less than the handler's buffers and what it hands on to.
        ours.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `ours` and `previous` are valid for the calls; `on_bus_error` has the
        // signature SA_SIGINFO asks for and only makes async-signal-safe calls.
        let installed = unsafe {
            libc::sigemptyset(&mut ours.sa_mask);
            libc::sigaction(libc::SIGBUS, &ours, &mut previous) == 0
        };
        if installed {
            let _ = PREVIOUS.set(previous);
        }
    });
}

/// Set while one thread hands a fault on, and from then on where that took this handler
/// away; another thread's fault waits for it.
static HANDING_ON: AtomicBool = AtomicBool::new(false);

/// How long a fault waits for another thread's to be handed on, in steps of
/// [`WAIT_STEP_NS`]: far longer than the action before takes to end the process, after
/// which it goes on anyway (an action before that jumped out of its handler, never to
/// come back, would otherwise leave the others waiting for ever).
const WAIT_STEPS: u32 = 500;

/// One step of the wait, in nanoseconds (10 ms).
const WAIT_STEP_NS: libc::c_long = 10_000_000;

/// The handler: reports a fault the kernel raised on a mapped file, then hands the signal
/// to the action before it, one thread at a time. A fault that comes while another
/// thread's is being handed on waits for it, then returns, so that its instruction runs
/// again and faults into this handler again; where the first ended the process, the wait
/// ends with it.
extern "C" fn on_bus_error(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if HANDING_ON.swap(true, Ordering::AcqRel) && waited_for_the_other_thread() {
        return;
    }
    // SAFETY: the kernel passes an SA_SIGINFO handler a valid `siginfo_t`; for SIGBUS its
    // address field is the faulting address.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A positive code is the kernel's (BUS_ADRERR, BUS_OBJERR, ...): a real fault.
    let fault = code > 0;
    if fault {
        report(address);
    }
    hand_on(signal, info, context, fault);
    // Where faults still come here, the next waits its turn no more. Where they no longer
    // do (the default put back: the process ends as this thread faults again; or the
    // action before took its place, as `faulthandler` does before it raises the signal
    // again), a thread whose fault reached this handler before stays waiting: it would
    // otherwise report and hand on once more while the process ends.
    if installed_is_ours(signal) {
        HANDING_ON.store(false, Ordering::Release);
    }
}

/// Sleeps while another thread hands its fault on: `true` once it has, `false` when the
/// wait ran out.
fn waited_for_the_other_thread() -> bool {
    let step = libc::timespec {
        tv_sec: 0,
        tv_nsec: WAIT_STEP_NS,
    };
    for _ in 0..WAIT_STEPS {
        // SAFETY: `nanosleep` is async-signal-safe; `step` is valid and the remainder is
        // not asked for.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
        if !HANDING_ON.load(Ordering::Acquire) {
            return true;
        }
    }
    false
}

/// Gives the signal to the action installed before ours. A handler is called here, on
/// this thread, with its mask: ours stays installed, so a fault on another thread
/// meanwhile still waits its turn. The default (or ignoring) is put back instead, and a
/// fault ends the process when its instruction runs again; a signal sent by a process
/// is raised once more, and arrives when this handler returns.
fn hand_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void, fault: bool) {
    // SAFETY: all-zero is the default action.
    let default: libc::sigaction = unsafe { std::mem::zeroed() };
    let previous = PREVIOUS.get().unwrap_or(&default);
    if matches!(previous.sa_sigaction, libc::SIG_DFL | libc::SIG_IGN) {
        // SAFETY: restoring a saved (or the default) action with a valid structure; `raise`
        // is async-signal-safe, and SIGBUS stays blocked until this handler returns.
        unsafe {
            libc::sigaction(signal, previous, std::ptr::null_mut());
            if !fault {
                libc::raise(signal);
            }
        }
        return;
    }
    // SAFETY: the masks are valid, `pthread_sigmask` and `sigaction` are async-signal-safe,
    // and the saved handler is called with the signature its flags say it was installed
    // with, the arguments this handler was given, and the mask it asked for.
    unsafe {
        if previous.sa_flags & libc::SA_RESETHAND != 0 {
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &previous.sa_mask, &mut mask);
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                std::mem::transmute(previous.sa_sigaction);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(libc::c_int) = std::mem::transmute(previous.sa_sigaction);
            handler(signal);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        // A handler that returned from a fault without taking ours away would meet it
        // again at once, in a loop of reports: the fault goes to it alone from now on.
        if fault && installed_is_ours(signal) {
            libc::sigaction(signal, previous, std::ptr::null_mut());
        }
    }
}

/// Whether the action installed for `signal` is still this module's handler.
fn installed_is_ours(signal: libc::c_int) -> bool {
    // SAFETY: all-zero is a valid `sigaction`, which the call fills in.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (no new action) into a valid structure; async-signal-safe.
    let queried = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } == 0;
    queried && current.sa_sigaction == on_bus_error as *const () as usize
}

/// Writes the report for a fault at `address`, when it lies in a mapped file.
fn report(address: usize) {
    let mut line = [0u8; LINE_BYTES];
    let Some((path, offset)) = mapped_file_at(address, &mut line) else {
        return;
    };
    let mut number = [0u8; 20];
    for part in [
        &b"\nshardify: bus error (SIGBUS) reading "[..],
        path,
        b" at byte ",
        decimal(offset, &mut number),
        b": the file is shorter than when it was mapped (truncated, or rewritten in place \
          while it was read: `cp` over a dataset in use does this), or its storage failed to \
          read. Never write over a dataset a job reads: copy a new one into another \
          directory (`shardify copy` refuses to write over another dataset), then start the \
          job again.\n",
    ] {
        write_all(part);
    }
}

/// The file mapped at `address` and the byte of it there, from `/proc/self/maps`, read
/// line by line into `line`; `None` where the address is in no file's mapping.
fn mapped_file_at(address: usize, line: &mut [u8; LINE_BYTES]) -> Option<(&[u8], u64)> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below on every path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut chunk = [0u8; 1024];
    let (mut len, mut found) = (0usize, None);
    'reading: loop {
        // SAFETY: `chunk` is valid for writes of its length.
        let read = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if read <= 0 {
            break;
        }
        for &byte in &chunk[..read as usize] {
            if byte != b'\n' {
                // A longer line (a path over 4 KiB) is cut; it cannot be ours to name.
                if len < line.len() {
                    line[len] = byte;
                    len += 1;
                }
                continue;
            }
            if let Some(hit) = file_at(&line[..len], address) {
                found = Some((hit.0, hit.1));
                break 'reading;
            }
            len = 0;
        }
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    let (at, offset) = found?;
    Some((&line[at..len], offset))
}

/// Where a `/proc/self/maps` line's path starts and the file's byte at `address`, when
/// the line maps a file over `address`: `start-end perms offset dev inode path`.
fn file_at(line: &[u8], address: usize) -> Option<(usize, u64)> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    if !(start..end).contains(&(address as u64)) {
        return None;
    }
    let offset = hex(fields.nth(1)?)?;
    let path = fields.nth(2)?;
    if path.first() != Some(&b'/') {
        return None; // anonymous memory, the heap, a stack: not a file
    }
    let at = path.as_ptr() as usize - line.as_ptr() as usize;
    Some((at, offset + (address as u64 - start)))
}

/// A hexadecimal number.
fn hex(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |value, &d| {
        let digit = (d as char).to_digit(16)?;
        value.checked_mul(16)?.checked_add(u64::from(digit))
    })
}

/// `value` in decimal, written into the end of `buffer`.
fn decimal(mut value: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buffer[at..];
        }
    }
}

/// Writes `bytes` to stderr (a short or failed write ends it: nothing else can be done).
fn write_all(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for reads of its length.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if written <= 0 {
            return;
        }
        bytes = &bytes[written as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_gives_the_file_and_its_byte() {
        let line =
            b"7f10a2000000-7f10a2400000 r--s 00200000 103:02 1312 /data/ds/shard_00003.safetensors";
        let (at, offset) = file_at(line, 0x7f10a2000000 + 0x1234).unwrap();
        assert_eq!(&line[at..], b"/data/ds/shard_00003.safetensors");
        assert_eq!(offset, 0x200000 + 0x1234);
        assert_eq!(file_at(line, 0x7f10a2400000), None, "the end is outside");
        assert_eq!(file_at(line, 0x7f10a1ffffff), None);
        let spaced =
            b"7f10a2000000-7f10a2400000 r--s 00000000 103:02 1312       /a b/c d (deleted)";
        let (at, _) = file_at(spaced, 0x7f10a2000000).unwrap();
        assert_eq!(&spaced[at..], b"/a b/c d (deleted)");
        let anonymous = b"7f10a2000000-7f10a2400000 rw-p 00000000 00:00 0 ";
        assert_eq!(file_at(anonymous, 0x7f10a2000001), None);
        let heap = b"55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0          [heap]";
        assert_eq!(file_at(heap, 0x55d0c0000001), None);
    }

    #[test]
    fn this_process_maps_a_file_it_can_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mapped.bin");
        std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a read-only map of a file only this test writes, before it maps it.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let mut line = [0u8; LINE_BYTES];
        let (named, offset) = mapped_file_at(map.as_ptr() as usize + 4096 + 5, &mut line).unwrap();
        assert_eq!(named, path.as_os_str().as_encoded_bytes());
        assert_eq!(offset, 4096 + 5);
        let on_the_stack = 0u8;
        assert!(mapped_file_at(&on_the_stack as *const u8 as usize, &mut line).is_none());
        assert_eq!(decimal(0, &mut [0; 20]), b"0");
        assert_eq!(decimal(u64::MAX, &mut [0; 20]), b"18446744073709551615");
    }
}

//! Lines for the terminal that never panic. `println!` and `eprintln!` panic when their
//! stream is closed: `shardify order DS | head -1` closes stdout after one line, and a
//! conversion's progress meets a closed stderr when the log's reader has gone. Here a
//! closed stdout is an error that ends the command quietly ([`CLOSED_STDOUT_STATUS`]), and
//! what stderr cannot take (progress, warnings) is dropped: nothing is left to tell.

/// `println!` that returns the write's `std::io::Result` instead of panicking.
#[allow(unused_macros)] // shardbench writes its table in one checked write
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

/// `eprintln!` that drops the line when stderr cannot take it.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The exit status of a command whose stdout's reader went away: the status a shell
/// reports for a command ended by SIGPIPE (128 + 13), so that `set -o pipefail` still sees
/// that the output was cut short, as it does for `cat` or `yes`.
pub const CLOSED_STDOUT_STATUS: u8 = 141;

/// Whether `error` comes from writing into a pipe whose reader has gone.
pub fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The exit status of a command that ended with `result`: 0; [`CLOSED_STDOUT_STATUS`],
/// quietly, when stdout's reader had gone; else 1, the error and its causes on stderr.
pub fn exit_status(result: anyhow::Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        // The reader of the output had what it wanted (`shardify order DS | head -1`).
        Err(e) if is_closed_pipe(&e) => CLOSED_STDOUT_STATUS,
        Err(e) => {
            tell!("error: {}", shardify::error::chain_text(e.as_ref()));
            1
        }
    }
}

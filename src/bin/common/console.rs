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

/// Sends the library's warnings to stderr, as ` WARN <text>` lines: each names a fallback
/// the run took (a filesystem without locks, a damaged work file done again, a copy waiting
/// for another) or a slow path the user can avoid. `RUST_LOG` chooses other levels
/// (`RUST_LOG=error` silences them, `RUST_LOG=info` adds e.g. why no GPU is used).
pub fn log_to_stderr() {
    // A second call in one process (the Python package) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(stderr_filter())
        .without_time()
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// What [`log_to_stderr`] prints: WARN and above, or what `RUST_LOG` asks for (also the
/// Python package's console script's choice).
pub fn stderr_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy()
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

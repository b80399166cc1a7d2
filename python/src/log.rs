//! The library's warnings, handed to Python's `logging`. The crate reports fallbacks it
//! took (pageable staging memory, a file read instead of mapped, a refused scheduling
//! policy, a copy waiting for another) through `tracing`, often on a gathering thread that
//! does not hold the GIL. A layer keeps each event here, and the next call from Python that
//! holds the GIL anyway (a batch, a loader or dataset made, a copy) hands them to the
//! logger named after the event's module (`shardify.dataset.copy.destination`, under
//! `shardify`): no Rust thread ever waits for the GIL, so a Python thread that holds it
//! while it waits for a gathering thread cannot deadlock. Python's default handler prints
//! warnings to stderr; `logging.getLogger("shardify")` configures them.
//!
//! The console script prints them to stderr at once instead ([`printing_to_stderr`]), as the
//! `shardify` binary does, at the levels `RUST_LOG` chooses as the binary's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// At most this many events wait for Python; later ones are counted, not kept.
const KEPT_AT_MOST: usize = 256;

/// One event: its `logging` level, logger name and message.
type Record = (u32, String, String);

/// Events not handed to Python yet, and how many were dropped past [`KEPT_AT_MOST`].
static WAITING: Mutex<(Vec<Record>, u64)> = Mutex::new((Vec::new(), 0));
/// Whether [`WAITING`] holds anything: the one load a batch pays when nothing does.
static ANY_WAITING: AtomicBool = AtomicBool::new(false);
/// Set by the console script: events go to stderr when they happen.
static TO_STDERR: AtomicBool = AtomicBool::new(false);

/// The events the layer sees: INFO and above for Python, the command line's choice while
/// it runs ([`printing_to_stderr`]).
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// What Python's `logging` is handed: INFO and above (its loggers filter further).
fn for_python() -> EnvFilter {
    EnvFilter::default().add_directive(LevelFilter::INFO.into())
}

/// Makes the layer the process's `tracing` subscriber (once; a subscriber set before is
/// kept), passing on INFO and above.
pub fn install() {
    let (filter, handle) = reload::Layer::new(for_python());
    if tracing_subscriber::registry()
        .with(Relay.with_filter(filter))
        .try_init()
        .is_ok()
    {
        let _ = FILTER.set(handle);
    }
}

/// The layer's filter from now on (nothing where another subscriber was installed first).
fn filter_events(filter: EnvFilter) {
    if let Some(handle) = FILTER.get() {
        let _ = handle.reload(filter);
    }
}

/// Runs `command` with the events `filter` passes printed to stderr when they happen (the
/// `shardify` binary's choice: WARN and above unless `RUST_LOG` says otherwise), not kept
/// for Python.
pub fn printing_to_stderr<T>(filter: EnvFilter, command: impl FnOnce() -> T) -> T {
    TO_STDERR.store(true, Ordering::Relaxed);
    filter_events(filter);
    let result = command();
    filter_events(for_python());
    TO_STDERR.store(false, Ordering::Relaxed);
    result
}

/// Hands the events kept since the last call to Python's `logging`. An error a handler
/// raises is `logging`'s to report (it prints it); what escapes it (`KeyboardInterrupt`
/// from a Ctrl-C that arrived while Rust ran) is returned, the events not yet handed over
/// dropped.
pub fn relay(py: Python<'_>) -> PyResult<()> {
    // A plain load first: a batch with nothing to hand over costs no read-modify-write.
    if !ANY_WAITING.load(Ordering::Relaxed) || !ANY_WAITING.swap(false, Ordering::Acquire) {
        return Ok(());
    }
    let (records, dropped) = {
        let mut waiting = WAITING.lock().unwrap_or_else(|e| e.into_inner());
        (
            std::mem::take(&mut waiting.0),
            std::mem::take(&mut waiting.1),
        )
    };
    let get_logger = py.import("logging")?.getattr("getLogger")?;
    let log = |level: u32, name: &str, message: &str| {
        get_logger
            .call1((name,))?
            .call_method1("log", (level, message))
            .map(drop)
    };
    for (level, name, message) in &records {
        log(*level, name, message)?;
    }
    if dropped > 0 {
        let text = format!("{dropped} more warnings from the Rust side were dropped");
        log(logging_level(Level::WARN), "shardify", &text)?;
    }
    Ok(())
}

/// Runs `work` without the GIL, then hands Python the events it raised ([`relay`]),
/// before its result (an error among it) is looked at.
pub fn detached<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    let done = py.detach(work);
    relay(py)?;
    Ok(done)
}

/// `logging`'s number for `level`.
fn logging_level(level: Level) -> u32 {
    match level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        _ => 10,
    }
}

/// The `tracing` layer that keeps events for [`relay`].
struct Relay;

impl<S: Subscriber> Layer<S> for Relay {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *metadata.level();
        if TO_STDERR.load(Ordering::Relaxed) {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{level:>5} {}", message.0);
            return;
        }
        let name = metadata.target().replace("::", ".");
        let mut waiting = WAITING.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.0.len() < KEPT_AT_MOST {
            waiting.0.push((logging_level(level), name, message.0));
        } else {
            waiting.1 += 1;
        }
        ANY_WAITING.store(true, Ordering::Release);
    }
}

/// An event's text: its message, then its other fields as `name=value`.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let gap = if self.0.is_empty() { "" } else { " " };
        let _ = if field.name() == "message" {
            write!(self.0, "{gap}{value:?}")
        } else {
            write!(self.0, "{gap}{}={value:?}", field.name())
        };
    }
}

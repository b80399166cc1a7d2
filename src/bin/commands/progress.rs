//! How a long command (a conversion, a copy) shows its progress.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use shardify::convert::Progress;

/// Progress bars on a terminal, log lines otherwise.
pub(super) struct Reporter {
    bar: Mutex<Option<ProgressBar>>,
    terminal: bool,
    state: Mutex<(&'static str, u64, u64, Instant)>,
}

impl Reporter {
    /// A bar on a terminal stderr, log lines otherwise.
    pub(super) fn new() -> Reporter {
        Reporter {
            bar: Mutex::new(None),
            terminal: std::io::stderr().is_terminal(),
            state: Mutex::new(("", 0, 0, Instant::now())),
        }
    }
}

impl Progress for Reporter {
    fn begin(&self, phase: &'static str, units: u64) {
        *self.state.lock().unwrap() = (phase, units, 0, Instant::now());
        if self.terminal {
            let bar = ProgressBar::new(units);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:40}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(phase);
            *self.bar.lock().unwrap() = Some(bar);
        } else {
            tell!("{phase}: {units} units to do");
        }
    }

    fn advance(&self, pulses: u64) {
        let mut state = self.state.lock().unwrap();
        state.2 += 1;
        let (phase, units, done, started) = *state;
        drop(state);
        if let Some(bar) = self.bar.lock().unwrap().as_ref() {
            bar.inc(1);
            bar.set_message(format!("{pulses} pulses"));
        } else {
            tell!(
                "{phase}: {done}/{units} done ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }

    fn end(&self) {
        if let Some(bar) = self.bar.lock().unwrap().take() {
            bar.finish();
        }
    }
}

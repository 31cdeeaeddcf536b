//! Logging: pretty lines for a terminal, JSON lines for machines
//! (`log.format`). `RUST_LOG`, when set, overrides `log.level`.

use std::io::Write;

use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, LogSettings};

/// Installs the global subscriber. Called once, from `main`. With
/// `beside_progress_line` (the demo on a terminal) each record first clears
/// the terminal's current line, so a log line never lands in the middle of a
/// progress line drawn on stdout; the next progress update draws it again.
pub fn init(settings: &LogSettings, beside_progress_line: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || {
            let mut stderr = std::io::stderr();
            if beside_progress_line {
                // Carriage return, then erase the line (ANSI EL 2).
                let _ = stderr.write_all(b"\r\x1b[2K");
            }
            stderr
        });
    // `try_init`: a second call (tests) keeps the first subscriber.
    let _ = match settings.format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

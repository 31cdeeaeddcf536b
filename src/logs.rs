//! Logging: pretty lines for a terminal, JSON lines for machines
//! (`log.format`). `RUST_LOG`, when set, overrides `log.level`. The level can
//! change while the service runs ([`set_level`], on a reload).

use std::io::Write;
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::settings::{LogFormat, LogSettings, TracingSettings};

/// Installs the global subscriber. Called once, from `main`, inside the
/// tokio runtime when `traces` is on (the exporter is a task of it). With
/// `beside_progress_line` (the demo on a terminal) each record first clears
/// the terminal's current line, so a log line never lands in the middle of a
/// progress line drawn on stdout; the next progress update draws it again.
///
/// The log filter applies to the log lines alone: the spans exported when
/// `tracing.otlp_endpoint` is set ([`crate::traces`]) do not depend on
/// `log.level`.
pub fn init(
    settings: &LogSettings,
    traces: &TracingSettings,
    beside_progress_line: bool,
) -> anyhow::Result<()> {
    let from_env = EnvFilter::try_from_default_env().ok();
    let overridden = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(&settings.level));
    let (filter, handle) = reload::Layer::new(filter);
    let lines = tracing_subscriber::fmt::layer().with_writer(move || {
        let mut stderr = std::io::stderr();
        if beside_progress_line {
            // Carriage return, then erase the line (ANSI EL 2).
            let _ = stderr.write_all(b"\r\x1b[2K");
        }
        stderr
    });
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match settings.format {
        LogFormat::Pretty => lines.with_filter(filter).boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    };
    let exported = crate::traces::layer::<Registry>(traces).map_err(|e| {
        anyhow::anyhow!(
            "tracing.otlp_endpoint: cannot set up the OTLP exporter for {}: {e}",
            traces.otlp_endpoint
        )
    })?;
    let mut layers = vec![lines];
    layers.extend(exported);
    // `try_init`: a second call (tests) keeps the first subscriber.
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_ok()
    {
        let _ = LEVEL.set(Level {
            reload: setter(handle),
            overridden,
        });
    }
    Ok(())
}

/// Replaces the installed subscriber's filter; false if the subscriber is gone.
type SetFilter = Box<dyn Fn(EnvFilter) -> bool + Send + Sync>;

/// The filter setter of a subscriber, whichever format it writes.
fn setter<S: 'static>(handle: tracing_subscriber::reload::Handle<EnvFilter, S>) -> SetFilter {
    Box::new(move |filter| handle.reload(filter).is_ok())
}

/// The installed subscriber's filter, to change at a reload.
struct Level {
    /// Replaces the filter.
    reload: SetFilter,
    /// Whether `RUST_LOG` set the filter, which `log.level` then does not.
    overridden: bool,
}

static LEVEL: OnceLock<Level> = OnceLock::new();

/// What became of a new `log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelChange {
    /// The filter is now the new level.
    Applied,
    /// `RUST_LOG` was set at start: it stays the filter.
    OverriddenByRustLog,
    /// This process's logging was not installed by [`init`] (a test, or a
    /// program embedding the library): its own filter stays.
    NotInstalled,
}

/// Sets the log filter to `level` (already validated as a setting).
pub fn set_level(level: &str) -> LevelChange {
    let Some(installed) = LEVEL.get() else {
        return LevelChange::NotInstalled;
    };
    if installed.overridden {
        return LevelChange::OverriddenByRustLog;
    }
    let reloaded = EnvFilter::try_new(level).is_ok_and(|filter| (installed.reload)(filter));
    if reloaded {
        LevelChange::Applied
    } else {
        LevelChange::NotInstalled
    }
}

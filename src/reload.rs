//! Reloading the settings while the service runs (`SIGHUP`,
//! `POST /admin/reload`): read again from the layers the service started
//! from, validated whole, and the keys that can change while running
//! ([`crate::settings::is_live`]) applied; every other changed key is left as
//! it runs and reported as needing a restart.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::domain::Millis;
use crate::logs::{self, LevelChange};
use crate::settings::{Change, Settings, SettingsSource, changes, check_applied, is_live};

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Some live key changed and was applied.
    Applied,
    /// No live key changed (restart-only ones may have).
    Unchanged,
    /// The settings did not validate; nothing was applied.
    Refused,
}

impl Outcome {
    /// Every outcome, as `config_reloads_total{outcome}` lists them.
    pub const ALL: [Outcome; 3] = [Self::Applied, Self::Unchanged, Self::Refused];

    /// The outcome's name in the API and the metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Unchanged => "unchanged",
            Self::Refused => "refused",
        }
    }
}

/// What a reload that validated did.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// Applied or unchanged.
    pub outcome: Outcome,
    /// The live keys that changed, now in effect.
    pub changed: Vec<Change>,
    /// The keys whose configured value differs from the one running, which
    /// only a restart applies: `from` is the running value, `to` the configured one.
    pub restart_needed: Vec<Change>,
    /// Anything applied otherwise than asked (a `log.level` that `RUST_LOG` overrides).
    pub notes: Vec<String>,
}

/// Why a reload applied nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// Built without a source (a program embedding the library).
    #[error("this instance was started without a settings source to reload from")]
    NoSource,
    /// The settings did not validate: the message names the key.
    #[error("{0}")]
    Refused(String),
}

/// The last reload, for `/admin/status`.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// When it was.
    pub last_at: Option<Millis>,
    /// How it ended.
    pub last_outcome: Option<Outcome>,
    /// What still waits for a restart.
    pub restart_needed: Vec<Change>,
}

/// Where settings are read again from, and the settings running.
pub struct Reloader {
    /// The layers of the start: the same file (read again) and environment.
    source: Option<SettingsSource>,
    /// The settings those layers gave at start, before any command-line
    /// override (`--no-migrate`): what the keys read only at start compare with.
    started: Settings,
    /// The settings in effect; components read the live keys from here.
    live: watch::Sender<Arc<Settings>>,
    /// The last reload; also serialises reloads.
    status: Mutex<Status>,
}

impl Reloader {
    /// Settings running as `settings` (start-up overrides applied), read
    /// again from `source` (`None`: never), whose layers gave `started`.
    pub fn new(settings: Settings, source: Option<(SettingsSource, Settings)>) -> Self {
        let (source, started) = match source {
            Some((source, started)) => (Some(source), started),
            None => (None, settings.clone()),
        };
        Self {
            source,
            started,
            live: watch::Sender::new(Arc::new(settings)),
            status: Mutex::new(Status::default()),
        }
    }

    /// The settings in effect now.
    pub fn current(&self) -> Arc<Settings> {
        self.live.borrow().clone()
    }

    /// A receiver that sees every reload (to wake a sleeping loop).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Settings>> {
        self.live.subscribe()
    }

    /// The last reload.
    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads the settings again and applies what can change while running;
    /// refuses them whole if any key is wrong. [`crate::context::Context::reload`]
    /// also logs and counts it.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let source = self.source.as_ref().ok_or(ReloadError::NoSource)?;
        // One reload at a time: two at once could apply in either order.
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.last_at = Some(Millis::now());
        let new = match Settings::load(source) {
            Ok(new) => new,
            Err(e) => {
                status.last_outcome = Some(Outcome::Refused);
                return Err(ReloadError::Refused(e.to_string()));
            }
        };
        let running = self.current();
        let applied = running.with_live(&new);
        if let Err(e) = check_applied(&running, &applied) {
            status.last_outcome = Some(Outcome::Refused);
            return Err(ReloadError::Refused(e.to_string()));
        }
        let changed: Vec<Change> = changes(&running, &new)
            .into_iter()
            .filter(|c| is_live(c.key, &running))
            .collect();
        // Against the start, not the last reload: a change waits for the
        // restart however many reloads come after it.
        let restart_needed: Vec<Change> = changes(&self.started, &new)
            .into_iter()
            .filter(|c| !is_live(c.key, &running))
            .collect();
        let mut notes = Vec::new();
        if running.log.level != new.log.level {
            match logs::set_level(&new.log.level) {
                LevelChange::Applied => {}
                LevelChange::OverriddenByRustLog => {
                    notes.push("log.level: RUST_LOG was set at start and stays the filter".into())
                }
                LevelChange::NotInstalled => notes.push(
                    "log.level: this process's logging was set up by its host program, which keeps its filter".into(),
                ),
            }
        }
        let outcome = if changed.is_empty() {
            Outcome::Unchanged
        } else {
            self.live.send_replace(Arc::new(applied));
            Outcome::Applied
        };
        let reloaded = Reloaded {
            outcome,
            changed,
            restart_needed,
            notes,
        };
        status.last_outcome = Some(outcome);
        status.restart_needed = reloaded.restart_needed.clone();
        Ok(reloaded)
    }
}

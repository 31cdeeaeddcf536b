//! The events of live control: roles paused and resumed, settings reloaded.

use super::Telemetry;
use crate::control::Pausable;
use crate::reload::{Outcome, Reloaded};
use crate::settings::Change;

/// `key: from -> to` for each change, on one line.
fn listed(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| format!("{}: {} -> {}", c.key, c.from, c.to))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Telemetry {
    /// A role was paused.
    pub fn role_paused(&self, role: Pausable) {
        self.m
            .paused
            .get_or_create(&[("role", role.as_str())])
            .set(1);
        tracing::warn!(
            role = role.as_str(),
            "paused: it takes no work until resumed"
        );
    }

    /// A paused role was resumed.
    pub fn role_resumed(&self, role: Pausable) {
        self.m
            .paused
            .get_or_create(&[("role", role.as_str())])
            .set(0);
        tracing::info!(role = role.as_str(), "resumed");
    }

    /// A paused consumer or router gave back to its queue what it had
    /// taken and not handled (`held` early deliveries among them), and
    /// cancelled its AMQP consumer.
    pub fn consumption_stopped(&self, role: Pausable, queue: &str, held: usize) {
        tracing::info!(
            role = role.as_str(),
            queue,
            held_returned = held,
            "consumption stopped: the messages wait in the queue"
        );
    }

    /// Settings were read again and what could change while running was applied.
    pub fn settings_reloaded(&self, reloaded: &Reloaded) {
        self.m
            .config_reloads
            .get_or_create(&[("outcome", reloaded.outcome.as_str())])
            .inc();
        let restart = listed(&reloaded.restart_needed);
        match reloaded.outcome {
            Outcome::Applied => tracing::info!(
                changed = listed(&reloaded.changed),
                notes = reloaded.notes.join("; "),
                "settings reloaded"
            ),
            _ => tracing::info!("settings reloaded: nothing that applies while running changed"),
        }
        if !restart.is_empty() {
            tracing::warn!(
                restart_needed = restart,
                "settings changed that apply only at the next start; the running values stay"
            );
        }
    }

    /// A reload found settings that do not validate: none of them was applied.
    pub fn settings_refused(&self, error: &str) {
        self.m
            .config_reloads
            .get_or_create(&[("outcome", Outcome::Refused.as_str())])
            .inc();
        tracing::error!(
            error,
            "settings reload refused: the running settings stay (and the next start would fail)"
        );
    }
}

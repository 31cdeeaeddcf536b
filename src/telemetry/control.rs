//! The events of live control: roles paused and resumed, settings reloaded.

use super::Telemetry;
use crate::control::{Pausable, Pause, PauseScope};
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
    /// A role was paused in `scope` (by this instance's API, or a shared
    /// pause read from the database).
    pub fn role_paused(&self, role: Pausable, scope: PauseScope, pause: &Pause) {
        self.m
            .paused
            .get_or_create(&[("role", role.as_str())])
            .set(1);
        tracing::warn!(
            role = role.as_str(),
            scope = scope.as_str(),
            by = pause.by,
            instance = pause.instance,
            reason = pause.reason.as_deref().unwrap_or(""),
            "paused: it takes no work until resumed"
        );
    }

    /// A role's pause in `scope` was lifted; `still_paused` when the other
    /// scope still holds it.
    pub fn role_resumed(&self, role: Pausable, scope: PauseScope, still_paused: bool) {
        self.m
            .paused
            .get_or_create(&[("role", role.as_str())])
            .set(i64::from(still_paused));
        if still_paused {
            tracing::warn!(
                role = role.as_str(),
                scope = scope.as_str(),
                "resumed in this scope; still paused by the other"
            );
        } else {
            tracing::info!(role = role.as_str(), scope = scope.as_str(), "resumed");
        }
    }

    /// The pauses shared by every instance could not be read (`in_a_row`
    /// readings so far): the last known ones stay in effect. Said once per
    /// outage, counted every time.
    pub fn shared_pauses_unread(&self, error: &str, in_a_row: u64) {
        self.m.pause_reads_failed.inc();
        if in_a_row == 1 {
            tracing::warn!(
                error,
                "the shared pauses (order_timeout_pauses) could not be read: the last known ones stay in effect, none is lifted until they can be read"
            );
        } else {
            tracing::debug!(error, in_a_row, "the shared pauses still cannot be read");
        }
    }

    /// The shared pauses were read again after `failed` readings failed.
    pub fn shared_pauses_read_again(&self, failed: u64) {
        tracing::info!(
            failed_readings = failed,
            "the shared pauses (order_timeout_pauses) are read again"
        );
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

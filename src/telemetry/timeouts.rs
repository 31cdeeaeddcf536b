//! The events of timeouts on their way to the database: deliveries, each
//! timeout applied, not applicable, early or parked, the sweeper's and the
//! catch-up's catches, the outbox relay's publishing, and the batch loop's
//! splits and lost commit answers.

use std::time::Duration;

use super::{Telemetry, outbox_name};
use crate::db::events::EVENTS;
use crate::db::store::{Outbox, OutboxState};
use crate::domain::{Millis, OrderKey, TimeoutKind};

impl Telemetry {
    /// A delivery arrived on a queue role (`ingest`, `payment`, …).
    pub fn delivery(&self, role: &'static str, redelivered: bool) {
        self.m.deliveries.get_or_create(&[("queue", role)]).inc();
        if redelivered {
            self.m.redeliveries.get_or_create(&[("queue", role)]).inc();
        }
    }

    /// A timeout transition committed.
    pub fn timeout_applied(
        &self,
        kind: TimeoutKind,
        id: &OrderKey,
        lateness_ms: i64,
        by: &'static str,
    ) {
        self.m
            .timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "applied")])
            .inc();
        self.m
            .lateness
            .get_or_create(&[("kind", kind.as_str())])
            .observe(lateness_ms.max(0) as f64 / 1000.0);
        tracing::info!(order_id = %id, kind = kind.as_str(), lateness_ms, by, outcome = "applied", "timeout applied");
    }

    /// A timeout found nothing to do (the order moved on, or a duplicate message).
    pub fn timeout_not_applicable(&self, kind: TimeoutKind, id: &OrderKey, status: &str) {
        self.m
            .timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "not_applicable")])
            .inc();
        tracing::debug!(order_id = %id, kind = kind.as_str(), status, outcome = "not_applicable", "timeout not applicable");
    }

    /// A timeout arrived before the deadline in the database.
    pub fn timeout_early(&self, kind: TimeoutKind, id: &OrderKey, remaining: Duration, held: bool) {
        self.m
            .timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "not_yet_due")])
            .inc();
        if !held {
            self.m
                .redelayed
                .get_or_create(&[("kind", kind.as_str())])
                .inc();
        }
        tracing::debug!(
            order_id = %id,
            kind = kind.as_str(),
            remaining_ms = remaining.as_millis() as u64,
            action = if held { "hold" } else { "redelay" },
            outcome = "not_yet_due",
            "timeout arrived early"
        );
    }

    /// Messages held in memory right now.
    pub fn held_changed(&self, delta: i64) {
        self.m.held.inc_by(delta);
    }

    /// A message was parked.
    pub fn parked(
        &self,
        reason: &'static str,
        detail: &str,
        by: &'static str,
        routing_key: &str,
        kind: Option<TimeoutKind>,
    ) {
        self.m
            .parked
            .get_or_create(&[("reason", reason), ("by", by)])
            .inc();
        if let Some(kind) = kind {
            self.m
                .timeouts
                .get_or_create(&[("kind", kind.as_str()), ("outcome", "parked")])
                .inc();
        }
        tracing::warn!(reason, detail, by, routing_key, "message parked");
    }

    /// The sweeper applied a transition no message had applied.
    pub fn sweeper_catch(&self, kind: TimeoutKind, id: &OrderKey, lateness_ms: i64) {
        self.m
            .sweeper_catches
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
        self.timeout_applied(kind, id, lateness_ms, "sweeper");
        tracing::warn!(order_id = %id, kind = kind.as_str(), lateness_ms, "sweeper caught an order its timer missed");
    }

    /// A sweep of `kind` read rows whose id the service cannot read: they
    /// are passed over (never acted on), counted by reason, and told in one
    /// line per round with one sample id, escaped and truncated.
    pub fn unreadable_ids(&self, kind: TimeoutKind, ids: &crate::orders::Unreadable) {
        for (reason, n) in &ids.counts {
            self.m
                .unreadable_ids
                .get_or_create(&[("kind", kind.as_str()), ("reason", reason)])
                .inc_by(*n);
        }
        tracing::warn!(
            kind = kind.as_str(),
            rows = ids.total(),
            reasons = ?ids.counts,
            sample = ids.sample.as_deref().unwrap_or(""),
            "overdue rows with an id the service cannot read were passed over; fix them in the shop's table (`order-timeout doctor` counts them)"
        );
    }

    /// A consumer's catch-up applied an order already due, ahead of its own
    /// message (which will find it done).
    pub fn caught_up(&self, kind: TimeoutKind, id: &OrderKey, lateness_ms: i64) {
        self.m
            .catch_ups
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
        self.timeout_applied(kind, id, lateness_ms, "catch_up");
    }

    /// Outbox rows were published and confirmed.
    pub fn outbox_published(&self, n: u64) {
        self.m.outbox_published.inc_by(n);
        tracing::debug!(rows = n, "outbox rows published");
    }

    /// Domain events were published and confirmed, one name per event.
    pub fn events_published<'a>(&self, events: impl IntoIterator<Item = &'a str>) {
        let mut n = 0;
        for event in events {
            // A label from the known set only: the column is text, and a
            // label per unknown value would grow the registry without bound.
            let label = EVENTS.into_iter().find(|e| *e == event).unwrap_or("other");
            self.m
                .events_published
                .get_or_create(&[("event", label)])
                .inc();
            n += 1;
        }
        tracing::debug!(events = n, "domain events published");
    }

    /// Rows of an outbox were not confirmed; they are tried again after a wait.
    pub fn outbox_failed(&self, outbox: Outbox, n: u64, error: &str) {
        let failures = match outbox {
            Outbox::Timeouts => &self.m.outbox_publish_failures,
            Outbox::Events => &self.m.events_publish_failures,
        };
        failures.inc_by(n);
        tracing::warn!(
            outbox = outbox_name(outbox),
            rows = n,
            error,
            "outbox publish not confirmed; will retry"
        );
    }

    /// Rows of an outbox were set aside; no relay takes them again.
    pub fn outbox_set_aside(&self, outbox: Outbox, ids: &[i64], reason: &str) {
        let (gauge, what) = match outbox {
            Outbox::Timeouts => (
                &self.m.outbox_set_aside,
                "outbox rows set aside: no relay publishes them again (the sweeper still applies their timeouts); docs/operations.md (Outbox rows set aside) says how to put them back",
            ),
            Outbox::Events => (
                &self.m.events_set_aside,
                "domain events set aside: no relay publishes them again until an operator puts them back (docs/wire-contract.md, Telemetry)",
            ),
        };
        gauge.inc_by(ids.len() as i64);
        tracing::error!(outbox = outbox_name(outbox), outbox_ids = ?ids, reason, "{what}");
    }

    /// An outbox now.
    pub fn outbox_backlog(&self, outbox: Outbox, state: OutboxState, now: Millis) {
        let (backlog, oldest, set_aside) = match outbox {
            Outbox::Timeouts => (
                &self.m.outbox_backlog,
                &self.m.outbox_oldest_age,
                &self.m.outbox_set_aside,
            ),
            Outbox::Events => (
                &self.m.events_backlog,
                &self.m.events_oldest_age,
                &self.m.events_set_aside,
            ),
        };
        backlog.set(state.waiting as i64);
        let age = state.oldest.map(|o| now.since(o)).unwrap_or_default();
        oldest.set(age.as_secs_f64());
        set_aside.set(state.set_aside as i64);
    }

    /// The database answered but refused a batch of `size` timeouts: it is
    /// halved, to find the order it refuses.
    pub fn batch_split(&self, kind: TimeoutKind, size: usize, error: &str) {
        tracing::warn!(
            kind = kind.as_str(),
            size,
            error,
            "the database refused a batch of timeouts; deciding each half on its own"
        );
    }

    /// A failed attempt had committed after all (its answer was lost): the
    /// audit rows it wrote say so, and its orders count as applied.
    pub fn commit_answer_lost(&self, kind: TimeoutKind, orders: usize) {
        tracing::warn!(
            kind = kind.as_str(),
            orders,
            "an attempt whose commit answer was lost had applied these timeouts; counted as applied, from the audit trail"
        );
    }

    /// The database refused one order's timeout in a sweep; the next sweep tries again.
    pub fn sweeper_refused(&self, kind: TimeoutKind, id: &OrderKey, error: &str) {
        tracing::error!(
            order_id = %id,
            kind = kind.as_str(),
            error,
            "the database refused this order's timeout; the next sweep tries again"
        );
    }
}

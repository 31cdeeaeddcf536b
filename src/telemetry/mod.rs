//! Telemetry: what the service tells its operators. Every thing worth knowing
//! that happens is one function of [`Telemetry`] that logs it and counts it, so
//! a metric and its log line cannot drift apart; `/metrics` renders the
//! registry ([`metrics`]) in the Prometheus text format. Where the log lines
//! go, and at what level, is [`crate::logs`]'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod control;
mod metrics;
mod timeouts;

use metrics::Metrics;

use crate::db::events::EVENTS;
use crate::db::store::{Backlog, DueAhead, Outbox};
use crate::domain::{Action, Millis, OrderId, OrderKey, OrderStatus, TimeoutKind};

/// The windows of the `due_next` gauge, shortest first, each with its label:
/// the next minute (what is about to land), five (what an alert can still
/// act on), an hour (what the dashboard plans with).
pub const DUE_WINDOWS: [(&str, Duration); 3] = [
    ("1m", Duration::from_secs(60)),
    ("5m", Duration::from_secs(300)),
    ("60m", Duration::from_secs(3600)),
];

/// The service's telemetry: each function logs one thing that happened and
/// counts it.
pub struct Telemetry {
    /// What is counted.
    m: Metrics,
    /// Whether the last read of the delay stages failed (logged on change only).
    stages_unreadable: AtomicBool,
    /// Whether the last readiness check found the database down (logged on change only).
    database_unready: AtomicBool,
    /// Whether the last reading of the order gauges failed (logged on change only).
    backlog_unreadable: AtomicBool,
    /// Whether the last skew measured was worth a warning (logged on change only).
    clock_skewed: AtomicBool,
}

impl Telemetry {
    /// Fresh events and metrics (one per application, so tests do not share counters).
    pub fn new() -> Arc<Self> {
        let events = Self {
            m: Metrics::new(),
            stages_unreadable: AtomicBool::new(false),
            database_unready: AtomicBool::new(false),
            backlog_unreadable: AtomicBool::new(false),
            clock_skewed: AtomicBool::new(false),
        };
        // Which build answers: one series, always 1, joined on by queries
        // that compare versions during a rollout.
        events
            .m
            .build_info
            .get_or_create(&[("version", crate::VERSION), ("commit", crate::COMMIT)])
            .set(1);
        // These series exist from the start, at zero, so a rate or an alert
        // over them is never empty.
        for reason in ["overloaded", "timeout", "database"] {
            let _ = events.m.http_refused.get_or_create(&[("reason", reason)]);
        }
        let _ = events.m.blocked.get_or_create(&[("role", "relay")]);
        for event in EVENTS {
            let _ = events.m.events_published.get_or_create(&[("event", event)]);
        }
        let _ = events.m.task_panics.get_or_create(&[("role", "consumer")]);
        for kind in TimeoutKind::ALL {
            let _ = events.m.catch_ups.get_or_create(&[("kind", kind.as_str())]);
            for reason in OrderKey::FAULTS {
                let labels = [("kind", kind.as_str()), ("reason", reason)];
                let _ = events.m.unreadable_ids.get_or_create(&labels);
            }
        }
        for role in crate::control::Pausable::ALL {
            let _ = events.m.paused.get_or_create(&[("role", role.as_str())]);
        }
        for outcome in crate::reload::Outcome::ALL {
            let _ = events
                .m
                .config_reloads
                .get_or_create(&[("outcome", outcome.as_str())]);
        }
        Arc::new(events)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.m.render()
    }

    /// A checkout created an order.
    pub fn order_created(&self, id: OrderId, deadline: Millis) {
        self.m.orders_created.inc();
        // Formatted only when the line is logged: not per checkout.
        tracing::debug!(order_id = %id, pay_deadline = %deadline.to_rfc3339(), "order created");
    }

    /// A checkout was refused (`insufficient_stock`, `unknown_sku`,
    /// `idempotency_key_reused`).
    pub fn checkout_rejected(&self, reason: &'static str, detail: &str) {
        self.m
            .checkouts_rejected
            .get_or_create(&[("reason", reason)])
            .inc();
        tracing::info!(reason, detail, "checkout refused");
    }

    /// A checkout with an Idempotency-Key already used for the same request
    /// was answered with the order that request created; nothing was reserved.
    pub fn checkout_replayed(&self, id: OrderId) {
        self.m.checkouts_replayed.inc();
        tracing::info!(order_id = %id, "checkout replayed for its idempotency key");
    }

    /// The cleaner deleted idempotency keys past `http.idempotency_retention`.
    pub fn idempotency_keys_expired(&self, count: u64) {
        tracing::debug!(count, "expired idempotency keys deleted");
    }

    /// The retention cleaner deleted audit rows older than `audit.retention`
    /// (one round: every batch until none was left).
    pub fn audit_rows_deleted(&self, count: u64, before: Millis) {
        self.m.audit_rows_deleted.inc_by(count);
        tracing::info!(
            count,
            before_ms = before.0,
            "audit rows past their retention deleted"
        );
    }

    /// The retention cleaner could not delete old audit rows; it tries again
    /// next round (the trail only grows meanwhile).
    pub fn audit_cleanup_failed(&self, error: &str) {
        tracing::warn!(error, "cannot delete audit rows past their retention");
    }

    /// The cleaner could not delete expired idempotency keys; it tries again
    /// next round (a key past its retention is treated as new meanwhile).
    pub fn idempotency_cleanup_failed(&self, error: &str) {
        tracing::warn!(error, "cannot delete expired idempotency keys");
    }

    /// The HTTP server refused a request: `overloaded` (too many in flight,
    /// answered at once) or `timeout` (it took longer than
    /// `http.request_timeout` and was dropped).
    pub fn request_refused(&self, reason: &'static str, path: &str) {
        self.m
            .http_refused
            .get_or_create(&[("reason", reason)])
            .inc();
        if reason == "timeout" {
            tracing::warn!(reason, path, "HTTP request timed out");
        } else {
            // A flood would repeat this line for every request: the counter says it.
            tracing::debug!(reason, path, "HTTP request refused");
        }
    }

    /// A client's action changed an order.
    pub fn order_changed(&self, id: OrderId, action: Action) {
        self.m
            .actions
            .get_or_create(&[("action", action.as_str()), ("outcome", "done")])
            .inc();
        tracing::info!(order_id = %id, action = action.as_str(), outcome = "done", "order changed");
    }

    /// A client's action was refused by the order's state. `late_payment`: it
    /// was the first payment after a timeout cancelled the order, recorded as
    /// its late payment (money may have been taken: refund it); counted once
    /// per order, not per retry.
    pub fn action_refused(
        &self,
        id: OrderId,
        action: Action,
        status: OrderStatus,
        late_payment: bool,
    ) {
        self.m
            .actions
            .get_or_create(&[("action", action.as_str()), ("outcome", "refused")])
            .inc();
        if late_payment {
            self.m.late_payments.inc();
            tracing::warn!(order_id = %id, status = status.as_str(), outcome = "late_payment", "late payment for a cancelled order; refund it");
        } else {
            tracing::info!(order_id = %id, action = action.as_str(), status = status.as_str(), outcome = "refused", "action refused");
        }
    }

    /// An HTTP request was refused by authentication (never with the token
    /// itself: a wrong one may be a real one of another system, or a typo of
    /// ours). Logged at debug: anyone who reaches the port can cause it.
    pub fn auth_refused(&self, reason: &'static str, method: &str, path: &str) {
        self.m
            .auth_refused
            .get_or_create(&[("reason", reason)])
            .inc();
        tracing::debug!(
            reason,
            method,
            path,
            "HTTP request refused by authentication"
        );
    }

    /// Names that exist without the safety nets the service declares
    /// (alternate and dead-letter exchanges into `parked`).
    pub fn earlier_topology(&self, names: &[String]) {
        tracing::warn!(
            names = %names.join(", "),
            "declared without an alternate or dead-letter exchange into parked (by hand, or by a definitions \
             file of your own): a message that finds no queue there is dropped instead of parked; \
             `order-timeout doctor` and UPGRADING.md say how to add them"
        );
    }

    /// The database failed; `role` pauses for `backoff`.
    pub fn paused(&self, role: &'static str, error: &str, backoff: Duration) {
        self.m
            .consumer_pauses
            .get_or_create(&[("role", role)])
            .inc();
        tracing::warn!(
            role,
            error,
            backoff_ms = backoff.as_millis() as u64,
            "database unavailable; pausing"
        );
    }

    /// The delay stages were read: timers in each (`None`: no such stage).
    pub fn stages_read(&self, ttl: Option<u64>, plugin: Option<u64>, native: Option<u64>) {
        for (stage, timers) in [("ttl", ttl), ("plugin", plugin), ("native", native)] {
            match timers {
                Some(n) => {
                    self.m
                        .waiting_timers
                        .get_or_create(&[("stage", stage)])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
                None => {
                    self.m.waiting_timers.remove(&[("stage", stage)]);
                }
            }
        }
        if self.stages_unreadable.swap(false, Ordering::Relaxed) {
            tracing::info!(?ttl, ?plugin, ?native, "delay stages readable again");
        }
    }

    /// The delay stages could not be read from the management API at `base`.
    pub fn stages_unreadable(&self, base: &str, error: &str) {
        self.m.waiting_timers.clear();
        if !self.stages_unreadable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                management_api = base,
                error,
                "cannot read the timers waiting in the delay stages (amqp.management_url); the waiting_timers gauge is withdrawn until it can"
            );
        }
    }

    /// The order gauges were read: each kind's backlog, and how many fall
    /// due within each of [`DUE_WINDOWS`] (kinds that act on nothing have no
    /// series).
    pub fn backlog_read(
        &self,
        backlogs: &[(TimeoutKind, Backlog)],
        ahead: &[(TimeoutKind, DueAhead)],
    ) {
        for (kind, due) in ahead {
            for (window, n) in DUE_WINDOWS.iter().zip(&due.within) {
                let label = [("kind", kind.as_str()), ("window", window.0)];
                self.m
                    .due_next
                    .get_or_create(&label)
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
        }
        for (kind, backlog) in backlogs {
            let label = [("kind", kind.as_str())];
            let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.m
                .pending_timeouts
                .get_or_create(&label)
                .set(gauge(backlog.pending));
            self.m
                .overdue_orders
                .get_or_create(&label)
                .set(gauge(backlog.overdue));
            self.m
                .oldest_overdue
                .get_or_create(&label)
                .set(backlog.oldest_overdue.as_secs_f64());
        }
        self.m.database_up.set(1);
        if self.backlog_unreadable.swap(false, Ordering::Relaxed) {
            tracing::info!("the order gauges are readable again");
        }
    }

    /// The order gauges could not be read: they are withdrawn rather than
    /// left at a stale value (a stale 0 would hide overdue orders), and
    /// `database_up` says why.
    pub fn backlog_unreadable(&self, error: &str) {
        self.m.pending_timeouts.clear();
        self.m.overdue_orders.clear();
        self.m.oldest_overdue.clear();
        self.m.due_next.clear();
        self.m.database_up.set(0);
        if !self.backlog_unreadable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error,
                "cannot read the order gauges from the database; pending_timeouts, overdue_orders, oldest_overdue_seconds and due_next are withdrawn until it can"
            );
        }
    }

    /// The skew between this host's clock and the database's was measured.
    /// Decisions do not depend on it (they use the database's clock), but a
    /// host whose clock is off writes misleading logs and AMQP timestamps,
    /// and is often a sign of a stepped or stopped NTP: warned about when it
    /// goes over [`SKEW_WARN`](crate::db::clock::SKEW_WARN), told again when
    /// it is back under.
    pub fn clock_skew(&self, skew: crate::db::clock::Skew) {
        self.m.clock_skew.set(skew.seconds());
        let worth = skew.worth_a_warning();
        if self.clock_skewed.swap(worth, Ordering::Relaxed) != worth {
            let skew_ms = skew.host_ahead_ms;
            if worth {
                tracing::warn!(
                    skew_ms,
                    "this host's clock is {:.3} s {} the database's; deadlines are judged by the database's clock, but fix the host's time (NTP)",
                    skew.seconds().abs(),
                    if skew_ms > 0 { "ahead of" } else { "behind" }
                );
            } else {
                tracing::info!(
                    skew_ms,
                    "this host's clock agrees with the database's again"
                );
            }
        }
    }

    /// `/readyz` checked the database: `Some(error)` when it did not answer.
    /// Logged when the answer changes, not on every probe.
    pub fn database_checked(&self, error: Option<&str>) {
        match error {
            Some(error) => {
                if !self.database_unready.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error, "readiness: the database does not answer");
                }
            }
            None => {
                if self.database_unready.swap(false, Ordering::Relaxed) {
                    tracing::info!("readiness: the database answers again");
                }
            }
        }
    }

    /// A broker connection is up.
    pub fn broker_connected(&self, role: &'static str, name: &str, node: &str) {
        self.m
            .broker_connects
            .get_or_create(&[("role", role)])
            .inc();
        self.m
            .broker_connected
            .get_or_create(&[("role", role)])
            .set(1);
        tracing::info!(role, connection = name, node, "connected to the broker");
    }

    /// A broker connection was lost or could not be made.
    pub fn broker_lost(&self, role: &'static str, error: &str, retry_in: Duration) {
        self.m
            .broker_disconnects
            .get_or_create(&[("role", role)])
            .inc();
        self.m
            .broker_connected
            .get_or_create(&[("role", role)])
            .set(0);
        tracing::warn!(
            role,
            error,
            retry_in_ms = retry_in.as_millis() as u64,
            "broker connection lost; reconnecting"
        );
    }

    /// The time zone check of `kind` is in `state` (unconfirmed, fits, off),
    /// for `reason`: a mismatch is an error, a zone not yet confirmed a
    /// warning.
    pub fn time_zone_check(&self, kind: &'static str, state: &'static str, reason: &str) {
        match state {
            "fits" => tracing::info!(kind, "{reason}"),
            "unconfirmed" => tracing::warn!(kind, "{reason}"),
            _ => tracing::error!(kind, "{reason}"),
        }
        for each in ["unconfirmed", "fits", "off"] {
            self.m
                .time_zone
                .get_or_create(&[("kind", kind), ("state", each)])
                .set(i64::from(each == state));
        }
    }

    /// Shadow mode's report of `kind` was counted.
    pub fn shadow_counted(&self, kind: &'static str, r: &crate::orders::mapped::ShadowReport) {
        for (outcome, n) in [
            ("would_close", r.would_close),
            ("shop_closed_after_us", r.shop_closed_after_us),
            ("shop_closed_before_us", r.shop_closed_before_us),
            ("closed_early", r.closed_early),
            ("still_open", r.still_open),
            ("disagreements", r.disagreements),
        ] {
            self.m
                .shadow
                .get_or_create(&[("kind", kind), ("outcome", outcome)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The delay mode was chosen, at start-up, once per process.
    pub fn delay_mode_chosen(&self, mode: &'static str, reason: &str) {
        self.m.delay_mode.get_or_create(&[("mode", mode)]).set(1);
        tracing::info!(mode, reason, "delay mode chosen");
    }

    /// The native stage's queue let a timer go before its delivery time `at`
    /// by this host's clock (the broker's clock is ahead of it): it is held
    /// again, until `until`.
    pub fn returned_early(&self, at: i64, until: i64) {
        tracing::warn!(
            delivery_time = %crate::domain::Millis(at).to_rfc3339(),
            held_until = %crate::domain::Millis(until).to_rfc3339(),
            "the broker returned a timer before its delivery time: is its clock ahead of this host's?"
        );
    }

    /// The broker blocked a connection's publishing (a resource alarm); its
    /// publishes wait until the alarm clears.
    pub fn publishing_blocked(&self, role: &'static str, reason: &str) {
        self.m.blocked.get_or_create(&[("role", role)]).inc();
        tracing::warn!(
            role,
            reason,
            "the broker blocked publishing (resource alarm)"
        );
    }

    /// A role's tasks had not ended `grace` after their connection failed:
    /// they were stopped, and the role reconnects. Nothing they held is lost
    /// (the broker requeued it with the connection); counted with the
    /// disconnects, which the role's reconnect reports.
    pub fn role_stopped(&self, role: &'static str, grace: Duration) {
        tracing::warn!(
            role,
            grace_ms = grace.as_millis() as u64,
            "the role's tasks had not ended after its connection failed: stopped"
        );
    }

    /// A task of a role panicked: a bug. Its siblings stop and the role
    /// reconnects; what the task held unacked is redelivered.
    pub fn task_panicked(&self, role: &'static str, error: &str) {
        self.m.task_panics.get_or_create(&[("role", role)]).inc();
        tracing::error!(role, error, "task panicked");
    }

    /// A message the router had in flight failed while it stopped. Not
    /// counted: unacked, the broker delivers it again, so nothing is lost.
    pub fn route_abandoned(&self, error: &str) {
        tracing::debug!(error, "in-flight route failed during stop");
    }

    /// A request was answered 503 because the database failed it; the cause
    /// is logged here, the client only learns it is not its fault.
    pub fn request_database_failed(&self, method: &str, path: &str, error: &str) {
        self.m
            .http_refused
            .get_or_create(&[("reason", "database")])
            .inc();
        tracing::error!(method, path, error, "database error in an HTTP request");
    }

    /// The HTTP listener could not accept a connection (out of file
    /// descriptors, say); it tries again after a pause. Logged only.
    pub fn accept_failed(&self, error: &str) {
        tracing::warn!(error, "HTTP accept failed");
    }

    /// A client's connection ended with an error (it went away, or was too
    /// slow): nothing to act on, so only at debug.
    pub fn connection_failed(&self, error: &str) {
        tracing::debug!(error, "HTTP connection ended with an error");
    }

    /// The service is built: database connected, listener bound.
    pub fn starting(&self, database: &str, backend: &str, broker: &str, prefix: &str) {
        tracing::info!(
            version = crate::VERSION,
            commit = crate::COMMIT,
            database,
            backend,
            broker,
            prefix,
            "order-timeout {} ready to start",
            crate::LONG_VERSION
        );
    }

    /// Another instance holds the migration lock: this one waits for its
    /// migration to end (then finds nothing pending), at most `wait`. No
    /// `self`: it happens before the application's telemetry exists.
    pub fn migration_waiting(holder: &str, wait: Duration) {
        tracing::info!(
            holder,
            wait_s = wait.as_secs(),
            "waiting for another instance's migration to finish (the migration lock is {holder})"
        );
    }

    /// The database records migrations of a newer release (a rolling
    /// upgrade under way): this version migrates nothing and runs on that
    /// schema, which the newer release keeps compatible. No `self`, like
    /// [`Telemetry::migration_waiting`].
    pub fn schema_newer(unknown: &[String]) {
        tracing::warn!(
            unknown = unknown.join(", "),
            "the database was migrated by a newer release (migrations this version does not know); \
             running on its schema without migrating, as a rolling upgrade allows"
        );
    }

    /// The HTTP API accepts connections.
    pub fn listening(&self, addr: &str) {
        tracing::info!(addr, "HTTP API listening");
    }

    /// Shutdown began: every component finishes what it holds.
    pub fn shutting_down(&self) {
        tracing::info!("shutting down: finishing in-flight work");
    }

    /// Shutdown took longer than its limit: what is left is abandoned (the
    /// broker redelivers every unacked message).
    pub fn shutdown_abandoned(&self, limit: Duration) {
        tracing::warn!(
            limit_s = limit.as_secs(),
            "shutdown limit reached; abandoning remaining work (the broker redelivers it)"
        );
    }

    /// The database pools did not close in time; the process exits anyway.
    pub fn pools_left_open(&self, limit: Duration) {
        tracing::warn!(
            limit_s = limit.as_secs(),
            "the database pools did not close in time; exiting anyway"
        );
    }

    /// Every component has stopped.
    pub fn stopped(&self) {
        tracing::info!("stopped");
    }

    /// The router sent a valid timeout on to its delay stage. Not counted
    /// here: `deliveries_total{queue}` counts what the router took in, and
    /// `parked_messages_total{by="router"}` what it refused.
    pub fn routed(&self, kind: TimeoutKind, routing_key: &str) {
        tracing::trace!(kind = kind.as_str(), routing_key, "routed");
    }
}

/// An outbox's table, as logs name it.
fn outbox_name(outbox: Outbox) -> &'static str {
    match outbox {
        Outbox::Timeouts => "outbox",
        Outbox::Events => "order_timeout_events",
    }
}

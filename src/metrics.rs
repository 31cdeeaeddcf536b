//! Events: every thing worth knowing that happens in the service, each logged and
//! counted by one function, so a metric and its log line cannot drift apart.
//! `/metrics` renders the registry in the Prometheus text format.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use crate::amqp::wire::Park;
use crate::db::store::OutboxState;
use crate::domain::{Action, Millis, OrderId, OrderStatus, TimeoutKind};

type Labels1 = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// Lateness buckets in seconds: from a millisecond to a minute.
const LATENESS_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The service's metrics and the event functions that feed them.
pub struct Events {
    registry: Registry,
    timeouts: Family<Labels2, Counter>,
    lateness: Family<Labels1, Histogram, fn() -> Histogram>,
    deliveries: Family<Labels1, Counter>,
    redeliveries: Family<Labels1, Counter>,
    parked: Family<Labels2, Counter>,
    sweeper_catches: Family<Labels1, Counter>,
    orders_created: Counter,
    checkouts_rejected: Family<Labels1, Counter>,
    checkouts_replayed: Counter,
    http_refused: Family<Labels1, Counter>,
    actions: Family<Labels2, Counter>,
    late_payments: Counter,
    outbox_published: Counter,
    outbox_publish_failures: Counter,
    outbox_backlog: Gauge,
    outbox_oldest_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    outbox_set_aside: Gauge,
    consumer_pauses: Family<Labels1, Counter>,
    broker_connects: Family<Labels1, Counter>,
    broker_disconnects: Family<Labels1, Counter>,
    held: Gauge,
    redelayed: Family<Labels1, Counter>,
    waiting_timers: Family<Labels1, Gauge>,
    auth_refused: Family<Labels1, Counter>,
    /// Whether the last read of the delay stages failed (logged on change only).
    stages_unreadable: AtomicBool,
    /// Whether the last readiness check found the database down (logged on change only).
    database_unready: AtomicBool,
}

/// Registers `metric` under `name` and returns it: a metric is a handle, so
/// the one kept here and the one in the registry count together.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

fn new_lateness_histogram() -> Histogram {
    Histogram::new(LATENESS_BUCKETS)
}

impl Events {
    /// A fresh registry (one per application, so tests do not share counters).
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("order_timeout");
        // A table: one registration per metric, in the order /metrics lists them.
        let events = Self {
            timeouts: registered(
                &mut registry,
                "timeouts_handled",
                "Timeout messages handled, by kind and outcome (applied, not_applicable, not_yet_due, parked)",
                Family::<Labels2, Counter>::default(),
            ),
            lateness: registered(
                &mut registry,
                "lateness_seconds",
                "Time from an order's deadline to the committed transition, by kind",
                Family::<Labels1, Histogram, fn() -> Histogram>::new_with_constructor(
                    new_lateness_histogram,
                ),
            ),
            deliveries: registered(
                &mut registry,
                "deliveries",
                "Deliveries received, by queue role",
                Family::<Labels1, Counter>::default(),
            ),
            redeliveries: registered(
                &mut registry,
                "redeliveries",
                "Deliveries flagged redelivered by the broker, by queue role",
                Family::<Labels1, Counter>::default(),
            ),
            parked: registered(
                &mut registry,
                "parked_messages",
                "Messages parked, by reason and component",
                Family::<Labels2, Counter>::default(),
            ),
            sweeper_catches: registered(
                &mut registry,
                "sweeper_catches",
                "Orders the sweeper handled because no message did (a lost or late timer), by kind",
                Family::<Labels1, Counter>::default(),
            ),
            orders_created: registered(
                &mut registry,
                "orders_created",
                "Orders created at checkout",
                Counter::default(),
            ),
            checkouts_rejected: registered(
                &mut registry,
                "checkouts_rejected",
                "Checkouts refused, by reason",
                Family::<Labels1, Counter>::default(),
            ),
            checkouts_replayed: registered(
                &mut registry,
                "checkouts_replayed",
                "Checkouts answered with the order an earlier request with the same Idempotency-Key created",
                Counter::default(),
            ),
            http_refused: registered(
                &mut registry,
                "http_requests_refused",
                "HTTP requests answered 503 by the server's limits, by reason (overloaded, timeout)",
                Family::<Labels1, Counter>::default(),
            ),
            actions: registered(
                &mut registry,
                "order_actions",
                "Client actions (pay, ship, confirm, cancel), by outcome (done, refused)",
                Family::<Labels2, Counter>::default(),
            ),
            late_payments: registered(
                &mut registry,
                "late_payments",
                "Payments for orders already cancelled or past their window (a refund may be due)",
                Counter::default(),
            ),
            outbox_published: registered(
                &mut registry,
                "outbox_published",
                "Outbox rows published and confirmed by the broker",
                Counter::default(),
            ),
            outbox_publish_failures: registered(
                &mut registry,
                "outbox_publish_failures",
                "Outbox publishes not confirmed (retried)",
                Counter::default(),
            ),
            outbox_backlog: registered(
                &mut registry,
                "outbox_backlog",
                "Outbox rows waiting to be published",
                Gauge::default(),
            ),
            outbox_oldest_age: registered(
                &mut registry,
                "outbox_oldest_age_seconds",
                "Age of the oldest unpublished outbox row",
                Gauge::<f64, std::sync::atomic::AtomicU64>::default(),
            ),
            outbox_set_aside: registered(
                &mut registry,
                "outbox_set_aside",
                "Outbox rows set aside for an operator (refused by the broker too often, or unpublishable); the sweeper still keeps their deadlines",
                Gauge::default(),
            ),
            consumer_pauses: registered(
                &mut registry,
                "consumer_pauses",
                "Times a component paused because the database failed, by role",
                Family::<Labels1, Counter>::default(),
            ),
            broker_connects: registered(
                &mut registry,
                "broker_connects",
                "Broker connections established, by role",
                Family::<Labels1, Counter>::default(),
            ),
            broker_disconnects: registered(
                &mut registry,
                "broker_disconnects",
                "Broker connections lost, by role",
                Family::<Labels1, Counter>::default(),
            ),
            held: registered(
                &mut registry,
                "held_messages",
                "Early messages held in memory until their deadline",
                Gauge::default(),
            ),
            redelayed: registered(
                &mut registry,
                "redelayed_messages",
                "Early messages sent back to wait, by kind",
                Family::<Labels1, Counter>::default(),
            ),
            waiting_timers: registered(
                &mut registry,
                "waiting_timers",
                "Timers waiting in each delay stage that exists in the vhost (ttl: the level queues; plugin: the delayed-message exchange), read from the broker's management API every 5 s; absent while it cannot be read",
                Family::<Labels1, Gauge>::default(),
            ),
            auth_refused: registered(
                &mut registry,
                "http_auth_refused",
                "HTTP requests refused before any handler ran, by reason (missing_token, invalid_token, insufficient_scope)",
                Family::<Labels1, Counter>::default(),
            ),
            registry,
            stages_unreadable: AtomicBool::new(false),
            database_unready: AtomicBool::new(false),
        };
        // Both series exist from the start, so a rate over them is never empty.
        for reason in ["overloaded", "timeout"] {
            let _ = events.http_refused.get_or_create(&[("reason", reason)]);
        }
        Arc::new(events)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// A checkout created an order.
    pub fn order_created(&self, id: OrderId, deadline: &str) {
        self.orders_created.inc();
        tracing::debug!(order_id = %id, pay_deadline = deadline, "order created");
    }

    /// A checkout was refused (`insufficient_stock`, `unknown_sku`,
    /// `idempotency_key_reused`).
    pub fn checkout_rejected(&self, reason: &'static str, detail: &str) {
        self.checkouts_rejected
            .get_or_create(&[("reason", reason)])
            .inc();
        tracing::info!(reason, detail, "checkout refused");
    }

    /// A checkout with an Idempotency-Key already used for the same request
    /// was answered with the order that request created; nothing was reserved.
    pub fn checkout_replayed(&self, id: OrderId) {
        self.checkouts_replayed.inc();
        tracing::info!(order_id = %id, "checkout replayed for its idempotency key");
    }

    /// The HTTP server refused a request: `overloaded` (too many in flight,
    /// answered at once) or `timeout` (it took longer than
    /// `http.request_timeout` and was dropped).
    pub fn request_refused(&self, reason: &'static str, path: &str) {
        self.http_refused.get_or_create(&[("reason", reason)]).inc();
        if reason == "timeout" {
            tracing::warn!(reason, path, "HTTP request timed out");
        } else {
            // A flood would repeat this line for every request: the counter says it.
            tracing::debug!(reason, path, "HTTP request refused");
        }
    }

    /// A client's action changed an order.
    pub fn order_changed(&self, id: OrderId, action: Action) {
        self.actions
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
        self.actions
            .get_or_create(&[("action", action.as_str()), ("outcome", "refused")])
            .inc();
        if late_payment {
            self.late_payments.inc();
            tracing::warn!(order_id = %id, status = status.as_str(), outcome = "late_payment", "late payment for a cancelled order; refund it");
        } else {
            tracing::info!(order_id = %id, action = action.as_str(), status = status.as_str(), outcome = "refused", "action refused");
        }
    }

    /// An HTTP request was refused by authentication (never with the token
    /// itself: a wrong one may be a real one of another system, or a typo of
    /// ours). Logged at debug: anyone who reaches the port can cause it.
    pub fn auth_refused(&self, reason: &'static str, method: &str, path: &str) {
        self.auth_refused.get_or_create(&[("reason", reason)]).inc();
        tracing::debug!(
            reason,
            method,
            path,
            "HTTP request refused by authentication"
        );
    }

    /// A delivery arrived on a queue role (`ingest`, `payment`, …).
    pub fn delivery(&self, role: &'static str, redelivered: bool) {
        self.deliveries.get_or_create(&[("queue", role)]).inc();
        if redelivered {
            self.redeliveries.get_or_create(&[("queue", role)]).inc();
        }
    }

    /// A timeout transition committed.
    pub fn timeout_applied(
        &self,
        kind: TimeoutKind,
        id: OrderId,
        lateness_ms: i64,
        by: &'static str,
    ) {
        self.timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "applied")])
            .inc();
        self.lateness
            .get_or_create(&[("kind", kind.as_str())])
            .observe(lateness_ms.max(0) as f64 / 1000.0);
        tracing::info!(order_id = %id, kind = kind.as_str(), lateness_ms, by, outcome = "applied", "timeout applied");
    }

    /// A timeout found nothing to do (the order moved on, or a duplicate message).
    pub fn timeout_not_applicable(&self, kind: TimeoutKind, id: OrderId, status: &str) {
        self.timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "not_applicable")])
            .inc();
        tracing::debug!(order_id = %id, kind = kind.as_str(), status, outcome = "not_applicable", "timeout not applicable");
    }

    /// A timeout arrived before the deadline in the database.
    pub fn timeout_early(&self, kind: TimeoutKind, id: OrderId, remaining: Duration, held: bool) {
        self.timeouts
            .get_or_create(&[("kind", kind.as_str()), ("outcome", "not_yet_due")])
            .inc();
        if !held {
            self.redelayed
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
        self.held.inc_by(delta);
    }

    /// A message was parked.
    pub fn parked(
        &self,
        park: &Park,
        by: &'static str,
        routing_key: &str,
        kind: Option<TimeoutKind>,
    ) {
        self.parked
            .get_or_create(&[("reason", park.reason.as_str()), ("by", by)])
            .inc();
        if let Some(kind) = kind {
            self.timeouts
                .get_or_create(&[("kind", kind.as_str()), ("outcome", "parked")])
                .inc();
        }
        tracing::warn!(reason = park.reason.as_str(), detail = %park.detail, by, routing_key, "message parked");
    }

    /// The sweeper applied a transition no message had applied.
    pub fn sweeper_catch(&self, kind: TimeoutKind, id: OrderId, lateness_ms: i64) {
        self.sweeper_catches
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
        self.timeout_applied(kind, id, lateness_ms, "sweeper");
        tracing::warn!(order_id = %id, kind = kind.as_str(), lateness_ms, "sweeper caught an order its timer missed");
    }

    /// Outbox rows were published and confirmed.
    pub fn outbox_published(&self, n: u64) {
        self.outbox_published.inc_by(n);
        tracing::debug!(rows = n, "outbox rows published");
    }

    /// Outbox rows were not confirmed; they are tried again after a wait.
    pub fn outbox_failed(&self, n: u64, error: &str) {
        self.outbox_publish_failures.inc_by(n);
        tracing::warn!(rows = n, error, "outbox publish not confirmed; will retry");
    }

    /// Outbox rows were set aside; no relay takes them again.
    pub fn outbox_set_aside(&self, ids: &[i64], reason: &str) {
        self.outbox_set_aside.inc_by(ids.len() as i64);
        tracing::error!(
            outbox_ids = ?ids,
            reason,
            "outbox rows set aside: no relay publishes them again (the sweeper still applies their timeouts); see the README to put them back"
        );
    }

    /// The outbox now.
    pub fn outbox_backlog(&self, state: OutboxState, now: Millis) {
        self.outbox_backlog.set(state.waiting as i64);
        let age = state.oldest.map(|o| now.since(o)).unwrap_or_default();
        self.outbox_oldest_age.set(age.as_secs_f64());
        self.outbox_set_aside.set(state.set_aside as i64);
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

    /// The database refused one order's timeout in a sweep; the next sweep tries again.
    pub fn sweeper_refused(&self, kind: TimeoutKind, id: OrderId, error: &str) {
        tracing::error!(
            order_id = %id,
            kind = kind.as_str(),
            error,
            "the database refused this order's timeout; the next sweep tries again"
        );
    }

    /// Names an earlier version declared without this version's safety nets
    /// (alternate and dead-letter exchanges into `parked`).
    pub fn earlier_topology(&self, names: &[String]) {
        tracing::warn!(
            names = %names.join(", "),
            "declared by an earlier version without an alternate or dead-letter exchange into parked:              a message that finds no queue there is dropped instead of parked;              `order-timeout doctor` and the README (Upgrading) say how to add them"
        );
    }

    /// The database failed; `role` pauses for `backoff`.
    pub fn paused(&self, role: &'static str, error: &str, backoff: Duration) {
        self.consumer_pauses.get_or_create(&[("role", role)]).inc();
        tracing::warn!(
            role,
            error,
            backoff_ms = backoff.as_millis() as u64,
            "database unavailable; pausing"
        );
    }

    /// The delay stages were read: timers in each (`None`: no such stage).
    pub fn stages_read(&self, ttl: Option<u64>, plugin: Option<u64>) {
        for (stage, timers) in [("ttl", ttl), ("plugin", plugin)] {
            match timers {
                Some(n) => {
                    self.waiting_timers
                        .get_or_create(&[("stage", stage)])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
                None => {
                    self.waiting_timers.remove(&[("stage", stage)]);
                }
            }
        }
        if self.stages_unreadable.swap(false, Ordering::Relaxed) {
            tracing::info!(?ttl, ?plugin, "delay stages readable again");
        }
    }

    /// The delay stages could not be read from the management API at `base`.
    pub fn stages_unreadable(&self, base: &str, error: &str) {
        self.waiting_timers.clear();
        if !self.stages_unreadable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                management_api = base,
                error,
                "cannot read the timers waiting in the delay stages (amqp.management_url); the waiting_timers gauge is withdrawn until it can"
            );
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
    pub fn broker_connected(&self, role: &'static str, name: &str) {
        self.broker_connects.get_or_create(&[("role", role)]).inc();
        tracing::info!(role, connection = name, "connected to the broker");
    }

    /// A broker connection was lost or could not be made.
    pub fn broker_lost(&self, role: &'static str, error: &str, retry_in: Duration) {
        self.broker_disconnects
            .get_or_create(&[("role", role)])
            .inc();
        tracing::warn!(
            role,
            error,
            retry_in_ms = retry_in.as_millis() as u64,
            "broker connection lost; reconnecting"
        );
    }
}

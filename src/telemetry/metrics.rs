//! Every metric the service exports, in one table: its name, help and type,
//! in the order `/metrics` lists them. [`super::Telemetry`] feeds them.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

pub(super) type Labels1 = [(&'static str, &'static str); 1];
pub(super) type Labels2 = [(&'static str, &'static str); 2];

/// Lateness buckets in seconds: from a millisecond to a minute.
const LATENESS_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The registry and a handle on each metric in it.
pub(super) struct Metrics {
    registry: Registry,

    pub(super) timeouts: Family<Labels2, Counter>,
    pub(super) lateness: Family<Labels1, Histogram, fn() -> Histogram>,
    pub(super) deliveries: Family<Labels1, Counter>,
    pub(super) redeliveries: Family<Labels1, Counter>,
    pub(super) parked: Family<Labels2, Counter>,
    pub(super) sweeper_catches: Family<Labels1, Counter>,
    pub(super) catch_ups: Family<Labels1, Counter>,
    pub(super) unreadable_ids: Family<Labels2, Counter>,
    pub(super) orders_created: Counter,
    pub(super) checkouts_rejected: Family<Labels1, Counter>,
    pub(super) checkouts_replayed: Counter,
    pub(super) http_refused: Family<Labels1, Counter>,
    pub(super) actions: Family<Labels2, Counter>,
    pub(super) late_payments: Counter,
    pub(super) outbox_published: Counter,
    pub(super) outbox_publish_failures: Counter,
    pub(super) outbox_backlog: Gauge,
    pub(super) outbox_oldest_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) outbox_set_aside: Gauge,
    pub(super) events_published: Family<Labels1, Counter>,
    pub(super) events_publish_failures: Counter,
    pub(super) events_backlog: Gauge,
    pub(super) events_oldest_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) events_set_aside: Gauge,
    pub(super) consumer_pauses: Family<Labels1, Counter>,
    pub(super) broker_connects: Family<Labels1, Counter>,
    pub(super) broker_disconnects: Family<Labels1, Counter>,
    pub(super) held: Gauge,
    pub(super) redelayed: Family<Labels1, Counter>,
    pub(super) waiting_timers: Family<Labels1, Gauge>,
    pub(super) auth_refused: Family<Labels1, Counter>,
    pub(super) delay_mode: Family<Labels1, Gauge>,
    pub(super) time_zone: Family<Labels2, Gauge>,
    pub(super) shadow: Family<Labels2, Gauge>,
    pub(super) blocked: Family<Labels1, Counter>,
    pub(super) task_panics: Family<Labels1, Counter>,
    pub(super) pending_timeouts: Family<Labels1, Gauge>,
    pub(super) overdue_orders: Family<Labels1, Gauge>,
    pub(super) oldest_overdue: Family<Labels1, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(super) due_next: Family<Labels2, Gauge>,
    pub(super) database_up: Gauge,
    pub(super) broker_connected: Family<Labels1, Gauge>,
    pub(super) paused: Family<Labels1, Gauge>,
    pub(super) pause_reads_failed: Counter,
    pub(super) config_reloads: Family<Labels1, Counter>,
    pub(super) clock_skew: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) audit_rows_deleted: Counter,
    pub(super) build_info: Family<Labels2, Gauge>,
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

impl Metrics {
    /// A fresh registry (one per application, so tests do not share counters).
    // A table: one registration per metric, so it is as long as the list.
    pub(super) fn new() -> Self {
        let mut registry = Registry::with_prefix("order_timeout");
        // Counted by the exporter, process-wide; only read here.
        registry.register(
            "trace_spans_lost",
            "Spans lost in trace exports that failed (the OTLP receiver refused a batch, did not answer or could not be reached); each batch is sent once",
            crate::traces::SPANS_LOST.clone(),
        );
        Self {
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
            catch_ups: registered(
                &mut registry,
                "catch_ups",
                "Orders a consumer applied when already due, woken by other deliveries of the kind, ahead of their own message, by kind",
                Family::<Labels1, Counter>::default(),
            ),
            unreadable_ids: registered(
                &mut registry,
                "unreadable_ids",
                "Overdue rows of a mapped table whose id the service cannot read (empty, surrounding blanks, control characters, over 255 bytes), passed over by the sweeper, by kind and reason, counted once per sweep round",
                Family::<Labels2, Counter>::default(),
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
            events_published: registered(
                &mut registry,
                "events_published",
                "Domain events published to <prefix>.events and confirmed by the broker, by event",
                Family::<Labels1, Counter>::default(),
            ),
            events_publish_failures: registered(
                &mut registry,
                "events_publish_failures",
                "Domain event publishes not confirmed (retried)",
                Counter::default(),
            ),
            events_backlog: registered(
                &mut registry,
                "events_backlog",
                "Domain events (rows of order_timeout_events) waiting to be published",
                Gauge::default(),
            ),
            events_oldest_age: registered(
                &mut registry,
                "events_oldest_age_seconds",
                "Age of the oldest unpublished domain event",
                Gauge::<f64, std::sync::atomic::AtomicU64>::default(),
            ),
            events_set_aside: registered(
                &mut registry,
                "events_set_aside",
                "Domain events set aside for an operator (refused by the broker too often)",
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
                "Timers waiting in each delay stage that exists in the vhost (ttl: the level queues; plugin: the delayed-message exchange; native: the wait queue, held timers included), read from the broker's management API every 5 s; absent while it cannot be read",
                Family::<Labels1, Gauge>::default(),
            ),
            auth_refused: registered(
                &mut registry,
                "http_auth_refused",
                "HTTP requests refused before any handler ran, by reason (missing_token, invalid_token, insufficient_scope)",
                Family::<Labels1, Counter>::default(),
            ),
            delay_mode: registered(
                &mut registry,
                "delay_mode",
                "The delay mode in effect (1 for the mode chosen at start-up: ttl, plugin or native)",
                Family::<Labels1, Gauge>::default(),
            ),
            time_zone: registered(
                &mut registry,
                "time_zone_check",
                "Mapped kinds read in the database server's default zone (no mapping.time_zone): 1 for the state of the check, by kind and state (unconfirmed: held until a new order confirms the zone; fits; off: a new order's stamp lay more than 15 minutes from now in that zone, held)",
                Family::<Labels2, Gauge>::default(),
            ),
            shadow: registered(
                &mut registry,
                "shadow_orders",
                "Shadow mode (orders.shadow): orders by kind and outcome: would_close (the service would have closed them), shop_closed_after_us, shop_closed_before_us, closed_early (the shop closed them before their deadline), still_open (would have closed, the shop has not changed them), disagreements (would have closed, the shop moved them elsewhere)",
                Family::<Labels2, Gauge>::default(),
            ),
            blocked: registered(
                &mut registry,
                "broker_blocked",
                "Times the broker blocked a connection's publishing (a memory or disk alarm), by role",
                Family::<Labels1, Counter>::default(),
            ),
            task_panics: registered(
                &mut registry,
                "task_panics",
                "Tasks that panicked (a bug: the role restarts on a new connection), by role",
                Family::<Labels1, Counter>::default(),
            ),
            pending_timeouts: registered(
                &mut registry,
                "pending_timeouts",
                "Orders waiting for a timeout of the kind (in the status it acts on), read from the database every metrics.gauge_interval; absent while it cannot be read",
                Family::<Labels1, Gauge>::default(),
            ),
            overdue_orders: registered(
                &mut registry,
                "overdue_orders",
                "Of those, the orders past their deadline by more than metrics.overdue_after: must be 0",
                Family::<Labels1, Gauge>::default(),
            ),
            oldest_overdue: registered(
                &mut registry,
                "oldest_overdue_seconds",
                "How long ago the deadline of the oldest overdue order of the kind passed (0 when none is)",
                Family::<Labels1, Gauge<f64, std::sync::atomic::AtomicU64>>::default(),
            ),
            due_next: registered(
                &mut registry,
                "due_next",
                "Orders of the kind whose deadline falls within the next window (1m, 5m, 60m) by the database's clock, in the status the timeout acts on",
                Family::<Labels2, Gauge>::default(),
            ),
            database_up: registered(
                &mut registry,
                "database_up",
                "1 when the last reading of the order gauges succeeded, 0 when the database failed it",
                Gauge::default(),
            ),
            broker_connected: registered(
                &mut registry,
                "broker_connected",
                "1 while a broker role's connection is up, 0 while it is down or reconnecting, by role",
                Family::<Labels1, Gauge>::default(),
            ),
            paused: registered(
                &mut registry,
                "paused",
                "1 while a role is paused on this instance, by a pause shared by every instance or by one of this instance only (the consumer of a kind, router, relay, sweeper), 0 while it runs, by role",
                Family::<Labels1, Gauge>::default(),
            ),
            pause_reads_failed: registered(
                &mut registry,
                "pause_reads_failed",
                "Readings of the pauses shared by every instance (order_timeout_pauses) that failed; meanwhile the last known pauses stay in effect",
                Counter::default(),
            ),
            config_reloads: registered(
                &mut registry,
                "config_reloads",
                "Settings reloads (SIGHUP, POST /admin/reload), by outcome: applied, unchanged, refused",
                Family::<Labels1, Counter>::default(),
            ),
            clock_skew: registered(
                &mut registry,
                "clock_skew_seconds",
                "How far this host's clock is ahead of the database's (negative: behind), measured every metrics.gauge_interval; what is due is decided by the database's clock either way",
                Gauge::<f64, std::sync::atomic::AtomicU64>::default(),
            ),
            audit_rows_deleted: registered(
                &mut registry,
                "audit_rows_deleted",
                "Rows of order_timeout_audit deleted by this instance because they were older than audit.retention",
                Counter::default(),
            ),
            build_info: registered(
                &mut registry,
                "build_info",
                "Always 1: the release (version) and the commit this instance was built from",
                Family::<Labels2, Gauge>::default(),
            ),
            registry,
        }
    }

    /// The Prometheus text exposition.
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

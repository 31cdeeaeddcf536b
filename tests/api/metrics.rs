//! Every metric docs/operations.md documents shows up after one timeout cycle that
//! touches each of them, with the value the cycle gives it: counters equal
//! what the test did, the histogram is consistent, gauges are back at rest.

use std::time::Duration;

use lapin::types::FieldTable;
use order_timeout::amqp::topology::LEVELS;
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::dashboard::check_dashboard_metrics;
use crate::helpers::*;

/// Metric names in the metrics table of docs/operations.md (`order_timeout_` prefixed).
fn documented_metrics() -> Vec<String> {
    let page = std::fs::read_to_string(repo_path("docs/operations.md")).unwrap();
    let table: Vec<&str> = page
        .lines()
        .skip_while(|l| !l.starts_with("| metric | labels | meaning |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let names: Vec<String> = table
        .iter()
        .flat_map(|row| {
            let first = row.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|n| format!("order_timeout_{}", n.split('{').next().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        names.len() >= 19,
        "docs/operations.md metrics table parsed: {names:?}"
    );
    names
}

/// Sample lines of the exposition: (name, labels text, value).
fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            Some((name.to_string(), labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Sum of the samples of `name` whose labels contain every fragment.
fn sum(samples: &[(String, String, f64)], name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|f| l.contains(f)))
        .map(|(_, _, v)| v)
        .sum()
}

/// One timeout cycle touching every documented metric, then the exposition:
/// each documented metric is there, counters equal what the test did, the
/// histogram is consistent, gauges are back to rest. Also the dashboard check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_after_a_timeout_cycle() {
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "1s")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "1s")
            .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms")
            // Long enough to hold an early message while the test closes connections.
            .env("ORDER_TIMEOUT__CONSUMER__HOLD_MAX", "5s"),
    )
    .await;
    app.put_stock("A", 100).await;
    let far = refusals_payments_and_early_timeouts(&app).await;
    sweeper_catches_a_lost_timer(&app).await;
    database_failure_pauses_the_consumer(&app, &far).await;
    // Every committed transition's domain event is out (the relay publishes
    // them after commit, at its own pace).
    wait_until(
        Duration::from_secs(10),
        "10 domain events published",
        || async {
            let published = app
                .metric("order_timeout_events_published_total", &[])
                .await;
            let backlog = app.metric("order_timeout_events_backlog", &[]).await;
            (published == 10.0 && backlog == 0.0).then_some(())
        },
    )
    .await;
    // The order gauges read again since the database came back: the far
    // order waits for its payment, the paid one for its shipping.
    wait_until(
        Duration::from_secs(10),
        "the order gauges at rest",
        || async {
            let pending = |kind: &'static str| {
                let app = &app;
                async move {
                    let label = format!("kind=\"{kind}\"");
                    app.metric("order_timeout_pending_timeouts", &[&label])
                        .await
                }
            };
            (pending("payment").await == 1.0 && pending("fulfillment").await == 1.0).then_some(())
        },
    )
    .await;

    let text = app.metrics().await;
    let s = samples(&text);
    assert_every_documented_metric_sampled(&text, &s);
    assert_counters_match_the_cycle(&s);
    assert_deliveries_and_connections(&s);
    assert_lateness_histogram(&s);
    assert_eq!(app.drain_parked().await.len(), 1);
    check_dashboard_metrics(&s).await;
}

/// A refused call and checkout; a paid order, a cancelled one paid too late,
/// an early timeout re-delayed, an early one held (then redelivered when every
/// connection is closed), and a message that breaks the contract. Returns the
/// order due in an hour, whose timeouts are early.
async fn refusals_payments_and_early_timeouts(app: &TestApp) -> String {
    // Refused by authentication: a call without a token.
    let refused = api_client(None)
        .put(format!("{}/inventory/A", app.base))
        .json(&json!({"available": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Refused checkout.
    let (status, _) = app.checkout(&[("A", 1000)], "2s").await;
    assert_eq!(status, 409);
    // Paid in time: its payment timeout finds nothing to do.
    let paid = app.order(&[("A", 1)], "2s").await;
    assert_eq!(app.post(&paid, "pay").await.0, 200);
    // Cancelled by its timeout, then paid too late.
    let cancelled = app.order(&[("A", 2)], "2s").await;
    // Far from due: a 1 ms timeout for it is early by more than hold_max, so re-delayed.
    let far = app.order(&[("A", 1)], "1h").await;
    app.publish_timeout(&far, "payment", 1).await;
    // A second, early timeout for an order due in 6 s: it arrives after 3 s and is
    // held in memory (unacked) for the rest.
    let held = app.order(&[("A", 1)], "6s").await;
    app.publish_timeout(&held, "payment", 3000).await;
    // Breaks the contract (no x-delay): parked by the router.
    let body = json!({"order_id": far, "kind": "payment"}).to_string();
    app.publish_raw("payment", FieldTable::default(), body.as_bytes())
        .await;

    // Once the 2 s orders are decided, the one held message is the early one.
    app.wait_status(&cancelled, "cancelled", Duration::from_secs(10))
        .await;
    wait_not_applicable(app, 1.0, "the paid order's timeout").await;
    wait_until(
        Duration::from_secs(10),
        "the early message held",
        || async { (app.metric("order_timeout_held_messages", &[]).await == 1.0).then_some(()) },
    )
    .await;
    assert_eq!(app.metric("order_timeout_outbox_backlog", &[]).await, 0.0);
    // The held message is unacked: closing the consumer's connection makes the
    // broker redeliver it, flagged. Every role reconnects.
    close_each_service_connection(&app.vhost).await;
    app.wait_status(&held, "cancelled", Duration::from_secs(15))
        .await;
    let (status, _) = app.post(&cancelled, "pay").await;
    assert_eq!(status, 409, "late payment");
    // Every message of those orders is decided: the paid order's and the held
    // order's duplicate find nothing to do.
    wait_not_applicable(app, 2.0, "duplicates decided").await;
    far
}

/// Waits until `n` payment timeouts found nothing to do.
async fn wait_not_applicable(app: &TestApp, n: f64, what: &str) {
    wait_until(Duration::from_secs(10), what, || async {
        (app.metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"not_applicable\""],
        )
        .await
            == n)
            .then_some(())
    })
    .await;
}

/// The sweeper's catch: the timer of this order is lost (levels purged) while
/// it waits in level 01 (3 s = 2 + 1: it enters at the 2 s level).
async fn sweeper_catches_a_lost_timer(app: &TestApp) {
    let swept = app.order(&[("A", 1)], "3s").await;
    wait_until(Duration::from_secs(3), "timer in level 01", || async {
        (app.queue_depth(&app.names.level(1)).await >= 1).then_some(())
    })
    .await;
    // The level it waits in first, before its 2 s there are up; then the rest.
    purge_queue(&app.vhost, &app.names.level(1)).await;
    for l in 0..LEVELS {
        purge_queue(&app.vhost, &app.names.level(l)).await;
    }
    let order = app
        .wait_status(&swept, "cancelled", Duration::from_secs(15))
        .await;
    assert!(
        ms(&order, "cancelled_at") - ms(&order, "pay_deadline") >= 1000,
        "after the grace"
    );
}

/// A database failure pauses the consumer: the orders table goes away for a
/// moment while an early timeout of `far` comes in; once it is back, the
/// message is decided: early, re-delayed (the second re-delay of the cycle).
async fn database_failure_pauses_the_consumer(app: &TestApp, far: &str) {
    app.ctx
        .db
        .execute_unprepared("ALTER TABLE orders RENAME TO orders_away")
        .await
        .unwrap();
    app.publish_timeout(far, "payment", 1).await;
    // The order gauges cannot be read: withdrawn, and the database said down.
    wait_until(Duration::from_secs(10), "database_up 0", || async {
        let text = app.metrics().await;
        (text.contains("\norder_timeout_database_up 0\n")
            && !text.contains("\norder_timeout_pending_timeouts{"))
        .then_some(())
    })
    .await;
    wait_until(Duration::from_secs(10), "a consumer pause", || async {
        (app.metric("order_timeout_consumer_pauses_total", &["role=\"payment\""])
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    app.ctx
        .db
        .execute_unprepared("ALTER TABLE orders_away RENAME TO orders")
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "second re-delay", || async {
        (app.metric("order_timeout_redelayed_messages_total", &[])
            .await
            == 2.0)
            .then_some(())
    })
    .await;
}

/// Each metric in the table of docs/operations.md has a TYPE line and at least one sample
/// (`_count` for a histogram).
fn assert_every_documented_metric_sampled(text: &str, s: &[(String, String, f64)]) {
    for name in documented_metrics() {
        let base = name.trim_end_matches("_total");
        assert!(
            text.contains(&format!("# TYPE {base} ")),
            "{name}: no TYPE line in /metrics"
        );
        let sample =
            if base.ends_with("_seconds") && text.contains(&format!("# TYPE {base} histogram")) {
                format!("{base}_count")
            } else {
                name.clone()
            };
        assert!(
            s.iter().any(|(n, _, _)| *n == sample),
            "{name}: documented but no sample after the cycle"
        );
    }
}

/// The counters and gauges, against what the cycle did.
fn assert_counters_match_the_cycle(s: &[(String, String, f64)]) {
    let eq = |name: &str, labels: &[&str], want: f64| {
        assert_eq!(sum(s, name, labels), want, "{name}{labels:?}");
    };
    eq("order_timeout_orders_created_total", &[], 5.0);
    eq(
        "order_timeout_checkouts_rejected_total",
        &["reason=\"insufficient_stock\""],
        1.0,
    );
    eq(
        "order_timeout_order_actions_total",
        &["action=\"pay\"", "outcome=\"done\""],
        1.0,
    );
    eq(
        "order_timeout_order_actions_total",
        &["action=\"pay\"", "outcome=\"refused\""],
        1.0,
    );
    eq("order_timeout_late_payments_total", &[], 1.0);
    eq(
        "order_timeout_http_auth_refused_total",
        &["reason=\"missing_token\""],
        1.0,
    );
    // cancelled, held and swept.
    eq(
        "order_timeout_timeouts_handled_total",
        &["kind=\"payment\"", "outcome=\"applied\""],
        3.0,
    );
    eq(
        "order_timeout_timeouts_handled_total",
        &["kind=\"payment\"", "outcome=\"not_applicable\""],
        2.0,
    );
    eq(
        "order_timeout_timeouts_handled_total",
        &["kind=\"payment\"", "outcome=\"parked\""],
        1.0,
    );
    // The far order twice, the held order at least once (more when its
    // redelivery or any sub-second early arrival was held too).
    assert!(
        sum(
            s,
            "order_timeout_timeouts_handled_total",
            &["outcome=\"not_yet_due\""]
        ) >= 3.0
    );
    eq(
        "order_timeout_redelayed_messages_total",
        &["kind=\"payment\""],
        2.0,
    );
    eq(
        "order_timeout_parked_messages_total",
        &["reason=\"missing_delay\"", "by=\"router\""],
        1.0,
    );
    eq("order_timeout_parked_messages_total", &[], 1.0);
    eq(
        "order_timeout_sweeper_catches_total",
        &["kind=\"payment\""],
        1.0,
    );
    // Payment timeouts of 5 orders and the paid order's fulfillment timeout.
    eq("order_timeout_outbox_published_total", &[], 6.0);
    eq("order_timeout_outbox_publish_failures_total", &[], 0.0);
    eq("order_timeout_outbox_backlog", &[], 0.0);
    eq("order_timeout_outbox_oldest_age_seconds", &[], 0.0);
    eq("order_timeout_held_messages", &[], 0.0);
    // The domain events of the cycle: 5 orders created, 1 paid, 3 cancelled
    // (two timeouts, one sweep), 1 late payment; nothing else.
    for (event, n) in [
        ("created", 5.0),
        ("paid", 1.0),
        ("cancelled", 3.0),
        ("late_payment", 1.0),
        ("shipped", 0.0),
        ("completed", 0.0),
        ("fulfillment_overdue", 0.0),
    ] {
        let label = format!("event=\"{event}\"");
        eq("order_timeout_events_published_total", &[&label], n);
    }
    eq("order_timeout_events_published_total", &[], 10.0);
    eq("order_timeout_events_publish_failures_total", &[], 0.0);
    eq("order_timeout_events_backlog", &[], 0.0);
    eq("order_timeout_events_oldest_age_seconds", &[], 0.0);
    eq("order_timeout_events_set_aside", &[], 0.0);
    // The order gauges: the far order waits for its payment, the paid one
    // for its shipping; none overdue.
    eq("order_timeout_database_up", &[], 1.0);
    for (kind, pending) in [("payment", 1.0), ("fulfillment", 1.0), ("receipt", 0.0)] {
        let label = format!("kind=\"{kind}\"");
        eq("order_timeout_pending_timeouts", &[&label], pending);
        eq("order_timeout_overdue_orders", &[&label], 0.0);
        eq("order_timeout_oldest_overdue_seconds", &[&label], 0.0);
        // Falling due within a window: within every longer one too, and
        // never more than wait.
        let due = |window: &str| {
            sum(
                s,
                "order_timeout_due_next",
                &[&label, &format!("window=\"{window}\"")],
            )
        };
        assert!(
            due("1m") <= due("5m") && due("5m") <= due("60m") && due("60m") <= pending,
            "{kind}: due_next 1m {} 5m {} 60m {}, {pending} pending",
            due("1m"),
            due("5m"),
            due("60m")
        );
    }
    // The far order's hour-long window ends within the next 60 minutes, not 5.
    eq(
        "order_timeout_due_next",
        &["kind=\"payment\"", "window=\"60m\""],
        1.0,
    );
    eq(
        "order_timeout_due_next",
        &["kind=\"payment\"", "window=\"5m\""],
        0.0,
    );
}

/// Deliveries through each queue, consumer pauses, and each broker role's
/// connects and disconnects (every role was closed once and reconnected).
fn assert_deliveries_and_connections(s: &[(String, String, f64)]) {
    // Through ingest: the 3 published by the test and 1 during the outage. The
    // relay's 6 and the consumer's re-delays go straight into the delay stage.
    assert_eq!(
        sum(s, "order_timeout_deliveries_total", &["queue=\"ingest\""])
            - sum(s, "order_timeout_redeliveries_total", &["queue=\"ingest\""]),
        4.0
    );
    assert!(sum(s, "order_timeout_deliveries_total", &["queue=\"payment\""]) >= 6.0);
    assert!(
        sum(
            s,
            "order_timeout_redeliveries_total",
            &["queue=\"payment\""]
        ) >= 1.0
    );
    assert!(sum(s, "order_timeout_consumer_pauses_total", &[]) >= 1.0);
    for role in ["relay", "router", "consumer"] {
        let label = format!("role=\"{role}\"");
        let connects = sum(s, "order_timeout_broker_connects_total", &[&label]);
        let disconnects = sum(s, "order_timeout_broker_disconnects_total", &[&label]);
        assert!(disconnects >= 1.0, "{role} disconnects");
        assert!(connects >= disconnects + 1.0, "{role}: {connects} connects");
        assert_eq!(
            sum(s, "order_timeout_broker_connected", &[&label]),
            1.0,
            "{role} connected"
        );
    }
}

/// The lateness histogram: one observation per applied timeout, buckets
/// cumulative up to +Inf = count, the sum within what the buckets allow.
fn assert_lateness_histogram(s: &[(String, String, f64)]) {
    let count = sum(
        s,
        "order_timeout_lateness_seconds_count",
        &["kind=\"payment\""],
    );
    let total = sum(
        s,
        "order_timeout_lateness_seconds_sum",
        &["kind=\"payment\""],
    );
    assert_eq!(count, 3.0);
    let buckets: Vec<f64> = s
        .iter()
        .filter(|(n, l, _)| n == "order_timeout_lateness_seconds_bucket" && l.contains("payment"))
        .map(|(_, _, v)| *v)
        .collect();
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "cumulative: {buckets:?}"
    );
    assert_eq!(buckets.last().copied(), Some(count), "+Inf bucket");
    // The swept order was at least the grace late; none more than a minute.
    assert!((1.0..180.0).contains(&total), "lateness sum {total}");
    assert!(
        sum(s, "order_timeout_lateness_seconds_bucket", &["le=\"0.5\""]) >= 1.0,
        "message-driven cancellations are prompt"
    );
}

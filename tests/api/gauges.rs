//! The on-call gauges, read from the orders table: with nothing closing the
//! orders (no relay publishing their timers, no sweeper), overdue ones show in
//! `overdue_orders` and age in `oldest_overdue_seconds`, and both go back to 0
//! once their timeouts are applied. And `broker_connected` follows each role.

use std::time::Duration;

use sea_orm::ConnectionTrait;

use crate::helpers::*;
use crate::mapped::{mall_mapping, mall_schema};
use crate::outages::{broker_away, broker_up};

/// Orders overdue by more than this count in `overdue_orders` (the tests' threshold).
const OVERDUE_AFTER: &str = "2s";

/// `pending_timeouts`, `overdue_orders` and `oldest_overdue_seconds` of a kind.
async fn gauges(app: &TestApp, kind: &str) -> (f64, f64, f64) {
    let text = app.metrics().await;
    let label = format!("kind=\"{kind}\"");
    let read = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        read("order_timeout_pending_timeouts"),
        read("order_timeout_overdue_orders"),
        read("order_timeout_oldest_overdue_seconds"),
    )
}

/// Waits until the gauges of `kind` are `pending` and `overdue`; returns the oldest age.
async fn wait_gauges(
    app: &TestApp,
    kind: &str,
    pending: f64,
    overdue: f64,
    within: Duration,
) -> f64 {
    wait_until(
        within,
        &format!("{kind}: {pending} pending, {overdue} overdue"),
        || async {
            let (p, o, oldest) = gauges(app, kind).await;
            (p == pending && o == overdue).then_some(oldest)
        },
    )
    .await
}

/// The service's own orders: three with a 3 s window, two with an hour.
/// Nothing publishes their timers (`relay.enabled = false`) and nothing
/// sweeps, so the short ones stay overdue until the test publishes their
/// timeouts itself.
async fn owned(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms")
            .env("ORDER_TIMEOUT__METRICS__OVERDUE_AFTER", OVERDUE_AFTER),
    )
    .await;
    app.put_stock("A", 100).await;
    let mut short = Vec::new();
    for _ in 0..3 {
        short.push(app.order(&[("A", 1)], "3s").await);
    }
    let long = [
        app.order(&[("A", 1)], "1h").await,
        app.order(&[("A", 1)], "1h").await,
    ];
    // Seen before the short ones are overdue (3 s + 2 s after checkout).
    let oldest = wait_gauges(&app, "payment", 5.0, 0.0, Duration::from_secs(4)).await;
    assert_eq!(oldest, 0.0, "no overdue order, no age");
    assert_eq!(app.metric("order_timeout_database_up", &[]).await, 1.0);
    // The relay does not run here: no series says it is connected or not.
    assert!(
        !app.metrics()
            .await
            .contains("order_timeout_broker_connected{role=\"relay\"}")
    );

    // A paid order waits for its shipping, then a shipped one for its receipt.
    assert_eq!(app.post(&long[1], "pay").await.0, 200);
    wait_gauges(&app, "fulfillment", 1.0, 0.0, Duration::from_secs(5)).await;
    assert_eq!(app.post(&long[1], "ship").await.0, 200);
    wait_gauges(&app, "receipt", 1.0, 0.0, Duration::from_secs(5)).await;
    wait_gauges(&app, "fulfillment", 0.0, 0.0, Duration::from_secs(5)).await;

    // Past the deadline by more than the threshold: overdue, and the oldest ages.
    let first = wait_gauges(&app, "payment", 4.0, 3.0, Duration::from_secs(15)).await;
    assert!(
        (2.0..60.0).contains(&first),
        "the oldest is past its deadline by more than the threshold: {first}"
    );
    wait_until(
        Duration::from_secs(10),
        "the oldest overdue ages",
        || async {
            let (_, _, oldest) = gauges(&app, "payment").await;
            (oldest >= first + 1.0).then_some(())
        },
    )
    .await;

    // Their timeouts applied, nothing is overdue any more.
    for id in &short {
        app.publish_timeout(id, "payment", 1).await;
    }
    for id in &short {
        app.wait_status(id, "cancelled", Duration::from_secs(15))
            .await;
    }
    let oldest = wait_gauges(&app, "payment", 1.0, 0.0, Duration::from_secs(10)).await;
    assert_eq!(oldest, 0.0);
    assert_eq!(gauges(&app, "receipt").await, (1.0, 0.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_orders_until_closed_sqlite() {
    owned(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_orders_until_closed_postgres() {
    owned(Backend::Postgres).await;
}

/// A shop's own table (the mall of `mapped`): three unpaid orders created an
/// hour ago (their 3 s payment window long past), two created an hour ahead.
/// Ages come from the database's clock. Receipt is mapped, fulfillment is
/// not: it has no series.
async fn mapped(backend: Backend) {
    let app = spawn_app(mall_mapping(
        Spawn::new(backend, DelayMode::Ttl)
            .setup(&mall_schema(backend))
            .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms")
            .env("ORDER_TIMEOUT__METRICS__OVERDUE_AFTER", OVERDUE_AFTER)
            // Known, not guessed: orders stamped an hour ahead would
            // otherwise be taken for a zone mismatch (`zones`).
            .env("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "+00:00"),
        false,
    ))
    .await;
    let (past, ahead) = match backend {
        Backend::Postgres => (
            "LOCALTIMESTAMP - INTERVAL '1 hour'",
            "LOCALTIMESTAMP + INTERVAL '1 hour'",
        ),
        _ => ("NOW() - INTERVAL 1 HOUR", "NOW() + INTERVAL 1 HOUR"),
    };
    for n in 1..=5 {
        let created = if n <= 3 { past } else { ahead };
        app.ctx
            .db
            .execute_unprepared(&format!(
                "INSERT INTO oms_order (id, member_id, order_sn, status, create_time) \
                 VALUES ({n}, {n}, 'sn-{n}', 0, {created})"
            ))
            .await
            .unwrap();
    }
    let oldest = wait_gauges(&app, "payment", 5.0, 3.0, Duration::from_secs(10)).await;
    assert!(
        (3500.0..3700.0).contains(&oldest),
        "an hour past the deadline, by the database's clock: {oldest}"
    );
    assert_eq!(gauges(&app, "receipt").await, (0.0, 0.0, 0.0));
    let text = app.metrics().await;
    assert!(
        !text.contains("order_timeout_pending_timeouts{kind=\"fulfillment\"}"),
        "a kind the mapping does not map has no series"
    );

    for n in 1..=3 {
        app.publish_timeout(&n.to_string(), "payment", 1).await;
    }
    let oldest = wait_gauges(&app, "payment", 2.0, 0.0, Duration::from_secs(15)).await;
    assert_eq!(oldest, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_orders_until_closed_mapped_postgres() {
    mapped(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_orders_until_closed_mapped_mariadb() {
    mapped(Backend::MariaDb).await;
}

/// `broker_connected` is 1 for each role while it is connected, 0 while its
/// connection is refused, and 1 again once the broker takes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connected_follows_each_role() {
    const ROLES: [&str; 3] = ["relay", "router", "consumer"];
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let connected = |up: f64| {
        let app = &app;
        async move {
            for role in ROLES {
                let role = format!("role=\"{role}\"");
                if app.metric("order_timeout_broker_connected", &[&role]).await != up {
                    return None;
                }
            }
            Some(())
        }
    };
    wait_until(Duration::from_secs(5), "every role connected", || {
        connected(1.0)
    })
    .await;

    broker_away(&app).await;
    wait_until(Duration::from_secs(20), "every role disconnected", || {
        connected(0.0)
    })
    .await;

    broker_up(&app.vhost).await;
    wait_until(Duration::from_secs(30), "every role reconnected", || {
        connected(1.0)
    })
    .await;
}

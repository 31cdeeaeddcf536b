//! One clock decides: the database's. A second `serve` whose host clock runs
//! two minutes fast (libfaketime, monotonic time left alone, as a stepped NTP
//! or a VM restored from a snapshot would leave it) works beside an instance
//! on the true time: none of 500 orders is cancelled before its deadline by
//! the database's clock, no payment inside its window is refused, every stamp
//! is the database's, and each instance shows its skew in the gauge.
//!
//! "Early" is judged by a trigger of the test's own, which stamps each
//! cancellation with PostgreSQL's `clock_timestamp()` as the row changes: the
//! service's own stamps cannot be the judge of the service's clock.

use std::path::Path;
use std::time::Duration;

use order_timeout_harness::{Process, Serve};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde_json::Value;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// libfaketime's multi-threaded build (the service runs tokio's threads).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// How far the fast instance's clock is ahead.
const AHEAD_S: i64 = 120;

/// The payment windows spread over 2 s to 2 s plus this (all well under
/// [`AHEAD_S`]).
const MAX_SPREAD_MS: usize = 18_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_instance_consuming_beside_a_true_one_is_never_early() {
    two_clocks(Roles::Both, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_instance_alone_running_the_sweeper_and_the_relay_is_never_early() {
    two_clocks(Roles::FastRelaysAndSweeps, 500).await;
}

/// Which instance runs the relay and the sweeper (both consume).
#[derive(Clone, Copy, PartialEq)]
enum Roles {
    /// Both instances run everything.
    Both,
    /// Only the fast one relays and sweeps.
    FastRelaysAndSweeps,
}

async fn two_clocks(roles: Roles, n: usize) {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: `make tools` installs Debian's faketime"
    );
    // A sweeper with no grace is the first to cancel early on a fast clock.
    let sweeper = [
        ("ORDER_TIMEOUT__SWEEPER__INTERVAL", "500ms".to_string()),
        ("ORDER_TIMEOUT__SWEEPER__GRACE", "0s".to_string()),
        ("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "1s".to_string()),
    ];
    let true_runs_all = roles == Roles::Both;
    let mut spawn = Spawn::new(Backend::Postgres, DelayMode::Ttl)
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", true_runs_all.to_string())
        .env("ORDER_TIMEOUT__RELAY__ENABLED", true_runs_all.to_string());
    for (k, v) in &sweeper {
        spawn = spawn.env(k, v.clone());
    }
    let app = spawn_app(spawn).await;
    observe_cancellations(&app.ctx.db).await;
    let (_fast, fast) = fast_instance(&app).await;
    app.put_stock("A", 10_000).await;

    // Orders through both instances, windows of 2 to 20 s: every one of
    // them far inside the fast clock's lead, so that a host clock asked what
    // is due would find each overdue at once (no longer window would make
    // the check any stronger, only slower). Every tenth order with a window
    // of 8 s or more is paid through the fast instance 2 s before its
    // deadline by the database's clock.
    let mut orders = Vec::with_capacity(n);
    let mut payments = Vec::new();
    for i in 0..n {
        let window_ms = 2_000 + (i * MAX_SPREAD_MS / n) as i64;
        let via = if i % 2 == 0 { &app.api } else { &fast };
        let (status, order) = via.checkout(&[("A", 1)], &format!("{window_ms}ms")).await;
        assert_eq!(status, 201, "{order}");
        let deadline = ms(&order, "pay_deadline");
        assert_eq!(
            deadline - ms(&order, "created_at"),
            window_ms,
            "the window is the deadline less the creation stamp: {order}"
        );
        let id = order["id"].as_str().unwrap().to_string();
        if i % 10 == 5 && window_ms >= 8_000 {
            let (db, fast, id) = (app.ctx.db.clone(), fast.clone(), id.clone());
            payments.push(tokio::spawn(async move {
                let wait = deadline - 2_000 - db_now_ms(&db).await;
                tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
                let (status, order) = fast.post(&id, "pay").await;
                (id, status, order)
            }));
        }
        orders.push(id);
    }
    let mut paid = Vec::new();
    for payment in payments {
        let (id, status, order) = payment.await.unwrap();
        assert_eq!(
            (status, order["status"].as_str()),
            (200, Some("paid")),
            "a payment 2 s inside its window is taken: {order}"
        );
        assert!(
            order.get("late_payment_at").is_none_or(Value::is_null),
            "{order}"
        );
        paid.push(id);
    }
    assert!(paid.len() >= n / 20, "{} payments made", paid.len());

    let unpaid: Vec<String> = orders.into_iter().filter(|id| !paid.contains(id)).collect();
    for id in &unpaid {
        app.wait_status(id, "cancelled", Duration::from_secs(90))
            .await;
    }
    assert_cancelled_once(&app, &unpaid).await;

    // Judged by the database's own clock, at the moment each row changed.
    let db = &app.ctx.db;
    let early = count(
        db,
        "SELECT COUNT(*) FROM orders o JOIN observed_cancel c ON c.order_id = o.id \
         WHERE c.at_ms < o.pay_deadline_ms",
    )
    .await;
    let observed = count(db, "SELECT COUNT(*) FROM observed_cancel").await;
    assert_eq!(observed, unpaid.len() as i64, "one cancellation each");
    assert_eq!(
        early, 0,
        "cancelled before the deadline by the database's clock"
    );
    // No stamp of the service's lies ahead of the database's clock.
    let now = db_now_ms(db).await;
    let ahead = count(
        db,
        &format!(
            "SELECT COUNT(*) FROM orders WHERE created_at_ms > {now} OR updated_at_ms > {now} \
             OR COALESCE(cancelled_at_ms, 0) > {now} OR COALESCE(paid_at_ms, 0) > {now}"
        ),
    )
    .await;
    assert_eq!(ahead, 0, "stamps from a clock ahead of the database's");
    assert_eq!(app.stock("A").await["reserved"], 0);

    // Each instance shows its own skew (read every second).
    let true_skew = skew(&app.api)
        .await
        .expect("the true instance's skew gauge");
    let fast_skew = skew(&fast).await.expect("the fast instance's skew gauge");
    assert!(
        true_skew.abs() < 1.0,
        "the true instance's skew: {true_skew}"
    );
    assert!(
        (fast_skew - AHEAD_S as f64).abs() < 2.0,
        "the fast instance's skew: {fast_skew}"
    );
}

/// The instance's `clock_skew_seconds` gauge.
async fn skew(api: &Api) -> Option<f64> {
    api.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix("order_timeout_clock_skew_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

/// A `serve` child on the app's settings whose host clock is [`AHEAD_S`]
/// ahead; it relays and sweeps in any case, and consumes like the app.
async fn fast_instance(app: &TestApp) -> (Process, Api) {
    let serve = Serve::new(BIN)
        .envs(app.env.clone())
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__RELAY__ENABLED", "true")
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", format!("+{AHEAD_S}s"))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .instance(format!("fast-{}", app.vhost));
    let (child, api) = start_ready(app, serve).await;
    // The fast clock is in effect in the child: its skew gauge says so
    // before any order is placed.
    wait_until(Duration::from_secs(15), "the fast clock seen", || async {
        skew(&api)
            .await
            .filter(|v| *v > (AHEAD_S - 5) as f64)
            .map(|_| ())
    })
    .await;
    (child, api)
}

/// The test's own record of when each order was cancelled, by the
/// database's clock at the moment the row changed.
async fn observe_cancellations(db: &DatabaseConnection) {
    for sql in [
        "CREATE TABLE observed_cancel (order_id BIGINT PRIMARY KEY, at_ms BIGINT NOT NULL)",
        "CREATE FUNCTION observe_cancel() RETURNS trigger AS $$ BEGIN \
         INSERT INTO observed_cancel VALUES \
         (NEW.id, CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)); \
         RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER observe_cancel AFTER UPDATE OF status ON orders FOR EACH ROW \
         WHEN (NEW.status = 'cancelled' AND OLD.status <> 'cancelled') \
         EXECUTE FUNCTION observe_cancel()",
    ] {
        db.execute_unprepared(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// PostgreSQL's clock, in ms since the epoch.
async fn db_now_ms(db: &DatabaseConnection) -> i64 {
    count(
        db,
        "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
    )
    .await
}

/// The one BIGINT a query returns.
async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        sql,
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
    .expect("a row")
    .try_get_by_index::<i64>(0)
    .unwrap()
}

//! A rolling upgrade: the previous release's binary and this one side by side
//! on one PostgreSQL database and one vhost while timers come due, the old
//! one stopped mid-run. Nothing is lost, nothing doubled, none early, stock
//! is conserved and nothing is parked.
//!
//! Ignored by default: it needs the previous release's binary, which
//! `make test-upgrade` builds (scripts/previous-release.sh) and names in
//! [`PREVIOUS_BIN`].

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use order_timeout::amqp::topology::Names;
use order_timeout_harness::{Process, Serve, Signal};
use sea_orm::{ConnectionTrait, Database, Statement};
use serde_json::json;

use crate::helpers::*;
use crate::migrations::{Logs, version_line};

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The previous release's `order-timeout`.
const PREVIOUS_BIN: &str = "ORDER_TIMEOUT_PREVIOUS_BIN";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: make test-upgrade"]
async fn rolling_upgrade_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, rolling_upgrade).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: make test-upgrade"]
async fn rolling_upgrade_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, rolling_upgrade).await
}

/// The previous release's binary, or a failure saying how to get one: a
/// test that cannot run must not pass.
fn previous_bin() -> String {
    let path = std::env::var(PREVIOUS_BIN).unwrap_or_else(|_| {
        panic!(
            "{PREVIOUS_BIN} is not set: run `make test-upgrade` (UPGRADE_FROM=TAG for another \
             release), or build one with `scripts/previous-release.sh TAG` and set {PREVIOUS_BIN} \
             to the path it prints"
        )
    });
    assert!(
        std::path::Path::new(&path).is_file(),
        "{PREVIOUS_BIN}={path}: no such file (scripts/previous-release.sh TAG builds it)"
    );
    path
}

/// Starts one `serve` child on `fresh`'s settings and waits until it is ready.
async fn start(fresh: &Fresh, bin: &str, name: &str, log: &std::path::Path) -> (Process, Api) {
    let mut child = Serve::new(bin)
        .envs(fresh.env.clone())
        .instance(name)
        .log(log)
        .start()
        .expect("serve starts");
    child
        .wait_ready(&fresh.http, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{name} ({bin}) becomes ready: {e}\n{}", child.log_text()));
    let api = fresh.api(&child);
    (child, api)
}

/// Places `n` orders of one unit of A through `api`, windows from `from` on
/// in steps of 150 ms (twenty different ones).
async fn place(api: &Api, n: usize, from: u64, ids: &mut Vec<String>) {
    for i in 0..n as u64 {
        let window = format!("{}ms", from + (i % 20) * 150);
        ids.push(api.order(&[("A", 1)], &window).await);
    }
}

async fn rolling_upgrade(backend: Backend, mode: DelayMode) {
    let previous = previous_bin();
    let (old_version, new_version) = (version_line(&previous), version_line(BIN));
    assert_ne!(
        old_version, new_version,
        "{PREVIOUS_BIN} must be an earlier build than the one under test"
    );
    eprintln!(
        "rolling upgrade ({}): {old_version} → {new_version}",
        mode.as_str()
    );
    let fresh = fresh(
        Spawn::new(backend, mode)
            // Both instances sweep too, as they would in production.
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "1s")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "2s"),
    )
    .await;
    let logs = Logs(
        ["old", "new"]
            .iter()
            .map(|n| std::env::temp_dir().join(format!("{}-{n}.log", fresh.vhost)))
            .collect(),
    );

    // The previous release alone, on an empty database it migrates itself.
    let (mut old, a) = start(&fresh, &previous, "old", &logs.0[0]).await;
    a.put_stock("A", 1000).await;
    let mut ids = Vec::new();
    place(&a, 40, 2000, &mut ids).await;

    // The new one joins: it migrates what is new while the old one runs.
    let (mut new, b) = start(&fresh, BIN, "new", &logs.0[1]).await;
    // Orders through both while the first ones come due.
    for i in 0..80 {
        let via = if i % 2 == 0 { &a } else { &b };
        place(via, 1, 1500 + (i % 20) * 150, &mut ids).await;
    }
    // Both apply timeouts side by side before the old one goes.
    let applied = |api: &Api| {
        let api = api.clone();
        async move {
            api.metric(
                "order_timeout_timeouts_handled_total",
                &["outcome=\"applied\""],
            )
            .await
        }
    };
    wait_until(
        Duration::from_secs(20),
        "both instances apply timeouts",
        || async { (applied(&a).await >= 1.0 && applied(&b).await >= 1.0).then_some(()) },
    )
    .await;

    // The old one is stopped mid-run (its drain); the new one finishes alone.
    old.signal(Signal::Term).unwrap();
    let (status, took) = old
        .wait(Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", old.log_text()));
    assert!(
        status.success(),
        "the old instance's SIGTERM: {status}\n{}",
        old.log_text()
    );
    eprintln!("old instance drained in {took:?}");
    place(&b, 40, 1500, &mut ids).await;

    for id in &ids {
        b.wait_status(id, "cancelled", Duration::from_secs(30))
            .await;
    }
    // Each order cancelled once, not before its deadline (both stamped by
    // the database's clock), by its timer or the sweeper.
    assert_cancelled_once(&b, &ids).await;
    assert_cancellations_in_the_database(fresh.database_url(), ids.len()).await;
    assert_eq!(
        b.stock("A").await,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0}),
        "stock conserved"
    );
    assert_eq!(
        b.metric("order_timeout_parked_messages_total", &[]).await,
        0.0,
        "the new instance parked nothing"
    );
    assert_eq!(parked(&fresh).await, 0, "nothing parked by either");
    new.stop();
}

/// One `cancelled` event per order, each caused by a timer or the sweeper,
/// as the database's own event table holds them.
async fn assert_cancellations_in_the_database(url: &str, orders: usize) {
    let db = Database::connect(url).await.expect("database reachable");
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) AS events, COUNT(DISTINCT order_id) AS orders, \
             COUNT(*) FILTER (WHERE cause NOT IN ('timeout', 'sweeper')) AS other \
             FROM order_events WHERE event = 'cancelled'",
        ))
        .await
        .unwrap()
        .unwrap();
    let count = |c: &str| row.try_get::<i64>("", c).unwrap() as usize;
    assert_eq!(
        (count("events"), count("orders"), count("other")),
        (orders, orders, 0),
        "(cancelled events, orders cancelled, not by a timer or the sweeper)"
    );
    db.close().await.ok();
}

/// Messages in the parked queue (over AMQP: no statistics lag).
async fn parked(fresh: &Fresh) -> u32 {
    let conn = Connection::connect(&fresh.amqp_url, ConnectionProperties::default())
        .await
        .expect("test connection");
    let channel = conn.create_channel().await.unwrap();
    let names = Names::new("order.timeouts");
    let queue = channel
        .queue_declare(
            names.parked().as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    conn.close(200, "done".into()).await.ok();
    queue.message_count()
}

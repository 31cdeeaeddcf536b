//! `audit.retention`: the audit trail a mapped table's transitions write
//! (`order_timeout_audit`) is deleted past its retention, by the database's
//! clock, a bounded batch per statement; recent rows stay; `off` keeps it.
//!
//! No timer is involved (the rows are written by the test, as years of
//! transitions would have), so each backend runs in one delay mode.

use std::time::Duration;

use order_timeout::db;
use order_timeout::domain::Millis;

use crate::helpers::*;
use crate::mapped::{Shop, mall_mapping, mall_schema};

const DAY_MS: i64 = 86_400_000;

/// Writes `n` audit rows `age_ms` old by the database's clock (each a
/// millisecond older than the last), named `<tag><n>`.
async fn write_audit(app: &TestApp, shop: &Shop, backend: Backend, tag: &str, n: u32, age_ms: i64) {
    let now = db::clock::now(&app.ctx.db).await.unwrap().0;
    let at = now - age_ms;
    let rows = match backend {
        Backend::Postgres => format!("generate_series(1, {n}) AS s(seq)"),
        _ => format!("seq_1_to_{n} AS s"),
    };
    let id = match backend {
        Backend::Postgres => format!("'{tag}' || s.seq"),
        _ => format!("CONCAT('{tag}', s.seq)"),
    };
    shop.exec(
        &format!(
            "INSERT INTO order_timeout_audit (order_id, event, from_status, to_status, cause, at_ms) \
             SELECT {id}, 'order.cancelled', '0', '4', 'timeout', {at} - s.seq FROM {rows}"
        ),
        vec![],
    )
    .await;
}

/// How many audit rows have an id starting with `tag`.
async fn count(shop: &Shop, tag: &str) -> u64 {
    shop.one(
        &format!(
            "SELECT {} FROM order_timeout_audit WHERE order_id LIKE '{tag}%'",
            shop.text("COUNT(*)")
        ),
        vec![],
    )
    .await
    .parse()
    .unwrap()
}

async fn retention(backend: Backend) {
    // One delay mode: nothing waits in the broker.
    let spawn = Spawn::new(backend, DelayMode::Ttl)
        .setup(&mall_schema(backend))
        .env("ORDER_TIMEOUT__AUDIT__RETENTION", "off");
    let app = spawn_app(mall_mapping(spawn, backend == Backend::MariaDb)).await;
    let shop = Shop::open(&app, backend).await;

    // Forty days of history against a thirty-day retention: 12,345 rows
    // past it, and rows of yesterday and of a day short of it that stay.
    write_audit(&app, &shop, backend, "old", 12_345, 40 * DAY_MS).await;
    write_audit(&app, &shop, backend, "recent", 10, DAY_MS).await;
    write_audit(&app, &shop, backend, "edge", 5, 29 * DAY_MS).await;

    // One statement deletes one batch, oldest first, and says how many.
    let before = Millis(db::clock::now(&app.ctx.db).await.unwrap().0 - 30 * DAY_MS);
    let mut batches = Vec::new();
    loop {
        let n = db::store::delete_old_audit(&app.ctx.db, before, 5_000)
            .await
            .unwrap();
        batches.push(n);
        if n < 5_000 {
            break;
        }
    }
    assert_eq!(batches, [5_000, 5_000, 2_345]);
    assert_eq!(
        (
            count(&shop, "old").await,
            count(&shop, "recent").await,
            count(&shop, "edge").await
        ),
        (0, 10, 5)
    );

    // The service does it by itself, at start and then every round: an
    // instance with a retention deletes what is past it, counting each row;
    // the first, with `off`, never touched the trail.
    write_audit(&app, &shop, backend, "older", 7_000, 400 * DAY_MS).await;
    let second = app
        .spawn_variant(&[("ORDER_TIMEOUT__AUDIT__RETENTION", "30d".to_string())])
        .await;
    wait_until(
        Duration::from_secs(30),
        "the old audit rows deleted",
        || async {
            (second
                .metric("order_timeout_audit_rows_deleted_total", &[])
                .await
                == 7_000.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        (
            count(&shop, "older").await,
            count(&shop, "recent").await,
            count(&shop, "edge").await
        ),
        (0, 10, 5)
    );
    assert_eq!(
        app.metric("order_timeout_audit_rows_deleted_total", &[])
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_past_retention_are_deleted_postgres() {
    retention(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_past_retention_are_deleted_mariadb() {
    retention(Backend::MariaDb).await
}

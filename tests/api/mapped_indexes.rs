//! A mapped table in production: the statements the sweeper, the catch-up,
//! the deadline wake and the gauges send filter on the status and compare
//! the bare deadline column, so that one index per kind serves them;
//! `doctor` says which index that is and warns, with the statement that
//! creates it, while it is missing.
//!
//! None of these involves a timer in the broker (the reads are the
//! sweeper's, the catch-up's and the gauges', on the database alone), so
//! each runs in one delay mode.
//!
//! - `the_planner_uses_the_index`: 200,000 orders of the mall schema on
//!   PostgreSQL, analysed; the statements the service really sent (read
//!   back from `pg_stat_activity`) are explained before and after the index
//!   `doctor` asks for;
//! - `doctor_names_the_missing_index_*`: on MariaDB (and PostgreSQL above):
//!   a warning with the statement; run it, and the warning is gone.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use crate::helpers::*;
use crate::mapped::{Shop, mall_mapping, mall_schema};

/// The index `doctor` asks for on the mall's payment kind.
const PAYMENT_INDEX: &str = "oms_order_status_create_time_idx";
/// ... and on its receipt kind.
const RECEIPT_INDEX: &str = "oms_order_status_delivery_time_idx";

/// The statements `doctor` prints to create the missing indexes, in its order.
fn statements_advised(report: &str) -> Vec<String> {
    report
        .lines()
        .filter(|l| l.contains("WARN  indexes:"))
        .filter_map(|l| l.find("CREATE INDEX").map(|at| l[at..].to_string()))
        .collect()
}

/// The shop's table full of history: 200,000 orders, the newest 300 unpaid
/// (within their window), every other one completed long ago. Analysed, as
/// autovacuum would have done on a table this size.
fn mall_history() -> Vec<&'static str> {
    vec![
        "INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, create_time) \
         SELECT g, g % 5000, 'sn' || g, 10.00, CASE WHEN g > 199700 THEN 0 ELSE 3 END, \
         LOCALTIMESTAMP(0) - (200000 - g) * INTERVAL '20 seconds' \
         FROM generate_series(1, 200000) AS g",
        "ANALYZE oms_order",
    ]
}

/// Waits until the service has sent a statement on the kind's table that
/// contains every one of `parts` and binds only `$1`, and returns its text
/// as `pg_stat_activity` shows it.
async fn sent(shop: &Shop, parts: &[&str]) -> String {
    let what = format!("a statement with {parts:?} in pg_stat_activity");
    wait_until(Duration::from_secs(30), &what, || async {
        let rows = shop
            .db
            .query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT query FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            ))
            .await
            .ok()?;
        rows.iter()
            .filter_map(|row| row.try_get_by_index::<String>(0).ok())
            .find(|q| parts.iter().all(|p| q.contains(p)) && !q.contains("$2"))
    })
    .await
}

/// The plan PostgreSQL makes for `query`, a statement binding the status as
/// `$1`, executed for the status `0` (a prepared statement's first, custom
/// plan, as the service's own unnamed statements get).
async fn plan(shop: &Shop, query: &str) -> String {
    let txn = shop.db.begin().await.unwrap();
    txn.execute_unprepared(&format!("PREPARE timeout_read AS {query}"))
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    let rows = txn
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "EXPLAIN EXECUTE timeout_read(0)",
        ))
        .await
        .unwrap();
    // A prepared statement outlives the transaction, not the session.
    txn.execute_unprepared("DEALLOCATE timeout_read")
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    rows.iter()
        .map(|row| row.try_get_by_index::<String>(0).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a plan reads the table through `index` (an index scan, an
/// index-only scan or a bitmap of it).
fn through(plan: &str, index: &str) -> bool {
    plan.contains(&format!(" using {index}")) || plan.contains(&format!("Index Scan on {index}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planner_uses_the_index() {
    // One delay mode: only database reads are looked at.
    let mut setup = mall_schema(Backend::Postgres);
    setup.extend(mall_history());
    let spawn = Spawn::new(Backend::Postgres, DelayMode::Ttl)
        .setup(&setup)
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
        .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true")
        // Known, not guessed: the history is closed at once, with no new
        // order to confirm a guess first (`zones`).
        .env("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "+00:00");
    // A day to pay: the unpaid orders are waiting, none is due.
    let app =
        spawn_app(mall_mapping(spawn, false).env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "1d")).await;
    let shop = Shop::open(&app, Backend::Postgres).await;

    // The sweeper's and the catch-up's page, the gauges' count, the deadline
    // wake's next deadline: each on the bare column.
    let sweep = sent(
        &shop,
        &[
            "\"status\" = $1 AND \"create_time\" <= ",
            "ORDER BY \"id\" LIMIT",
        ],
    )
    .await;
    let gauge = sent(&shop, &["COUNT(CASE WHEN \"create_time\" <= "]).await;
    let wake = sent(&shop, &["WHERE \"create_time\" >= "]).await;
    // The gauges' deadlines ahead: grouped by the minute, bounded on the column.
    let ahead = sent(&shop, &["AS due_now FROM", "WHERE \"create_time\" < "]).await;
    for query in [&sweep, &wake, &ahead] {
        // The select list may compute the deadline; the conditions may not.
        let (_, conditions) = query.split_once(" WHERE ").unwrap();
        assert!(
            !conditions.contains("\"create_time\" +"),
            "a sum of the column, which no index serves: {query}"
        );
    }
    let before = plan(&shop, &sweep).await;
    assert!(
        before.contains("Seq Scan on oms_order"),
        "without the index the table is read whole:\n{before}"
    );

    // doctor: a warning per kind, with the statement; not a failure.
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    let advised = statements_advised(&report);
    assert_eq!(
        advised,
        [
            format!(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{PAYMENT_INDEX}\" ON \"oms_order\" (\"status\", \"create_time\")"
            ),
            format!(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{RECEIPT_INDEX}\" ON \"oms_order\" (\"status\", \"delivery_time\")"
            ),
        ],
        "{report}"
    );
    assert!(
        report.contains(
            "WARN  indexes: payment: no index of oms_order starts with (status, create_time)"
        ),
        "{report}"
    );
    // As the operator would: each statement on its own, outside a transaction.
    for statement in &advised {
        admin(&app.env["ORDER_TIMEOUT__DATABASE__URL"], statement).await;
    }
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    assert!(statements_advised(&report).is_empty(), "{report}");
    assert!(
        report.contains(&format!(
            "ok    indexes: payment: oms_order (status, create_time) is served by index {PAYMENT_INDEX}"
        )),
        "{report}"
    );

    // The same statements now read through the index; the gauge counts
    // every order in the status, which either index's first column finds.
    for (what, query, indexes) in [
        ("sweeper", &sweep, &[PAYMENT_INDEX][..]),
        ("wake", &wake, &[PAYMENT_INDEX]),
        ("gauge", &gauge, &[PAYMENT_INDEX, RECEIPT_INDEX]),
        ("deadlines ahead", &ahead, &[PAYMENT_INDEX]),
    ] {
        let after = plan(&shop, query).await;
        assert!(
            indexes.iter().any(|index| through(&after, index)),
            "the {what}'s read does not use {indexes:?}:\n{query}\n{after}"
        );
    }
    // The deadlines ahead are a range of the index, not the whole status.
    let after = plan(&shop, &ahead).await;
    assert!(
        after
            .lines()
            .any(|l| l.contains("Index Cond") && l.contains("create_time <")),
        "the deadlines ahead read a range of the index:\n{ahead}\n{after}"
    );
}

/// A partial index on the deadline's column, holding only the kind's
/// status, serves as well (PostgreSQL); `doctor` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_accepts_a_partial_index_postgres() {
    // One delay mode: doctor reads the catalog only.
    let mut setup = mall_schema(Backend::Postgres);
    setup.push("CREATE INDEX unpaid_by_age ON oms_order (create_time) WHERE status = 0");
    let spawn = Spawn::new(Backend::Postgres, DelayMode::Ttl).setup(&setup);
    let app = spawn_app(mall_mapping(spawn, false)).await;
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    assert!(
        report.contains(
            "ok    indexes: payment: oms_order (status, create_time) is served by index unpaid_by_age"
        ),
        "{report}"
    );
    // The receipt kind (status 2, delivery_time) still has none.
    assert_eq!(
        statements_advised(&report),
        [
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"oms_order_status_delivery_time_idx\" ON \"oms_order\" (\"status\", \"delivery_time\")"
        ],
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_the_missing_index_mariadb() {
    // One delay mode: doctor reads the catalog only.
    let spawn = Spawn::new(Backend::MariaDb, DelayMode::Ttl).setup(&mall_schema(Backend::MariaDb));
    let app = spawn_app(mall_mapping(spawn, true)).await;
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    let advised = statements_advised(&report);
    assert_eq!(
        advised,
        [
            "CREATE INDEX `oms_order_status_create_time_idx` ON `oms_order` (`status`, `create_time`) LOCK = NONE",
            "CREATE INDEX `oms_order_status_delivery_time_idx` ON `oms_order` (`status`, `delivery_time`) LOCK = NONE",
        ],
        "{report}"
    );
    for statement in &advised {
        admin(&app.env["ORDER_TIMEOUT__DATABASE__URL"], statement).await;
    }
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    assert!(statements_advised(&report).is_empty(), "{report}");
    for line in [
        "ok    indexes: payment: oms_order (status, create_time) is served by index oms_order_status_create_time_idx",
        "ok    indexes: receipt: oms_order (status, delivery_time) is served by index oms_order_status_delivery_time_idx",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
}

//! Leaving a cron job (docs/migrating-from-cron.md): the service and the
//! shop's cron side by side on the shop's own table, and `doctor`'s dry run
//! of what the first start closes.
//!
//! - `beside_a_cron`: while the service runs (timeouts, catch-up, sweeper),
//!   a cron-like loop keeps running the shop's own conditional cancel
//!   (`UPDATE shop_orders SET status = 'cancelled', cancelled_by = 'cron' …
//!   WHERE status = 'pending' AND deadline < now`) on waves of overdue and
//!   soon-due orders, and gives back the stock of exactly the rows its
//!   update changed. Every order is cancelled once: the service's wins (its
//!   audit rows) and the cron's (its column) are disjoint and add up to all;
//!   none before its deadline by the database's clock; each order's stock
//!   given back once, by its winner.
//! - `dry_run_mapped`, `dry_run_owned`: `doctor`'s counts per kind, oldest
//!   deadline and first ids against a table filled here; it changes nothing,
//!   and a sweep then takes exactly what it said.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, TransactionTrait};

use crate::helpers::*;
use crate::mapped::Shop;
use order_timeout::domain::Millis;

/// Per wave, orders already overdue when they appear (the cron's backlog),
/// and orders falling due over the next seconds.
const OVERDUE: i64 = 100;
const SOON: i64 = 100;

/// At most this many waves: another follows while one side has won nothing
/// yet (a race one side always wins shows nothing).
const WAVES: i64 = 4;

/// Each SKU's stock before any order.
const ON_HAND: i64 = 10_000;

/// The shop's tables: orders with a stored deadline and a column of the
/// cron's own, order lines, stock, and a log of every stock release (who
/// gave back which order's stock).
pub(crate) fn schema(backend: Backend) -> Vec<&'static str> {
    match backend {
        Backend::Postgres => vec![
            "CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, \
             deadline TIMESTAMPTZ(3) NOT NULL, confirm_by TIMESTAMPTZ(3), \
             cancelled_at TIMESTAMPTZ(3), cancelled_by VARCHAR(16), cron_run BIGINT)",
            "CREATE TABLE shop_order_lines (order_id BIGINT NOT NULL, sku BIGINT NOT NULL, qty INT NOT NULL)",
            "CREATE INDEX shop_order_lines_order ON shop_order_lines (order_id)",
            "CREATE TABLE shop_stock (sku BIGINT PRIMARY KEY, on_hand BIGINT NOT NULL, reserved BIGINT NOT NULL)",
            "CREATE TABLE shop_stock_moves (order_id BIGINT NOT NULL, by_whom VARCHAR(16) NOT NULL)",
            "INSERT INTO shop_stock VALUES (1, 10000, 0), (2, 10000, 0), (3, 10000, 0), (4, 10000, 0)",
        ],
        // Explicit defaults: no TIMESTAMP column gets ON UPDATE CURRENT_TIMESTAMP.
        _ => vec![
            "CREATE TABLE shop_orders (id BIGINT NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL, \
             deadline TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
             confirm_by TIMESTAMP(3) NULL DEFAULT NULL, \
             cancelled_at TIMESTAMP(3) NULL DEFAULT NULL, cancelled_by VARCHAR(16), cron_run BIGINT)",
            "CREATE TABLE shop_order_lines (order_id BIGINT NOT NULL, sku BIGINT NOT NULL, qty INT NOT NULL, \
             INDEX shop_order_lines_order (order_id))",
            "CREATE TABLE shop_stock (sku BIGINT NOT NULL PRIMARY KEY, on_hand BIGINT NOT NULL, reserved BIGINT NOT NULL)",
            "CREATE TABLE shop_stock_moves (order_id BIGINT NOT NULL, by_whom VARCHAR(16) NOT NULL)",
            "INSERT INTO shop_stock VALUES (1, 10000, 0), (2, 10000, 0), (3, 10000, 0), (4, 10000, 0)",
        ],
    }
}

/// The mapping: `pending` → `cancelled` at `deadline`, stamped in
/// `cancelled_at`; the lines' quantities leave `reserved` for `on_hand`; the
/// service's own release statement logs each release as the service's.
/// Shipped orders are completed at `confirm_by`.
pub(crate) fn mapping(spawn: Spawn, backend: Backend) -> Spawn {
    let id = match backend {
        Backend::Postgres => "$1",
        _ => "?",
    };
    spawn
        .env("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped")
        .env("ORDER_TIMEOUT__MAPPING__TABLE", "shop_orders")
        .env("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "status")
        .env("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "cancelled_at")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "pending")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "cancelled")
        .env(
            "ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN",
            "deadline",
        )
        .env("ORDER_TIMEOUT__MAPPING__RECEIPT__FROM", "shipped")
        .env("ORDER_TIMEOUT__MAPPING__RECEIPT__TO", "completed")
        .env(
            "ORDER_TIMEOUT__MAPPING__RECEIPT__DEADLINE_COLUMN",
            "confirm_by",
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_TABLE",
            "shop_order_lines",
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_ORDER_COLUMN",
            "order_id",
        )
        .env("ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_SKU_COLUMN", "sku")
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_QUANTITY_COLUMN",
            "qty",
        )
        .env("ORDER_TIMEOUT__MAPPING__STOCK__TABLE", "shop_stock")
        .env("ORDER_TIMEOUT__MAPPING__STOCK__ID_COLUMN", "sku")
        .env("ORDER_TIMEOUT__MAPPING__STOCK__RESERVED_COLUMN", "reserved")
        .env("ORDER_TIMEOUT__MAPPING__STOCK__AVAILABLE_COLUMN", "on_hand")
        .env(
            "ORDER_TIMEOUT__MAPPING__RELEASE_SQL",
            format!("INSERT INTO shop_stock_moves (order_id, by_whom) VALUES ({id}, 'service')"),
        )
}

/// The lines of order `n`: two SKUs, `(sku, quantity)`.
pub(crate) fn lines(n: i64) -> [(i64, i64); 2] {
    [(n % 4 + 1, n % 3 + 1), ((n + 1) % 4 + 1, 1)]
}

/// The database's now plus `ms` (negative: before), as an SQL expression.
fn at(backend: Backend, ms: i64) -> String {
    match backend {
        Backend::Postgres => format!("(CURRENT_TIMESTAMP + INTERVAL '{ms} milliseconds')"),
        _ => format!("(NOW(3) + INTERVAL {} MICROSECOND)", ms * 1000),
    }
}

/// The shop's checkout for many orders at once, in one transaction: each
/// `(id, status, deadline in ms from now)`, its lines, its reserved stock.
pub(crate) async fn place(shop: &Shop, backend: Backend, orders: &[(i64, &str, i64)]) {
    let rows: Vec<String> = orders
        .iter()
        .map(|(n, status, ms)| format!("({n}, '{status}', {})", at(backend, *ms)))
        .collect();
    let line_rows: Vec<String> = orders
        .iter()
        .flat_map(|(n, _, _)| lines(*n).map(|(sku, q)| format!("({n}, {sku}, {q})")))
        .collect();
    let mut reserved: BTreeMap<i64, i64> = BTreeMap::new();
    for (n, status, _) in orders {
        if *status == "pending" {
            for (sku, q) in lines(*n) {
                *reserved.entry(sku).or_default() += q;
            }
        }
    }
    let txn = shop.db.begin().await.unwrap();
    shop.exec_on(
        &txn,
        &format!(
            "INSERT INTO shop_orders (id, status, deadline) VALUES {}",
            rows.join(", ")
        ),
        vec![],
    )
    .await;
    shop.exec_on(
        &txn,
        &format!(
            "INSERT INTO shop_order_lines (order_id, sku, qty) VALUES {}",
            line_rows.join(", ")
        ),
        vec![],
    )
    .await;
    for (sku, q) in reserved {
        shop.exec_on(
            &txn,
            &format!(
                "UPDATE shop_stock SET on_hand = on_hand - {q}, reserved = reserved + {q} WHERE sku = {sku}"
            ),
            vec![],
        )
        .await;
    }
    txn.commit().await.unwrap();
}

/// What the cron did.
#[derive(Debug, Default)]
struct CronRun {
    /// The orders its update changed.
    won: BTreeSet<i64>,
    /// How many times it ran.
    rounds: u64,
    /// Runs the database refused (a deadlock, a lock timeout): rolled
    /// back, their orders left for the next run.
    refused: Vec<String>,
}

/// The shop's cron, run every 20 ms until `stop` (every minute,
/// compressed): each run is one transaction of [`cancel_due`].
async fn cron(db: DatabaseConnection, backend: Backend, stop: Arc<AtomicBool>) -> CronRun {
    let mut run = CronRun::default();
    while !stop.load(Ordering::SeqCst) {
        run.rounds += 1;
        match cancel_due(&db, backend, run.rounds, &Rule::default()).await {
            Ok(won) => run.won.extend(won),
            Err(e) => run.refused.push(format!("run {}: {e}", run.rounds)),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run
}

/// A shop's own rule of what its cron cancels, besides the deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    /// It cancels orders whose deadline falls before now plus this (a cron
    /// that closes early, by a wrong window or comparison; 0: on time).
    pub(crate) early_ms: i64,
    /// Orders with an id from this one on are spared (a shop's exception).
    pub(crate) spare_from: i64,
}

impl Default for Rule {
    fn default() -> Self {
        Self {
            early_ms: 0,
            spare_from: i64::MAX,
        }
    }
}

/// One run of the cron, as a shop writes it: lock the pending orders past
/// their deadline in id order, cancel them with one conditional `UPDATE`
/// (marked with the run, as a shop without `UPDATE … RETURNING` does), and
/// give back the stock of exactly the rows that update changed, stock rows
/// locked in SKU order, in the same transaction. Returns those orders.
pub(crate) async fn cancel_due(
    db: &DatabaseConnection,
    backend: Backend,
    round: u64,
    rule: &Rule,
) -> Result<Vec<i64>, sea_orm::DbErr> {
    let now = match backend {
        Backend::Postgres => "CURRENT_TIMESTAMP",
        _ => "NOW(3)",
    };
    // The cron's "now" for the deadline: its own, early or not.
    let due = at(backend, rule.early_ms);
    let spared = format!("id < {}", rule.spare_from);
    let txn = db.begin().await?;
    let exec = |sql: String| {
        let txn = &txn;
        async move { txn.execute_unprepared(&sql).await }
    };
    exec(format!(
        "SELECT id FROM shop_orders WHERE status = 'pending' AND deadline < {due} AND {spared} ORDER BY id FOR UPDATE"
    ))
    .await?;
    let changed = exec(format!(
        "UPDATE shop_orders SET status = 'cancelled', cancelled_by = 'cron', cron_run = {round}, \
         cancelled_at = {now} WHERE status = 'pending' AND deadline < {due} AND {spared}"
    ))
    .await?
    .rows_affected();
    let mut won = Vec::new();
    if changed > 0 {
        let mine = format!("SELECT id FROM shop_orders WHERE cron_run = {round}");
        for row in txn
            .query_all_raw(sea_orm::Statement::from_string(
                txn.get_database_backend(),
                mine.clone(),
            ))
            .await?
        {
            won.push(row.try_get_by_index::<i64>(0)?);
        }
        exec("SELECT sku FROM shop_stock ORDER BY sku FOR UPDATE".to_string()).await?;
        let given_back = format!(
            "(SELECT sku, SUM(qty) AS q FROM shop_order_lines WHERE order_id IN ({mine}) GROUP BY sku) r"
        );
        exec(match backend {
            Backend::Postgres => format!(
                "UPDATE shop_stock s SET reserved = s.reserved - r.q, on_hand = s.on_hand + r.q \
                 FROM {given_back} WHERE s.sku = r.sku"
            ),
            _ => format!(
                "UPDATE shop_stock s JOIN {given_back} ON s.sku = r.sku \
                 SET s.reserved = s.reserved - r.q, s.on_hand = s.on_hand + r.q"
            ),
        })
        .await?;
        exec(format!(
            "INSERT INTO shop_stock_moves (order_id, by_whom) SELECT id, 'cron' FROM shop_orders WHERE cron_run = {round}"
        ))
        .await?;
    }
    txn.commit().await?;
    assert_eq!(won.len() as u64, changed, "the run's mark names its rows");
    Ok(won)
}

/// Ids of a query's rows (an integer in the first column, read as text).
pub(crate) async fn ids(shop: &Shop, sql: &str) -> BTreeSet<i64> {
    shop.rows(sql, vec![])
        .await
        .iter()
        .map(|r| r.split('|').next().unwrap().parse().unwrap())
        .collect()
}

async fn beside_a_cron(backend: Backend, mode: DelayMode) {
    let spawn = Spawn::new(backend, mode)
        .setup(&schema(backend))
        // Every way the service closes an order runs: the timeouts, the
        // catch-up at each deadline, and a sweeper with no grace.
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "100ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
        .env("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true");
    let app = spawn_app(mapping(spawn, backend)).await;
    let shop = Shop::open(&app, backend).await;
    let cron_db = Database::connect(app.env["ORDER_TIMEOUT__DATABASE__URL"].as_str())
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cron = tokio::spawn(cron(cron_db, backend, stop.clone()));
    let publisher = app.publisher().await;
    let mut total = 0;
    for wave in 0..WAVES {
        // The backlog a cron leaves (minutes to an hour overdue, no timer
        // for any), and orders falling due over the next two seconds, each
        // with its timeout published after the commit, as a checkout does.
        let base = wave * 1_000;
        let mut orders: Vec<(i64, &str, i64)> = (1..=OVERDUE)
            .map(|n| (base + n, "pending", -37_000 * n))
            .collect();
        let soon = |n: i64| 300 + n * 15;
        orders.extend((1..=SOON).map(|n| (base + OVERDUE + n, "pending", soon(n))));
        place(&shop, backend, &orders).await;
        for n in 1..=SOON {
            publisher
                .timeout(&(base + OVERDUE + n).to_string(), "payment", soon(n))
                .await;
        }
        total += orders.len();
        wait_until(Duration::from_secs(60), "every order cancelled", || async {
            let left = shop
                .one(
                    &format!(
                        "SELECT {} FROM shop_orders WHERE status <> 'cancelled'",
                        shop.text("COUNT(*)")
                    ),
                    vec![],
                )
                .await;
            (left == "0").then_some(())
        })
        .await;
        let cron_won = shop
            .one(
                &format!(
                    "SELECT {} FROM shop_orders WHERE cancelled_by = 'cron'",
                    shop.text("COUNT(*)")
                ),
                vec![],
            )
            .await;
        if cron_won != "0" && cron_won != total.to_string() {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let run = cron.await.unwrap();

    // Who won: the service by its audit rows, the cron by its column.
    let service: Vec<i64> = shop
        .rows(
            &format!(
                "SELECT {} FROM order_timeout_audit ORDER BY order_id",
                shop.text("order_id")
            ),
            vec![],
        )
        .await
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    let by_service: BTreeSet<i64> = service.iter().copied().collect();
    assert_eq!(service.len(), by_service.len(), "an order audited twice");
    let by_cron = ids(
        &shop,
        &format!(
            "SELECT {} FROM shop_orders WHERE cancelled_by = 'cron'",
            shop.text("id")
        ),
    )
    .await;
    assert_eq!(
        by_cron, run.won,
        "the cron's column is what its updates changed"
    );
    let both: Vec<&i64> = by_service.intersection(&by_cron).collect();
    assert!(both.is_empty(), "cancelled by both: {both:?}");
    assert_eq!(by_service.len() + by_cron.len(), total);
    eprintln!(
        "{backend:?}/{mode:?}: the service cancelled {}, the cron {} in {} rounds; {} cron transaction(s) refused",
        by_service.len(),
        by_cron.len(),
        run.rounds,
        run.refused.len()
    );
    assert!(
        !by_service.is_empty() && !by_cron.is_empty(),
        "both sides must win some for this to show anything: service {}, cron {} ({:?})",
        by_service.len(),
        by_cron.len(),
        run.refused.first()
    );

    // None early, by the database's clock: each stamp at or after its deadline.
    let early = ids(
        &shop,
        &format!(
            "SELECT {} FROM shop_orders WHERE cancelled_at IS NULL OR cancelled_at < deadline",
            shop.text("id")
        ),
    )
    .await;
    assert!(early.is_empty(), "cancelled before the deadline: {early:?}");

    // Stock given back once per order, by whoever cancelled it.
    let moves: BTreeMap<i64, Vec<String>> = shop
        .rows(
            &format!(
                "SELECT {}, by_whom FROM shop_stock_moves ORDER BY order_id",
                shop.text("order_id")
            ),
            vec![],
        )
        .await
        .iter()
        .fold(BTreeMap::new(), |mut m, r| {
            let (id, by) = r.split_once('|').unwrap();
            m.entry(id.parse().unwrap())
                .or_insert_with(Vec::new)
                .push(by.to_string());
            m
        });
    assert_eq!(moves.len(), total, "every order's stock given back");
    for (n, by) in &moves {
        let winner = if by_cron.contains(n) {
            "cron"
        } else {
            "service"
        };
        assert_eq!(by, &vec![winner.to_string()], "order {n}");
    }
    let stock = shop
        .rows(
            &format!(
                "SELECT {}, {} FROM shop_stock ORDER BY sku",
                shop.text("on_hand"),
                shop.text("reserved")
            ),
            vec![],
        )
        .await;
    let expected = vec![format!("{ON_HAND}|0"); 4];
    assert_eq!(stock, expected, "stock back where it was, nothing reserved");
}

mod beside_a_cron {
    use crate::helpers::{Backend, DelayMode, run};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ttl() {
        run(Backend::Postgres, DelayMode::Ttl, super::beside_a_cron).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_plugin() {
        run(Backend::Postgres, DelayMode::Plugin, super::beside_a_cron).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_ttl() {
        run(Backend::MariaDb, DelayMode::Ttl, super::beside_a_cron).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_plugin() {
        run(Backend::MariaDb, DelayMode::Plugin, super::beside_a_cron).await
    }
}

// ------------------------------------------------------------- the dry run

/// Every row a first start could change, and the service's own tables' sizes.
async fn snapshot(shop: &Shop) -> Vec<String> {
    let mut all = shop
        .rows(
            "SELECT CAST(id AS TEXT), status, CAST(cancelled_at AS TEXT), cancelled_by FROM shop_orders ORDER BY id",
            vec![],
        )
        .await;
    for table in [
        "shop_stock",
        "shop_stock_moves",
        "order_timeout_audit",
        "order_timeout_events",
    ] {
        all.push(
            shop.one(
                &format!("SELECT CAST(COUNT(*) AS TEXT) FROM {table}"),
                vec![],
            )
            .await,
        );
    }
    all.extend(
        shop.rows(
            "SELECT CAST(sku AS TEXT), CAST(on_hand AS TEXT), CAST(reserved AS TEXT) FROM shop_stock ORDER BY sku",
            vec![],
        )
        .await,
    );
    all
}

/// The line of `report` that starts with `start`.
fn line<'a>(report: &'a str, start: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line `{start}`:\n{report}"))
}

/// A shop's table with overdue orders of two kinds among others: `doctor`
/// counts them per kind (all past the deadline, and past `sweeper.grace`),
/// gives the oldest deadline and the first ids in the sweep's order (id
/// order on a mapped table), warns of a backlog over `sweeper.batch_size`,
/// and changes nothing; the sweep that follows closes exactly what it
/// counted past the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_mapped() {
    let backend = Backend::Postgres;
    // Nothing here closes an order on its own: the sweeper is the harness's
    // (off), no timeout is published, the catch-up waits for one.
    let spawn = Spawn::new(backend, DelayMode::Ttl)
        .setup(&schema(backend))
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "1h")
        .env("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "100");
    let app = spawn_app(mapping(spawn, backend)).await;
    let shop = Shop::open(&app, backend).await;

    // Orders 1–300: every tenth not due for an hour, every tenth but five
    // cancelled already, the rest pending and n × 37 s overdue (past the
    // hour's grace from order 98 on).
    let mut orders = Vec::new();
    let mut overdue = Vec::new();
    for n in 1..=300_i64 {
        match n % 10 {
            0 => orders.push((n, "pending", 3_600_000)),
            5 => orders.push((n, "cancelled", -37_000 * n)),
            _ => {
                orders.push((n, "pending", -37_000 * n));
                overdue.push(n);
            }
        }
    }
    place(&shop, backend, &orders).await;
    // Receipts: 301–320 shipped, confirmable until 10 minutes ago (odd) or
    // in an hour (even).
    shop.exec(
        &format!(
            "INSERT INTO shop_orders (id, status, deadline, confirm_by) \
             SELECT n, 'shipped', {past}, CASE WHEN n % 2 = 1 THEN {past} ELSE {later} END \
             FROM generate_series(301, 320) AS n",
            past = at(backend, -600_000),
            later = at(backend, 3_600_000)
        ),
        vec![],
    )
    .await;
    let past_grace = overdue.iter().filter(|n| 37 * **n > 3_600).count();
    let oldest: i64 = shop
        .one(
            "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM MIN(deadline)) * 1000) AS TEXT) \
             FROM shop_orders WHERE status = 'pending'",
            vec![],
        )
        .await
        .parse()
        .unwrap();

    let before = snapshot(&shop).await;
    let (ok, report) = doctor(
        &app,
        &[("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true")],
    );
    assert!(ok, "{report}");
    assert_eq!(snapshot(&shop).await, before, "doctor changed something");

    let n = overdue.len();
    let waiting = line(&report, "ok    orders: payment:");
    assert!(
        waiting.ends_with(&format!(
            "payment: 270 waiting, {n} of them past the deadline now"
        )),
        "{waiting}"
    );
    let closes = line(&report, "note  first start: payment: closes");
    assert!(
        closes.contains(&format!(
            "closes {n} at once (the consumers' catch-up, as it starts: every one past the deadline; {past_grace} of them past it by more than sweeper.grace (1h)); oldest deadline "
        )),
        "{closes}\nexpected {n} past the deadline, {past_grace} past the grace"
    );
    // Reckoned from the database's now of another statement: a few ms apart.
    let said = closes.split("oldest deadline ").nth(1).unwrap();
    let said = Millis::parse_rfc3339(said.split(' ').next().unwrap()).unwrap();
    assert!(
        (said.0 - oldest).abs() < 1_000,
        "oldest deadline {said:?}, the table's {oldest}: {closes}"
    );
    let first = line(&report, "note  first start: payment: the first ids");
    assert!(
        first.ends_with("in the order they are taken: 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, …"),
        "{first}"
    );
    let warning = line(&report, "WARN  first start: payment:");
    assert!(
        warning.contains(&format!(
            "{n} to close, more than sweeper.batch_size (100): the first start closes all of them within 1 catch-up round(s) of up to 2000"
        )),
        "{warning}"
    );
    let receipts = line(&report, "ok    orders: receipt:");
    assert!(
        receipts.ends_with("receipt: 20 waiting, 10 of them past the deadline now"),
        "{receipts}"
    );
    assert!(
        line(&report, "note  first start: receipt: the first ids")
            .ends_with("301, 303, 305, 307, 309, 311, 313, 315, 317, 319"),
        "{report}"
    );
    assert!(
        !report.contains("WARN  first start: receipt"),
        "ten receipts fit a page: {report}"
    );

    // With the sweeper alone, it counts what is past the grace.
    let (_, sweeper_only) = doctor(
        &app,
        &[
            ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false"),
            ("ORDER_TIMEOUT__SWEEPER__ENABLED", "true"),
        ],
    );
    let closes = line(&sweeper_only, "note  first start: payment: closes");
    assert!(
        closes.contains(&format!(
            "closes {past_grace} at once (the sweeper, 30s after the start: past the deadline by more than sweeper.grace (1h); {n} past it in all)"
        )),
        "{closes}"
    );
    assert_eq!(snapshot(&shop).await, before, "doctor changed something");

    // The sweep takes exactly what the dry run counted past the grace.
    let now = order_timeout::db::clock::now(&app.ctx.db).await.unwrap();
    let caught = order_timeout::sweeper::sweep(&app.ctx, now).await.unwrap();
    assert_eq!(caught, past_grace as u64, "the sweep and the dry run agree");
    let cancelled = ids(
        &shop,
        "SELECT CAST(id AS TEXT) FROM shop_orders WHERE status = 'cancelled' AND cancelled_at IS NOT NULL",
    )
    .await;
    let expected: BTreeSet<i64> = overdue.iter().copied().filter(|n| 37 * n > 3_600).collect();
    assert_eq!(cancelled, expected);
}

/// The service's own orders: the dry run counts them too, by the same
/// queries, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_owned() {
    // No timeout is published (the relay is off), and nothing else closes
    // them: the orders stay overdue.
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl).env("ORDER_TIMEOUT__RELAY__ENABLED", "false"),
    )
    .await;
    app.put_stock("A", 100).await;
    let mut due = Vec::new();
    for _ in 0..3 {
        due.push(app.order(&[("A", 2)], "1s").await);
    }
    let later = app.order(&[("A", 1)], "1h").await;
    let report = wait_until(Duration::from_secs(10), "three orders overdue", || async {
        let (ok, report) = doctor(&app, &[]);
        assert!(ok, "{report}");
        report
            .contains("payment: 4 waiting, 3 of them past the deadline now")
            .then_some(report)
    })
    .await;
    let first = line(&report, "note  first start: payment: the first ids");
    assert!(
        first.ends_with(&format!("taken: {}", due.join(", "))),
        "{first}"
    );
    assert!(
        line(&report, "ok    first start: fulfillment:")
            .ends_with("closes none (none past the deadline)"),
        "{report}"
    );
    for id in due.iter().chain([&later]) {
        assert_eq!(app.get_order(id).await["status"], "pending_payment");
    }
    assert_eq!(app.stock("A").await["reserved"], 7);
}

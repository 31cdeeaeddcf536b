//! The mapped mode (`orders.source = mapped`): the service acts on a shop's
//! own tables. The shop's side here does what its checkout would: it writes
//! orders, items and reserved stock in its own tables and publishes the
//! timeouts by the wire contract; the service cancels at the deadline by the
//! database's clock, gives `lock_stock` back, completes unconfirmed
//! deliveries, and changes no other column or table.
//!
//! - `mall`: macrozheng/mall's `oms_order`, `oms_order_item` and
//!   `pms_sku_stock` (the columns used plus some left alone) on MariaDB, keyed
//!   by `order_sn` (text ids), and on PostgreSQL, keyed by `id` (integers);
//! - `uuid_table`: a UUID-keyed table with string statuses, a stored deadline
//!   and the operator's own release statement, on PostgreSQL;
//! - `refuses_a_mapping_that_does_not_match`: start-up and `doctor` name the
//!   setting and the table or column.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value,
};
use tokio::time::Instant;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The shop's side: its own connection to its own database.
pub(crate) struct Shop {
    pub(crate) db: DatabaseConnection,
    backend: Backend,
    /// Whether its clock is written to the millisecond (`NOW(3)`), else whole seconds.
    precise: bool,
}

impl Shop {
    pub(crate) async fn open(app: &TestApp, backend: Backend) -> Self {
        let url = &app.env["ORDER_TIMEOUT__DATABASE__URL"];
        let db = Database::connect(url.as_str())
            .await
            .expect("shop database");
        Self {
            db,
            backend,
            precise: false,
        }
    }

    /// The shop's own session, on one connection, after `session` (its
    /// `SET TIME ZONE …`): its `NOW()` is its local time, to the millisecond.
    pub(crate) async fn open_session(app: &TestApp, backend: Backend, session: &str) -> Self {
        let url = &app.env["ORDER_TIMEOUT__DATABASE__URL"];
        let mut options = sea_orm::ConnectOptions::new(url.as_str());
        options
            .max_connections(1)
            .min_connections(1)
            .sqlx_logging(false);
        let db = Database::connect(options).await.expect("shop database");
        db.execute_unprepared(session)
            .await
            .unwrap_or_else(|e| panic!("{session}: {e}"));
        Self {
            db,
            backend,
            precise: true,
        }
    }

    /// A statement written with `?`, numbered for PostgreSQL.
    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        match self.backend {
            Backend::Postgres => {
                let mut out = String::new();
                let mut n = 0;
                for c in sql.chars() {
                    if c == '?' {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(c);
                    }
                }
                Statement::from_sql_and_values(DbBackend::Postgres, out, values)
            }
            _ => Statement::from_sql_and_values(DbBackend::MySql, sql, values),
        }
    }

    pub(crate) async fn exec(&self, sql: &str, values: Vec<Value>) -> u64 {
        self.exec_on(&self.db, sql, values).await
    }

    /// The same, in a transaction of the shop's.
    pub(crate) async fn exec_on<C: ConnectionTrait>(
        &self,
        on: &C,
        sql: &str,
        values: Vec<Value>,
    ) -> u64 {
        on.execute_raw(self.statement(sql, values))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    /// Every row of a query, each column read as text and joined by `|`.
    pub(crate) async fn rows(&self, sql: &str, values: Vec<Value>) -> Vec<String> {
        let rows = self
            .db
            .query_all_raw(self.statement(sql, values))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|row| {
                (0..)
                    .map_while(|i| row.try_get_by_index::<Option<String>>(i).ok())
                    .map(|v| v.unwrap_or_else(|| "NULL".into()))
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    pub(crate) async fn one(&self, sql: &str, values: Vec<Value>) -> String {
        let rows = self.rows(sql, values).await;
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        rows[0].clone()
    }

    pub(crate) fn text(&self, column: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("CAST({column} AS TEXT)"),
            _ => format!("CAST({column} AS CHAR)"),
        }
    }

    pub(crate) fn now(&self) -> &'static str {
        match (self.backend, self.precise) {
            (Backend::Postgres, false) => "LOCALTIMESTAMP(0)",
            (Backend::Postgres, true) => "LOCALTIMESTAMP(3)",
            (_, false) => "NOW()",
            (_, true) => "NOW(3)",
        }
    }

    /// The tables of the database, by name.
    async fn tables(&self) -> Vec<String> {
        let current = match self.backend {
            Backend::Postgres => "current_schema()",
            _ => "DATABASE()",
        };
        let mut tables = self
            .rows(
                &format!(
                    "SELECT {} FROM information_schema.tables WHERE table_schema = {current}",
                    self.text("table_name")
                ),
                vec![],
            )
            .await;
        tables.sort();
        tables
    }
}

/// Payment timeouts that came before their deadline (held or re-delayed).
async fn early_payments(app: &TestApp) -> f64 {
    app.metric(
        "order_timeout_timeouts_handled_total",
        &["kind=\"payment\"", "outcome=\"not_yet_due\""],
    )
    .await
}

// ---------------------------------------------------------------- the mall

pub(crate) fn mall_schema(backend: Backend) -> Vec<&'static str> {
    match backend {
        Backend::Postgres => vec![
            "CREATE TABLE oms_order (id BIGINT PRIMARY KEY, member_id BIGINT NOT NULL, \
             order_sn VARCHAR(64) NOT NULL UNIQUE, total_amount DECIMAL(10,2), \
             status SMALLINT NOT NULL DEFAULT 0, note VARCHAR(500), \
             create_time TIMESTAMP(0) NOT NULL, modify_time TIMESTAMP(0), \
             payment_time TIMESTAMP(0), delivery_time TIMESTAMP(0))",
            "CREATE TABLE oms_order_item (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, \
             order_sn VARCHAR(64) NOT NULL, product_sku_id BIGINT NOT NULL, \
             product_quantity INT NOT NULL, product_price DECIMAL(10,2))",
            "CREATE TABLE pms_sku_stock (id BIGINT PRIMARY KEY, product_id BIGINT, \
             sku_code VARCHAR(64), price DECIMAL(10,2), stock INT NOT NULL, \
             lock_stock INT NOT NULL DEFAULT 0)",
            "CREATE TABLE oms_order_setting (id BIGINT PRIMARY KEY, normal_order_overtime INT)",
            "INSERT INTO oms_order_setting VALUES (1, 60)",
            "INSERT INTO pms_sku_stock VALUES (1, 26, '201806070026001', 3788.00, 100, 0), \
             (2, 26, '201806070026002', 3999.00, 100, 0), (3, 27, '201808270027001', 2699.00, 100, 0)",
        ],
        _ => vec![
            "CREATE TABLE oms_order (id BIGINT NOT NULL PRIMARY KEY, member_id BIGINT NOT NULL, \
             order_sn VARCHAR(64) NOT NULL UNIQUE, total_amount DECIMAL(10,2), \
             status TINYINT NOT NULL DEFAULT 0, note VARCHAR(500), \
             create_time DATETIME NOT NULL, modify_time DATETIME, \
             payment_time DATETIME, delivery_time DATETIME)",
            "CREATE TABLE oms_order_item (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             order_id BIGINT NOT NULL, order_sn VARCHAR(64) NOT NULL, \
             product_sku_id BIGINT NOT NULL, product_quantity INT NOT NULL, \
             product_price DECIMAL(10,2))",
            "CREATE TABLE pms_sku_stock (id BIGINT NOT NULL PRIMARY KEY, product_id BIGINT, \
             sku_code VARCHAR(64), price DECIMAL(10,2), stock INT NOT NULL, \
             lock_stock INT NOT NULL DEFAULT 0)",
            "CREATE TABLE oms_order_setting (id BIGINT PRIMARY KEY, normal_order_overtime INT)",
            "INSERT INTO oms_order_setting VALUES (1, 60)",
            "INSERT INTO pms_sku_stock VALUES (1, 26, '201806070026001', 3788.00, 100, 0), \
             (2, 26, '201806070026002', 3999.00, 100, 0), (3, 27, '201808270027001', 2699.00, 100, 0)",
        ],
    }
}

/// The mall mapping, as the worked example of docs/mapped-mode.md writes it: closing an
/// unpaid order sets `status` 0 → 4 and gives its items back from
/// `lock_stock`; a delivered order never confirmed goes 2 → 3.
pub(crate) fn mall_mapping(spawn: Spawn, text_ids: bool) -> Spawn {
    let (id, items_order) = if text_ids {
        ("order_sn", "order_sn")
    } else {
        ("id", "order_id")
    };
    spawn
        .env("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped")
        .env("ORDER_TIMEOUT__MAPPING__TABLE", "oms_order")
        .env("ORDER_TIMEOUT__MAPPING__ID_COLUMN", id)
        .env("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "status")
        .env("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "modify_time")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "0")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "4")
        .env(
            "ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN",
            "create_time",
        )
        .env("ORDER_TIMEOUT__MAPPING__RECEIPT__FROM", "2")
        .env("ORDER_TIMEOUT__MAPPING__RECEIPT__TO", "3")
        .env(
            "ORDER_TIMEOUT__MAPPING__RECEIPT__SINCE_COLUMN",
            "delivery_time",
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_TABLE",
            "oms_order_item",
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_ORDER_COLUMN",
            items_order,
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_SKU_COLUMN",
            "product_sku_id",
        )
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_QUANTITY_COLUMN",
            "product_quantity",
        )
        .env("ORDER_TIMEOUT__MAPPING__STOCK__TABLE", "pms_sku_stock")
        .env("ORDER_TIMEOUT__MAPPING__STOCK__ID_COLUMN", "id")
        .env(
            "ORDER_TIMEOUT__MAPPING__STOCK__RESERVED_COLUMN",
            "lock_stock",
        )
        .env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "3s")
        .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", "2s")
}

/// The mall's side of an order.
pub(crate) struct Mall<'a> {
    pub(crate) shop: &'a Shop,
    pub(crate) text_ids: bool,
}

impl Mall<'_> {
    /// The id the wire carries for order `n`.
    pub(crate) fn key(&self, n: i64) -> String {
        if self.text_ids {
            format!("2026120101{n:06}")
        } else {
            n.to_string()
        }
    }

    fn where_key(&self) -> &'static str {
        if self.text_ids {
            "order_sn = ?"
        } else {
            "id = ?"
        }
    }

    fn key_value(&self, n: i64) -> Value {
        if self.text_ids {
            Value::from(self.key(n))
        } else {
            Value::from(n)
        }
    }

    /// What order `n` holds: `(sku, quantity)`.
    pub(crate) fn items(n: i64) -> Vec<(i64, i32)> {
        vec![(n % 3 + 1, n as i32), ((n + 1) % 3 + 1, 1)]
    }

    /// The mall's checkout: the order, its items and `lock_stock`, in one
    /// transaction, `create_time` by the database's clock.
    pub(crate) async fn checkout(&self, n: i64) {
        let s = self.shop;
        let txn = s.db.begin().await.unwrap();
        s.exec_on(
            &txn,
            &format!(
                "INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, note, create_time) \
                 VALUES (?, ?, ?, ?, 0, ?, {})",
                s.now()
            ),
            vec![
                n.into(),
                (n * 10).into(),
                self.key(n).into(),
                Value::from(n as f64 * 99.5),
                format!("note {n}").into(),
            ],
        )
        .await;
        for (sku, quantity) in Self::items(n) {
            s.exec_on(
                &txn,
                "INSERT INTO oms_order_item (order_id, order_sn, product_sku_id, product_quantity, product_price) \
                 VALUES (?, ?, ?, ?, 10.00)",
                vec![n.into(), self.key(n).into(), sku.into(), quantity.into()],
            )
            .await;
            s.exec_on(
                &txn,
                "UPDATE pms_sku_stock SET lock_stock = lock_stock + ? WHERE id = ?",
                vec![quantity.into(), sku.into()],
            )
            .await;
        }
        txn.commit().await.unwrap();
    }

    /// The mall's payment: 0 → 1 only if still unpaid; stock sold. Whether it won.
    pub(crate) async fn pay(&self, n: i64) -> bool {
        let s = self.shop;
        let txn = s.db.begin().await.unwrap();
        let won = s
            .exec_on(
                &txn,
                &format!(
                    "UPDATE oms_order SET status = 1, payment_time = {} WHERE {} AND status = 0",
                    s.now(),
                    self.where_key()
                ),
                vec![self.key_value(n)],
            )
            .await
            == 1;
        if won {
            for (sku, quantity) in Self::items(n) {
                s.exec_on(
                    &txn,
                    "UPDATE pms_sku_stock SET stock = stock - ?, lock_stock = lock_stock - ? WHERE id = ?",
                    vec![quantity.into(), quantity.into(), sku.into()],
                )
                .await;
            }
        }
        txn.commit().await.unwrap();
        won
    }

    async fn ship(&self, n: i64) {
        let s = self.shop;
        let shipped = s
            .exec(
                &format!(
                    "UPDATE oms_order SET status = 2, delivery_time = {} WHERE {} AND status = 1",
                    s.now(),
                    self.where_key()
                ),
                vec![self.key_value(n)],
            )
            .await;
        assert_eq!(shipped, 1);
    }

    pub(crate) async fn status(&self, n: i64) -> String {
        let s = self.shop;
        s.one(
            &format!(
                "SELECT {}, {} FROM oms_order WHERE {}",
                s.text("status"),
                s.text("modify_time"),
                self.where_key()
            ),
            vec![self.key_value(n)],
        )
        .await
        .split('|')
        .next()
        .unwrap()
        .to_string()
    }

    pub(crate) async fn wait_status(&self, n: i64, status: &str, within: Duration) {
        let what = format!("order {n} to reach status {status}");
        wait_until(within, &what, || async {
            (self.status(n).await == status).then_some(())
        })
        .await;
    }

    /// `stock|lock_stock` per SKU.
    pub(crate) async fn stock(&self) -> BTreeMap<i64, (i64, i64)> {
        let rows = self
            .shop
            .rows(
                &format!(
                    "SELECT {}, {}, {} FROM pms_sku_stock ORDER BY id",
                    self.shop.text("id"),
                    self.shop.text("stock"),
                    self.shop.text("lock_stock")
                ),
                vec![],
            )
            .await;
        rows.iter()
            .map(|r| {
                let v: Vec<i64> = r.split('|').map(|x| x.parse().unwrap()).collect();
                (v[0], (v[1], v[2]))
            })
            .collect()
    }

    /// Every column nobody but the shop's checkout writes, of every table:
    /// what the service must leave exactly as it was.
    async fn untouched(&self) -> Vec<String> {
        let s = self.shop;
        let t = |c: &str| s.text(c);
        let mut all = Vec::new();
        for (table, columns) in [
            (
                "oms_order",
                vec![
                    "id",
                    "member_id",
                    "order_sn",
                    "total_amount",
                    "note",
                    "create_time",
                ],
            ),
            (
                "oms_order_item",
                vec![
                    "id",
                    "order_id",
                    "order_sn",
                    "product_sku_id",
                    "product_quantity",
                    "product_price",
                ],
            ),
            (
                "pms_sku_stock",
                vec!["id", "product_id", "sku_code", "price"],
            ),
            ("oms_order_setting", vec!["id", "normal_order_overtime"]),
        ] {
            let select: Vec<String> = columns.iter().map(|c| t(c)).collect();
            let rows = s
                .rows(
                    &format!("SELECT {} FROM {table} ORDER BY id", select.join(", ")),
                    vec![],
                )
                .await;
            all.extend(rows.into_iter().map(|r| format!("{table}: {r}")));
        }
        all
    }
}

async fn mall(backend: Backend, mode: DelayMode) {
    // MariaDB keys by `order_sn` (text ids); PostgreSQL by `id` (integers).
    let text_ids = backend == Backend::MariaDb;
    let spawn = Spawn::new(backend, mode)
        .setup(&mall_schema(backend))
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "300ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "3s")
        // Each order by its own message, or by the sweeper for the one that has
        // none: the catch-up would take that one first (`catch_up::*` shows it).
        .env("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false");
    let app = spawn_app(mall_mapping(spawn, text_ids)).await;
    let shop = Shop::open(&app, backend).await;
    let mall = Mall {
        shop: &shop,
        text_ids,
    };
    let tables_before = shop.tables().await;
    let tap = EventTap::open(&app).await;

    // 1–6 unpaid; 7–8 paid in time; 9 paid at the deadline (a race); 10 with
    // an early message; 11 with its message twice; 12 with no message at all
    // (a lost timer: the sweeper's); 13 shipped and never confirmed.
    // The paid ones are paid at once: a loaded machine must not make them late.
    // Each timeout is published as the shop's checkout would, right after the
    // commit that set its deadline, so that a loaded machine does not put the
    // messages behind the sweeper's grace.
    let publisher = app.publisher().await;
    let mut placed = Instant::now();
    for n in 1..=13 {
        mall.checkout(n).await;
        if n == 9 {
            placed = Instant::now();
        }
        if [7, 8, 13].contains(&n) {
            assert!(mall.pay(n).await);
        }
        match n {
            10 => publisher.timeout(&mall.key(n), "payment", 500).await,
            11 => {
                publisher.timeout(&mall.key(n), "payment", 3_000).await;
                publisher.timeout(&mall.key(n), "payment", 3_000).await;
            }
            12 | 13 => {}
            _ => publisher.timeout(&mall.key(n), "payment", 3_000).await,
        }
    }
    mall.ship(13).await;
    publisher.timeout(&mall.key(13), "receipt", 2_000).await;
    // What the shop's table cannot have: parked with the reason.
    publisher.timeout(&mall.key(999), "payment", 10).await;
    publisher.timeout("abc", "payment", 10).await;
    publisher.timeout(&mall.key(7), "fulfillment", 10).await;
    let untouched = mall.untouched().await;

    // The last-millisecond payment, as the deadline passes.
    tokio::time::sleep_until(placed + Duration::from_millis(2_990)).await;
    let paid_in_race = mall.pay(9).await;

    for n in [1, 2, 3, 4, 5, 6, 10, 11] {
        mall.wait_status(n, "4", Duration::from_secs(20)).await;
    }
    mall.wait_status(13, "3", Duration::from_secs(20)).await;
    // The sweeper finds the order no message came for (deadline + grace).
    mall.wait_status(12, "4", Duration::from_secs(30)).await;
    assert_eq!(mall.status(9).await, if paid_in_race { "1" } else { "4" });
    // None early, by the database's clock: the stamp of every cancel is at or
    // after its deadline (both columns whole seconds, as the mall has them);
    // order 10's early message was seen early, and waited.
    let interval = match backend {
        Backend::Postgres => "INTERVAL '3 seconds'",
        _ => "INTERVAL 3 SECOND",
    };
    let early = shop
        .rows(
            &format!(
                "SELECT {} FROM oms_order WHERE status = 4 AND modify_time < create_time + {interval}",
                shop.text("id")
            ),
            vec![],
        )
        .await;
    assert!(early.is_empty(), "cancelled before the deadline: {early:?}");
    assert!(
        early_payments(&app).await >= 1.0,
        "the early message was not seen early"
    );
    for n in [7, 8] {
        assert_eq!(mall.status(n).await, "1", "a paid order is left alone");
    }

    // Stock: every unpaid order's items left lock_stock once; paid ones were
    // the shop's to move. Nothing reserved remains.
    let sold: i64 = [7, 8, 13]
        .into_iter()
        .chain(paid_in_race.then_some(9))
        .flat_map(Mall::items)
        .map(|(_, q)| q as i64)
        .sum();
    let stock = mall.stock().await;
    assert!(stock.values().all(|(_, lock)| *lock == 0), "{stock:?}");
    assert_eq!(
        stock.values().map(|(s, _)| 100 - s).sum::<i64>(),
        sold,
        "{stock:?}"
    );

    // The transition's stamp; no other column or table of the shop changed.
    let stamped = shop
        .rows(
            &format!(
                "SELECT {} FROM oms_order WHERE status = 4 AND modify_time IS NULL",
                shop.text("id")
            ),
            vec![],
        )
        .await;
    assert!(
        stamped.is_empty(),
        "cancelled without modify_time: {stamped:?}"
    );
    assert_eq!(mall.untouched().await, untouched);
    let ours: Vec<String> = shop
        .tables()
        .await
        .into_iter()
        .filter(|t| !tables_before.contains(t))
        .collect();
    assert!(
        ours.iter().all(|t| t.starts_with("order_timeout_")),
        "tables the service made in the shop's database: {ours:?}"
    );

    let mut parked: Vec<(String, String)> = app
        .drain_parked()
        .await
        .into_iter()
        .map(|(reason, _, body)| (reason, String::from_utf8_lossy(&body).to_string()))
        .collect();
    parked.sort();
    let reasons: Vec<&str> = parked.iter().map(|(r, _)| r.as_str()).collect();
    let expected = if text_ids {
        // "abc" is a text id like any other: no such order.
        vec!["unknown_kind", "unknown_order", "unknown_order"]
    } else {
        vec!["invalid_body", "unknown_kind", "unknown_order"]
    };
    assert_eq!(reasons, expected, "{parked:?}");
    assert!(
        app.metric("order_timeout_sweeper_catches_total", &["kind=\"payment\""])
            .await
            >= 1.0
    );

    // Every transition told once, after its commit, with what it released;
    // nothing for the orders the shop paid.
    let mut cancelled = vec![1, 2, 3, 4, 5, 6, 10, 11, 12];
    if !paid_in_race {
        cancelled.push(9);
    }
    let told = tap.collect(cancelled.len() + 1).await;
    assert_eq!(told.len(), cancelled.len() + 1, "{told:?}");
    for n in cancelled {
        let events = &told[&mall.key(n)];
        assert_eq!(events.len(), 1, "order {n}: {events:?}");
        let (key, body) = &events[0];
        assert_eq!(key, "order.cancelled");
        assert_eq!(
            (body["from"].as_str(), body["to"].as_str()),
            (Some("0"), Some("4"))
        );
        let cause = body["cause"].as_str().unwrap();
        if n == 12 {
            assert_eq!(cause, "sweeper");
        } else {
            assert!(cause == "timeout" || cause == "sweeper", "{body}");
        }
        let mut released: Vec<(String, i64)> = body["released"]
            .as_array()
            .unwrap_or_else(|| panic!("a cancel says what it released: {body}"))
            .iter()
            .map(|r| {
                (
                    r["sku"].as_str().unwrap().to_string(),
                    r["quantity"].as_i64().unwrap(),
                )
            })
            .collect();
        released.sort();
        let mut items: Vec<(String, i64)> = Mall::items(n)
            .into_iter()
            .map(|(sku, q)| (sku.to_string(), q as i64))
            .collect();
        items.sort();
        assert_eq!(released, items, "order {n}");
    }
    let completed = &told[&mall.key(13)];
    assert_eq!(completed.len(), 1, "{completed:?}");
    assert_eq!(completed[0].0, "order.completed");
    assert_eq!(completed[0].1["cause"], "timeout");
    assert!(completed[0].1["released"].is_null(), "{completed:?}");
    // The service's own audit trail, in its own table.
    let audit = shop
        .one(
            &format!("SELECT {} FROM order_timeout_audit", shop.text("COUNT(*)")),
            vec![],
        )
        .await;
    assert_eq!(audit, told.len().to_string());
}

/// The mall's payment timeout commits and the answer is lost (the connection
/// cut right after the COMMIT, see `outages::commit_cutter`): the retry finds
/// the order no longer applicable and counts it applied all the same, from
/// the `order_timeout_audit` row the lost commit wrote; the order is closed
/// once and its stock given back once.
async fn mall_lost_commit_answer(backend: Backend, mode: DelayMode) {
    let (port, cuts) =
        crate::outages::commit_cutter(b"UPDATE \"oms_order\"", b"INSERT INTO order_timeout_audit")
            .await;
    let spawn = Spawn::new(backend, mode)
        .setup(&mall_schema(backend))
        .database_port(port);
    let app = spawn_app(mall_mapping(spawn, false)).await;
    let shop = Shop::open(&app, backend).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    mall.checkout(1).await;
    let publisher = app.publisher().await;
    publisher.timeout(&mall.key(1), "payment", 3_000).await;
    mall.wait_status(1, "4", Duration::from_secs(20)).await;
    assert!(
        cuts.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "no commit was cut"
    );
    crate::outages::assert_counted_applied_once(&app).await;
    let stock = mall.stock().await;
    assert!(
        stock.values().all(|(s, lock)| *s == 100 && *lock == 0),
        "{stock:?}"
    );
    let audit = shop
        .one(
            &format!("SELECT {} FROM order_timeout_audit", shop.text("COUNT(*)")),
            vec![],
        )
        .await;
    assert_eq!(audit, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mall_lost_commit_answer_postgres_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, mall_lost_commit_answer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mall_lost_commit_answer_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        mall_lost_commit_answer,
    )
    .await
}

mod mall {
    use crate::helpers::{Backend, DelayMode, run};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_ttl() {
        run(Backend::MariaDb, DelayMode::Ttl, super::mall).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_plugin() {
        run(Backend::MariaDb, DelayMode::Plugin, super::mall).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ttl() {
        run(Backend::Postgres, DelayMode::Ttl, super::mall).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_plugin() {
        run(Backend::Postgres, DelayMode::Plugin, super::mall).await
    }
}

// ---------------------------------------------------- a UUID-keyed table

const UUID_SCHEMA: &[&str] = &[
    "CREATE TABLE shop_orders (id UUID PRIMARY KEY, state TEXT NOT NULL, \
     pay_by TIMESTAMPTZ NOT NULL, closed_at TIMESTAMPTZ, note TEXT, \
     paid_at TIMESTAMPTZ, ship_overdue_at TIMESTAMPTZ)",
    "CREATE TABLE shop_order_lines (order_id UUID NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)",
    "CREATE TABLE shop_stock (sku TEXT PRIMARY KEY, on_hand INTEGER NOT NULL, reserved INTEGER NOT NULL)",
    "INSERT INTO shop_stock VALUES ('tea', 50, 0), ('cup', 50, 0)",
];

/// The operator's own statement: the lines' quantities leave `reserved`
/// and go back on hand. The id is bound as `$1`, never spliced.
const UUID_RELEASE: &str = "UPDATE shop_stock SET reserved = shop_stock.reserved - l.qty, \
     on_hand = shop_stock.on_hand + l.qty FROM shop_order_lines l \
     WHERE l.order_id = $1 AND shop_stock.sku = l.sku";

async fn uuid_table(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .setup(UUID_SCHEMA)
            .env("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped")
            .env("ORDER_TIMEOUT__MAPPING__TABLE", "shop_orders")
            .env("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "state")
            .env("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "closed_at")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "awaiting_payment")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "cancelled")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN", "pay_by")
            .env("ORDER_TIMEOUT__MAPPING__RELEASE_SQL", UUID_RELEASE)
            // Paid and not shipped within a second: flagged, the status kept.
            .env("ORDER_TIMEOUT__MAPPING__FULFILLMENT__FROM", "paid")
            .env(
                "ORDER_TIMEOUT__MAPPING__FULFILLMENT__FLAG_COLUMN",
                "ship_overdue_at",
            )
            .env(
                "ORDER_TIMEOUT__MAPPING__FULFILLMENT__SINCE_COLUMN",
                "paid_at",
            )
            .env("ORDER_TIMEOUT__WINDOWS__FULFILLMENT", "1s"),
    )
    .await;
    let shop = Shop::open(&app, backend).await;
    let tap = EventTap::open(&app).await;
    let ids: Vec<String> = (0..5).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    for id in &ids {
        shop.exec(
            "INSERT INTO shop_orders (id, state, pay_by, note) VALUES (CAST(? AS UUID), \
             'awaiting_payment', CURRENT_TIMESTAMP + INTERVAL '2 seconds', 'keep me')",
            vec![id.as_str().into()],
        )
        .await;
        for (sku, qty) in [("tea", 2), ("cup", 1)] {
            shop.exec(
                "INSERT INTO shop_order_lines VALUES (CAST(? AS UUID), ?, ?)",
                vec![id.as_str().into(), sku.into(), qty.into()],
            )
            .await;
            shop.exec(
                "UPDATE shop_stock SET on_hand = on_hand - ?, reserved = reserved + ? WHERE sku = ?",
                vec![qty.into(), qty.into(), sku.into()],
            )
            .await;
        }
    }
    // 3 is paid at once (a loaded machine must not make it late).
    let paid = shop
        .exec(
            "UPDATE shop_orders SET state = 'paid', paid_at = CURRENT_TIMESTAMP \
             WHERE id = CAST(? AS UUID) AND state = 'awaiting_payment'",
            vec![ids[3].as_str().into()],
        )
        .await;
    assert_eq!(paid, 1);
    shop.exec(
        "UPDATE shop_stock SET reserved = reserved - l.qty FROM shop_order_lines l \
         WHERE l.order_id = CAST(? AS UUID) AND shop_stock.sku = l.sku",
        vec![ids[3].as_str().into()],
    )
    .await;
    // 0 in upper case (one order, however spelled); 1 twice; 2 early.
    let publisher = app.publisher().await;
    publisher
        .timeout(&ids[0].to_uppercase(), "payment", 2_000)
        .await;
    for i in [1, 1, 3, 4] {
        publisher.timeout(&ids[i], "payment", 2_000).await;
    }
    publisher.timeout(&ids[2], "payment", 300).await;
    publisher.timeout("not-a-uuid", "payment", 10).await;
    for _ in 0..2 {
        publisher.timeout(&ids[3], "fulfillment", 1_000).await;
    }

    let state = |i: usize| {
        let shop = &shop;
        let id = ids[i].clone();
        async move {
            shop.one(
                "SELECT state FROM shop_orders WHERE id = CAST(? AS UUID)",
                vec![id.into()],
            )
            .await
        }
    };
    for i in [0, 1, 2, 4] {
        wait_until(Duration::from_secs(20), "cancelled at pay_by", || async {
            (state(i).await == "cancelled").then_some(())
        })
        .await;
    }
    assert_eq!(state(3).await, "paid");
    assert!(
        early_payments(&app).await >= 1.0,
        "the early message was not seen early"
    );
    let flag = || async {
        shop.one(
            "SELECT CAST(ship_overdue_at AS TEXT), CAST(ship_overdue_at >= paid_at + INTERVAL '1 second' AS TEXT) \
             FROM shop_orders WHERE id = CAST(? AS UUID)",
            vec![ids[3].as_str().into()],
        )
        .await
    };
    let flagged = wait_until(
        Duration::from_secs(20),
        "the paid order flagged",
        || async {
            let f = flag().await;
            (!f.starts_with("NULL")).then_some(f)
        },
    )
    .await;
    assert!(
        flagged.ends_with("|true"),
        "flagged before its deadline: {flagged}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        flag().await,
        flagged,
        "flagged once, by the first of two messages"
    );
    assert_eq!(state(3).await, "paid");
    let late = shop
        .rows(
            "SELECT CAST(id AS TEXT) FROM shop_orders WHERE state = 'cancelled' AND (closed_at IS NULL OR closed_at < pay_by)",
            vec![],
        )
        .await;
    assert!(
        late.is_empty(),
        "closed before the deadline or unstamped: {late:?}"
    );
    // Released once each (1 came twice): nothing reserved, all on hand but
    // the paid order's.
    let stock = shop
        .rows("SELECT sku, CAST(on_hand AS TEXT), CAST(reserved AS TEXT) FROM shop_stock ORDER BY sku", vec![])
        .await;
    assert_eq!(stock, vec!["cup|49|0", "tea|48|0"]);
    let notes = shop
        .rows(
            "SELECT note FROM shop_orders WHERE note <> 'keep me'",
            vec![],
        )
        .await;
    assert!(notes.is_empty());
    let parked = app.drain_parked().await;
    let reasons: Vec<&str> = parked.iter().map(|(r, _, _)| r.as_str()).collect();
    assert_eq!(reasons, vec!["invalid_body"], "{parked:?}");
    assert!(parked[0].1.contains("not a UUID"), "{}", parked[0].1);
    // Told once each, the id as the table spells it (lower case).
    let told = tap.collect(5).await;
    for i in [0, 1, 2, 4] {
        let events = &told[&ids[i]];
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, "order.cancelled");
        assert_eq!(events[0].1["to"], "cancelled");
        // Released by the operator's statement, which the mapping cannot itemise.
        assert_eq!(events[0].1["released"], serde_json::json!([]));
    }
    let flagged = &told[&ids[3]];
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0].0, "order.fulfillment_overdue");
    assert_eq!(
        (flagged[0].1["from"].as_str(), flagged[0].1["to"].as_str()),
        (Some("paid"), Some("paid"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uuid_table_postgres_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, uuid_table).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uuid_table_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, uuid_table).await
}

// --------------------------------------------- a mapping that does not match

/// Start-up (and `doctor`) refuse a mapping the database does not have,
/// naming the setting and the table or column; `doctor` reports what it
/// found for one that matches. Nothing is changed either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_mapping_that_does_not_match() {
    let app = spawn_app(mall_mapping(
        Spawn::new(Backend::Postgres, DelayMode::Ttl).setup(&mall_schema(Backend::Postgres)),
        false,
    ))
    .await;
    let (ok, report) = doctor(&app, &[]);
    assert!(ok, "{report}");
    for line in [
        "orders table oms_order: id id (bigint), status status (smallint)",
        "payment: status 0 → 4 when create_time + windows.payment (3s) has passed (create_time holds whole seconds: read as 1 s later)",
        "time zone of datetime / timestamp-without-zone columns: ",
        "fulfillment: not mapped",
        "stock: oms_order_item.product_quantity per oms_order_item.order_id given back from pms_sku_stock.lock_stock",
        "payment: 0 waiting, 0 of them past the deadline now",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
    for (key, value, said) in [
        (
            "ORDER_TIMEOUT__MAPPING__STATUS_COLUMN",
            "state",
            "`mapping.status_column`: no column state in oms_order",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__TABLE",
            "orders",
            "`mapping.table`: no table orders",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN",
            "order_sn",
            "`mapping.payment.since_column`: oms_order.order_sn is character varying; expected a date and time",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__PAYMENT__FROM",
            "unpaid",
            "`mapping.payment.from`: 'unpaid' is not an integer",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__RESERVED_COLUMN",
            "locked",
            "`mapping.stock.reserved_column`: no column locked in pms_sku_stock",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__RELEASE_SQL",
            "UPDATE no_such_table SET x = 1 WHERE id = $1",
            "`mapping.release_sql`: 'UPDATE no_such_table SET x = 1 WHERE id = $1' fails",
        ),
    ] {
        let (ok, report) = doctor(&app, &[(key, value)]);
        assert!(
            !ok && report.contains(said),
            "{key}={value}: {said}\n{report}"
        );
        let out = Command::new(BIN)
            .arg("serve")
            .envs(app.env.clone())
            .env(key, value)
            .env("ORDER_TIMEOUT__HTTP__BIND", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(said),
            "{key}={value}: {said}\n{stderr}"
        );
    }
    let shop = Shop::open(&app, Backend::Postgres).await;
    assert_eq!(
        shop.one("SELECT CAST(COUNT(*) AS TEXT) FROM oms_order", vec![])
            .await,
        "0"
    );
}

/// The worked example of docs/mapped-mode.md, `config/mall.toml`, is the
/// mapping the mall tests run (the file read as `--config` reads it), and
/// the page shows the file as it is.
#[test]
fn the_worked_example_is_the_tested_mapping() {
    use order_timeout::settings::{Settings, SettingsSource};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("config/mall.toml");
    let from_file = Settings::load(&SettingsSource {
        file: Some(file.clone()),
        env: Some(Default::default()),
    })
    .expect("config/mall.toml loads");
    let env = mall_mapping(Spawn::new(Backend::MariaDb, DelayMode::Ttl), false)
        .env
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain([(
            "ORDER_TIMEOUT__DATABASE__URL".to_string(),
            "mysql://root@127.0.0.1:3306/test".to_string(),
        )])
        .collect();
    let tested = Settings::load(&SettingsSource {
        file: None,
        env: Some(env),
    })
    .expect("the tests' mapping loads");
    assert_eq!(from_file.mapping, tested.mapping);
    let text = std::fs::read_to_string(&file).unwrap();
    let page = std::fs::read_to_string(root.join("docs/mapped-mode.md")).unwrap();
    assert!(
        page.contains(&text),
        "docs/mapped-mode.md must show config/mall.toml as it is"
    );
}

/// The service's own orders keep their positive integer ids: a UUID or an
/// `order_sn` sent to an owned instance is parked as `invalid_body` by the
/// router, before any delay, saying why; `"007"` is order 7.
async fn owned_ids_stay_integers(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1h").await;
    for bad in [
        "8f14e45f-ceea-467a-9a5f-1b7f2c3d4e5f",
        "SN202612010001",
        "-3",
    ] {
        app.publish_timeout(bad, "payment", 60_000).await;
    }
    let parked = app.names.parked();
    wait_until(Duration::from_secs(10), "three parked", || async {
        (app.queue_depth(&parked).await >= 3).then_some(())
    })
    .await;
    for (reason, detail, _) in app.drain_parked().await {
        assert_eq!(reason, "invalid_body");
        assert!(detail.contains("`orders.source = owned`"), "{detail}");
    }
    app.wait_stage_timers(mode, 1, Duration::from_secs(10))
        .await;
    assert_eq!(
        app.stage_timers(mode).await,
        1,
        "only the order's own timer reached the delay stage"
    );
    // Leading zeros spell the same order: it is found, not due yet.
    app.publish_timeout(&format!("00{id}"), "payment", 10).await;
    wait_until(
        Duration::from_secs(10),
        "the early timeout seen",
        || async { (early_payments(&app).await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(app.get_order(&id).await["status"], "pending_payment");
    assert_eq!(app.queue_depth(&parked).await, 0);
}

each_mode!(owned_ids_stay_integers);

/// A queue of the test's own bound to `<prefix>.events` (`order.#`), as a
/// shop's notification service would bind one.
struct EventTap {
    _conn: lapin::Connection,
    channel: lapin::Channel,
    queue: String,
}

impl EventTap {
    /// Waits until events for `orders` orders have come, then a moment more
    /// for any duplicate; each order's events, de-duplicated.
    async fn collect(&self, orders: usize) -> BTreeMap<String, Vec<(String, serde_json::Value)>> {
        let mut seen = std::collections::HashSet::new();
        let mut told: BTreeMap<String, Vec<(String, serde_json::Value)>> = BTreeMap::new();
        let start = Instant::now();
        while told.len() < orders {
            for (order, events) in self.drain(&mut seen).await {
                told.entry(order).or_default().extend(events);
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "events for {orders} orders expected, got {told:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (order, events) in self.drain(&mut seen).await {
            told.entry(order).or_default().extend(events);
        }
        told
    }

    async fn open(app: &TestApp) -> Self {
        use lapin::options::{QueueBindOptions, QueueDeclareOptions};
        let conn = app.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        let queue = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .unwrap()
            .name()
            .to_string();
        let exchange = format!("{}.events", app.names.entry());
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "order.#".into(),
                QueueBindOptions::default(),
                Default::default(),
            )
            .await
            .unwrap();
        Self {
            _conn: conn,
            channel,
            queue,
        }
    }

    /// Every event published since the last call, once per `message_id`
    /// (`seen` keeps them across calls), by order id: `(routing key, body)`.
    async fn drain(
        &self,
        seen: &mut std::collections::HashSet<String>,
    ) -> BTreeMap<String, Vec<(String, serde_json::Value)>> {
        use lapin::options::{BasicAckOptions, BasicGetOptions};
        let mut by_order: BTreeMap<String, Vec<(String, serde_json::Value)>> = BTreeMap::new();
        while let Some(msg) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            let d = &msg.delivery;
            let id = d.properties.message_id().as_ref().map(|m| m.to_string());
            let id = id.expect("every event has a message_id");
            let body: serde_json::Value = serde_json::from_slice(&d.data).unwrap();
            if seen.insert(id) {
                let order = body["order_id"].as_str().unwrap().to_string();
                by_order
                    .entry(order)
                    .or_default()
                    .push((d.routing_key.to_string(), body));
            }
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        }
        by_order
    }
}

/// The catch-up on a shop's table: one due message, and every unpaid mall
/// order already due is closed with its stock, none early, the sweeper off.
async fn mapped_catch_up(backend: Backend, mode: DelayMode) {
    let spawn = Spawn::new(backend, mode).setup(&mall_schema(backend));
    let app = spawn_app(mall_mapping(spawn, false)).await;
    let shop = Shop::open(&app, backend).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    for n in 1..=10 {
        mall.checkout(n).await;
    }
    // Past every deadline, then one message only: 3 s, plus the second a
    // whole-second column adds, after a create_time PostgreSQL may have
    // rounded up by half a second.
    tokio::time::sleep(Duration::from_millis(4_700)).await;
    app.publish_timeout(&mall.key(1), "payment", 1).await;
    all_ten_closed(&app, &mall, Duration::from_secs(10), 9.0).await;
}

/// Waits until the ten mall orders are closed, then checks every unit is
/// back and how many a catch-up applied.
async fn all_ten_closed(app: &TestApp, mall: &Mall<'_>, within: Duration, caught: f64) {
    for n in 1..=10 {
        mall.wait_status(n, "4", within).await;
    }
    let stock = mall.stock().await;
    assert!(
        stock.values().all(|(s, lock)| *s == 100 && *lock == 0),
        "{stock:?}"
    );
    let metric = app
        .metric("order_timeout_catch_ups_total", &["kind=\"payment\""])
        .await;
    assert_eq!(metric, caught);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_catch_up_mariadb_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, mapped_catch_up).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_catch_up_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, mapped_catch_up).await
}

/// The deadline wake on a shop's table: no message at all, and the catch-up
/// reads when the next mall order falls due (its `since_column` plus the
/// window, by the database's clock in the shop's zone) and closes every
/// unpaid one with its stock then. The window, 6 s, is past the wake's 5 s
/// re-read, as a real one is: how late that leaves an order, against the
/// deadline its whole-second `create_time` gives, is printed (the README's
/// figure for a shop that publishes nothing).
async fn mapped_deadlines_wake_the_catch_up(backend: Backend, mode: DelayMode) {
    let spawn = Spawn::new(backend, mode)
        .setup(&mall_schema(backend))
        .env("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true");
    let app =
        spawn_app(mall_mapping(spawn, false).env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "6s")).await;
    let shop = Shop::open(&app, backend).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    for n in 1..=10 {
        mall.checkout(n).await;
    }
    // Every one by a catch-up: no message came.
    all_ten_closed(&app, &mall, Duration::from_secs(20), 10.0).await;
    let mut late: Vec<i64> = shop
        .rows(
            &format!("SELECT {} FROM order_timeout_audit", shop.text("late_ms")),
            vec![],
        )
        .await
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    late.sort_unstable();
    eprintln!(
        "{backend:?} {mode:?}: no message, closed by the deadline wake: lateness p50 {} ms, max {} ms ({} orders)",
        late[late.len() / 2],
        late[late.len() - 1],
        late.len()
    );
    assert!(late[0] >= 0 && late[late.len() - 1] < 2_000, "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_deadlines_wake_the_catch_up_mariadb_ttl() {
    run(
        Backend::MariaDb,
        DelayMode::Ttl,
        mapped_deadlines_wake_the_catch_up,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_deadlines_wake_the_catch_up_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        mapped_deadlines_wake_the_catch_up,
    )
    .await
}

// ------------------------------------------- ids the service cannot read

/// A text-keyed table whose overdue rows include ids the service cannot
/// read (empty, surrounding blanks, a newline, 300 characters), sorted
/// between three pages of good ones: one sweep round cancels every good row
/// (pages follow the rows read, not the rows kept), the bad ones are counted
/// by reason, and `doctor` says how many the table has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_ids_do_not_stop_the_sweep() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .setup(&[
                "CREATE TABLE text_orders (id TEXT PRIMARY KEY, state TEXT NOT NULL, \
                 pay_by TIMESTAMPTZ NOT NULL, closed_at TIMESTAMPTZ)",
            ])
            .env("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped")
            .env("ORDER_TIMEOUT__MAPPING__TABLE", "text_orders")
            .env("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "state")
            .env("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "closed_at")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "awaiting_payment")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "cancelled")
            .env("ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN", "pay_by")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
            .env("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "5"),
    )
    .await;
    let shop = Shop::open(&app, Backend::Postgres).await;
    let good: Vec<String> = (1..=12).map(|n| format!("g{n:03}")).collect();
    let long = format!("g006{}", "x".repeat(296));
    let bad = ["", " 12 ", "g003\nx", long.as_str()];
    for id in good.iter().map(String::as_str).chain(bad) {
        shop.exec(
            "INSERT INTO text_orders (id, state, pay_by) \
             VALUES (?, 'awaiting_payment', CURRENT_TIMESTAMP - INTERVAL '1 hour')",
            vec![id.into()],
        )
        .await;
    }
    let now = order_timeout::db::clock::now(&app.ctx.db).await.unwrap();
    let caught = order_timeout::sweeper::sweep(&app.ctx, now).await.unwrap();
    assert_eq!(caught, 12, "every good row in one round");
    assert_eq!(
        shop.one(
            "SELECT CAST(COUNT(*) AS TEXT) FROM text_orders WHERE state = 'cancelled'",
            vec![]
        )
        .await,
        "12"
    );
    for reason in [
        "empty",
        "surrounding_blanks",
        "control_characters",
        "too_long",
    ] {
        let label = format!("reason=\"{reason}\"");
        assert_eq!(
            app.metric(
                "order_timeout_unreadable_ids_total",
                &["kind=\"payment\"", &label]
            )
            .await,
            1.0,
            "{reason}"
        );
    }
    let out = Command::new(BIN)
        .arg("doctor")
        .envs(app.env.clone())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("4 row(s) have an id the service cannot read"),
        "{report}"
    );
}

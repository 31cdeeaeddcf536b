//! Shadow mode (`orders.shadow = true`) beside the shop's real cron, before
//! a cut-over: the service runs as `serve` would (timeouts published as a
//! checkout does, the catch-up, a sweeper with no grace) on the shop's own
//! table while the cron (`cron::cancel_due`: a conditional `UPDATE` and the
//! stock of exactly its rows) keeps closing orders. The shop's tables end
//! byte for byte as the cron and the shop left them, the service's audit
//! and events stay empty, and the report (`GET /admin/shadow`, `ctl shadow`,
//! the metrics, `doctor`) counts what the test computes from the table:
//! who closed what, the cron's lateness by its own stamp, orders it spared
//! (still open past their deadline, then paid late: disagreements), and, for
//! a cron whose rule closes 2 s early, every close reported early.
//!
//! Once per delay mode: PostgreSQL with the on-time cron in ttl mode,
//! MariaDB with the early one in plugin mode.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sea_orm::Database;
use serde_json::Value;

use crate::control::ctl;
use crate::cron::{Rule, cancel_due, ids, mapping, place, schema};
use crate::helpers::*;
use crate::mapped::Shop;
use crate::roles::psql;

/// Orders the cron closes, due over the next few seconds, each with its
/// timeout published; orders the shop spares (ids from 1000) and pays
/// after their deadline; orders paid before it.
const CLOSED: i64 = 20;
const SPARED: [i64; 3] = [1001, 1002, 1003];
const PAID: [i64; 2] = [2001, 2002];

/// Every shop row, as text, in id order: what the cron and the shop may
/// change is compared apart.
async fn rows(shop: &Shop) -> Vec<Vec<String>> {
    let t = |c: &str| shop.text(c);
    shop.rows(
        &format!(
            "SELECT {}, status, {}, {}, {}, {}, {} FROM shop_orders ORDER BY id",
            t("id"),
            t("deadline"),
            t("confirm_by"),
            t("cancelled_at"),
            t("cancelled_by"),
            t("cron_run")
        ),
        vec![],
    )
    .await
    .iter()
    .map(|r| r.split('|').map(str::to_string).collect())
    .collect()
}

/// The other shop tables, as text rows: the order lines, the stock by SKU
/// (`sku|on_hand|reserved`), the stock moves (`order_id|by_whom`).
async fn others(shop: &Shop) -> [Vec<String>; 3] {
    let t = |c: &str| shop.text(c);
    [
        format!(
            "SELECT {}, {}, {} FROM shop_order_lines ORDER BY order_id, sku",
            t("order_id"),
            t("sku"),
            t("qty")
        ),
        format!(
            "SELECT {}, {}, {} FROM shop_stock ORDER BY sku",
            t("sku"),
            t("on_hand"),
            t("reserved")
        ),
        format!(
            "SELECT {}, by_whom FROM shop_stock_moves ORDER BY order_id, by_whom",
            t("order_id")
        ),
    ]
    .map(|sql| async move { shop.rows(&sql, vec![]).await })
    .into_iter()
    .collect::<futures_util::future::JoinAll<_>>()
    .await
    .try_into()
    .unwrap()
}

/// The report of the payment kind.
async fn report(app: &TestApp) -> Value {
    let body = app.get_json("/admin/shadow").await;
    body["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "payment")
        .unwrap_or_else(|| panic!("{body}"))["report"]
        .clone()
}

fn n(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {report}"))
}

async fn beside_the_cron(backend: Backend, mode: DelayMode, early_ms: i64) {
    let spawn = Spawn::new(backend, mode)
        .setup(&schema(backend))
        .env("ORDER_TIMEOUT__ORDERS__SHADOW", "true")
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s");
    let app = spawn_app(mapping(spawn, backend)).await;
    let shop = Shop::open(&app, backend).await;
    let publisher = app.publisher().await;

    // Due in 1.5 to 3.4 s (the spared ones at 1.5 s), each timeout published
    // after the commit, as a checkout does; the paid ones far ahead.
    let due = |i: i64| 1_500 + i * 100;
    let mut orders: Vec<(i64, &str, i64)> = (1..=CLOSED).map(|i| (i, "pending", due(i))).collect();
    orders.extend(SPARED.map(|id| (id, "pending", 1_500)));
    orders.extend(PAID.map(|id| (id, "pending", 2_000)));
    place(&shop, backend, &orders).await;
    for (id, _, ms) in &orders {
        publisher.timeout(&id.to_string(), "payment", *ms).await;
    }
    let placed = rows(&shop).await;
    let placed_others = others(&shop).await;
    // The shop takes two payments in time.
    for id in PAID {
        shop.exec(
            &format!("UPDATE shop_orders SET status = 'paid' WHERE id = {id}"),
            vec![],
        )
        .await;
    }

    // The shop's cron, every 300 ms, sparing ids from 1000 on.
    let rule = Rule {
        early_ms,
        spare_from: 1_000,
    };
    let cron_db = Database::connect(app.env["ORDER_TIMEOUT__DATABASE__URL"].as_str())
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cron = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let _ = cancel_due(&cron_db, backend, round, &rule).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let closed = |id: &str| format!("SELECT {id} FROM shop_orders WHERE cancelled_by = 'cron'",);
    wait_until(
        Duration::from_secs(30),
        "the cron closed its orders",
        || async {
            (ids(&shop, &closed(&shop.text("id"))).await.len() as i64 == CLOSED).then_some(())
        },
    )
    .await;
    // The spared orders stay open past their deadline: the report says so
    // once it has seen the cron's closes.
    let open = wait_until(Duration::from_secs(10), "the report caught up", || async {
        let r = report(&app).await;
        (n(&r, "shop_closed_after_us") + n(&r, "shop_closed_before_us") == CLOSED as u64)
            .then_some(r)
    })
    .await;
    assert_eq!(n(&open, "still_open"), SPARED.len() as u64, "{open}");
    let still: BTreeSet<String> = open["first_still_open"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["order_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(still, SPARED.map(|id| id.to_string()).into(), "{open}");
    // Then the shop takes their payments, late: we would have closed them.
    for id in SPARED {
        shop.exec(
            &format!("UPDATE shop_orders SET status = 'paid' WHERE id = {id}"),
            vec![],
        )
        .await;
    }
    let r = wait_until(
        Duration::from_secs(10),
        "the late payments seen",
        || async {
            let r = report(&app).await;
            (n(&r, "disagreements") == SPARED.len() as u64).then_some(r)
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    cron.await.unwrap();
    eprintln!("{backend:?} {mode:?}, cron {early_ms} ms early: {r}");

    // The truth, from the table: the cron's closes and their lateness by
    // its own stamp against each deadline.
    let late: Vec<i64> = shop
        .rows(
            &format!(
                "SELECT {} FROM shop_orders WHERE cancelled_by = 'cron' ORDER BY id",
                match backend {
                    Backend::Postgres =>
                        "CAST(FLOOR(EXTRACT(EPOCH FROM (cancelled_at - deadline)) * 1000) AS TEXT)",
                    _ =>
                        "CAST(TIMESTAMPDIFF(MICROSECOND, deadline, cancelled_at) DIV 1000 AS CHAR)",
                }
            ),
            vec![],
        )
        .await
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    let early = late.iter().filter(|ms| **ms < 0).count() as u64;
    assert_eq!(n(&r, "closed_early"), early, "{r} {late:?}");
    if early_ms > 0 {
        assert_eq!(
            early, CLOSED as u64,
            "the early cron closed every order early: {late:?}"
        );
        // Closed before their timers came: the service never would have.
        assert_eq!(n(&r, "shop_closed_before_us"), CLOSED as u64, "{r}");
        assert!(!r["first_early"].as_array().unwrap().is_empty(), "{r}");
    } else {
        assert_eq!(early, 0, "{late:?}");
    }
    assert_eq!(r["shop_late_ms"]["n"], CLOSED, "{r}");
    let mut sorted = late.clone();
    sorted.sort_unstable();
    let max = r["shop_late_ms"]["max"].as_i64().unwrap();
    assert!(
        (max - sorted[sorted.len() - 1]).abs() <= 1,
        "{r} {sorted:?}"
    );
    // What the service would have closed: every order it found open at its
    // deadline, the spared ones among them, each never early.
    assert_eq!(
        n(&r, "would_close") + n(&r, "shop_closed_before_us"),
        (CLOSED + SPARED.len() as i64) as u64,
        "{r}"
    );
    assert_eq!(n(&r, "still_open"), 0, "{r}");
    if n(&r, "would_close") > 0 {
        assert!(r["our_late_ms"]["p50"].as_i64().unwrap() >= 0, "{r}");
    }

    // The shop's tables: exactly what the cron and the shop did, nothing of
    // the service's.
    let mut now = rows(&shop).await;
    let cron_closed = ids(&shop, &closed(&shop.text("id"))).await;
    for row in now.iter_mut() {
        let id: i64 = row[0].parse().unwrap();
        let before = placed.iter().find(|p| p[0] == row[0]).unwrap();
        if cron_closed.contains(&id) {
            assert_eq!(row[1], "cancelled");
            // Status, stamp, mark and run: the cron's.
            for i in [1, 4, 5, 6] {
                row[i] = before[i].clone();
            }
        } else if SPARED.contains(&id) || PAID.contains(&id) {
            assert_eq!(row[1], "paid");
            row[1] = before[1].clone();
        }
    }
    assert_eq!(
        now, placed,
        "shop_orders: only the cron's and the shop's changes"
    );
    // Lines untouched; each cron close's lines back from reserved to on
    // hand, once; a move logged by the cron for each, none by the service.
    let [lines, stock, moves] = others(&shop).await;
    assert_eq!(lines, placed_others[0], "shop_order_lines");
    let mut expected: std::collections::BTreeMap<i64, (i64, i64)> = placed_others[1]
        .iter()
        .map(|r| {
            let f: Vec<i64> = r.split('|').map(|v| v.parse().unwrap()).collect();
            (f[0], (f[1], f[2]))
        })
        .collect();
    for id in &cron_closed {
        for (sku, q) in crate::cron::lines(*id) {
            let s = expected.get_mut(&sku).unwrap();
            *s = (s.0 + q, s.1 - q);
        }
    }
    let expected: Vec<String> = expected
        .iter()
        .map(|(sku, (on, res))| format!("{sku}|{on}|{res}"))
        .collect();
    assert_eq!(stock, expected, "shop_stock: only the cron's releases");
    let moves: BTreeSet<String> = moves.into_iter().collect();
    let cron_moves: BTreeSet<String> = cron_closed.iter().map(|id| format!("{id}|cron")).collect();
    assert_eq!(moves, cron_moves, "shop_stock_moves: the cron's alone");
    for table in ["order_timeout_audit", "order_timeout_events"] {
        let count = shop
            .one(
                &format!("SELECT {} FROM {table}", shop.text("COUNT(*)")),
                vec![],
            )
            .await;
        assert_eq!(
            count, "0",
            "{table}: shadow mode writes nothing of the service's"
        );
    }

    // The same report in the metrics, ctl and doctor.
    // Counted for the metrics every few seconds.
    wait_until(Duration::from_secs(10), "the metric counted", || async {
        let counted = app
            .metric(
                "order_timeout_shadow_orders",
                &["kind=\"payment\"", "outcome=\"disagreements\""],
            )
            .await;
        (counted == SPARED.len() as f64).then_some(())
    })
    .await;
    let (out, err, ok) = ctl(&app, &["shadow"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("payment: would close {};", n(&r, "would_close")))
            && out.contains("3 disagreements"),
        "{out}"
    );
    let (_, report) = doctor(&app, &[]);
    assert!(
        report.contains("ok    shadow: payment: would close"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_an_on_time_cron_postgres_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, |b, m| {
        beside_the_cron(b, m, 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_an_early_cron_mariadb_plugin() {
    run(Backend::MariaDb, DelayMode::Plugin, |b, m| {
        beside_the_cron(b, m, 2_000)
    })
    .await;
}

/// Shadow mode is for a shop's own table: with the service's own orders it
/// stops start-up, naming the key.
#[tokio::test]
async fn refused_with_owned_orders() {
    let (ok, report) = {
        let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
        doctor(&app, &[("ORDER_TIMEOUT__ORDERS__SHADOW", "true")])
    };
    assert!(!ok, "{report}");
    assert!(
        report.contains("`orders.shadow`: is true but `orders.source` is owned"),
        "{report}"
    );
}

/// Shadow mode writes nothing of the shop's, so it serves as a PostgreSQL
/// role that may only read the mapped columns (and use the service's own
/// tables): it records its decisions, and `doctor`, run as
/// that role, passes with those grants alone. One delay mode: the rights
/// are the database's business.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_select_alone_postgres() {
    let backend = Backend::Postgres;
    let spawn = Spawn::new(backend, DelayMode::Ttl)
        .setup(&schema(backend))
        .env("ORDER_TIMEOUT__ORDERS__SHADOW", "true");
    // The first instance migrates, as the owner would; then it stops.
    let mut owner = spawn_app(mapping(spawn, backend)).await;
    owner.stop().await;
    let url = owner.env["ORDER_TIMEOUT__DATABASE__URL"].clone();
    let database = url.rsplit('/').next().unwrap().to_string();
    let role = format!("{database}_shadow");
    let _role = Role {
        database: database.clone(),
        name: role.clone(),
    };
    psql(
        &database,
        &format!(
            "CREATE ROLE {role} LOGIN; \
             GRANT SELECT (id, status, deadline, confirm_by, cancelled_at) ON shop_orders TO {role}; \
             GRANT SELECT (order_id, sku, qty) ON shop_order_lines TO {role}; \
             GRANT SELECT (sku, reserved, on_hand) ON shop_stock TO {role}; \
             DO $$ DECLARE t text; BEGIN \
               FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'order\\_timeout\\_%' LOOP \
                 EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I', t, '{role}'); \
               END LOOP; END $$; \
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};"
        ),
    )
    .unwrap();
    let as_role = format!("postgres://{role}@127.0.0.1:5432/{database}");
    let app = owner
        .spawn_variant(&[("ORDER_TIMEOUT__DATABASE__URL", as_role.clone())])
        .await;
    let shop = Shop::open(&owner, backend).await;
    place(&shop, backend, &[(1, "pending", 500), (2, "pending", 600)]).await;
    let publisher = app.publisher().await;
    for id in [1, 2] {
        publisher.timeout(&id.to_string(), "payment", 500).await;
    }
    let r = wait_until(Duration::from_secs(20), "both decided", || async {
        let r = report(&app).await;
        (n(&r, "would_close") == 2).then_some(r)
    })
    .await;
    assert_eq!(n(&r, "still_open"), 2, "{r}");
    let (ok, report) = doctor(&app, &[]);
    assert!(ok, "{report}");
    assert!(report.contains("ok    grants:"), "{report}");
    assert_eq!(
        rows(&shop)
            .await
            .iter()
            .filter(|r| r[1] == "pending")
            .count(),
        2,
        "nothing of the shop's changed"
    );
}

/// A role made by a test in its database, dropped with its grants there
/// when the test ends, however it ends (before the database goes).
struct Role {
    database: String,
    name: String,
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = psql(
            &self.database,
            &format!("DROP OWNED BY {0}; DROP ROLE IF EXISTS {0};", self.name),
        );
    }
}

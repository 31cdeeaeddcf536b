//! Status columns of every type a shop uses, end to end: MariaDB's
//! `ENUM(…)` and a PostgreSQL enum type (and `char(n)` beside it), left as
//! the shop made them. Unpaid orders are cancelled by their timeouts, a paid
//! one is left alone, and a mapping whose value is not a member of the enum
//! stops start-up and `doctor`, naming the key. One delay mode per backend:
//! the column's type is the database's business.

use std::time::Duration;

use crate::helpers::*;
use crate::mapped::Shop;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

fn schema(backend: Backend) -> Vec<&'static str> {
    match backend {
        Backend::Postgres => vec![
            "CREATE TYPE order_state AS ENUM ('unpaid', 'paid', 'shipped', 'closed')",
            "CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, state order_state NOT NULL DEFAULT 'unpaid', \
             channel CHAR(8) NOT NULL DEFAULT 'web', placed_at TIMESTAMPTZ(3) NOT NULL, closed_at TIMESTAMPTZ(3))",
            "CREATE INDEX shop_orders_state_placed ON shop_orders (state, placed_at)",
        ],
        _ => vec![
            "CREATE TABLE shop_orders (id BIGINT NOT NULL PRIMARY KEY, \
             state ENUM('unpaid','paid','shipped','closed') NOT NULL DEFAULT 'unpaid', \
             channel CHAR(8) NOT NULL DEFAULT 'web', placed_at TIMESTAMP(3) NOT NULL, closed_at TIMESTAMP(3) NULL)",
            "CREATE INDEX shop_orders_state_placed ON shop_orders (state, placed_at)",
        ],
    }
}

fn mapping(spawn: Spawn) -> Spawn {
    spawn
        .env("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped")
        .env("ORDER_TIMEOUT__MAPPING__TABLE", "shop_orders")
        .env("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "state")
        .env("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "closed_at")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "unpaid")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "closed")
        .env("ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN", "placed_at")
        .env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "2s")
}

async fn enum_status(backend: Backend, mode: DelayMode) {
    let mut app = spawn_app(mapping(Spawn::new(backend, mode).setup(&schema(backend)))).await;
    let shop = Shop::open(&app, backend).await;
    for n in 1..=4i64 {
        shop.exec(
            &format!(
                "INSERT INTO shop_orders (id, placed_at) VALUES (?, {})",
                shop.now()
            ),
            vec![n.into()],
        )
        .await;
    }
    shop.exec("UPDATE shop_orders SET state = 'paid' WHERE id = 4", vec![])
        .await;
    let publisher = app.publisher().await;
    for n in 1..=4i64 {
        publisher.timeout(&n.to_string(), "payment", 2_000).await;
    }
    let state = |n: i64| {
        let shop = &shop;
        async move {
            shop.one(
                &format!(
                    "SELECT {} FROM shop_orders WHERE id = ?",
                    shop.text("state")
                ),
                vec![n.into()],
            )
            .await
        }
    };
    for n in 1..=3 {
        wait_until(
            Duration::from_secs(20),
            &format!("order {n} closed"),
            || async { (state(n).await == "closed").then_some(()) },
        )
        .await;
    }
    // The paid order's timeout is handled (acked as not applicable) and
    // leaves it as it was.
    wait_until(
        Duration::from_secs(20),
        "the paid order's timeout handled",
        || async {
            let handled = app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\""],
                )
                .await;
            (handled >= 4.0).then_some(())
        },
    )
    .await;
    assert_eq!(state(4).await, "paid");
    assert_eq!(
        shop.one(
            &format!(
                "SELECT {} FROM shop_orders WHERE state = 'closed' AND closed_at IS NOT NULL AND channel = 'web'",
                shop.text("COUNT(*)")
            ),
            vec![]
        )
        .await,
        "3",
        "each cancel stamped closed_at; channel, char(8), untouched"
    );
    let (ok, report) = doctor(&app, &[]);
    assert!(ok, "{report}");
    assert!(
        report.contains("payment: status unpaid → closed"),
        "{report}"
    );

    // A value the enum does not have: refused by name, before anything runs.
    for (key, value) in [
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "cancelled"),
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "Unpaid"),
    ] {
        let field = if key.ends_with("TO") { "to" } else { "from" };
        let said = format!(
            "`mapping.payment.{field}`: '{value}' is not one of the values shop_orders.state can hold (unpaid, paid, shipped, closed)"
        );
        let (ok, report) = doctor(&app, &[(key, value)]);
        assert!(!ok && report.contains(&said), "{said}\n{report}");
        let out = std::process::Command::new(BIN)
            .arg("serve")
            .envs(app.env.clone())
            .env(key, value)
            .env("ORDER_TIMEOUT__HTTP__BIND", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(&said),
            "{said}\n{stderr}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn mariadb_enum_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, enum_status).await
}

#[tokio::test]
async fn postgres_enum_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, enum_status).await
}

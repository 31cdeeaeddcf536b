//! Least privilege on a shop's own database: `config/postgres-mapped-roles.sql`,
//! run as an operator would against the mall's tables, makes a role that
//! owns the service's bookkeeping tables and migrates, and a role that
//! serves on column rights to the mapped columns alone. The service closes
//! an overdue order as the latter; the columns and tables the mapping does
//! not name stay out of its reach, and out of the owner's; `doctor` names a
//! column grant taken away, with the `GRANT` that gives it back.
//!
//! The order is closed by the sweeper, not by a timer in the broker: the
//! rights are the database's business, so one delay mode is enough.

use std::process::Command;
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

use crate::helpers::*;
use crate::mapped::{mall_mapping, mall_schema};
use crate::roles::{Made, psql};

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The one value of a query, as text; the database's refusal as an error.
async fn one(db: &DatabaseConnection, sql: &str) -> Result<String, String> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{sql}: no row"))?;
    let value: Option<String> = row.try_get_by_index(0).map_err(|e| e.to_string())?;
    Ok(value.unwrap_or_else(|| "NULL".into()))
}

/// A statement the role must not be allowed to run: refused for want of a
/// privilege, not for any other reason.
async fn refused(db: &DatabaseConnection, who: &str, sql: &str) {
    match db
        .execute_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
    {
        Ok(done) => panic!("{who} may run {sql} ({} rows)", done.rows_affected()),
        Err(e) => assert!(
            e.to_string().contains("permission denied"),
            "{who}: {sql}: {e}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_the_mapped_columns_alone() {
    // One delay mode: the sweeper closes the order, no timer is involved.
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (owner, serve, database) = (
        format!("ot_test_mown_{id}"),
        format!("ot_test_msrv_{id}"),
        format!("ot_test_mdb_{id}"),
    );
    let _made = Made {
        database: database.clone(),
        roles: [owner.clone(), serve.clone()],
    };
    // The shop's database and tables, as the shop made them (as the superuser).
    psql("postgres", &format!("CREATE DATABASE {database}")).unwrap();
    psql(
        &database,
        &format!("{};", mall_schema(Backend::Postgres).join(";\n")),
    )
    .unwrap();
    let file = std::fs::read_to_string(repo_path("config/postgres-mapped-roles.sql")).unwrap();
    let sql = file
        .replace("order_timeout_owner", &owner)
        .replace("order_timeout_serve", &serve);
    psql(&database, &sql).unwrap_or_else(|e| panic!("config/postgres-mapped-roles.sql: {e}"));
    let url = |role: &str| format!("postgres://{role}@127.0.0.1:5432/{database}");
    let shop = Database::connect(url("postgres")).await.unwrap();
    // An order an hour old, unpaid, its items' stock reserved; and one a
    // minute old.
    shop.execute_unprepared(
        "INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, note, create_time) VALUES \
         (1, 10, 'sn1', 20.00, 0, 'leave me', LOCALTIMESTAMP(0) - INTERVAL '1 hour'), \
         (2, 20, 'sn2', 10.00, 0, 'leave me', LOCALTIMESTAMP(0) - INTERVAL '1 minute'); \
         INSERT INTO oms_order_item (order_id, order_sn, product_sku_id, product_quantity, product_price) \
         VALUES (1, 'sn1', 1, 2, 10.00), (2, 'sn2', 2, 1, 10.00); \
         UPDATE pms_sku_stock SET lock_stock = 2 WHERE id = 1; \
         UPDATE pms_sku_stock SET lock_stock = 1 WHERE id = 2",
    )
    .await
    .unwrap();

    // The settings of the mall, for each command.
    let mapping = mall_mapping(Spawn::new(Backend::Postgres, DelayMode::Ttl), false)
        .env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "30m")
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false");

    // The owner migrates: the bookkeeping tables are its own.
    let out = Command::new(BIN)
        .args(["migrate", "up"])
        .envs(mapping.env.iter().cloned())
        .env("ORDER_TIMEOUT__DATABASE__URL", url(&owner))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        one(
            &shop,
            "SELECT string_agg(DISTINCT CAST(tableowner AS TEXT), ',') FROM pg_tables \
             WHERE schemaname = 'public' AND tablename LIKE 'order\\_timeout\\_%'"
        )
        .await
        .unwrap(),
        owner,
        "the events, the audit and their migrations' record belong to the owner"
    );

    // The other serves, and closes the overdue order, giving its stock back.
    let app = spawn_app(mapping.env("ORDER_TIMEOUT__DATABASE__URL", url(&serve))).await;
    // The payment timeouts are read in the server's default zone, a guess
    // held until an order placed while the service watches confirms it
    // (`zone_check`): the shop's next checkout.
    shop.execute_unprepared(
        "INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, note, create_time) \
         VALUES (3, 30, 'sn3', 10.00, 0, 'leave me', LOCALTIMESTAMP(0))",
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(20), "order 1 closed", || async {
        (one(
            &shop,
            "SELECT CAST(status AS TEXT) FROM oms_order WHERE id = 1",
        )
        .await
        .ok()?
            == "4")
            .then_some(())
    })
    .await;
    assert_eq!(
        one(
            &shop,
            "SELECT CAST(status AS TEXT) || ' ' || CAST(modify_time IS NOT NULL AS TEXT) || ' ' || note \
             FROM oms_order WHERE id = 1"
        )
        .await
        .unwrap(),
        "4 true leave me"
    );
    assert_eq!(
        one(
            &shop,
            "SELECT string_agg(CAST(lock_stock AS TEXT), ',' ORDER BY id) FROM pms_sku_stock"
        )
        .await
        .unwrap(),
        "0,1,0"
    );
    assert_eq!(
        one(
            &shop,
            "SELECT CAST(status AS TEXT) FROM oms_order WHERE id = 2"
        )
        .await
        .unwrap(),
        "0",
        "not yet due"
    );
    assert_eq!(
        one(
            &shop,
            "SELECT order_id || ' ' || cause FROM order_timeout_audit"
        )
        .await
        .unwrap(),
        "1 sweeper"
    );
    // doctor runs as the same role: the mapping, the catalog, the migrations.
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    assert!(report.contains("applied, none pending"), "{report}");
    assert!(
        report.contains(&format!(
            "ok    grants: \"{serve}\" holds the 12 column privileges"
        )),
        "{report}"
    );

    // What the mapping does not name, the serving role cannot touch.
    let as_serve = Database::connect(url(&serve)).await.unwrap();
    assert_eq!(
        one(
            &as_serve,
            "SELECT CAST(status AS TEXT) FROM oms_order WHERE id = 2"
        )
        .await
        .unwrap(),
        "0",
        "the mapped columns are readable"
    );
    for sql in [
        "UPDATE oms_order SET note = 'changed' WHERE id = 2",
        "UPDATE oms_order SET total_amount = 0 WHERE id = 2",
        "SELECT member_id FROM oms_order WHERE id = 2",
        "DELETE FROM oms_order WHERE id = 2",
        "INSERT INTO oms_order (id, member_id, order_sn, status, create_time) VALUES (3, 1, 'x', 0, LOCALTIMESTAMP)",
        "UPDATE pms_sku_stock SET stock = 0",
        "SELECT price FROM pms_sku_stock",
        "SELECT * FROM oms_order_setting",
    ] {
        refused(&as_serve, &serve, sql).await;
    }
    // ... and the owner none of the shop's at all.
    let as_owner = Database::connect(url(&owner)).await.unwrap();
    for sql in [
        "SELECT id FROM oms_order",
        "UPDATE oms_order SET status = 4 WHERE id = 2",
    ] {
        refused(&as_owner, &owner, sql).await;
    }

    // A column grant taken away: doctor fails naming it, and the GRANT it
    // prints puts it back.
    psql(
        &database,
        &format!("REVOKE UPDATE (lock_stock) ON pms_sku_stock FROM {serve}"),
    )
    .unwrap();
    let (passed, report) = doctor(&app, &[]);
    assert!(!passed, "{report}");
    let grant = format!(r#"GRANT UPDATE ("lock_stock") ON "pms_sku_stock" TO "{serve}""#);
    assert!(
        report.contains(&format!(
            "FAIL  grants: \"{serve}\" may not UPDATE pms_sku_stock.lock_stock \
             (mapping.stock.reserved_column): {grant}\n"
        )),
        "{report}"
    );
    psql(&database, &grant).unwrap();
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    for db in [as_serve, as_owner, shop] {
        db.close().await.ok();
    }
}

//! Least privilege on a shop's own MariaDB database:
//! `config/mariadb-mapped-roles.sql`, run as an operator would against the
//! mall's tables before the first migration, makes a user that creates and
//! migrates the service's bookkeeping tables (and no other) and a user with
//! column rights on the mapped columns alone;
//! `config/mariadb-mapped-roles-after-migrate.sql`, run after the owner's
//! `migrate up`, gives the latter its rights on the bookkeeping tables. The
//! service then serves as that user: an order closed by its timer, the
//! catch-up that timer sets off, the sweeper on both kinds, an order's story,
//! `doctor`. The columns and tables the mapping does not name stay out of
//! its reach, and out of the owner's; `doctor` names a column grant taken
//! away, with the `GRANT` that gives it back.
//!
//! One delay mode: the rights are the database's business.

use std::process::Command;
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

use crate::helpers::*;
use crate::mapped::{mall_mapping, mall_schema};
use crate::roles::piped;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The users and the database a test made: removed on drop, whatever way
/// the test ends.
struct Made {
    database: String,
    users: [String; 2],
}

impl Drop for Made {
    fn drop(&mut self) {
        let sql = format!(
            "DROP DATABASE IF EXISTS {}; DROP USER IF EXISTS '{}'@'%', '{}'@'%';",
            self.database, self.users[0], self.users[1]
        );
        let _ = mariadb(None, &sql);
    }
}

/// Runs SQL with the `mariadb` client as root, in `database` if given.
fn mariadb(database: Option<&str>, sql: &str) -> Result<String, String> {
    let mut command = Command::new("mariadb");
    command.args([
        "--protocol=TCP",
        "-h",
        "127.0.0.1",
        "-P",
        "3306",
        "-u",
        "root",
    ]);
    if let Some(database) = database {
        command.arg(database);
    }
    piped(command, sql)
}

/// The one value of a query, as text; the database's refusal as an error.
async fn one(db: &DatabaseConnection, sql: &str) -> Result<String, String> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::MySql, sql))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{sql}: no row"))?;
    let value: Option<String> = row.try_get_by_index(0).map_err(|e| e.to_string())?;
    Ok(value.unwrap_or_else(|| "NULL".into()))
}

/// Every value of a one-column query, as text.
async fn column(db: &DatabaseConnection, sql: &str) -> Vec<String> {
    db.query_all_raw(Statement::from_string(DbBackend::MySql, sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).unwrap())
        .collect()
}

/// A statement the user must not be allowed to run: refused for want of a
/// privilege, not for any other reason.
async fn refused(db: &DatabaseConnection, who: &str, sql: &str) {
    match db
        .execute_raw(Statement::from_string(DbBackend::MySql, sql))
        .await
    {
        Ok(done) => panic!("{who} may run {sql} ({} rows)", done.rows_affected()),
        Err(e) => assert!(
            e.to_string().contains("command denied"),
            "{who}: {sql}: {e}"
        ),
    }
}

/// The mall's orders, by status and how old: what each path of the service
/// is to close.
const ORDERS: &str = "\
    INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, note, create_time, delivery_time) VALUES \
    (1, 10, 'sn1', 20.00, 0, 'leave me', NOW() - INTERVAL 2 HOUR, NULL), \
    (2, 20, 'sn2', 10.00, 0, 'leave me', NOW() - INTERVAL 31 MINUTE, NULL), \
    (3, 30, 'sn3', 30.00, 0, 'leave me', NOW() - INTERVAL 32 MINUTE, NULL), \
    (4, 40, 'sn4', 10.00, 0, 'leave me', NOW(), NULL), \
    (5, 50, 'sn5', 10.00, 2, 'leave me', NOW() - INTERVAL 3 HOUR, NOW() - INTERVAL 2 HOUR); \
    INSERT INTO oms_order_item (order_id, order_sn, product_sku_id, product_quantity, product_price) VALUES \
    (1, 'sn1', 1, 2, 10.00), (2, 'sn2', 2, 1, 10.00), (3, 'sn3', 3, 3, 10.00), (4, 'sn4', 1, 1, 10.00); \
    UPDATE pms_sku_stock SET lock_stock = 3 WHERE id = 1; \
    UPDATE pms_sku_stock SET lock_stock = 1 WHERE id = 2; \
    UPDATE pms_sku_stock SET lock_stock = 3 WHERE id = 3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_the_mapped_columns_alone_mariadb() {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (owner, serve, database) = (
        format!("ot_test_mown_{id}"),
        format!("ot_test_msrv_{id}"),
        format!("ot_test_mdb_{id}"),
    );
    let _made = Made {
        database: database.clone(),
        users: [owner.clone(), serve.clone()],
    };
    // The shop's database and tables, as the shop made them (as root).
    mariadb(None, &format!("CREATE DATABASE {database}")).unwrap();
    mariadb(
        Some(&database),
        &format!("{};", mall_schema(Backend::MariaDb).join(";\n")),
    )
    .unwrap();
    let file = |path: &str| {
        std::fs::read_to_string(repo_path(path))
            .unwrap()
            .replace("order_timeout_owner", &owner)
            .replace("order_timeout_serve", &serve)
    };
    let before = "config/mariadb-mapped-roles.sql";
    mariadb(Some(&database), &file(before)).unwrap_or_else(|e| panic!("{before}: {e}"));
    // The operator's next step: passwords, and the users unlocked.
    let password = uuid::Uuid::new_v4().simple().to_string();
    mariadb(
        Some(&database),
        &format!(
            "ALTER USER '{owner}'@'%' IDENTIFIED BY '{password}' ACCOUNT UNLOCK; \
             ALTER USER '{serve}'@'%' IDENTIFIED BY '{password}' ACCOUNT UNLOCK;"
        ),
    )
    .unwrap();
    let url = |user: &str| format!("mysql://{user}:{password}@127.0.0.1:3306/{database}");
    let shop = Database::connect(format!("mysql://root@127.0.0.1:3306/{database}"))
        .await
        .unwrap();
    // Written by root's sessions, in UTC: the zone the mapping names.
    shop.execute_unprepared(ORDERS).await.unwrap();

    // The settings of the mall, for each command: the sweeper takes what is
    // overdue by an hour, leaving what is due by a minute to the broker.
    let mapping = mall_mapping(Spawn::new(Backend::MariaDb, DelayMode::Ttl), false)
        .env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "30m")
        .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", "30m")
        .env("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "+00:00")
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "1h")
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false");

    // The owner migrates: it may create the bookkeeping tables.
    let out = Command::new(BIN)
        .args(["migrate", "up"])
        .envs(mapping.env.iter().cloned())
        .env("ORDER_TIMEOUT__DATABASE__URL", url(&owner))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let after = "config/mariadb-mapped-roles-after-migrate.sql";
    mariadb(Some(&database), &file(after)).unwrap_or_else(|e| panic!("{after}: {e}"));

    // The tables the migrations made, as the database lists them: the
    // first file let the owner create those and no other, the second gives
    // the serving user rows in each, and only reads the migrations' record.
    let tables = column(
        &shop,
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name LIKE 'order\\_timeout\\_%' ORDER BY 1",
    )
    .await;
    assert!(
        tables.contains(&"order_timeout_audit".to_string()) && tables.len() >= 5,
        "{tables:?}"
    );
    let granted = |user: &str| {
        format!(
            "SELECT CAST(Table_name AS CHAR) FROM mysql.tables_priv \
             WHERE User = '{user}' AND Db = DATABASE() ORDER BY 1"
        )
    };
    assert_eq!(column(&shop, &granted(&owner)).await, tables, "{before}");
    for table in &tables {
        let rights = one(
            &shop,
            &format!(
                "SELECT CAST(Table_priv AS CHAR) FROM mysql.tables_priv \
                 WHERE User = '{serve}' AND Db = DATABASE() AND Table_name = '{table}'"
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{after} grants nothing on {table}: {e}"));
        let wanted = if table == "order_timeout_migrations" {
            "Select"
        } else {
            "Select,Insert,Update,Delete"
        };
        assert_eq!(rights, wanted, "{after}: {table}");
    }

    // The serving user: the sweeper closes the order overdue by hours and
    // completes the delivery never confirmed.
    let app = spawn_app(mapping.env("ORDER_TIMEOUT__DATABASE__URL", url(&serve))).await;
    let status = |n: i64| {
        let shop = &shop;
        async move {
            one(
                shop,
                &format!("SELECT CAST(status AS CHAR) FROM oms_order WHERE id = {n}"),
            )
            .await
            .unwrap()
        }
    };
    let reaches = |n: i64, wanted: &'static str| {
        let status = &status;
        async move {
            wait_until(
                Duration::from_secs(20),
                &format!("order {n} reaches {wanted}"),
                || async { (status(n).await == wanted).then_some(()) },
            )
            .await
        }
    };
    reaches(1, "4").await;
    reaches(5, "3").await;
    // Its timer closes the one due by a minute, and the catch-up it sets
    // off the other.
    app.publisher().await.timeout("2", "payment", 200).await;
    reaches(2, "4").await;
    reaches(3, "4").await;
    assert_eq!(status(4).await, "0", "not yet due");
    assert_eq!(
        one(
            &shop,
            "SELECT GROUP_CONCAT(id, ' ', status, ' ', modify_time IS NOT NULL, ' ', note ORDER BY id) \
             FROM oms_order"
        )
        .await
        .unwrap(),
        "1 4 1 leave me,2 4 1 leave me,3 4 1 leave me,4 0 0 leave me,5 3 1 leave me"
    );
    assert_eq!(
        one(
            &shop,
            "SELECT GROUP_CONCAT(lock_stock ORDER BY id) FROM pms_sku_stock"
        )
        .await
        .unwrap(),
        "1,0,0",
        "orders 1, 2 and 3 gave their items back; order 4 holds its own"
    );
    assert_eq!(
        one(
            &shop,
            "SELECT GROUP_CONCAT(order_id, ' ', cause ORDER BY order_id) FROM order_timeout_audit"
        )
        .await
        .unwrap(),
        "1 sweeper,2 timeout,3 timeout,5 sweeper"
    );
    assert_eq!(
        app.metric("order_timeout_catch_ups_total", &["kind=\"payment\""])
            .await,
        1.0
    );
    // An order's story reads the mapped columns and the audit trail.
    let story = app.get_json("/admin/orders/2").await;
    assert_eq!(
        story["transitions"].as_array().map(Vec::len),
        Some(1),
        "{story}"
    );

    // doctor runs as the same user: the mapping, its grants, the migrations.
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    assert!(
        report.contains(&format!(
            "ok    grants: '{serve}'@'%' holds the 12 column privileges"
        )),
        "{report}"
    );
    assert!(report.contains("applied, none pending"), "{report}");

    // What the mapping does not name, the serving user cannot touch.
    let as_serve = Database::connect(url(&serve)).await.unwrap();
    assert_eq!(
        one(
            &as_serve,
            "SELECT CAST(status AS CHAR) FROM oms_order WHERE id = 4"
        )
        .await
        .unwrap(),
        "0",
        "the mapped columns are readable"
    );
    for sql in [
        "UPDATE oms_order SET note = 'changed' WHERE id = 4",
        "UPDATE oms_order SET total_amount = 0 WHERE id = 4",
        "SELECT member_id FROM oms_order WHERE id = 4",
        "DELETE FROM oms_order WHERE id = 4",
        "INSERT INTO oms_order (id, member_id, order_sn, status, create_time) VALUES (9, 1, 'x', 0, NOW())",
        "UPDATE pms_sku_stock SET stock = 0",
        "SELECT price FROM pms_sku_stock",
        "SELECT * FROM oms_order_setting",
        "DELETE FROM order_timeout_migrations",
        "DROP TABLE order_timeout_audit",
        "CREATE TABLE order_timeout_extra (id INT)",
    ] {
        refused(&as_serve, &serve, sql).await;
    }
    // ... and the owner none of the shop's, nor a table of its own choosing.
    let as_owner = Database::connect(url(&owner)).await.unwrap();
    for sql in [
        "SELECT id FROM oms_order",
        "UPDATE oms_order SET status = 4 WHERE id = 4",
        "DROP TABLE oms_order_setting",
        "CREATE TABLE order_timeout_extra (id INT)",
    ] {
        refused(&as_owner, &owner, sql).await;
    }

    // A column grant taken away: doctor fails naming it, and the GRANT it
    // prints puts it back.
    mariadb(
        Some(&database),
        &format!("REVOKE UPDATE (lock_stock) ON pms_sku_stock FROM '{serve}'@'%'"),
    )
    .unwrap();
    let (passed, report) = doctor(&app, &[]);
    assert!(!passed, "{report}");
    let grant =
        format!("GRANT UPDATE (`lock_stock`) ON `{database}`.`pms_sku_stock` TO '{serve}'@'%'");
    assert!(
        report.contains(&format!(
            "FAIL  grants: '{serve}'@'%' may not UPDATE pms_sku_stock.lock_stock \
             (mapping.stock.reserved_column): {grant}\n"
        )),
        "{report}"
    );
    mariadb(None, &grant).unwrap();
    let (passed, report) = doctor(&app, &[]);
    assert!(passed, "{report}");
    for db in [as_serve, as_owner, shop] {
        db.close().await.ok();
    }
}

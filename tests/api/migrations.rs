//! Instances that start at the same moment on an empty database (a
//! Deployment's first rollout): they take turns under the migration lock,
//! all become ready, each migration is applied once, and the service works.

use std::time::Duration;

use migrations::{Bookkeeping, Migrator, MigratorTrait};
use order_timeout_harness::{Process, Serve};
use sea_orm::{ConnectionTrait, Database, Statement};
use serde_json::json;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// How many instances start at once.
const INSTANCES: usize = 4;

/// What an instance logs while another one migrates (the telemetry's line).
const WAITING: &str = "waiting for another instance's migration";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_start_at_once_on_an_empty_postgres_database() {
    instances_start_at_once(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_start_at_once_on_an_empty_mariadb_database() {
    instances_start_at_once(Backend::MariaDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_start_at_once_on_an_empty_sqlite_file() {
    instances_start_at_once(Backend::Sqlite).await
}

async fn instances_start_at_once(backend: Backend) {
    let fresh = fresh(Spawn::new(backend, DelayMode::Ttl)).await;
    let logs = Logs(
        (0..INSTANCES)
            .map(|i| std::env::temp_dir().join(format!("{}-{i}.log", fresh.vhost)))
            .collect(),
    );
    // Spawned back to back, before any is awaited: they start together.
    let mut children: Vec<Process> = logs
        .0
        .iter()
        .enumerate()
        .map(|(i, log)| {
            Serve::new(BIN)
                .envs(fresh.env.clone())
                .instance(format!("start-{i}"))
                .log(log)
                .start()
                .expect("serve starts")
        })
        .collect();
    for child in &mut children {
        child
            .wait_ready(&fresh.http, Duration::from_secs(90))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{backend:?}: every instance becomes ready: {e}\n{}",
                    child.log_text()
                )
            });
    }
    let waited = children
        .iter()
        .filter(|c| c.log_text().contains(WAITING))
        .count();
    eprintln!("{backend:?}: {waited} of {INSTANCES} instances waited for another's migration");

    assert_each_migration_applied_once(fresh.database_url()).await;

    // The service works: an order placed through one is cancelled at its
    // deadline, never early. Within 5 s, not the 1 s of the timing tests:
    // four instances share two cores with the rest of the suite, and the
    // broker under that load has been seen taking seconds to confirm.
    let api = fresh.api(&children[1]);
    api.put_stock("A", 10).await;
    let id = api.order(&[("A", 1)], "2s").await;
    let order = api
        .wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    eprintln!(
        "{backend:?}: cancelled {} ms after its deadline",
        ms(&order, "cancelled_at") - ms(&order, "pay_deadline")
    );
    assert_on_time_within(&order, "cancelled_at", "pay_deadline", 5_000);
    cancelled_once(&api.order_with_audit(&id).await);
    assert_eq!(order["status"], "cancelled");
    assert_eq!(
        api.stock("A").await,
        json!({"sku": "A", "available": 10, "reserved": 0, "sold": 0})
    );
    assert_build_info(&api).await;

    for child in &mut children {
        child.stop();
    }
}

/// The children's log files, removed however the test ends (a failure
/// quotes the log that tells why).
pub struct Logs(pub Vec<std::path::PathBuf>);

impl Drop for Logs {
    fn drop(&mut self) {
        for log in &self.0 {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// Both migration tables list every migration of this version exactly once.
async fn assert_each_migration_applied_once(url: &str) {
    let db = Database::connect(url).await.expect("database reachable");
    let tables = [
        ("seaql_migrations", names(Migrator::migrations())),
        (
            migrations::BOOKKEEPING_MIGRATION_TABLE,
            names(Bookkeeping::migrations()),
        ),
    ];
    for (table, expected) in tables {
        let rows = db
            .query_all_raw(Statement::from_string(
                db.get_database_backend(),
                format!("SELECT version FROM {table} ORDER BY version"),
            ))
            .await
            .unwrap_or_else(|e| panic!("{table}: {e}"));
        let applied: Vec<String> = rows
            .iter()
            .map(|r| r.try_get("", "version").unwrap())
            .collect();
        assert_eq!(applied, expected, "{table}: each migration once");
    }
    db.close().await.ok();
}

fn names(list: Vec<Box<dyn migrations::MigrationTrait>>) -> Vec<String> {
    let mut names: Vec<String> = list.iter().map(|m| m.name().to_string()).collect();
    names.sort();
    names
}

/// `order_timeout_build_info` says what `--version` says.
async fn assert_build_info(api: &Api) {
    let version = version_line(BIN);
    // `order-timeout 0.1.0 (abc123def456)`
    let (release, commit) = version
        .strip_prefix("order-timeout ")
        .and_then(|rest| rest.split_once(" ("))
        .and_then(|(v, c)| Some((v, c.strip_suffix(')')?)))
        .unwrap_or_else(|| panic!("--version: {version:?}"));
    let labels = [
        format!("version=\"{release}\""),
        format!("commit=\"{commit}\""),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    assert_eq!(
        api.metric("order_timeout_build_info", &labels).await,
        1.0,
        "{}",
        api.metrics().await
    );
}

/// The one line `BIN --version` prints.
pub fn version_line(bin: &str) -> String {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{bin} --version: {e}"));
    assert!(out.status.success(), "{bin} --version: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn version_names_the_release_and_the_commit() {
    let line = version_line(BIN);
    let rest = line
        .strip_prefix(&format!("order-timeout {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("`order-timeout X.Y.Z (COMMIT)`: {line:?}"));
    // A git checkout (these tests run in one): twelve hex digits, HEAD's.
    assert_eq!(rest.len(), 12, "{line:?}");
    assert!(rest.chars().all(|c| c.is_ascii_hexdigit()), "{line:?}");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    if head.status.success() {
        assert_eq!(
            rest,
            String::from_utf8_lossy(&head.stdout).trim(),
            "{line:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_migration_lock_is_waited_for_then_named_on_postgres() {
    a_held_lock_is_waited_for_then_named(Backend::Postgres, "PostgreSQL backend pid").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_migration_lock_is_waited_for_then_named_on_mariadb() {
    a_held_lock_is_waited_for_then_named(Backend::MariaDb, "MariaDB/MySQL connection").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_migration_lock_is_waited_for_then_named_on_sqlite() {
    a_held_lock_is_waited_for_then_named(Backend::Sqlite, "another process writing").await
}

/// Another session holds the lock (as an instance that migrates would):
/// `migrate up` says it waits, gives up after `database.migrate_lock_wait`
/// naming the holder, and migrates once the lock is free.
async fn a_held_lock_is_waited_for_then_named(backend: Backend, holder: &str) {
    use order_timeout::db::migrate::{MYSQL_LOCK_PREFIX, POSTGRES_LOCK_KEY};
    use sea_orm::{SqliteTransactionMode, TransactionOptions, TransactionTrait};

    let fresh = fresh(Spawn::new(backend, DelayMode::Ttl)).await;
    let mut options = sea_orm::ConnectOptions::new(fresh.database_url());
    // In WAL mode, as the service opens it: switching a file's journal mode
    // needs it alone, which this session would deny the service.
    options
        .max_connections(1)
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|o| o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal));
    let session = Database::connect(options).await.unwrap();
    let held = match backend {
        Backend::Postgres => {
            let sql = format!("SELECT pg_advisory_lock({POSTGRES_LOCK_KEY})");
            session.execute_unprepared(&sql).await.unwrap();
            None
        }
        Backend::MariaDb => {
            let sql = format!("SELECT GET_LOCK(CONCAT('{MYSQL_LOCK_PREFIX}', DATABASE()), 5)");
            session.execute_unprepared(&sql).await.unwrap();
            None
        }
        Backend::Sqlite => Some(
            session
                .begin_with_options(TransactionOptions {
                    sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                    ..Default::default()
                })
                .await
                .unwrap(),
        ),
    };
    let migrate = || {
        std::process::Command::new(BIN)
            .args(["migrate", "up"])
            .envs(fresh.env.clone())
            .env("ORDER_TIMEOUT__DATABASE__MIGRATE_LOCK_WAIT", "2s")
            .output()
            .unwrap()
    };
    let started = std::time::Instant::now();
    let out = migrate();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{backend:?}: {text}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{backend:?}: waited: {text}"
    );
    assert!(text.contains(WAITING), "{backend:?}: says it waits: {text}");
    assert!(
        text.contains("still holds the migration lock after 2s") && text.contains(holder),
        "{backend:?}: names the holder: {text}"
    );

    match held {
        Some(txn) => txn.rollback().await.unwrap(),
        None => session.close().await.unwrap(),
    }
    let out = migrate();
    assert!(out.status.success(), "{backend:?}: {out:?}");
    assert_each_migration_applied_once(fresh.database_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_migrated_by_a_newer_release_is_run_on_as_it_is() {
    // An instance of this version restarting during a rollout to a newer
    // one: the database records a migration it does not know.
    let fresh = fresh(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    let migrate = || {
        std::process::Command::new(BIN)
            .args(["migrate", "up"])
            .envs(fresh.env.clone())
            .output()
            .unwrap()
    };
    assert!(migrate().status.success());
    let newer = "m29991231_000001_from_a_newer_release";
    admin(
        fresh.database_url(),
        &format!("INSERT INTO seaql_migrations (version, applied_at) VALUES ('{newer}', 0)"),
    )
    .await;
    let out = migrate();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("migrated by a newer release") && text.contains(newer),
        "{text}"
    );
    // And `serve` starts on it.
    let logs = Logs(vec![
        std::env::temp_dir().join(format!("{}-newer.log", fresh.vhost)),
    ]);
    let mut child = Serve::new(BIN)
        .envs(fresh.env.clone())
        .log(&logs.0[0])
        .start()
        .expect("serve starts");
    child
        .wait_ready(&fresh.http, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", child.log_text()));
    child.stop();
}

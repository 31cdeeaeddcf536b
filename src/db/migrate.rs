//! Migrations under a database lock, so that any number of instances may
//! start at once on one database: the first takes the lock and migrates, the
//! others wait for it (saying so), then find nothing pending and go on.
//!
//! Without the lock, two instances that start together on an empty
//! PostgreSQL database both create the same table, and one fails with
//! `duplicate key value violates unique constraint "pg_type_typname_nsp_index"`;
//! on MariaDB, whose DDL is not transactional, a migration could be left half
//! applied.

use std::time::Duration;

use migrations::{Bookkeeping, Migrator, MigratorTrait};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, IntoDatabaseExecutor,
    SqliteTransactionMode, SqlxMySqlConnector, SqlxPostgresConnector, Statement,
    TransactionOptions, TransactionTrait,
};

/// The PostgreSQL advisory lock key of migrations: the ASCII bytes of
/// `order-to` as a 64-bit integer (`8030591472425071727`). Advisory locks are
/// per database, so instances on different databases never wait for each
/// other. An operator can see who holds it in `pg_locks` (`locktype =
/// 'advisory'`, `classid = 1869767781`, `objid = 1915581551`).
pub const POSTGRES_LOCK_KEY: i64 = 0x6f72_6465_722d_746f;

/// The MariaDB/MySQL named lock of migrations is this followed by the
/// database's name (cut to the 64 characters `GET_LOCK` takes): named locks
/// are server-wide, so the name must say which database it guards.
pub const MYSQL_LOCK_PREFIX: &str = "order-timeout migrations ";

/// How long to wait for another instance's migration, and what to say
/// while waiting or about a schema newer than this version (the caller's
/// telemetry: the database layer does not log).
#[derive(Clone, Copy)]
pub struct MigrationLock {
    /// Past this, the wait ends with an error naming who holds the lock.
    pub wait: Duration,
    /// Called once, with who holds the lock, when this instance has to wait.
    pub waiting: fn(holder: &str, wait: Duration),
    /// Called with the migrations a newer release applied that this version
    /// does not know (it then migrates nothing and runs on that schema).
    pub newer: fn(unknown: &[String]),
}

impl MigrationLock {
    /// A lock wait that says nothing (tools and tests).
    pub fn quiet(wait: Duration) -> Self {
        Self {
            wait,
            waiting: |_, _| {},
            newer: |_| {},
        }
    }
}

/// What a migrator does, given the migrations it knows and those the
/// database records.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Apply what is pending (maybe nothing).
    Apply,
    /// Leave the schema alone: a newer release applied these migrations,
    /// after every one this version knows.
    Newer(Vec<String>),
}

/// Whether to migrate a database that may have been migrated by a newer
/// release.
///
/// During a rolling upgrade an instance of the release before may restart
/// after the new one migrated. The migrations of a minor series are
/// additive (UPGRADING.md, "Rolling upgrades"), so when every migration this
/// version knows is applied, it runs on the newer schema as it is; SeaORM's
/// own check would refuse to start ("migration file … is missing"). A
/// database that records unknown migrations but lacks some of this
/// version's is no schema either release made: that is an error.
fn plan(known: &[String], applied: &[String]) -> Result<Plan, DbErr> {
    let unknown: Vec<String> = applied
        .iter()
        .filter(|a| !known.contains(a))
        .cloned()
        .collect();
    if unknown.is_empty() {
        return Ok(Plan::Apply);
    }
    let missing: Vec<&String> = known.iter().filter(|k| !applied.contains(k)).collect();
    if missing.is_empty() {
        Ok(Plan::Newer(unknown))
    } else {
        Err(DbErr::Migration(format!(
            "the database records migrations this version does not know ({}) but lacks some it \
             needs ({}): it was not migrated by a release of this series; run the release that \
             applied them, or restore the database",
            unknown.join(", "),
            missing
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// Applies `M`'s pending migrations, unless a newer release migrated past
/// them ([`plan`]).
async fn up<'c, M, C>(conn: &'c C, lock: MigrationLock) -> Result<(), DbErr>
where
    M: MigratorTrait,
    C: ConnectionTrait,
    &'c C: IntoDatabaseExecutor<'c>,
{
    let known: Vec<String> = M::migrations()
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    // Creates the migration table when there is none: under the lock.
    let applied: Vec<String> = M::get_migration_models(conn)
        .await?
        .into_iter()
        .map(|m| m.version)
        .collect();
    match plan(&known, &applied)? {
        Plan::Apply => M::up(conn, None).await,
        Plan::Newer(unknown) => {
            (lock.newer)(&unknown);
            Ok(())
        }
    }
}

/// What to do once the lock is held.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    /// Apply every pending migration: the service's own (when it owns the
    /// orders), then the bookkeeping ones.
    Up { owned: bool },
    /// Roll back the most recent migration.
    DownOne { owned: bool },
}

/// How a backend keeps two processes from migrating at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A session advisory lock ([`POSTGRES_LOCK_KEY`]) on one dedicated connection.
    Advisory,
    /// A named lock (`GET_LOCK`) on one dedicated connection.
    Named,
    /// The database file's write lock, held by one `BEGIN IMMEDIATE`
    /// transaction around the whole migration.
    FileWrite,
}

/// The lock each backend takes around a migration.
///
/// PostgreSQL and MariaDB/MySQL locks belong to a session, and SeaORM's
/// connection is a pool whose statements may each run on another connection:
/// so the lock is taken, the migrations run and the lock is released on a
/// pool of exactly one connection of its own (never recycled while it runs),
/// not on the service's pools. A session lock, rather than one held by a
/// transaction around everything, leaves each migration its own transaction
/// (PostgreSQL) and works where DDL commits on its own (MariaDB). SQLite has
/// no such locks, but its DDL is transactional and one writer excludes every
/// other: a `BEGIN IMMEDIATE` transaction takes the file's write lock before
/// anything is read, so a second process waits at its `BEGIN`, then reads
/// the migrations the first committed.
fn guard(backend: DbBackend) -> Guard {
    match backend {
        DbBackend::Postgres => Guard::Advisory,
        DbBackend::MySql => Guard::Named,
        _ => Guard::FileWrite,
    }
}

/// Runs `step` under the migration lock of `db`'s backend.
pub(super) async fn locked(
    db: &DatabaseConnection,
    step: Step,
    lock: MigrationLock,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    match guard(backend) {
        Guard::Advisory | Guard::Named => {
            let session = dedicated(db, backend).await?;
            let result = match acquire(&session, backend, lock).await {
                Ok(()) => {
                    let applied = apply(&session, step, lock).await;
                    let released = release(&session, backend).await;
                    applied.and(released)
                }
                Err(e) => Err(e),
            };
            session.close().await.ok();
            result
        }
        Guard::FileWrite => sqlite_locked(db, step, lock).await,
    }
}

/// A pool of one connection, with the settings of `db`'s pool, that is never
/// closed for age or idleness while a migration runs on it: the session that
/// holds the lock.
async fn dedicated(
    db: &DatabaseConnection,
    backend: DbBackend,
) -> Result<DatabaseConnection, DbErr> {
    let conn_err = |e: sea_orm::sqlx::Error| {
        DbErr::Migration(format!(
            "cannot open a connection to take the migration lock: {e}"
        ))
    };
    match backend {
        DbBackend::Postgres => Ok(SqlxPostgresConnector::from_sqlx_postgres_pool(
            one_of(db.get_postgres_connection_pool())
                .await
                .map_err(conn_err)?,
        )),
        _ => Ok(SqlxMySqlConnector::from_sqlx_mysql_pool(
            one_of(db.get_mysql_connection_pool())
                .await
                .map_err(conn_err)?,
        )),
    }
}

/// A new pool of one connection with `pool`'s options and connect options,
/// never recycled for age or idleness.
async fn one_of<D: sea_orm::sqlx::Database>(
    pool: &sea_orm::sqlx::Pool<D>,
) -> Result<sea_orm::sqlx::Pool<D>, sea_orm::sqlx::Error> {
    pool.options()
        .clone()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with((*pool.connect_options()).clone())
        .await
}

/// The MariaDB/MySQL lock name, as an SQL expression.
fn mysql_lock_name() -> String {
    format!("LEFT(CONCAT('{MYSQL_LOCK_PREFIX}', COALESCE(DATABASE(), '')), 64)")
}

/// Takes the session lock: at once if free, else after telling
/// [`MigrationLock::waiting`] who holds it, within [`MigrationLock::wait`].
async fn acquire(
    session: &DatabaseConnection,
    backend: DbBackend,
    lock: MigrationLock,
) -> Result<(), DbErr> {
    let name = mysql_lock_name();
    let try_now = match backend {
        DbBackend::Postgres => {
            format!("SELECT pg_try_advisory_lock({POSTGRES_LOCK_KEY})::int::bigint AS got")
        }
        _ => format!("SELECT CAST(COALESCE(GET_LOCK({name}, 0), 0) AS SIGNED) AS got"),
    };
    if answer(session, &try_now).await? {
        return Ok(());
    }
    (lock.waiting)(&holder(session, backend).await, lock.wait);
    let waited = match backend {
        DbBackend::Postgres => {
            // lock_timeout bounds the wait of pg_advisory_lock; the session is
            // ours alone, and it is reset before any migration runs.
            session
                .execute_unprepared(&format!(
                    "SET lock_timeout = {}",
                    lock.wait.as_millis().max(1)
                ))
                .await?;
            let got = session
                .execute_unprepared(&format!("SELECT pg_advisory_lock({POSTGRES_LOCK_KEY})"))
                .await;
            session.execute_unprepared("RESET lock_timeout").await?;
            match got {
                Ok(_) => true,
                Err(e) if e.to_string().contains("lock timeout") => false,
                Err(e) => return Err(e),
            }
        }
        _ => {
            // GET_LOCK waits whole seconds: round up, so the wait is never shorter.
            let secs = lock.wait.as_secs() + u64::from(lock.wait.subsec_nanos() > 0);
            answer(
                session,
                &format!("SELECT CAST(COALESCE(GET_LOCK({name}, {secs}), 0) AS SIGNED) AS got"),
            )
            .await?
        }
    };
    if waited {
        Ok(())
    } else {
        Err(timed_out(&holder(session, backend).await, lock.wait))
    }
}

/// The error of a wait that ran out.
fn timed_out(holder: &str, wait: Duration) -> DbErr {
    DbErr::Migration(format!(
        "another instance's migration still holds the migration lock after {} ({holder}); \
         if it is stuck, end that session, or raise database.migrate_lock_wait for a long migration",
        humantime::format_duration(wait)
    ))
}

/// Releases the session lock; a lock that was no longer held (the
/// connection was lost and replaced mid-way) is an error: another instance
/// may have migrated at the same time.
async fn release(session: &DatabaseConnection, backend: DbBackend) -> Result<(), DbErr> {
    let sql = match backend {
        DbBackend::Postgres => {
            format!("SELECT pg_advisory_unlock({POSTGRES_LOCK_KEY})::int::bigint AS got")
        }
        _ => format!(
            "SELECT CAST(COALESCE(RELEASE_LOCK({}), 0) AS SIGNED) AS got",
            mysql_lock_name()
        ),
    };
    if answer(session, &sql).await? {
        Ok(())
    } else {
        Err(DbErr::Migration(
            "the migration lock was lost while migrating (the connection holding it closed); \
             run `order-timeout migrate status` to see what was applied"
                .into(),
        ))
    }
}

/// Whether the integer column `got` of a one-row query is 1 (the lock
/// functions answer 1, 0 or NULL).
async fn answer(session: &DatabaseConnection, sql: &str) -> Result<bool, DbErr> {
    let backend = session.get_database_backend();
    let row = session
        .query_one_raw(Statement::from_string(backend, sql))
        .await?;
    Ok(row.and_then(|r| r.try_get::<Option<i64>>("", "got").ok().flatten()) == Some(1))
}

/// Who holds the lock, as the database tells: enough for an operator to
/// find the process (a session id, its client, since when).
async fn holder(session: &DatabaseConnection, backend: DbBackend) -> String {
    let (sql, describe): (String, fn(&sea_orm::QueryResult) -> Option<String>) = match backend {
        DbBackend::Postgres => (
            format!(
                "SELECT a.pid::bigint AS pid, COALESCE(host(a.client_addr), 'a local socket') AS client, \
                 COALESCE(a.application_name, '') AS app, a.backend_start::text AS since \
                 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                 AND l.classid = {}::oid AND l.objid = {}::oid \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (POSTGRES_LOCK_KEY >> 32) as u32,
                POSTGRES_LOCK_KEY as u32
            ),
            |r| {
                let pid: i64 = r.try_get("", "pid").ok()?;
                let client: String = r.try_get("", "client").ok()?;
                let app: String = r.try_get("", "app").ok()?;
                let since: String = r.try_get("", "since").ok()?;
                let app = if app.is_empty() {
                    String::new()
                } else {
                    format!(", application '{app}'")
                };
                Some(format!(
                    "held by PostgreSQL backend pid {pid}, from {client}{app}, connected since {since}"
                ))
            },
        ),
        _ => (
            format!(
                "SELECT CAST(p.ID AS SIGNED) AS id, p.USER AS user, p.HOST AS host \
                 FROM information_schema.PROCESSLIST p WHERE p.ID = IS_USED_LOCK({})",
                mysql_lock_name()
            ),
            |r| {
                let id: i64 = r.try_get("", "id").ok()?;
                let user: String = r.try_get("", "user").ok()?;
                let host: String = r.try_get("", "host").ok()?;
                Some(format!(
                    "held by MariaDB/MySQL connection {id}, {user}@{host}"
                ))
            },
        ),
    };
    let row = session
        .query_one_raw(Statement::from_string(backend, sql))
        .await;
    match row {
        Ok(Some(row)) => describe(&row),
        _ => None,
    }
    .unwrap_or_else(|| "held by a session this role cannot see".to_string())
}

/// SQLite: the whole step in one `BEGIN IMMEDIATE` transaction. The first
/// attempt does not wait (busy timeout 0), so a wait is said before it
/// begins; the second waits up to [`MigrationLock::wait`].
async fn sqlite_locked(
    db: &DatabaseConnection,
    step: Step,
    lock: MigrationLock,
) -> Result<(), DbErr> {
    let immediate = TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..Default::default()
    };
    let restore = format!(
        "PRAGMA busy_timeout = {}",
        super::SQLITE_BUSY_TIMEOUT.as_millis()
    );
    db.execute_unprepared("PRAGMA busy_timeout = 0").await?;
    let txn = match db.begin_with_options(immediate).await {
        Ok(txn) => Ok(txn),
        Err(e) if is_busy(&e) => {
            let holder = "held by another process writing to this SQLite file";
            (lock.waiting)(holder, lock.wait);
            db.execute_unprepared(&format!("PRAGMA busy_timeout = {}", lock.wait.as_millis()))
                .await?;
            match db.begin_with_options(immediate).await {
                Err(e) if is_busy(&e) => Err(timed_out(holder, lock.wait)),
                other => other,
            }
        }
        Err(e) => Err(e),
    };
    let txn = match txn {
        Ok(txn) => txn,
        Err(e) => {
            db.execute_unprepared(&restore).await.ok();
            return Err(e);
        }
    };
    // The pool's one connection is the transaction's now: restored through it.
    txn.execute_unprepared(&restore).await?;
    match apply(&txn, step, lock).await {
        Ok(()) => txn.commit().await,
        Err(e) => {
            txn.rollback().await.ok();
            Err(e)
        }
    }
}

/// Whether SQLite said another connection holds the lock it needs.
fn is_busy(e: &DbErr) -> bool {
    let text = e.to_string();
    text.contains("database is locked") || text.contains("database is busy")
}

/// The step itself, on the connection that holds the lock.
async fn apply<'c, C>(conn: &'c C, step: Step, lock: MigrationLock) -> Result<(), DbErr>
where
    C: ConnectionTrait,
    &'c C: IntoDatabaseExecutor<'c>,
{
    match step {
        Step::Up { owned } => {
            if owned {
                up::<Migrator, C>(conn, lock).await?;
            }
            up::<Bookkeeping, C>(conn, lock).await
        }
        Step::DownOne { owned } => {
            // The bookkeeping migrations were applied after the service's own.
            if owned && Bookkeeping::get_applied_migrations(conn).await?.is_empty() {
                Migrator::down(conn, Some(1)).await
            } else {
                Bookkeeping::down(conn, Some(1)).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_has_its_own_guard() {
        assert_eq!(guard(DbBackend::Postgres), Guard::Advisory);
        assert_eq!(guard(DbBackend::MySql), Guard::Named);
        assert_eq!(guard(DbBackend::Sqlite), Guard::FileWrite);
    }

    #[test]
    fn the_postgres_key_is_the_documented_one() {
        assert_eq!(POSTGRES_LOCK_KEY, 8_030_591_472_425_071_727);
        assert_eq!(POSTGRES_LOCK_KEY.to_be_bytes(), *b"order-to");
        assert_eq!((POSTGRES_LOCK_KEY >> 32) as u32, 1_869_767_781);
        assert_eq!(POSTGRES_LOCK_KEY as u32, 1_915_581_551);
    }

    #[test]
    fn a_schema_a_newer_release_migrated_is_left_as_it_is() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let known = names(&["m1", "m2"]);
        assert_eq!(plan(&known, &[]).unwrap(), Plan::Apply);
        assert_eq!(plan(&known, &names(&["m1"])).unwrap(), Plan::Apply);
        assert_eq!(plan(&known, &known).unwrap(), Plan::Apply);
        assert_eq!(
            plan(&known, &names(&["m1", "m2", "m3"])).unwrap(),
            Plan::Newer(names(&["m3"]))
        );
        let e = plan(&known, &names(&["m1", "m3"])).unwrap_err().to_string();
        assert!(e.contains("(m3)") && e.contains("(m2)"), "{e}");
    }

    #[test]
    fn a_timed_out_wait_names_the_holder_and_the_setting() {
        let e = timed_out(
            "held by PostgreSQL backend pid 42",
            Duration::from_secs(300),
        )
        .to_string();
        assert!(e.contains("pid 42"), "{e}");
        assert!(e.contains("5m"), "{e}");
        assert!(e.contains("database.migrate_lock_wait"), "{e}");
    }
}

//! The database: connecting (with the right settings per backend), migrating
//! (under a lock, [`migrate`]),
//! the transactions in [`store`], and the domain events every transition
//! appends ([`events`]).

pub mod clock;
pub mod entities;
pub mod events;
pub mod migrate;
pub mod pauses;
pub mod store;

use std::time::Duration;

use migrations::{Bookkeeping, Migrator, MigratorTrait};

pub use migrate::MigrationLock;
use migrate::Step;
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend, DbErr};

use crate::settings::DatabaseSettings;

/// Most values one statement binds from a list (ids in an `IN`, SKUs in a
/// `CASE`, rows of a multi-row `INSERT`). SQLite accepts 32,766 bind
/// parameters per statement, PostgreSQL and MySQL 65,535; a stock move binds
/// five per SKU, an audit row seven and an event row six, so lists are cut
/// well below both. (Also `store::LIST_CHUNK`.)
pub const LIST_CHUNK: usize = 500;

/// How long a SQLite writer waits for another connection's write to end
/// before it fails with `database is locked`.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the configured database with a pool of `database.max_connections`
/// (what `doctor`, `migrate` and the tools use).
pub async fn connect(settings: &DatabaseSettings) -> Result<DatabaseConnection, DbErr> {
    connect_pool(settings, settings.max_connections).await
}

/// The two pools of a running service: `(background, api)`. The consumers,
/// relay and sweeper use the first, HTTP handlers the second, so requests that
/// exhaust their pool (a flood, or a lock they wait on) cannot keep timeouts
/// from being applied. An in-memory SQLite database exists once per
/// connection, so there both are the same pool.
pub async fn connect_pools(
    settings: &DatabaseSettings,
) -> Result<(DatabaseConnection, DatabaseConnection), DbErr> {
    let background = connect_pool(settings, settings.background_connections).await?;
    let url = settings.url.expose();
    if url.starts_with("sqlite:") && (url.contains(":memory:") || url.contains("mode=memory")) {
        return Ok((background.clone(), background));
    }
    let api = connect_pool(settings, settings.max_connections).await?;
    Ok((background, api))
}

/// Connects a pool of at most `size` connections.
///
/// SQLite gets WAL (readers never block the writer), `synchronous = NORMAL`
/// (no fsync per commit: a process crash loses nothing, but a power cut or OS
/// crash may take back the last commits; docs/operations.md, "Choosing the
/// database", says what that means), foreign keys, a busy timeout,
/// and a single pooled connection: SQLite has one writer anyway, and one
/// connection means no `database is locked` between our own transactions.
/// The service's two pools are two writers on one file: the busy timeout makes
/// each wait for the other's commit. Every transaction of the store begins
/// with a write, which SQLite retries under the busy timeout (a transaction
/// that read first could not be retried and would fail at once).
pub async fn connect_pool(
    settings: &DatabaseSettings,
    size: u32,
) -> Result<DatabaseConnection, DbErr> {
    let url = settings.url.expose();
    let mut options = ConnectOptions::new(url.to_string());
    options
        .sqlx_logging(false)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(10));
    if url.starts_with("sqlite:") {
        options
            .max_connections(1)
            .min_connections(1)
            .map_sqlx_sqlite_opts(|o| {
                o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                    .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                    .foreign_keys(true)
                    .busy_timeout(SQLITE_BUSY_TIMEOUT)
            });
    } else {
        options.max_connections(size);
    }
    // A driver's error may quote the URL it was given: never with its password.
    Database::connect(options)
        .await
        .map_err(|e| DbErr::Custom(crate::settings::scrub_url(&e.to_string(), url)))
}

/// Applies pending migrations: the service's own tables ([`Migrator`]), then
/// its bookkeeping tables, under the migration lock ([`MigrationLock`]).
pub async fn migrate(db: &DatabaseConnection, lock: MigrationLock) -> Result<(), DbErr> {
    migrate::locked(db, Step::Up { owned: true }, lock).await
}

/// The migrations a database needs: all of them when the service owns the
/// orders, only the bookkeeping ones ([`Bookkeeping`]: the event outbox and
/// the audit trail, all named `order_timeout_…`, recorded in their own
/// migration table) in a shop's database (`orders.source = mapped`), whose
/// own tables are never touched. Under the migration lock, so instances
/// that start together apply each migration once.
///
/// A role that may not change the schema (least privilege: `serve` on row
/// rights only) gets an error saying so and what to do, not the driver's text
/// alone.
pub async fn migrate_for(
    db: &DatabaseConnection,
    owned: bool,
    lock: MigrationLock,
) -> Result<(), DbErr> {
    migrate::locked(db, Step::Up { owned }, lock)
        .await
        .map_err(|e| {
            let text = e.to_string();
            let denied = ["permission denied", "command denied", "access denied"]
                .iter()
                .any(|d| text.to_lowercase().contains(d));
            if denied {
                DbErr::Migration(format!(
                    "the role of database.url may not change the schema ({text}): run the migrations \
                     as the role that owns the schema (`order-timeout migrate up` with its URL), and \
                     serve with database.migrate_on_start = false (docs/operations.md: least privilege \
                     on the database)"
                ))
            } else {
                e
            }
        })
}

/// Rolls back the most recent migration, under the migration lock: the last
/// bookkeeping one while any is applied (they were applied after the
/// service's own), else the last of the service's own.
pub async fn migrate_down_one(
    db: &DatabaseConnection,
    owned: bool,
    lock: MigrationLock,
) -> Result<(), DbErr> {
    migrate::locked(db, Step::DownOne { owned }, lock).await
}

/// `(applied, pending)` migration names, the service's own (when it owns
/// the orders) then the bookkeeping ones, in the order they apply. Read
/// only: a database that was never migrated is reported, not changed.
pub async fn migration_status(
    db: &DatabaseConnection,
    owned: bool,
) -> Result<(Vec<String>, Vec<String>), DbErr> {
    let mut all = if owned {
        Migrator::get_migration_with_status_read_only(db).await?
    } else {
        Vec::new()
    };
    all.extend(Bookkeeping::get_migration_with_status_read_only(db).await?);
    let (applied, pending): (Vec<_>, Vec<_>) = all
        .iter()
        .partition(|m| m.status() == migrations::MigrationStatus::Applied);
    let names = |list: Vec<&migrations::Migration>| -> Vec<String> {
        list.iter().map(|m| m.name().to_string()).collect()
    };
    Ok((names(applied), names(pending)))
}

/// Cheap round trip, for `/readyz` and `doctor`.
pub async fn ping(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.ping().await
}

/// The backend's name for logs.
pub fn backend_name(db: &DatabaseConnection) -> &'static str {
    match db.get_database_backend() {
        DbBackend::Postgres => "postgres",
        DbBackend::Sqlite => "sqlite",
        DbBackend::MySql => "mysql",
        _ => "unknown",
    }
}

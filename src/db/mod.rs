//! The database: connecting (with the right settings per backend), migrating,
//! and the transactions in [`store`].

pub mod entities;
pub mod store;

use std::time::Duration;

use migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend, DbErr};

use crate::settings::DatabaseSettings;

/// Connects to the configured database.
///
/// SQLite gets WAL (readers never block the writer), `synchronous = NORMAL`
/// (no fsync per commit: a process crash loses nothing, but a power cut or OS
/// crash may take back the last commits; the README says what that means),
/// foreign keys, a busy timeout,
/// and a single pooled connection: SQLite has one writer anyway, and one
/// connection means no `database is locked` between our own transactions.
pub async fn connect(settings: &DatabaseSettings) -> Result<DatabaseConnection, DbErr> {
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
                    .busy_timeout(Duration::from_secs(10))
            });
    } else {
        options.max_connections(settings.max_connections);
    }
    // A driver's error may quote the URL it was given: never with its password.
    Database::connect(options)
        .await
        .map_err(|e| DbErr::Custom(crate::settings::scrub_url(&e.to_string(), url)))
}

/// Applies pending migrations.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

/// `(applied, pending)` migration names.
pub async fn migration_status(
    db: &DatabaseConnection,
) -> Result<(Vec<String>, Vec<String>), DbErr> {
    let applied: Vec<String> = Migrator::get_applied_migrations(db)
        .await?
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    let pending: Vec<String> = Migrator::get_pending_migrations(db)
        .await?
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    Ok((applied, pending))
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

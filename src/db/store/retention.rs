//! Bounded deletes of rows past their retention: the oldest first, at most
//! a batch per statement, so that no statement holds many locks or runs
//! long, even on the first run over years of rows. Each table's column is
//! indexed, so a batch reads only what it deletes.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

use crate::domain::Millis;

/// Deletes at most `batch` rows of `table` whose `column` (epoch
/// milliseconds) is before `before`, oldest first; the number deleted (fewer
/// than `batch`: none are left). `table` and `column` are the service's own
/// names, never a setting's.
pub(super) async fn delete_before(
    db: &DatabaseConnection,
    table: &str,
    column: &str,
    before: Millis,
    batch: u64,
) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        // MariaDB takes no LIMIT in an IN subquery, but a DELETE's own.
        DbBackend::MySql => {
            format!("DELETE FROM {table} WHERE {column} < ? ORDER BY {column} LIMIT {batch}")
        }
        // SQLite's DELETE … LIMIT is a compile-time option; the row id is not.
        DbBackend::Sqlite => format!(
            "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} \
             WHERE {column} < ? ORDER BY {column} LIMIT {batch})"
        ),
        _ => format!(
            "DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} \
             WHERE {column} < $1 ORDER BY {column} LIMIT {batch})"
        ),
    };
    let done = db
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [before.0.into()],
        ))
        .await?;
    Ok(done.rows_affected())
}

/// Deletes at most `batch` rows of `order_timeout_audit` written before
/// `before` (its `at_ms`, the database's clock at the transition), oldest
/// first; the number deleted (fewer than `batch`: none are left).
pub async fn delete_old_audit(
    db: &DatabaseConnection,
    before: Millis,
    batch: u64,
) -> Result<u64, DbErr> {
    delete_before(db, "order_timeout_audit", "at_ms", before, batch).await
}

//! Raw reads on the bench's own connection to the run's database: the bench
//! reads the service's tables as SQL, not through the service's code.

use anyhow::Context as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, QueryResult, Statement};

/// Every row `sql` returns; the error names the statement.
pub(crate) async fn query(db: &DatabaseConnection, sql: &str) -> anyhow::Result<Vec<QueryResult>> {
    db.query_all_raw(Statement::from_string(
        db.get_database_backend(),
        sql.to_string(),
    ))
    .await
    .with_context(|| format!("query failed: {sql}"))
}

/// The first column of the first row of `sql`, a `COUNT(*)`.
pub(crate) async fn count(db: &DatabaseConnection, sql: &str) -> anyhow::Result<i64> {
    let rows = query(db, sql).await?;
    let row = rows.first().with_context(|| format!("no row from {sql}"))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

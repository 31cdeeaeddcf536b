//! The shared pauses in `order_timeout_pauses`: one row per role paused for
//! every instance. Pausing is one `INSERT` that the primary key lets only
//! the first pauser win (a second pause of a paused role changes nothing
//! and keeps who paused it first, and when); resuming is one `DELETE`. Each
//! statement's outcome is the answer: nothing here reads a row to decide
//! what to write.

use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set, SqlErr};

use super::entities::order_timeout_pauses as pauses;

/// A role paused for every instance, as stored.
pub type Row = pauses::Model;

/// Writes the pause of `row.role`; `false` when the role already was
/// paused (its row, and so its first pauser, stays).
pub async fn insert(db: &impl ConnectionTrait, row: Row) -> Result<bool, DbErr> {
    let row = pauses::ActiveModel {
        role: Set(row.role),
        paused_at_ms: Set(row.paused_at_ms),
        paused_by: Set(row.paused_by),
        instance: Set(row.instance),
        reason: Set(row.reason),
    };
    // A plain INSERT outside any transaction: the key refuses a second row
    // on every backend alike, and the refusal leaves nothing to roll back.
    match pauses::Entity::insert(row).exec_without_returning(db).await {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the pause of `role`; `false` when it was not paused.
pub async fn delete(db: &impl ConnectionTrait, role: &str) -> Result<bool, DbErr> {
    let done = pauses::Entity::delete_by_id(role.to_string())
        .exec(db)
        .await?;
    Ok(done.rows_affected > 0)
}

/// The pause of one role, if it is paused.
pub async fn get(db: &impl ConnectionTrait, role: &str) -> Result<Option<Row>, DbErr> {
    pauses::Entity::find_by_id(role.to_string()).one(db).await
}

/// Every shared pause.
pub async fn all(db: &impl ConnectionTrait) -> Result<Vec<Row>, DbErr> {
    pauses::Entity::find().all(db).await
}

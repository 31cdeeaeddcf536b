//! Checkout: an order, its stock reservation, its payment timeout in the
//! outbox and its idempotency key, in one transaction.

use super::*;
use crate::domain::CREATED;

/// Creates an order: reserves stock, writes the order `pending_payment`, its
/// items, and the outbox row of its payment timeout, in one transaction. Short
/// stock on any line rolls everything back.
///
/// With an idempotency key, the key is written in the same transaction, so an
/// order exists with its key or not at all; a key used before answers
/// [`CheckoutError::Replay`] or [`CheckoutError::KeyReused`] and reserves
/// nothing. A refused checkout keeps no key: it may be retried with it. Keys
/// are the caller's ([`IdempotencyKey::scope`]), and one older than its
/// retention is claimed anew, as if it had never been used.
pub async fn checkout(
    db: &DatabaseConnection,
    items: &[NewItem],
    window: Duration,
    now: Millis,
    key: Option<&IdempotencyKey>,
) -> Result<Order, CheckoutError> {
    let mut items = items.to_vec();
    items.sort_by(|a, b| a.sku.cmp(&b.sku));
    let txn = db.begin().await?;
    if let Some(key) = key
        && !claim_key(&txn, key, now).await?
    {
        txn.rollback().await?;
        return Err(key_used(db, key).await?);
    }
    if let Err(short) = reserve(&txn, &items, now).await? {
        txn.rollback().await?;
        return Err(short);
    }
    let created = create_order(&txn, items, now.plus(window), now).await?;
    if let Some(key) = key {
        let answer = (key.answer)(&created)
            .map_err(|e| DbErr::Custom(format!("cannot encode the order: {e}")))?;
        settle_key(&txn, key, created.id, answer).await?;
    }
    txn.commit().await?;
    Ok(created)
}

/// Reserves every line, or says which line is short (the caller rolls back).
async fn reserve(
    txn: &DatabaseTransaction,
    items: &[NewItem],
    now: Millis,
) -> Result<Result<(), CheckoutError>, DbErr> {
    // The rows are locked first, in the database's order, as every stock move
    // locks them: a checkout and a batch releasing the same SKUs cannot deadlock.
    if items.len() > 1 {
        let skus: Vec<&str> = items.iter().map(|i| i.sku.as_str()).collect();
        lock_stock(txn, &skus).await?;
    }
    for item in items {
        let reserved = inventory::Entity::update_many()
            .col_expr(
                inventory::Column::Available,
                Expr::col(inventory::Column::Available).sub(item.quantity),
            )
            .col_expr(
                inventory::Column::Reserved,
                Expr::col(inventory::Column::Reserved).add(item.quantity),
            )
            .col_expr(inventory::Column::UpdatedAtMs, Expr::value(now.0))
            .filter(inventory::Column::Sku.eq(item.sku.as_str()))
            .filter(inventory::Column::Available.gte(item.quantity))
            .exec(txn)
            .await?;
        if reserved.rows_affected == 0 {
            // The update said no; this read only words the answer.
            return Ok(Err(match get_stock(txn, &item.sku).await? {
                None => CheckoutError::UnknownSku(item.sku.clone()),
                Some(stock) => CheckoutError::InsufficientStock {
                    sku: item.sku.clone(),
                    requested: item.quantity,
                    available: stock.available,
                },
            }));
        }
    }
    Ok(Ok(()))
}

/// Writes the order `pending_payment`, its items, the outbox row of its
/// payment timeout and its first audit row.
async fn create_order(
    txn: &DatabaseTransaction,
    items: Vec<NewItem>,
    deadline: Millis,
    now: Millis,
) -> Result<Order, DbErr> {
    let order = orders::ActiveModel {
        status: Set(OrderStatus::PendingPayment.as_str().to_string()),
        pay_deadline_ms: Set(deadline.0),
        ship_deadline_ms: Set(None),
        confirm_deadline_ms: Set(None),
        created_at_ms: Set(now.0),
        paid_at_ms: Set(None),
        shipped_at_ms: Set(None),
        completed_at_ms: Set(None),
        cancelled_at_ms: Set(None),
        fulfillment_overdue_at_ms: Set(None),
        late_payment_at_ms: Set(None),
        version: Set(0),
        updated_at_ms: Set(now.0),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    order_items::Entity::insert_many(items.iter().map(|i| order_items::ActiveModel {
        order_id: Set(order.id),
        sku: Set(i.sku.clone()),
        quantity: Set(i.quantity),
    }))
    .exec_without_returning(txn)
    .await?;
    let id = OrderId::new(order.id);
    enqueue(txn, id, TimeoutKind::Payment, deadline, now).await?;
    let pending = OrderStatus::PendingPayment;
    record(txn, &[id], CREATED, None, pending, Cause::Api, now, None).await?;
    let items = items
        .into_iter()
        .map(|i| Item {
            sku: i.sku,
            quantity: i.quantity,
        })
        .collect();
    order_from(order, items)
}

/// Claims an idempotency key: the first statement of the checkout, so that a
/// concurrent checkout with the same key waits on the key (PostgreSQL and
/// MariaDB block on the uncommitted row; SQLite has one writer) before it has
/// reserved anything, and then finds it taken. False when the key is taken.
async fn claim_key(
    txn: &DatabaseTransaction,
    key: &IdempotencyKey,
    now: Millis,
) -> Result<bool, DbErr> {
    // A key past its retention is new again, whether or not the cleaner has
    // deleted it yet. Deleted in this transaction, so a concurrent checkout
    // with the same key waits on the row, then claims or finds it taken.
    let expired = now.minus(key.retention).0;
    let stale = idempotency_keys::Entity::delete_many()
        .filter(idempotency_keys::Column::Scope.eq(key.scope.as_str()))
        .filter(idempotency_keys::Column::Key.eq(key.key.as_str()))
        .filter(idempotency_keys::Column::CreatedAtMs.lt(expired));
    // On MySQL/MariaDB a DELETE that finds no row takes a gap lock, which two
    // racing first uses of a key both take and then deadlock on with their
    // INSERTs: there it runs only when an expired row is there (a record
    // lock). Elsewhere the DELETE stays first: on SQLite a read first would
    // make the INSERT upgrade a shared lock, which racing writers refuse.
    let look_first = txn.get_database_backend() == sea_orm::DbBackend::MySql;
    let there = !look_first
        || idempotency_keys::Entity::find()
            .filter(idempotency_keys::Column::Scope.eq(key.scope.as_str()))
            .filter(idempotency_keys::Column::Key.eq(key.key.as_str()))
            .filter(idempotency_keys::Column::CreatedAtMs.lt(expired))
            .one(txn)
            .await?
            .is_some();
    if there {
        stale.exec(txn).await?;
    }
    let row = idempotency_keys::ActiveModel {
        scope: Set(key.scope.clone()),
        key: Set(key.key.clone()),
        order_id: Set(None),
        request: Set(key.request.clone()),
        answer: Set(None),
        created_at_ms: Set(now.0),
    };
    match idempotency_keys::Entity::insert(row)
        .exec_without_returning(txn)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ties a claimed key to the order it created and the answer to repeat.
async fn settle_key(
    txn: &DatabaseTransaction,
    key: &IdempotencyKey,
    order: OrderId,
    answer: String,
) -> Result<(), DbErr> {
    idempotency_keys::Entity::update_many()
        .col_expr(idempotency_keys::Column::OrderId, Expr::value(order.get()))
        .col_expr(idempotency_keys::Column::Answer, Expr::value(answer))
        .filter(idempotency_keys::Column::Scope.eq(key.scope.as_str()))
        .filter(idempotency_keys::Column::Key.eq(key.key.as_str()))
        .exec(txn)
        .await?;
    Ok(())
}

/// Deletes at most `batch` idempotency keys written before `before`, oldest
/// first; the number deleted (fewer than `batch`: none are left). Bounded so
/// that a backlog (the first run after an upgrade) never holds long locks.
pub async fn delete_expired_keys(
    db: &DatabaseConnection,
    before: Millis,
    batch: u64,
) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        // MariaDB takes no LIMIT in an IN subquery, but a DELETE's own.
        DbBackend::MySql => format!(
            "DELETE FROM idempotency_keys WHERE created_at_ms < ? \
             ORDER BY created_at_ms LIMIT {batch}"
        ),
        // SQLite's DELETE … LIMIT is a compile-time option; the row id is not.
        DbBackend::Sqlite => format!(
            "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys \
             WHERE created_at_ms < ? ORDER BY created_at_ms LIMIT {batch})"
        ),
        _ => format!(
            "DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys \
             WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT {batch})"
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

/// What a taken key was used for, read after the claim failed (the checkout
/// that holds it has committed: a claim waits for it).
async fn key_used(db: &DatabaseConnection, key: &IdempotencyKey) -> Result<CheckoutError, DbErr> {
    let row = idempotency_keys::Entity::find_by_id((key.scope.clone(), key.key.clone()))
        .one(db)
        .await?
        .ok_or_else(|| DbErr::Custom("an idempotency key vanished after a conflict".into()))?;
    if row.request != key.request {
        return Ok(CheckoutError::KeyReused);
    }
    match (row.order_id, row.answer) {
        (Some(order), Some(answer)) => Ok(CheckoutError::Replay {
            order: OrderId::new(order),
            answer,
        }),
        _ => Err(DbErr::Custom(
            "an idempotency key is stored without its order".into(),
        )),
    }
}

/// Writes an outbox row: the relay publishes it after the transaction commits.
pub(super) async fn enqueue(
    txn: &DatabaseTransaction,
    order: OrderId,
    kind: TimeoutKind,
    due: Millis,
    now: Millis,
) -> Result<(), DbErr> {
    outbox::Entity::insert(outbox::ActiveModel {
        order_id: Set(order.get()),
        kind: Set(kind.as_str().to_string()),
        due_at_ms: Set(due.0),
        created_at_ms: Set(now.0),
        attempts: Set(0),
        ..Default::default()
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

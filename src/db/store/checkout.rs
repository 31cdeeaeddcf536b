//! Checkout: an order, its stock reservation, its payment timeout in the
//! outbox, its `created` event and its idempotency key, in one transaction.
//! On PostgreSQL the order is placed by one data-modifying statement (a
//! checkout without a key is that statement alone, one round trip); MariaDB
//! and SQLite place it a statement at a time ([`Placing`]).

use super::*;
use crate::domain::CREATED;

/// Creates an order: reserves stock, writes the order `pending_payment`, its
/// items, the outbox row of its payment timeout, its `created` event and its
/// audit row, in one transaction. Short stock on any line reserves nothing.
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
    if let Some(twice) = items.windows(2).find(|w| w[0].sku == w[1].sku) {
        // One line per SKU (the API refuses the rest): the one statement
        // would reserve such a SKU once for two lines.
        return Err(DbErr::Custom(format!("sku '{}' is given twice", twice[0].sku)).into());
    }
    let deadline = now.plus(window);
    let placing = Placing::of(db.get_database_backend());
    if key.is_none() && placing == Placing::OneStatement {
        // One statement is a transaction of its own: no BEGIN, no COMMIT.
        return place_at_once(db, items, deadline, now).await?;
    }
    let txn = db.begin().await?;
    if let Some(key) = key
        && !claim_key(&txn, key, now).await?
    {
        txn.rollback().await?;
        return Err(key_used(db, key).await?);
    }
    let placed = match placing {
        Placing::OneStatement => place_at_once(&txn, items, deadline, now).await?,
        Placing::InSteps => place_in_steps(&txn, items, deadline, now).await?,
    };
    let created = match placed {
        Ok(created) => created,
        Err(short) => {
            txn.rollback().await?;
            return Err(short);
        }
    };
    if let Some(key) = key {
        let answer = (key.answer)(&created)
            .map_err(|e| DbErr::Custom(format!("cannot encode the order: {e}")))?;
        settle_key(&txn, key, created.id, answer).await?;
    }
    txn.commit().await?;
    Ok(created)
}

/// How a backend places an order (the reservation and the five inserts):
/// chosen here, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placing {
    /// PostgreSQL: one data-modifying statement ([`place_at_once`]).
    OneStatement,
    /// MariaDB and SQLite, which have no data-modifying CTEs: a conditional
    /// `UPDATE` per line, then one insert per table ([`place_in_steps`]),
    /// the order's id taken from its insert's answer rather than read back.
    /// Nothing shorter is sound there: one `UPDATE … CASE` for every line
    /// would leave the lines that had stock reserved when one is short, and
    /// the refusal could no longer tell which line it was; and `RETURNING`
    /// (MariaDB 10.5, SQLite 3.35) still writes one table per statement.
    InSteps,
}

impl Placing {
    fn of(backend: DbBackend) -> Self {
        match backend {
            DbBackend::Postgres => Self::OneStatement,
            _ => Self::InSteps,
        }
    }
}

/// Places the order in one statement (PostgreSQL): the stock rows of every
/// line are locked in SKU order and read (`stock`), the short lines found
/// (`short`); only when none is, every line is reserved (`r`), and only when
/// every line was, the order, its items, its outbox row, its `created` event
/// and its audit row are inserted. A refusal writes nothing, and names the
/// first short line in SKU order with its stock as locked: no second read.
async fn place_at_once<C: ConnectionTrait>(
    conn: &C,
    items: Vec<NewItem>,
    deadline: Millis,
    now: Millis,
) -> Result<Result<Order, CheckoutError>, DbErr> {
    let pending = OrderStatus::PendingPayment;
    // The body is made by the events' one encoder; the statement puts the
    // order id it inserts between the two halves.
    let (before, after) = told(CREATED, None, pending, Cause::Api, now)
        .body_around_id()
        .ok_or_else(|| DbErr::Custom("the created event's body has no place for its id".into()))?;
    // `$1` to `$11`, as the statement numbers them; then the lines.
    let mut values: Vec<sea_orm::Value> = vec![
        now.0.into(),
        deadline.0.into(),
        pending.as_str().into(),
        TimeoutKind::Payment.as_str().into(),
        new_message_id().into(),
        CREATED.into(),
        before.into(),
        after.into(),
        Cause::Api.as_str().into(),
        (items.len() as i64).into(),
        // The checkout's span, which the relays' publishes continue (null: traces off).
        crate::traces::current().into(),
    ];
    let first = values.len() + 1;
    for item in &items {
        values.push(item.sku.as_str().into());
        values.push(item.quantity.into());
    }
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            one_statement(first, items.len()),
            values,
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("the checkout statement returned no row".into()))?;
    let id: Option<i64> = row.try_get("", "id")?;
    let short: Option<String> = row.try_get("", "short_sku")?;
    let available: Option<i64> = row.try_get("", "available")?;
    match (id, short) {
        (Some(id), _) => Ok(Ok(new_order(OrderId::new(id), items, deadline, now))),
        (None, Some(sku)) => Ok(Err(refusal(&items, sku, available))),
        (None, None) => Err(DbErr::Custom(
            "the checkout statement neither placed the order nor found a short line".into(),
        )),
    }
}

/// The checkout statement for `lines` lines whose SKU and quantity are the
/// parameters from `$first` on, the rest numbered as [`place_at_once`]
/// binds them. The lines are a `VALUES` list, not an array: the planner
/// knows how many there are, and finds their stock rows by the index.
fn one_statement(first: usize, lines: usize) -> String {
    let line = |i: usize| (first + 2 * i, first + 2 * i + 1);
    let values: Vec<String> = (0..lines)
        .map(|i| {
            let (sku, quantity) = line(i);
            format!("({i}, ${sku}::varchar, ${quantity}::bigint)")
        })
        .collect();
    let skus: Vec<String> = (0..lines).map(|i| format!("${}", line(i).0)).collect();
    // The stock rows are locked first, in the index's order, as every stock
    // move locks them (`lock_stock`): a checkout and a batch releasing the
    // same SKUs cannot deadlock. `short` reads them as locked (the newest
    // committed values), and the reservation waits for the whole of it: a
    // condition on no row is checked once, before the UPDATE touches any.
    format!(
        "WITH line (n, sku, quantity) AS (VALUES {values}), \
         stock AS MATERIALIZED (SELECT sku, available FROM inventory \
           WHERE sku IN ({skus}) ORDER BY sku FOR UPDATE), \
         short AS (SELECT line.n, line.sku, stock.available FROM line \
           LEFT JOIN stock ON stock.sku = line.sku \
           WHERE stock.available IS NULL OR stock.available < line.quantity), \
         r AS (UPDATE inventory SET available = available - line.quantity, \
           reserved = reserved + line.quantity, updated_at_ms = $1 FROM line \
           WHERE inventory.sku IN ({skus}) AND inventory.sku = line.sku \
           AND inventory.available >= line.quantity AND NOT EXISTS (SELECT FROM short) \
           RETURNING inventory.sku), \
         o AS (INSERT INTO orders (status, pay_deadline_ms, created_at_ms, version, updated_at_ms) \
           SELECT $3, $2, $1, 0, $1 WHERE (SELECT count(*) FROM r) = $10 RETURNING id), \
         i AS (INSERT INTO order_items (order_id, sku, quantity) \
           SELECT o.id, line.sku, line.quantity FROM o, line), \
         b AS (INSERT INTO outbox (order_id, kind, due_at_ms, created_at_ms, attempts, trace_context) \
           SELECT id, $4, $2, $1, 0, $11::varchar FROM o), \
         e AS (INSERT INTO order_timeout_events (message_id, order_id, event, body, created_at_ms, attempts, trace_context) \
           SELECT $5, id::text, $6, $7 || id::text || $8, $1, 0, $11::varchar FROM o), \
         a AS (INSERT INTO order_events (order_id, event, from_status, to_status, cause, at_ms) \
           SELECT id, $6, NULL, $3, $9, $1 FROM o) \
         SELECT (SELECT id FROM o) AS id, \
           (SELECT sku FROM short ORDER BY n LIMIT 1) AS short_sku, \
           (SELECT available FROM short ORDER BY n LIMIT 1) AS available",
        values = values.join(", "),
        skus = skus.join(", "),
    )
}

/// Places the order a statement at a time (MariaDB, SQLite), in `txn`: a
/// conditional reservation per line, then the order, its items, its outbox
/// row, its event and its audit row. A short line answers the refusal (the
/// caller rolls back).
async fn place_in_steps(
    txn: &DatabaseTransaction,
    items: Vec<NewItem>,
    deadline: Millis,
    now: Millis,
) -> Result<Result<Order, CheckoutError>, DbErr> {
    if let Err(short) = reserve(txn, &items, now).await? {
        return Ok(Err(short));
    }
    let pending = OrderStatus::PendingPayment;
    // The id from the insert's own answer: every other column is known, so
    // the row is not read back.
    let inserted = orders::Entity::insert(orders::ActiveModel {
        status: Set(pending.as_str().to_string()),
        pay_deadline_ms: Set(deadline.0),
        created_at_ms: Set(now.0),
        version: Set(0),
        updated_at_ms: Set(now.0),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    let id = OrderId::new(inserted.last_insert_id);
    order_items::Entity::insert_many(items.iter().map(|i| order_items::ActiveModel {
        order_id: Set(id.get()),
        sku: Set(i.sku.clone()),
        quantity: Set(i.quantity),
    }))
    .exec_without_returning(txn)
    .await?;
    enqueue(txn, id, TimeoutKind::Payment, deadline, now).await?;
    record(
        txn,
        &[id],
        CREATED,
        None,
        pending,
        Cause::Api,
        now,
        None,
        None,
    )
    .await?;
    Ok(Ok(new_order(id, items, deadline, now)))
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
            let available = get_stock(txn, &item.sku).await?.map(|s| s.available);
            return Ok(Err(refusal(items, item.sku.clone(), available)));
        }
    }
    Ok(Ok(()))
}

/// Why the line of `sku` is short: no such SKU (`available` is `None`), or
/// not enough of it.
fn refusal(items: &[NewItem], sku: String, available: Option<i64>) -> CheckoutError {
    let requested = items
        .iter()
        .find(|i| i.sku == sku)
        .map_or(0, |i| i.quantity);
    match available {
        None => CheckoutError::UnknownSku(sku),
        Some(available) => CheckoutError::InsufficientStock {
            sku,
            requested,
            available,
        },
    }
}

/// The order a checkout just wrote, from what it wrote (no read back).
fn new_order(id: OrderId, items: Vec<NewItem>, deadline: Millis, now: Millis) -> Order {
    Order {
        id,
        status: OrderStatus::PendingPayment,
        items: items
            .into_iter()
            .map(|i| Item {
                sku: i.sku,
                quantity: i.quantity,
            })
            .collect(),
        pay_deadline: deadline,
        created_at: now,
        updated_at: now,
        version: 0,
        paid_at: None,
        ship_deadline: None,
        fulfillment_overdue_at: None,
        shipped_at: None,
        confirm_deadline: None,
        completed_at: None,
        cancelled_at: None,
        late_payment_at: None,
        audit: None,
    }
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
    super::retention::delete_before(db, "idempotency_keys", "created_at_ms", before, batch).await
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
        // The checkout's span, which the relay's publish continues.
        trace_context: Set(crate::traces::current()),
        ..Default::default()
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

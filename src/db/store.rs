//! Every state change of the service, each one transaction.
//!
//! A transition is one conditional `UPDATE … WHERE id … AND status = … AND
//! deadline <= now`; its row count (or `RETURNING` list) says who won, so a
//! payment and a timeout racing for the same order cannot both succeed, and a
//! redelivered timeout changes nothing. Stock moves only in the transaction of
//! the transition that won, so it is released at most once. Nothing here reads a
//! row and then writes what it read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait, OnConflict};
use sea_orm::sea_query::{LockBehavior, LockType};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection,
    DatabaseTransaction, DbBackend, DbErr, EntityTrait, IsolationLevel, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, Set, SqlErr, TransactionTrait,
};
use serde::Serialize;

use super::entities::{idempotency_keys, inventory, order_events, order_items, orders, outbox};
use crate::domain::{Millis, OrderId, OrderStatus, TimeoutKind};
use crate::settings::Windows;

/// Most values one statement binds from a list (ids in an `IN`, SKUs in a
/// `CASE`, rows of a multi-row `INSERT`). SQLite accepts 32,766 bind
/// parameters per statement, PostgreSQL and MySQL 65,535; a stock move binds
/// five per SKU and an audit row seven, so lists are cut well below both.
pub const LIST_CHUNK: usize = 500;

/// One line of a new order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    /// The SKU.
    pub sku: String,
    /// How many; positive.
    pub quantity: i64,
}

/// A checkout's `Idempotency-Key` with the request it came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The client's key (1 to 255 visible ASCII characters, checked by the API).
    pub key: String,
    /// The validated request in a canonical form: the effective window in
    /// milliseconds, then `sku*quantity` per line in SKU order, for example
    /// `window=900000ms items=A*2,B*1`. Stored as is (no hash: it is short,
    /// and SKUs cannot hold the separators), so JSON key order, whitespace, the
    /// order of lines or a window spelled differently do not make two
    /// requests differ.
    pub request: String,
}

impl IdempotencyKey {
    /// The key of a checkout of `items` with this effective payment `window`.
    pub fn new(key: String, items: &[NewItem], window: Duration) -> Self {
        let mut lines: Vec<String> = items
            .iter()
            .map(|i| format!("{}*{}", i.sku, i.quantity))
            .collect();
        lines.sort();
        let request = format!("window={}ms items={}", window.as_millis(), lines.join(","));
        Self { key, request }
    }
}

/// One line of an order, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ItemView {
    /// The SKU.
    pub sku: String,
    /// How many.
    pub quantity: i64,
}

/// An order as the API shows it. Later deadlines and timestamps appear once they exist.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    /// The id, as a string.
    #[schema(value_type = String, example = "42")]
    pub id: OrderId,
    /// Current status.
    #[schema(value_type = String, example = "pending_payment")]
    pub status: OrderStatus,
    /// What was ordered.
    pub items: Vec<ItemView>,
    /// End of the payment window.
    #[schema(value_type = String, format = DateTime)]
    pub pay_deadline: Millis,
    /// Checkout time.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Millis,
    /// Last change.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Millis,
    /// Incremented by every transition.
    pub version: i32,
    /// Payment time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub paid_at: Option<Millis>,
    /// End of the fulfillment window.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ship_deadline: Option<Millis>,
    /// When the fulfillment timeout found it unshipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub fulfillment_overdue_at: Option<Millis>,
    /// Shipping time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub shipped_at: Option<Millis>,
    /// End of the receipt window.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub confirm_deadline: Option<Millis>,
    /// Completion time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completed_at: Option<Millis>,
    /// Cancellation time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub cancelled_at: Option<Millis>,
    /// When a payment first came after a timeout had cancelled the order: a
    /// refund is due. Recorded once, however often the client retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub late_payment_at: Option<Millis>,
    /// The audit trail, oldest first, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Vec<AuditView>>,
}

/// One audit-trail entry as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AuditView {
    /// What happened.
    pub event: String,
    /// Status before (absent for `created`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Status after.
    pub to: String,
    /// `api`, `timeout` or `sweeper`.
    pub cause: String,
    /// When.
    #[schema(value_type = String, format = DateTime)]
    pub at: Millis,
    /// More to say, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What caused a change, as the audit trail records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A client request.
    Api,
    /// A timeout message (or a deadline found passed by a request).
    Timeout,
    /// The sweeper.
    Sweeper,
}

impl Cause {
    /// The audit spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Timeout => "timeout",
            Self::Sweeper => "sweeper",
        }
    }
}

/// A transition a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `pending_payment` → `paid`, inside the payment window.
    Pay,
    /// `paid` → `shipped`; starts the receipt window.
    Ship,
    /// `shipped` → `completed`, by the buyer.
    Confirm,
    /// `pending_payment` → `cancelled`, by the buyer; releases the stock.
    Cancel,
}

impl Action {
    /// The edge of the state diagram this action walks.
    pub fn edge(self) -> (OrderStatus, OrderStatus) {
        match self {
            Self::Pay => (OrderStatus::PendingPayment, OrderStatus::Paid),
            Self::Ship => (OrderStatus::Paid, OrderStatus::Shipped),
            Self::Confirm => (OrderStatus::Shipped, OrderStatus::Completed),
            Self::Cancel => (OrderStatus::PendingPayment, OrderStatus::Cancelled),
        }
    }
}

/// Stock of one SKU, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct StockView {
    /// The SKU.
    pub sku: String,
    /// On sale.
    pub available: i64,
    /// Held by unpaid orders.
    pub reserved: i64,
    /// Paid for.
    pub sold: i64,
}

/// Why a checkout did not happen. Nothing was reserved in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// No inventory row for this SKU.
    #[error("unknown sku '{0}'")]
    UnknownSku(String),
    /// Not enough on sale.
    #[error("insufficient stock for sku '{sku}': {requested} requested, {available} available")]
    InsufficientStock {
        /// The SKU.
        sku: String,
        /// What the order asked for.
        requested: i64,
        /// What is on sale.
        available: i64,
    },
    /// The idempotency key was used before for this same request: the order
    /// it created, and the body of the answer that created it.
    #[error("idempotency key already used for order {order}")]
    Replay {
        /// The order created with the key.
        order: OrderId,
        /// The first answer's body (JSON), given again unchanged.
        answer: String,
    },
    /// The idempotency key was used before for a different request.
    #[error("idempotency key already used for a different request")]
    KeyReused,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// Why a requested transition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// No such order.
    #[error("order {0} not found")]
    NotFound(OrderId),
    /// The order is not in a state that allows it; carries the current order.
    #[error("order {} is {}: {reason}", .order.id, .order.status)]
    Conflict {
        /// The order as it is now.
        order: Box<OrderView>,
        /// Why, for the error message.
        reason: String,
        /// This refused payment is the order's late payment, recorded now (the
        /// first payment after a timeout cancelled it).
        late_payment: bool,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// What a timeout (or the sweeper) found for one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryOutcome {
    /// The transition was applied now; the deadline it was for.
    Applied {
        /// The deadline that passed.
        deadline: Millis,
    },
    /// The order is in the right status but its deadline is still ahead.
    NotDue {
        /// The deadline in the database.
        deadline: Millis,
    },
    /// Nothing to do: the order moved on (paid, cancelled, shipped, already flagged…).
    Inapplicable {
        /// The order's status now.
        status: OrderStatus,
    },
    /// No order has this id.
    NotFound,
}

fn deadline_column(kind: TimeoutKind) -> orders::Column {
    match kind {
        TimeoutKind::Payment => orders::Column::PayDeadlineMs,
        TimeoutKind::Fulfillment => orders::Column::ShipDeadlineMs,
        TimeoutKind::Receipt => orders::Column::ConfirmDeadlineMs,
    }
}

fn deadline_of(kind: TimeoutKind, order: &orders::Model) -> Option<Millis> {
    match kind {
        TimeoutKind::Payment => Some(order.pay_deadline_ms),
        TimeoutKind::Fulfillment => order.ship_deadline_ms,
        TimeoutKind::Receipt => order.confirm_deadline_ms,
    }
    .map(Millis)
}

fn parse_status(raw: &str) -> Result<OrderStatus, DbErr> {
    raw.parse()
        .map_err(|e: String| DbErr::Custom(format!("corrupt order row: {e}")))
}

/// Sets or replaces the available stock of a SKU (restocking); `reserved` and
/// `sold` are kept.
pub async fn put_stock(
    db: &DatabaseConnection,
    sku: &str,
    available: i64,
    now: Millis,
) -> Result<StockView, DbErr> {
    let row = inventory::ActiveModel {
        sku: Set(sku.to_string()),
        available: Set(available),
        reserved: Set(0),
        sold: Set(0),
        updated_at_ms: Set(now.0),
    };
    inventory::Entity::insert(row)
        .on_conflict(
            OnConflict::column(inventory::Column::Sku)
                .update_columns([inventory::Column::Available, inventory::Column::UpdatedAtMs])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    get_stock(db, sku)
        .await?
        .ok_or_else(|| DbErr::Custom(format!("sku '{sku}' vanished after upsert")))
}

/// One SKU's stock.
pub async fn get_stock<C: ConnectionTrait>(db: &C, sku: &str) -> Result<Option<StockView>, DbErr> {
    Ok(inventory::Entity::find_by_id(sku.to_string())
        .one(db)
        .await?
        .map(|m| StockView {
            sku: m.sku,
            available: m.available,
            reserved: m.reserved,
            sold: m.sold,
        }))
}

/// Creates an order: reserves stock, writes the order `pending_payment`, its
/// items, and the outbox row of its payment timeout, in one transaction. Short
/// stock on any line rolls everything back.
///
/// With an idempotency key, the key is written in the same transaction, so an
/// order exists with its key or not at all; a key used before answers
/// [`CheckoutError::Replay`] or [`CheckoutError::KeyReused`] and reserves
/// nothing. A refused checkout keeps no key: it may be retried with it.
pub async fn checkout(
    db: &DatabaseConnection,
    items: &[NewItem],
    window: Duration,
    now: Millis,
    key: Option<&IdempotencyKey>,
) -> Result<OrderView, CheckoutError> {
    let mut items = items.to_vec();
    items.sort_by(|a, b| a.sku.cmp(&b.sku));
    let txn = db.begin().await?;
    if let Some(key) = key
        && !claim_key(&txn, key, now).await?
    {
        txn.rollback().await?;
        return Err(key_used(db, key).await?);
    }
    // The rows are locked first, in the database's order, as every stock move
    // locks them: a checkout and a batch releasing the same SKUs cannot deadlock.
    if items.len() > 1 {
        let skus: Vec<&str> = items.iter().map(|i| i.sku.as_str()).collect();
        lock_stock(&txn, &skus).await?;
    }
    for item in &items {
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
            .exec(&txn)
            .await?;
        if reserved.rows_affected == 0 {
            // The update said no; this read only words the answer.
            let error = match get_stock(&txn, &item.sku).await? {
                None => CheckoutError::UnknownSku(item.sku.clone()),
                Some(stock) => CheckoutError::InsufficientStock {
                    sku: item.sku.clone(),
                    requested: item.quantity,
                    available: stock.available,
                },
            };
            txn.rollback().await?;
            return Err(error);
        }
    }
    let deadline = now.plus(window);
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
    .insert(&txn)
    .await?;
    order_items::Entity::insert_many(items.iter().map(|i| order_items::ActiveModel {
        order_id: Set(order.id),
        sku: Set(i.sku.clone()),
        quantity: Set(i.quantity),
    }))
    .exec_without_returning(&txn)
    .await?;
    let id = OrderId::new(order.id);
    enqueue(&txn, id, TimeoutKind::Payment, deadline, now).await?;
    record(
        &txn,
        &[id],
        "created",
        None,
        OrderStatus::PendingPayment,
        Cause::Api,
        now,
        None,
    )
    .await?;
    let created = view(
        order,
        items
            .into_iter()
            .map(|i| ItemView {
                sku: i.sku,
                quantity: i.quantity,
            })
            .collect(),
    );
    if let Some(key) = key {
        settle_key(&txn, key, &created).await?;
    }
    txn.commit().await?;
    Ok(created)
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
    let row = idempotency_keys::ActiveModel {
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
    created: &OrderView,
) -> Result<(), DbErr> {
    let answer = serde_json::to_string(created)
        .map_err(|e| DbErr::Custom(format!("cannot encode the order: {e}")))?;
    idempotency_keys::Entity::update_many()
        .col_expr(
            idempotency_keys::Column::OrderId,
            Expr::value(created.id.get()),
        )
        .col_expr(idempotency_keys::Column::Answer, Expr::value(answer))
        .filter(idempotency_keys::Column::Key.eq(key.key.as_str()))
        .exec(txn)
        .await?;
    Ok(())
}

/// What a taken key was used for, read after the claim failed (the checkout
/// that holds it has committed: a claim waits for it).
async fn key_used(db: &DatabaseConnection, key: &IdempotencyKey) -> Result<CheckoutError, DbErr> {
    let row = idempotency_keys::Entity::find_by_id(key.key.clone())
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
async fn enqueue(
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

/// Applies a client's action to an order, with its side effects, in one
/// transaction: pay moves reserved stock to sold and starts the fulfillment
/// window; ship starts the receipt window; cancel releases the stock. Each is a
/// conditional update from the one status the diagram allows; when it loses, the
/// answer is a conflict carrying the order as it is.
///
/// A payment after the deadline loses to the timeout even when no message has
/// acted yet: the order is cancelled here as the timeout would cancel it, and the
/// payment is recorded as a late payment, to be refunded.
pub async fn act(
    db: &DatabaseConnection,
    id: OrderId,
    action: Action,
    windows: &Windows,
    now: Millis,
) -> Result<OrderView, TransitionError> {
    let (from, to) = action.edge();
    let txn = db.begin().await?;
    let mut update = orders::Entity::update_many()
        .col_expr(orders::Column::Status, Expr::value(to.as_str()))
        .col_expr(
            orders::Column::Version,
            Expr::col(orders::Column::Version).add(1),
        )
        .col_expr(orders::Column::UpdatedAtMs, Expr::value(now.0))
        .filter(orders::Column::Id.eq(id.get()))
        .filter(orders::Column::Status.eq(from.as_str()));
    let mut timeout = None;
    update = match action {
        Action::Pay => {
            let deadline = now.plus(windows.fulfillment);
            timeout = Some((TimeoutKind::Fulfillment, deadline));
            update
                .col_expr(orders::Column::PaidAtMs, Expr::value(now.0))
                .col_expr(orders::Column::ShipDeadlineMs, Expr::value(deadline.0))
                .filter(orders::Column::PayDeadlineMs.gt(now.0))
        }
        Action::Ship => {
            let deadline = now.plus(windows.receipt);
            timeout = Some((TimeoutKind::Receipt, deadline));
            update
                .col_expr(orders::Column::ShippedAtMs, Expr::value(now.0))
                .col_expr(orders::Column::ConfirmDeadlineMs, Expr::value(deadline.0))
        }
        Action::Confirm => update.col_expr(orders::Column::CompletedAtMs, Expr::value(now.0)),
        Action::Cancel => update.col_expr(orders::Column::CancelledAtMs, Expr::value(now.0)),
    };
    if update.exec(&txn).await?.rows_affected == 1 {
        match action {
            Action::Pay => move_stock(&txn, &[id], Stock::Reserved, Stock::Sold, now).await?,
            Action::Cancel => {
                move_stock(&txn, &[id], Stock::Reserved, Stock::Available, now).await?
            }
            Action::Ship | Action::Confirm => {}
        }
        if let Some((kind, deadline)) = timeout {
            enqueue(&txn, id, kind, deadline, now).await?;
        }
        record(
            &txn,
            &[id],
            to.as_str(),
            Some(from),
            to,
            Cause::Api,
            now,
            None,
        )
        .await?;
        let order = load(&txn, id).await?.ok_or(TransitionError::NotFound(id))?;
        txn.commit().await?;
        return Ok(order);
    }
    if action == Action::Pay {
        // The window may have closed with no message yet: apply the timeout now.
        // It is conditional too, so a consumer doing the same at once is harmless.
        apply_expiry(&txn, TimeoutKind::Payment, &[id], now, Cause::Timeout).await?;
    }
    // A late payment is recorded once per order, and only for an order that a
    // timeout (its message or the sweeper) cancelled: a retry, or a payment for
    // an order the buyer cancelled, is a plain conflict. One conditional UPDATE;
    // its row count says whether this payment is the order's late payment.
    let late_payment = action == Action::Pay
        && orders::Entity::update_many()
            .col_expr(orders::Column::LatePaymentAtMs, Expr::value(now.0))
            .filter(orders::Column::Id.eq(id.get()))
            .filter(orders::Column::Status.eq(OrderStatus::Cancelled.as_str()))
            .filter(orders::Column::LatePaymentAtMs.is_null())
            .filter(
                orders::Column::Id.in_subquery(
                    sea_orm::sea_query::Query::select()
                        .column(order_events::Column::OrderId)
                        .from(order_events::Entity)
                        .and_where(order_events::Column::OrderId.eq(id.get()))
                        .and_where(order_events::Column::Event.eq(OrderStatus::Cancelled.as_str()))
                        .and_where(order_events::Column::Cause.ne(Cause::Api.as_str()))
                        .to_owned(),
                ),
            )
            .exec(&txn)
            .await?
            .rows_affected
            == 1;
    let order = load(&txn, id).await?.ok_or(TransitionError::NotFound(id))?;
    let reason = if late_payment {
        let detail = format!(
            "payment at {} for an order cancelled at {}; refund it",
            now.to_rfc3339(),
            order
                .cancelled_at
                .unwrap_or(order.pay_deadline)
                .to_rfc3339()
        );
        let status = OrderStatus::Cancelled;
        let late = Some(detail.as_str());
        record(
            &txn,
            &[id],
            "late_payment",
            Some(status),
            status,
            Cause::Api,
            now,
            late,
        )
        .await?;
        format!(
            "the payment window closed at {}; a refund is due if money was taken",
            order.pay_deadline.to_rfc3339()
        )
    } else if let (Action::Pay, Some(first)) = (action, order.late_payment_at) {
        format!(
            "the payment window closed at {}; a late payment was already recorded at {}",
            order.pay_deadline.to_rfc3339(),
            first.to_rfc3339()
        )
    } else {
        format!("only a {from} order can become {to}")
    };
    txn.commit().await?;
    Err(TransitionError::Conflict {
        order: Box::new(order),
        reason,
        late_payment,
    })
}

/// Writes audit rows, in the caller's transaction.
#[allow(clippy::too_many_arguments)]
async fn record(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
    event: &str,
    from: Option<OrderStatus>,
    to: OrderStatus,
    cause: Cause,
    now: Millis,
    detail: Option<&str>,
) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    for chunk in ids.chunks(LIST_CHUNK) {
        let rows = chunk.iter().map(|id| order_events::ActiveModel {
            order_id: Set(id.get()),
            event: Set(event.to_string()),
            from_status: Set(from.map(|f| f.as_str().to_string())),
            to_status: Set(to.as_str().to_string()),
            cause: Set(cause.as_str().to_string()),
            at_ms: Set(now.0),
            detail: Set(detail.map(|d| crate::domain::truncate(d, 250))),
            ..Default::default()
        });
        order_events::Entity::insert_many(rows)
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// The three stock columns.
#[derive(Debug, Clone, Copy)]
enum Stock {
    Available,
    Reserved,
    Sold,
}

impl Stock {
    fn column(self) -> inventory::Column {
        match self {
            Self::Available => inventory::Column::Available,
            Self::Reserved => inventory::Column::Reserved,
            Self::Sold => inventory::Column::Sold,
        }
    }
}

/// Moves the quantities of some orders' items from one stock column to another,
/// `LIST_CHUNK` SKUs at a time: each chunk's rows are first locked (see
/// [`lock_stock`]), then one `UPDATE … CASE sku …` moves the chunk.
async fn move_stock(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
    from: Stock,
    to: Stock,
    now: Millis,
) -> Result<(), DbErr> {
    let per_sku: Vec<(String, i64)> = quantities(txn, ids).await?.into_iter().collect();
    for chunk in per_sku.chunks(LIST_CHUNK) {
        let skus: Vec<&str> = chunk.iter().map(|(sku, _)| sku.as_str()).collect();
        lock_stock(txn, &skus).await?;
        let mut quantity = CaseStatement::new();
        for (sku, q) in chunk {
            quantity = quantity.case(inventory::Column::Sku.eq(sku.as_str()), *q);
        }
        let quantity: Expr = quantity.finally(0).into();
        inventory::Entity::update_many()
            .col_expr(
                from.column(),
                Expr::col(from.column()).sub(quantity.clone()),
            )
            .col_expr(to.column(), Expr::col(to.column()).add(quantity))
            .col_expr(inventory::Column::UpdatedAtMs, Expr::value(now.0))
            .filter(inventory::Column::Sku.is_in(skus))
            .exec(txn)
            .await?;
    }
    Ok(())
}

/// Locks inventory rows in the order of the column's index (its collation:
/// PostgreSQL's `C` sorts `B` before `a`, MariaDB's default collation the
/// other way), one statement for the lot. Checkout and every stock move lock
/// through here, so two transactions wanting the same SKUs queue instead of
/// deadlocking. SQLite has one writer at a time and takes no row locks.
async fn lock_stock(txn: &DatabaseTransaction, skus: &[&str]) -> Result<(), DbErr> {
    if txn.get_database_backend() == DbBackend::Sqlite {
        return Ok(());
    }
    inventory::Entity::find()
        .select_only()
        .column(inventory::Column::Sku)
        .filter(inventory::Column::Sku.is_in(skus.iter().copied()))
        .order_by_asc(inventory::Column::Sku)
        .lock_exclusive()
        .into_tuple::<String>()
        .all(txn)
        .await?;
    Ok(())
}

/// Locks order rows in id order before a batch updates them, so two batches
/// that share orders (a consumer and the sweeper, two instances) queue instead
/// of deadlocking. SQLite has one writer and needs no lock.
async fn lock_orders(txn: &DatabaseTransaction, ids: &[i64]) -> Result<(), DbErr> {
    if txn.get_database_backend() == DbBackend::Sqlite || ids.len() < 2 {
        return Ok(());
    }
    orders::Entity::find()
        .select_only()
        .column(orders::Column::Id)
        .filter(orders::Column::Id.is_in(ids.iter().copied()))
        .order_by_asc(orders::Column::Id)
        .lock_exclusive()
        .into_tuple::<i64>()
        .all(txn)
        .await?;
    Ok(())
}

/// Applies the timeout of `kind` to each order whose deadline has passed by
/// `now`, in one transaction, and says for every id what it found.
pub async fn expire(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    ids: &[OrderId],
    now: Millis,
    cause: Cause,
) -> Result<HashMap<OrderId, ExpiryOutcome>, DbErr> {
    let txn = db.begin().await?;
    let applied = apply_expiry(&txn, kind, ids, now, cause).await?;
    let mut outcomes: HashMap<OrderId, ExpiryOutcome> = applied
        .into_iter()
        .map(|(id, deadline)| (id, ExpiryOutcome::Applied { deadline }))
        .collect();
    let rest: Vec<i64> = ids
        .iter()
        .filter(|id| !outcomes.contains_key(id))
        .map(|id| id.get())
        .collect();
    // Read after the conditional update only to say why it did not apply.
    for chunk in rest.chunks(LIST_CHUNK) {
        let found = orders::Entity::find()
            .filter(orders::Column::Id.is_in(chunk.iter().copied()))
            .all(&txn)
            .await?;
        for order in found {
            let status = parse_status(&order.status)?;
            let outcome = match deadline_of(kind, &order) {
                Some(deadline)
                    if status == kind.acts_on() && deadline > now && not_flagged(kind, &order) =>
                {
                    ExpiryOutcome::NotDue { deadline }
                }
                _ => ExpiryOutcome::Inapplicable { status },
            };
            outcomes.insert(OrderId::new(order.id), outcome);
        }
    }
    txn.commit().await?;
    for id in ids {
        outcomes.entry(*id).or_insert(ExpiryOutcome::NotFound);
    }
    Ok(outcomes)
}

/// Whether the database accepts a transition of `kind` at all: the same
/// statements as [`expire`], for an id no order has. When a batch fails and
/// this succeeds, the batch itself is the problem (one order a trigger or a
/// constraint refuses); when this fails too, the database is (away, a table
/// renamed, a migration half done), and nothing is to be given up.
pub async fn probe(db: &DatabaseConnection, kind: TimeoutKind) -> Result<(), DbErr> {
    expire(db, kind, &[OrderId::new(0)], Millis::now(), Cause::Timeout)
        .await
        .map(|_| ())
}

fn not_flagged(kind: TimeoutKind, order: &orders::Model) -> bool {
    kind != TimeoutKind::Fulfillment || order.fulfillment_overdue_at_ms.is_none()
}

/// The conditional update of a timeout, its side effects (stock release for a
/// payment timeout) and its audit rows. Returns the ids it changed with their
/// deadlines.
async fn apply_expiry(
    txn: &DatabaseTransaction,
    kind: TimeoutKind,
    ids: &[OrderId],
    now: Millis,
    cause: Cause,
) -> Result<Vec<(OrderId, Millis)>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let deadline = deadline_column(kind);
    let mut update = orders::Entity::update_many()
        .col_expr(
            orders::Column::Version,
            Expr::col(orders::Column::Version).add(1),
        )
        .col_expr(orders::Column::UpdatedAtMs, Expr::value(now.0))
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()))
        .filter(deadline.lte(now.0));
    let (event, to) = match kind {
        TimeoutKind::Payment => {
            update = update
                .col_expr(
                    orders::Column::Status,
                    Expr::value(OrderStatus::Cancelled.as_str()),
                )
                .col_expr(orders::Column::CancelledAtMs, Expr::value(now.0));
            ("cancelled", OrderStatus::Cancelled)
        }
        TimeoutKind::Fulfillment => {
            // Flagged, not cancelled: the goods are paid for; people must act.
            update = update
                .col_expr(orders::Column::FulfillmentOverdueAtMs, Expr::value(now.0))
                .filter(orders::Column::FulfillmentOverdueAtMs.is_null());
            ("fulfillment_overdue", OrderStatus::Paid)
        }
        TimeoutKind::Receipt => {
            update = update
                .col_expr(
                    orders::Column::Status,
                    Expr::value(OrderStatus::Completed.as_str()),
                )
                .col_expr(orders::Column::CompletedAtMs, Expr::value(now.0));
            ("completed", OrderStatus::Completed)
        }
    };
    // Ascending and without repeats: every batch locks its orders in one order.
    let unique: Vec<i64> = ids
        .iter()
        .map(|i| i.get())
        .collect::<BTreeSet<i64>>()
        .into_iter()
        .collect();
    let mut applied = Vec::new();
    for chunk in unique.chunks(LIST_CHUNK) {
        lock_orders(txn, chunk).await?;
        if txn.support_returning() {
            let changed = update
                .clone()
                .filter(orders::Column::Id.is_in(chunk.iter().copied()))
                .exec_with_returning(txn)
                .await?;
            for order in changed {
                if let Some(d) = deadline_of(kind, &order) {
                    applied.push((OrderId::new(order.id), d));
                }
            }
        } else {
            // MariaDB/MySQL have no UPDATE … RETURNING: one conditional update per
            // id, in id order, each still deciding by its own row count.
            for &id in chunk {
                let result = update
                    .clone()
                    .filter(orders::Column::Id.eq(id))
                    .exec(txn)
                    .await?;
                if result.rows_affected == 1
                    && let Some(order) = orders::Entity::find_by_id(id).one(txn).await?
                    && let Some(d) = deadline_of(kind, &order)
                {
                    applied.push((OrderId::new(id), d));
                }
            }
        }
    }
    let changed: Vec<OrderId> = applied.iter().map(|(id, _)| *id).collect();
    if kind == TimeoutKind::Payment {
        move_stock(txn, &changed, Stock::Reserved, Stock::Available, now).await?;
    }
    record(
        txn,
        &changed,
        event,
        Some(kind.acts_on()),
        to,
        cause,
        now,
        None,
    )
    .await?;
    Ok(applied)
}

/// Quantities per SKU over some orders, in SKU order (the lock order of every
/// stock update, so concurrent transactions cannot deadlock on inventory rows).
async fn quantities(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
) -> Result<BTreeMap<String, i64>, DbErr> {
    let raw: Vec<i64> = ids.iter().map(|i| i.get()).collect();
    let mut per_sku = BTreeMap::new();
    for chunk in raw.chunks(LIST_CHUNK) {
        let rows = order_items::Entity::find()
            .filter(order_items::Column::OrderId.is_in(chunk.iter().copied()))
            .all(txn)
            .await?;
        for row in rows {
            *per_sku.entry(row.sku).or_insert(0) += row.quantity;
        }
    }
    Ok(per_sku)
}

/// Orders in the status `kind` acts on whose deadline is before `before`, with
/// their deadlines, oldest deadline first (for the sweeper); `after` continues
/// from the last `(id, deadline)` of the previous page.
pub async fn overdue(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    before: Millis,
    after: Option<(OrderId, Millis)>,
    limit: u64,
) -> Result<Vec<(OrderId, Millis)>, DbErr> {
    let deadline = deadline_column(kind);
    let mut query = orders::Entity::find()
        .select_only()
        .column(orders::Column::Id)
        .column(deadline)
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()))
        .filter(deadline.lt(before.0));
    if kind == TimeoutKind::Fulfillment {
        query = query.filter(orders::Column::FulfillmentOverdueAtMs.is_null());
    }
    if let Some((id, at)) = after {
        query = query.filter(
            Condition::any().add(deadline.gt(at.0)).add(
                Condition::all()
                    .add(deadline.eq(at.0))
                    .add(orders::Column::Id.gt(id.get())),
            ),
        );
    }
    let rows: Vec<(i64, i64)> = query
        .order_by_asc(deadline)
        .order_by_asc(orders::Column::Id)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, at)| (OrderId::new(id), Millis(at)))
        .collect())
}

/// One order with its items, and its audit trail when asked.
pub async fn get_order(
    db: &DatabaseConnection,
    id: OrderId,
    with_audit: bool,
) -> Result<Option<OrderView>, DbErr> {
    let Some(mut order) = load(db, id).await? else {
        return Ok(None);
    };
    if with_audit {
        order.audit = Some(audit(db, id).await?);
    }
    Ok(Some(order))
}

/// An order's audit trail, oldest first.
pub async fn audit<C: ConnectionTrait>(db: &C, id: OrderId) -> Result<Vec<AuditView>, DbErr> {
    Ok(order_events::Entity::find()
        .filter(order_events::Column::OrderId.eq(id.get()))
        .order_by_asc(order_events::Column::Id)
        .all(db)
        .await?
        .into_iter()
        .map(|e| AuditView {
            event: e.event,
            from: e.from_status,
            to: e.to_status,
            cause: e.cause,
            at: Millis(e.at_ms),
            detail: e.detail,
        })
        .collect())
}

async fn load<C: ConnectionTrait>(db: &C, id: OrderId) -> Result<Option<OrderView>, DbErr> {
    let Some(order) = orders::Entity::find_by_id(id.get()).one(db).await? else {
        return Ok(None);
    };
    let items = order_items::Entity::find()
        .filter(order_items::Column::OrderId.eq(id.get()))
        .order_by_asc(order_items::Column::Sku)
        .all(db)
        .await?
        .into_iter()
        .map(|i| ItemView {
            sku: i.sku,
            quantity: i.quantity,
        })
        .collect();
    Ok(Some(view(order, items)))
}

fn view(o: orders::Model, items: Vec<ItemView>) -> OrderView {
    OrderView {
        id: OrderId::new(o.id),
        // Rows are only written by this module, with valid statuses.
        status: o.status.parse().unwrap_or(OrderStatus::PendingPayment),
        items,
        pay_deadline: Millis(o.pay_deadline_ms),
        created_at: Millis(o.created_at_ms),
        updated_at: Millis(o.updated_at_ms),
        version: o.version,
        paid_at: o.paid_at_ms.map(Millis),
        ship_deadline: o.ship_deadline_ms.map(Millis),
        fulfillment_overdue_at: o.fulfillment_overdue_at_ms.map(Millis),
        late_payment_at: o.late_payment_at_ms.map(Millis),
        shipped_at: o.shipped_at_ms.map(Millis),
        confirm_deadline: o.confirm_deadline_ms.map(Millis),
        completed_at: o.completed_at_ms.map(Millis),
        cancelled_at: o.cancelled_at_ms.map(Millis),
        audit: None,
    }
}

/// How long a relay round holds the rows it claimed. A relay that dies
/// mid-round delays those rows by at most this; the relays of other instances
/// skip them meanwhile.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// Longest wait before a refused row is tried again.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// Rows no relay round holds and nobody set aside.
fn publishable(now: Millis) -> Condition {
    Condition::all()
        .add(outbox::Column::SetAsideAtMs.is_null())
        .add(
            Condition::any()
                .add(outbox::Column::ClaimedUntilMs.is_null())
                .add(outbox::Column::ClaimedUntilMs.lt(now.0)),
        )
}

/// Claims up to `limit` publishable outbox rows for one relay round, oldest
/// first, and returns them. Rows another round holds are skipped (`FOR UPDATE
/// SKIP LOCKED` on PostgreSQL and MariaDB/MySQL, then a conditional update that
/// only takes rows still free, on every backend), so the relays of several
/// instances publish disjoint rows.
pub async fn outbox_claim(
    db: &DatabaseConnection,
    limit: u64,
    now: Millis,
) -> Result<Vec<outbox::Model>, DbErr> {
    let claim = uuid::Uuid::new_v4().to_string();
    let lease_end = now.plus(CLAIM_LEASE).0;
    let candidates = outbox::Entity::find()
        .select_only()
        .column(outbox::Column::Id)
        .filter(publishable(now))
        .order_by_asc(outbox::Column::Id)
        .limit(limit);
    let ids: Vec<i64> = if db.get_database_backend() == DbBackend::Sqlite {
        // One writer at a time, and a read that later writes could not upgrade
        // past another connection's commit: no transaction, the conditional
        // update decides.
        let ids = candidates.into_tuple().all(db).await?;
        take_claim(db, &ids, &claim, lease_end, now).await?;
        ids
    } else {
        // Read committed: MariaDB's default (repeatable read) would also lock
        // the gaps the scan passes, and deadlock relays against each other.
        let txn = db
            .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
            .await?;
        let ids = candidates
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .into_tuple()
            .all(&txn)
            .await?;
        take_claim(&txn, &ids, &claim, lease_end, now).await?;
        txn.commit().await?;
        ids
    };
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(LIST_CHUNK) {
        rows.extend(
            outbox::Entity::find()
                .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
                .filter(outbox::Column::Claim.eq(claim.as_str()))
                .order_by_asc(outbox::Column::Id)
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

async fn take_claim<C: ConnectionTrait>(
    db: &C,
    ids: &[i64],
    claim: &str,
    lease_end: i64,
    now: Millis,
) -> Result<(), DbErr> {
    for chunk in ids.chunks(LIST_CHUNK) {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Claim, Expr::value(claim))
            .col_expr(outbox::Column::ClaimedUntilMs, Expr::value(lease_end))
            .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
            .filter(publishable(now))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Removes rows the broker confirmed.
pub async fn outbox_delete(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    for chunk in ids.chunks(LIST_CHUNK) {
        outbox::Entity::delete_many()
            .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Gives claimed rows back at once (the round could not publish them: the
/// connection broke), so the next round need not wait for the lease to end.
pub async fn outbox_release(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    for chunk in ids.chunks(LIST_CHUNK) {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(Option::<i64>::None),
            )
            .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Counts a refused publish on each row. A row refused
/// `max_attempts` times (`relay.max_attempts`) is set aside with its reason; the others wait
/// (1 s, 2 s, 4 s … at most a minute) before any relay takes them again, and
/// the rows behind them go out meanwhile. Returns the ids set aside.
pub async fn outbox_refused(
    db: &DatabaseConnection,
    rows: &[(&outbox::Model, String)],
    max_attempts: i32,
    now: Millis,
) -> Result<Vec<i64>, DbErr> {
    let mut set_aside = Vec::new();
    for (row, reason) in rows {
        let attempts = row.attempts.saturating_add(1);
        let mut update = outbox::Entity::update_many()
            .col_expr(outbox::Column::Attempts, Expr::value(attempts))
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .filter(outbox::Column::Id.eq(row.id));
        if attempts >= max_attempts {
            set_aside.push(row.id);
            let reason = format!("refused {attempts} times by the broker: {reason}");
            update = update
                .col_expr(
                    outbox::Column::ClaimedUntilMs,
                    Expr::value(Option::<i64>::None),
                )
                .col_expr(outbox::Column::SetAsideAtMs, Expr::value(now.0))
                .col_expr(
                    outbox::Column::SetAsideReason,
                    Expr::value(crate::domain::truncate(&reason, 250)),
                );
        } else {
            let wait = Duration::from_secs(1 << attempts.clamp(0, 6)).min(MAX_RETRY_WAIT);
            update = update.col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(now.plus(wait).0),
            );
        }
        update.exec(db).await?;
    }
    Ok(set_aside)
}

/// Sets rows aside for an operator: no relay takes them again. Their orders'
/// deadlines are still kept by the sweeper.
pub async fn outbox_set_aside(
    db: &DatabaseConnection,
    ids: &[i64],
    reason: &str,
    now: Millis,
) -> Result<(), DbErr> {
    for chunk in ids.chunks(LIST_CHUNK) {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::SetAsideAtMs, Expr::value(now.0))
            .col_expr(
                outbox::Column::SetAsideReason,
                Expr::value(crate::domain::truncate(reason, 250)),
            )
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(Option::<i64>::None),
            )
            .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// The outbox now, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxState {
    /// Rows waiting to be published (claimed ones included).
    pub waiting: u64,
    /// Creation time of the oldest waiting row.
    pub oldest: Option<Millis>,
    /// Rows set aside.
    pub set_aside: u64,
}

/// Rows waiting, the creation time of the oldest, and rows set aside.
pub async fn outbox_backlog(db: &DatabaseConnection) -> Result<OutboxState, DbErr> {
    let waiting = outbox::Entity::find()
        .filter(outbox::Column::SetAsideAtMs.is_null())
        .count(db)
        .await?;
    let oldest = outbox::Entity::find()
        .filter(outbox::Column::SetAsideAtMs.is_null())
        .order_by_asc(outbox::Column::Id)
        .one(db)
        .await?
        .map(|r| Millis(r.created_at_ms));
    let set_aside = outbox::Entity::find()
        .filter(outbox::Column::SetAsideAtMs.is_not_null())
        .count(db)
        .await?;
    Ok(OutboxState {
        waiting,
        oldest,
        set_aside,
    })
}

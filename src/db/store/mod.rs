//! Every state change of the service, each one transaction.
//!
//! A transition is one conditional `UPDATE … WHERE id … AND status = … AND
//! deadline <= now`; its row count (or `RETURNING` list) says who won, so a
//! payment and a timeout racing for the same order cannot both succeed, and a
//! redelivered timeout changes nothing. Stock moves only in the transaction of
//! the transition that won, so it is released at most once. Nothing here reads a
//! row and then writes what it read.
//!
//! By family: [`checkout`](checkout()) (order, reservation, outbox row,
//! idempotency key), [`act`] (the client's actions), [`expire`] and
//! [`overdue`] (timeouts, for the consumers and the sweeper), the outbox
//! (`outbox_*`, for the relay), stock (`put_stock`, `get_stock`, and the moves
//! and lock order every transition shares), and reads (`get_order`, `audit`).
//! This module holds the types they share and the audit writer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use sea_orm::UpdateMany;
use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait, OnConflict};
use sea_orm::sea_query::{LockBehavior, LockType};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, EntityTrait, IsolationLevel, ModelTrait, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait, Set, SqlErr, Statement, TransactionTrait,
};

use super::entities::{idempotency_keys, inventory, order_events, order_items, orders, outbox};
use super::events::{DomainEvent, append, new_message_id};
use crate::domain::{Edge, Millis, OrderId, OrderStatus, StockMove, TimeoutKind};
use crate::settings::Windows;

mod actions;
mod ahead;
mod checkout;
mod expiry;
mod publishing;
mod reads;
mod retention;
mod stock;

pub use actions::{Deadline, act, act_during};
pub use ahead::{DueAhead, MINUTE_MS, OVERDUE_BAND, due_ahead};
use checkout::enqueue;
pub use checkout::{checkout, delete_expired_keys};
use expiry::apply_expiry;
pub use expiry::{Backlog, applied_earlier, backlog, expire, next_deadline, overdue, probe};
pub use publishing::{
    CLAIM_LEASE, Outbox, OutboxState, Relayed, is_deadlock, outbox_backlog, outbox_claim,
    outbox_delete, outbox_refused, outbox_release, outbox_set_aside,
};
use reads::load;
pub use reads::{OrderStory, audit, get_order, story};
pub use retention::delete_old_audit;
use stock::{Stock, lock_orders, lock_stock, move_lines, move_stock, order_lines};
pub use stock::{get_stock, put_stock};

pub use super::LIST_CHUNK;

/// One line of a new order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    /// The SKU.
    pub sku: String,
    /// How many; positive.
    pub quantity: i64,
}

/// A checkout's `Idempotency-Key` with the request it came with, and how
/// the caller words the answer a retry with the key gets again.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    /// Whose key it is ([`crate::auth::Caller::scope`]): the same key of two
    /// callers is two keys.
    pub scope: String,
    /// The client's key (1 to 255 visible ASCII characters, checked by the API).
    pub key: String,
    /// How long a key is kept (`http.idempotency_retention`): an older one is
    /// used anew.
    pub retention: Duration,
    /// The validated request in a canonical form: the effective window in
    /// milliseconds, then `sku*quantity` per line in SKU order, for example
    /// `window=900000ms items=A*2,B*1`. Stored as is (no hash: it is short,
    /// and SKUs cannot hold the separators), so JSON key order, whitespace, the
    /// order of lines or a window spelled differently do not make two
    /// requests differ.
    pub request: String,
    /// The body of the answer that created the order (the API's JSON),
    /// stored with the key in the checkout's transaction.
    pub answer: fn(&Order) -> Result<String, serde_json::Error>,
}

impl IdempotencyKey {
    /// The key of a checkout of `items` with this effective payment `window`,
    /// whose order is answered as `answer` words it.
    pub fn new(
        scope: String,
        key: String,
        retention: Duration,
        items: &[NewItem],
        window: Duration,
        answer: fn(&Order) -> Result<String, serde_json::Error>,
    ) -> Self {
        let mut lines: Vec<String> = items
            .iter()
            .map(|i| format!("{}*{}", i.sku, i.quantity))
            .collect();
        lines.sort();
        let request = format!("window={}ms items={}", window.as_millis(), lines.join(","));
        Self {
            scope,
            key,
            retention,
            request,
            answer,
        }
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The SKU.
    pub sku: String,
    /// How many.
    pub quantity: i64,
}

/// An order as stored: its row, typed, and its items (by SKU). The HTTP API
/// decides how it is shown (`http::orders::OrderView`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The id.
    pub id: OrderId,
    /// Current status.
    pub status: OrderStatus,
    /// What was ordered, by SKU.
    pub items: Vec<Item>,
    /// End of the payment window.
    pub pay_deadline: Millis,
    /// Checkout time.
    pub created_at: Millis,
    /// Last change.
    pub updated_at: Millis,
    /// Incremented by every transition.
    pub version: i32,
    /// Payment time.
    pub paid_at: Option<Millis>,
    /// End of the fulfillment window.
    pub ship_deadline: Option<Millis>,
    /// When the fulfillment timeout found it unshipped.
    pub fulfillment_overdue_at: Option<Millis>,
    /// Shipping time.
    pub shipped_at: Option<Millis>,
    /// End of the receipt window.
    pub confirm_deadline: Option<Millis>,
    /// Completion time.
    pub completed_at: Option<Millis>,
    /// Cancellation time.
    pub cancelled_at: Option<Millis>,
    /// When a payment first came after a timeout had cancelled the order.
    pub late_payment_at: Option<Millis>,
    /// The audit trail, oldest first, when it was asked for.
    pub audit: Option<Vec<AuditEntry>>,
}

/// One audit-trail entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// What happened.
    pub event: String,
    /// Status before (absent for `created`).
    pub from: Option<String>,
    /// Status after.
    pub to: String,
    /// `api`, `timeout` or `sweeper`.
    pub cause: String,
    /// When.
    pub at: Millis,
    /// More to say, if anything.
    pub detail: Option<String>,
}

pub use crate::domain::{Action, Cause, ExpiryOutcome};

/// Stock of one SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuStock {
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
        order: Box<Order>,
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

/// The orders column the domain names (`domain::DIAGRAM`, `domain::KINDS`
/// name them as the migration does; a unit test checks that every one is a
/// column of the entity).
fn column(name: &str) -> orders::Column {
    name.parse()
        .unwrap_or_else(|_| panic!("the domain names an orders column `{name}` the entity lacks"))
}

fn deadline_column(kind: TimeoutKind) -> orders::Column {
    column(kind.info().deadline)
}

fn deadline_of(kind: TimeoutKind, order: &orders::Model) -> Option<Millis> {
    match order.get(deadline_column(kind)) {
        sea_orm::Value::BigInt(ms) => ms.map(Millis),
        _ => None,
    }
}

/// The conditional update of `e` at `now`, by the diagram: from its status,
/// to its status (or, flag-only, setting its flag once), stamping its column
/// and counting a version. The caller adds which orders, and the deadline.
fn edge_update(e: &Edge, now: Millis) -> UpdateMany<orders::Entity> {
    let stamp = column(e.stamps);
    let update = orders::Entity::update_many()
        .col_expr(
            orders::Column::Version,
            Expr::col(orders::Column::Version).add(1),
        )
        .col_expr(orders::Column::UpdatedAtMs, Expr::value(now.0))
        .col_expr(stamp, Expr::value(now.0))
        .filter(orders::Column::Status.eq(e.from.as_str()));
    if e.flag_only {
        update.filter(stamp.is_null())
    } else {
        update.col_expr(orders::Column::Status, Expr::value(e.to.as_str()))
    }
}

/// The stock move of `e` for the orders it changed: `lines` are theirs when
/// [`record`] read them (an edge that releases), else empty.
async fn move_edge_stock(
    txn: &DatabaseTransaction,
    e: &Edge,
    ids: &[OrderId],
    lines: &[order_items::Model],
    now: Millis,
) -> Result<(), DbErr> {
    let Some((from, to)) = stock_columns(e.stock) else {
        return Ok(());
    };
    if e.stock == StockMove::Release {
        move_lines(txn, lines, from, to, now).await
    } else if ids.is_empty() {
        Ok(())
    } else {
        move_stock(txn, ids, from, to, now).await
    }
}

/// A stock move of the diagram as the inventory's columns: `(from, to)`.
fn stock_columns(m: StockMove) -> Option<(Stock, Stock)> {
    match m {
        StockMove::Keep => None,
        StockMove::Sell => Some((Stock::Reserved, Stock::Sold)),
        StockMove::Release => Some((Stock::Reserved, Stock::Available)),
    }
}

fn parse_status(raw: &str) -> Result<OrderStatus, DbErr> {
    raw.parse()
        .map_err(|e: String| DbErr::Custom(format!("corrupt order row: {e}")))
}

/// What a timeout's audit rows say beyond the transition: each order's
/// deadline (its lateness is the transition's time minus it, both by the
/// database's clock) and the instance that applied it (none when a
/// client's request found the deadline passed).
#[derive(Debug, Clone, Copy)]
pub(super) struct Applied<'a> {
    /// The deadline each order's transition was for.
    pub deadlines: &'a HashMap<OrderId, Millis>,
    /// `amqp.instance` of the instance that applied it.
    pub instance: Option<&'a str>,
}

/// Writes the audit rows of a transition (or a late payment) and appends its
/// domain events, in the caller's transaction: the events exist exactly when
/// the change commits. A timeout's rows also say how late and by whom
/// (`applied`). A cancel's events say what stock it released (the
/// orders' lines, read here, one query per chunk of orders); those lines are
/// returned, for the caller's stock move (empty for anything but a cancel).
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
    applied: Option<Applied<'_>>,
) -> Result<Vec<order_items::Model>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let told = told(event, from, to, cause, now);
    let (events, lines) = per_order(txn, ids, &told).await?;
    append(txn, &events).await?;
    for chunk in ids.chunks(LIST_CHUNK) {
        let rows = chunk.iter().map(|id| order_events::ActiveModel {
            order_id: Set(id.get()),
            event: Set(event.to_string()),
            from_status: Set(from.map(|f| f.as_str().to_string())),
            to_status: Set(to.as_str().to_string()),
            cause: Set(cause.as_str().to_string()),
            at_ms: Set(now.0),
            detail: Set(detail.map(|d| crate::domain::truncate(d, 250))),
            late_ms: Set(applied
                .and_then(|a| a.deadlines.get(id))
                .map(|deadline| now.0 - deadline.0)),
            instance: Set(applied
                .and_then(|a| a.instance)
                .map(|i| crate::domain::truncate(i, 255))),
            ..Default::default()
        });
        order_events::Entity::insert_many(rows)
            .exec_without_returning(txn)
            .await?;
    }
    Ok(lines)
}

/// The domain event of a transition, for no order yet (each order's id is
/// set per order): what [`record`] appends, and what checkout's one
/// statement writes.
fn told(
    event: &str,
    from: Option<OrderStatus>,
    to: OrderStatus,
    cause: Cause,
    now: Millis,
) -> DomainEvent {
    DomainEvent {
        order_id: String::new(),
        event: event.to_string(),
        cause: cause.party(event).to_string(),
        from: from.map(|f| f.as_str().to_string()),
        to: to.as_str().to_string(),
        at: now,
        released: None,
    }
}

/// The event `told` for each order, with the lines a cancel gives back (read
/// here, one query per chunk of orders, and returned).
async fn per_order(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
    told: &DomainEvent,
) -> Result<(Vec<DomainEvent>, Vec<order_items::Model>), DbErr> {
    // The edges that release stock say so in their events.
    let cancel = crate::domain::DIAGRAM
        .iter()
        .any(|e| e.event == told.event && e.stock == StockMove::Release);
    let lines = if cancel {
        order_lines(txn, ids).await?
    } else {
        Vec::new()
    };
    let mut released: HashMap<i64, Vec<(String, i64)>> = HashMap::new();
    for line in &lines {
        released
            .entry(line.order_id)
            .or_default()
            .push((line.sku.clone(), line.quantity));
    }
    let events = ids
        .iter()
        .map(|id| DomainEvent {
            order_id: id.to_string(),
            released: cancel.then(|| released.remove(&id.get()).unwrap_or_default()),
            ..told.clone()
        })
        .collect();
    Ok((events, lines))
}

#[cfg(test)]
mod tests;

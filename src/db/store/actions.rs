//! The client's actions on an order: pay, ship, confirm, cancel.

use sea_orm::UpdateMany;

use super::*;
use crate::domain::{Trigger, edge};

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
) -> Result<Order, TransitionError> {
    act_during(db, id, action, windows, now, Deadline::Enforced).await
}

/// Whether a payment after its order's deadline loses to the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// It does: the order is cancelled, the payment recorded as late.
    Enforced,
    /// Payment timeouts are paused by an operator (a payment provider was
    /// down, say): an order still waiting for payment takes it, late.
    Paused,
}

/// [`act`], with the payment deadline enforced or not.
pub async fn act_during(
    db: &DatabaseConnection,
    id: OrderId,
    action: Action,
    windows: &Windows,
    now: Millis,
    deadline: Deadline,
) -> Result<Order, TransitionError> {
    let txn = db.begin().await?;
    let (update, timeout) = conditional_update(id, action, windows, now, deadline);
    if update.exec(&txn).await?.rows_affected == 1 {
        return applied(txn, id, action, timeout, now).await;
    }
    refused(txn, id, action, now).await
}

/// The action's conditional update, by its edge of the diagram (from the one
/// status it allows, stamping its column, starting its window, and inside
/// the window it races unless that timeout is paused), and the timeout it
/// starts, if any.
fn conditional_update(
    id: OrderId,
    action: Action,
    windows: &Windows,
    now: Millis,
    deadline: Deadline,
) -> (UpdateMany<orders::Entity>, Option<(TimeoutKind, Millis)>) {
    let e = edge(Trigger::Action(action));
    let mut update = edge_update(&e, now).filter(orders::Column::Id.eq(id.get()));
    if let (Some(races), Deadline::Enforced) = (e.within, deadline) {
        update = update.filter(deadline_column(races).gt(now.0));
    }
    let timeout = e.starts.map(|kind| (kind, now.plus(windows.of(kind))));
    if let Some((kind, at)) = timeout {
        update = update.col_expr(deadline_column(kind), Expr::value(at.0));
    }
    (update, timeout)
}

/// The action won: its timeout in the outbox, its audit row, its stock move.
/// As for a timeout's cancel, the stock rows are locked last, and a cancel's
/// lines are read once (by `record`, for its event) for both.
async fn applied(
    txn: DatabaseTransaction,
    id: OrderId,
    action: Action,
    timeout: Option<(TimeoutKind, Millis)>,
    now: Millis,
) -> Result<Order, TransitionError> {
    let e = edge(Trigger::Action(action));
    if let Some((kind, deadline)) = timeout {
        enqueue(&txn, id, kind, deadline, now).await?;
    }
    let (from, to) = (Some(e.from), e.to);
    let lines = record(&txn, &[id], e.event, from, to, Cause::Api, now, None, None).await?;
    move_edge_stock(&txn, &e, &[id], &lines, now).await?;
    let order = load(&txn, id).await?.ok_or(TransitionError::NotFound(id))?;
    txn.commit().await?;
    Ok(order)
}

/// The action lost: a conflict carrying the order as it is. A payment past
/// its window first applies the payment timeout (no message may have yet; it
/// is conditional, so a consumer doing the same at once is harmless), and is
/// recorded as the order's late payment when it is the first for an order a
/// timeout cancelled.
async fn refused(
    txn: DatabaseTransaction,
    id: OrderId,
    action: Action,
    now: Millis,
) -> Result<Order, TransitionError> {
    let (from, to) = action.edge();
    // The timeout this action races may not have acted yet: it acts first.
    if let Some(races) = edge(Trigger::Action(action)).within {
        apply_expiry(&txn, races, &[id], now, Cause::Timeout, None).await?;
    }
    let late_payment = action == Action::Pay && first_late_payment(&txn, id, now).await?;
    let order = load(&txn, id).await?.ok_or(TransitionError::NotFound(id))?;
    let closed = order.pay_deadline.to_rfc3339();
    let reason = if late_payment {
        let cancelled = order.cancelled_at.unwrap_or(order.pay_deadline);
        let detail = format!(
            "payment at {} for an order cancelled at {}; refund it",
            now.to_rfc3339(),
            cancelled.to_rfc3339()
        );
        let status = OrderStatus::Cancelled;
        let event = crate::domain::LATE_PAYMENT;
        record(
            &txn,
            &[id],
            event,
            Some(status),
            status,
            Cause::Api,
            now,
            Some(&detail),
            None,
        )
        .await?;
        format!("the payment window closed at {closed}; a refund is due if money was taken")
    } else if let (Action::Pay, Some(first)) = (action, order.late_payment_at) {
        format!(
            "the payment window closed at {closed}; a late payment was already recorded at {}",
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

/// Records a late payment once per order, and only for an order that a
/// timeout (its message or the sweeper) cancelled: a retry, or a payment for
/// an order the buyer cancelled, is a plain conflict. One conditional UPDATE;
/// its row count says whether this payment is the order's late payment.
async fn first_late_payment(
    txn: &DatabaseTransaction,
    id: OrderId,
    now: Millis,
) -> Result<bool, DbErr> {
    let cancelled_by_a_timeout = sea_orm::sea_query::Query::select()
        .column(order_events::Column::OrderId)
        .from(order_events::Entity)
        .and_where(order_events::Column::OrderId.eq(id.get()))
        .and_where(order_events::Column::Event.eq(OrderStatus::Cancelled.as_str()))
        .and_where(order_events::Column::Cause.ne(Cause::Api.as_str()))
        .to_owned();
    let result = orders::Entity::update_many()
        .col_expr(orders::Column::LatePaymentAtMs, Expr::value(now.0))
        .filter(orders::Column::Id.eq(id.get()))
        .filter(orders::Column::Status.eq(OrderStatus::Cancelled.as_str()))
        .filter(orders::Column::LatePaymentAtMs.is_null())
        .filter(orders::Column::Id.in_subquery(cancelled_by_a_timeout))
        .exec(txn)
        .await?;
    Ok(result.rows_affected == 1)
}

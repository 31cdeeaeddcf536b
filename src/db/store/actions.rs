//! The client's actions on an order: pay, ship, confirm, cancel.

use super::*;

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

//! Reading an order, its items and its audit trail.

use super::*;

/// One order with its items, and its audit trail when asked.
pub async fn get_order(
    db: &DatabaseConnection,
    id: OrderId,
    with_audit: bool,
) -> Result<Option<Order>, DbErr> {
    let Some(mut order) = load(db, id).await? else {
        return Ok(None);
    };
    if with_audit {
        order.audit = Some(audit(db, id).await?);
    }
    Ok(Some(order))
}

/// An order's audit trail, oldest first.
pub async fn audit<C: ConnectionTrait>(db: &C, id: OrderId) -> Result<Vec<AuditEntry>, DbErr> {
    Ok(order_events::Entity::find()
        .filter(order_events::Column::OrderId.eq(id.get()))
        .order_by_asc(order_events::Column::Id)
        .all(db)
        .await?
        .into_iter()
        .map(|e| AuditEntry {
            event: e.event,
            from: e.from_status,
            to: e.to_status,
            cause: e.cause,
            at: Millis(e.at_ms),
            detail: e.detail,
        })
        .collect())
}

pub(super) async fn load<C: ConnectionTrait>(db: &C, id: OrderId) -> Result<Option<Order>, DbErr> {
    let Some(order) = orders::Entity::find_by_id(id.get()).one(db).await? else {
        return Ok(None);
    };
    let items = order_items::Entity::find()
        .filter(order_items::Column::OrderId.eq(id.get()))
        .order_by_asc(order_items::Column::Sku)
        .all(db)
        .await?
        .into_iter()
        .map(|i| Item {
            sku: i.sku,
            quantity: i.quantity,
        })
        .collect();
    order_from(order, items).map(Some)
}

/// The typed order of a row; a status no version of this service writes is
/// an error (a corrupt row), never shown as some other status.
pub(super) fn order_from(o: orders::Model, items: Vec<Item>) -> Result<Order, DbErr> {
    Ok(Order {
        id: OrderId::new(o.id),
        status: parse_status(&o.status)?,
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
    })
}

/// One order's deadlines, audit trail and the timeouts still ahead of it at
/// `now` (the database's clock), for its story; `None` when there is no
/// such order.
pub async fn story(
    db: &DatabaseConnection,
    id: OrderId,
    now: Millis,
) -> Result<Option<OrderStory>, DbErr> {
    let Some(row) = orders::Entity::find_by_id(id.get()).one(db).await? else {
        return Ok(None);
    };
    let status = parse_status(&row.status)?;
    let deadlines: Vec<(TimeoutKind, Millis)> = TimeoutKind::ALL
        .into_iter()
        .filter_map(|kind| Some((kind, deadline_of(kind, &row)?)))
        .collect();
    // The condition a timeout acts on, as `expire` reads it: in its status,
    // not flagged yet; here only those not due yet.
    let waiting = deadlines
        .iter()
        .copied()
        .filter(|(kind, at)| {
            status == kind.acts_on() && *at > now && expiry::not_flagged(*kind, &row)
        })
        .collect();
    let trail = order_events::Entity::find()
        .filter(order_events::Column::OrderId.eq(id.get()))
        .order_by_asc(order_events::Column::Id)
        .all(db)
        .await?;
    Ok(Some(OrderStory {
        status,
        deadlines,
        waiting,
        trail,
    }))
}

/// What [`story`] read of one order.
#[derive(Debug, Clone)]
pub struct OrderStory {
    /// Its status.
    pub status: OrderStatus,
    /// The deadline of each kind it has one for.
    pub deadlines: Vec<(TimeoutKind, Millis)>,
    /// The timeouts still ahead for its status, with their deadlines.
    pub waiting: Vec<(TimeoutKind, Millis)>,
    /// Its audit rows, oldest first.
    pub trail: Vec<order_events::Model>,
}

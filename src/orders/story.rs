//! One order's whole story, for `GET /admin/orders/{id}` and `ctl order`:
//! what each [`OrderStore`](super::OrderStore) reads of its own tables
//! ([`Story`]: status, deadlines, transitions, the timeouts still ahead),
//! and what is the same whatever owns the order: the state of each
//! transition's domain event in the event outbox ([`event_states`]).

use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};

use crate::db::entities::order_timeout_events;
use crate::db::events::routing_key;
use crate::domain::{Cause, Millis, OrderKey, TimeoutKind};

/// What the store read of one order, all by the database's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Story {
    /// The order, in its canonical spelling.
    pub key: OrderKey,
    /// Its status as the service names it (`pending_payment`, `cancelled`,
    /// …); a mapped status the mapping does not name is given as it is.
    pub status: String,
    /// A mapped order's status as the shop's table spells it.
    pub status_raw: Option<String>,
    /// The deadline of each kind that has one for this order.
    pub deadlines: Vec<(TimeoutKind, Millis)>,
    /// Every recorded transition, oldest first.
    pub transitions: Vec<Transition>,
    /// The timeouts still ahead for its current status, by the database:
    /// the kind and its deadline.
    pub waiting: Vec<(TimeoutKind, Millis)>,
}

/// One recorded transition (or late payment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// When it committed.
    pub at: Millis,
    /// What happened (the events' names: `cancelled`, `paid`, …).
    pub event: String,
    /// The status before (none at creation), as the store spells it.
    pub from: Option<String>,
    /// The status after.
    pub to: String,
    /// `timeout`, `sweeper`, `buyer`, `shop`; `api` where the store cannot
    /// tell which party's request it was.
    pub cause: String,
    /// The timeout kind, for a timeout's or the sweeper's transition.
    pub kind: Option<TimeoutKind>,
    /// How long after its deadline a timeout was applied.
    pub late_ms: Option<i64>,
    /// The instance that applied a timeout.
    pub instance: Option<String>,
    /// A sentence for people, when there is more to say.
    pub detail: Option<String>,
}

impl Transition {
    /// The kind whose timeout (or sweep) made `event` with `cause`.
    pub fn kind_of(event: &str, cause: &str) -> Option<TimeoutKind> {
        let by_timer = [Cause::Timeout, Cause::Sweeper]
            .iter()
            .any(|c| c.as_str() == cause);
        by_timer
            .then(|| {
                TimeoutKind::ALL
                    .into_iter()
                    .find(|k| k.edge().event == event)
            })
            .flatten()
    }
}

/// Where a transition's domain event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Confirmed by the broker: the relay deletes a row once it is.
    Published,
    /// Still in the event outbox, waiting for the relay.
    Pending,
    /// In the event outbox, set aside: no relay takes it again.
    SetAside,
}

impl Delivery {
    /// The answer's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Pending => "pending",
            Self::SetAside => "set_aside",
        }
    }
}

/// One domain event of the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventState {
    /// Its routing key, `order.<event>`.
    pub event: String,
    /// Where it is.
    pub state: Delivery,
    /// When its transition committed.
    pub at: Millis,
    /// Why it was set aside.
    pub reason: Option<String>,
}

/// The domain event of each transition, by the rows of the event outbox
/// (`order_timeout_events`) left for the order. A transition writes its
/// event in its own transaction, with the transition's time, and the relay
/// deletes the row once the broker confirmed it: a transition whose row is
/// gone was published. A row no transition accounts for (its audit row
/// deleted by retention) is listed as it is.
pub async fn event_states<C: ConnectionTrait>(
    db: &C,
    key: &OrderKey,
    transitions: &[Transition],
) -> Result<Vec<EventState>, DbErr> {
    let mut rows = order_timeout_events::Entity::find()
        .filter(order_timeout_events::Column::OrderId.eq(key.as_str()))
        .order_by_asc(order_timeout_events::Column::Id)
        .all(db)
        .await?;
    let state = |row: &order_timeout_events::Model| EventState {
        event: routing_key(&row.event),
        state: if row.set_aside_at_ms.is_some() {
            Delivery::SetAside
        } else {
            Delivery::Pending
        },
        at: Millis(row.created_at_ms),
        reason: row.set_aside_reason.clone(),
    };
    let mut out = Vec::with_capacity(transitions.len() + rows.len());
    for t in transitions {
        let found = rows
            .iter()
            .position(|r| r.event == t.event && r.created_at_ms == t.at.0);
        out.push(match found {
            Some(i) => state(&rows.remove(i)),
            None => EventState {
                event: routing_key(&t.event),
                state: Delivery::Published,
                at: t.at,
                reason: None,
            },
        });
    }
    out.extend(rows.iter().map(state));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeouts_transition_is_of_its_kind_and_a_clients_of_none() {
        let cancelled = TimeoutKind::Payment.edge().event;
        assert_eq!(
            Transition::kind_of(cancelled, "timeout"),
            Some(TimeoutKind::Payment)
        );
        assert_eq!(
            Transition::kind_of(cancelled, "sweeper"),
            Some(TimeoutKind::Payment)
        );
        assert_eq!(Transition::kind_of(cancelled, "api"), None);
        assert_eq!(Transition::kind_of("paid", "timeout"), None);
    }
}

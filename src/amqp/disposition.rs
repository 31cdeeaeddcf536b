//! What happens to a timeout delivery once the database has spoken (see
//! [`crate::apply::Decided`]): its [`Disposition`] (ack, hold, re-delay or
//! park), decided in one place.

use std::time::Duration;

use super::wire::{Park, ParkReason, TimeoutMessage};
use crate::domain::Millis;
use crate::orders::{ExpiryOutcome, Orders};

/// What to do with one delivery once the database has spoken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The transition committed now: ack.
    Applied {
        /// Milliseconds from the deadline to now.
        lateness_ms: i64,
    },
    /// Nothing to do: ack.
    NotApplicable {
        /// The order's status.
        status: String,
    },
    /// Early, due within `hold_max`: keep it unacked and try again at the deadline.
    Hold(Duration),
    /// Early by more than `hold_max`: publish it again to wait, then ack.
    Redelay(Duration),
    /// Park with this reason, then ack.
    Park(Park),
}

impl Disposition {
    /// Records on a `consumer.apply` span what became of its delivery.
    pub(crate) fn record_on(&self, span: &tracing::Span) {
        let outcome = match self {
            Self::Applied { lateness_ms } => {
                span.record("timeout.lateness_ms", *lateness_ms);
                "applied"
            }
            Self::NotApplicable { .. } => "not_applicable",
            Self::Hold(_) => "held",
            Self::Redelay(_) => "redelayed",
            Self::Park(_) => "parked",
        };
        span.record("timeout.outcome", outcome);
    }
}

/// A decoded message the orders can act on, its id in canonical spelling;
/// or why not, to park it: an id the orders cannot have (the service's own
/// ids are positive integers; a mapped id column's type decides), or a kind a
/// mapped table has no states for.
pub fn admit(orders: &Orders, mut message: TimeoutMessage) -> Result<TimeoutMessage, Park> {
    let kind = message.kind;
    if !orders.maps(kind) {
        return Err(Park::new(
            ParkReason::UnknownKind,
            format!("the mapping has no {kind} states (`mapping.{kind}.from` is not set)"),
        ));
    }
    message.order_id = orders
        .accept(&message.order_id)
        .map_err(|e| Park::new(ParkReason::InvalidBody, e))?;
    Ok(message)
}

/// The one place that maps a database outcome to what happens to a delivery.
pub fn decide(
    outcome: ExpiryOutcome,
    now: Millis,
    hold_max: Duration,
    first_for_order: bool,
) -> Disposition {
    match outcome {
        ExpiryOutcome::Applied { deadline } if first_for_order => Disposition::Applied {
            lateness_ms: now.signed_since(deadline),
        },
        // A duplicate of the same order in the same batch: the first one applied it.
        ExpiryOutcome::Applied { .. } => Disposition::NotApplicable {
            status: "duplicate".into(),
        },
        ExpiryOutcome::Inapplicable { status } => Disposition::NotApplicable { status },
        ExpiryOutcome::NotFound => {
            Disposition::Park(Park::new(ParkReason::UnknownOrder, "no order has this id"))
        }
        ExpiryOutcome::NotDue { deadline } => {
            // One extra millisecond so the retry lands at or after the deadline.
            let remaining = deadline.since(now) + Duration::from_millis(1);
            if remaining <= hold_max {
                Disposition::Hold(remaining)
            } else {
                Disposition::Redelay(remaining)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OrderStatus;

    const HOLD: Duration = Duration::from_secs(1);

    #[test]
    fn applied_once_per_order() {
        let now = Millis(10_000);
        let applied = ExpiryOutcome::Applied {
            deadline: Millis(9_900),
        };
        assert_eq!(
            decide(applied.clone(), now, HOLD, true),
            Disposition::Applied { lateness_ms: 100 }
        );
        assert!(matches!(
            decide(applied, now, HOLD, false),
            Disposition::NotApplicable { .. }
        ));
    }

    #[test]
    fn early_messages_are_held_or_redelayed_never_applied() {
        let now = Millis(10_000);
        assert_eq!(
            decide(
                ExpiryOutcome::NotDue {
                    deadline: Millis(10_500)
                },
                now,
                HOLD,
                true
            ),
            Disposition::Hold(Duration::from_millis(501))
        );
        assert_eq!(
            decide(
                ExpiryOutcome::NotDue {
                    deadline: Millis(70_000)
                },
                now,
                HOLD,
                true
            ),
            Disposition::Redelay(Duration::from_millis(60_001))
        );
    }

    #[test]
    fn moved_on_is_acked_and_unknown_is_parked() {
        let now = Millis(0);
        assert_eq!(
            decide(
                ExpiryOutcome::Inapplicable {
                    status: OrderStatus::Paid.as_str().into()
                },
                now,
                HOLD,
                true
            ),
            Disposition::NotApplicable {
                status: "paid".into()
            }
        );
        match decide(ExpiryOutcome::NotFound, now, HOLD, true) {
            Disposition::Park(p) => assert_eq!(p.reason, ParkReason::UnknownOrder),
            other => panic!("{other:?}"),
        }
    }
}

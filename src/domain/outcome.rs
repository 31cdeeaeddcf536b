//! What a transition's audit row says caused it, and what a timeout found
//! for one order: the vocabulary the stores write and the orders layer hands
//! to the consumers and the sweeper.

use super::{Action, Millis};

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

    /// Who caused `event`, as its domain event says: `timeout` or `sweeper`,
    /// and for a client's request the party whose request it is: `shop` for
    /// shipping (an admin call), `buyer` for everything else (checkout, pay,
    /// cancel, confirm, a late payment).
    pub fn party(self, event: &str) -> &'static str {
        let shipped = super::edge(super::Trigger::Action(Action::Ship)).event;
        match self {
            Self::Timeout => "timeout",
            Self::Sweeper => "sweeper",
            Self::Api if event == shipped => "shop",
            Self::Api => "buyer",
        }
    }
}

/// What a timeout (or the sweeper) found for one order.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        /// The order's status now, as the orders table spells it.
        status: String,
    },
    /// No order has this id.
    NotFound,
}

//! The order state diagram as one table: every status, every edge (who
//! takes it, the column it stamps, the window it starts, what it does to
//! stock, whether it only flags the order), the domain events they tell, and
//! the timeout kinds with their deadline columns. The store, the mapped
//! tables, the roles and the API read these tables; nothing lists a kind or
//! an edge by hand.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::truncate;

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Created, stock reserved, waiting for payment until `pay_deadline`.
    PendingPayment,
    /// Paid; stock sold; must ship by `ship_deadline`.
    Paid,
    /// Shipped; completes on confirmation or at `confirm_deadline`.
    Shipped,
    /// Done.
    Completed,
    /// Cancelled (by the buyer or the payment timeout); stock released.
    Cancelled,
}

impl OrderStatus {
    /// Every status, for parsing and tests.
    pub const ALL: [OrderStatus; 5] = [
        Self::PendingPayment,
        Self::Paid,
        Self::Shipped,
        Self::Completed,
        Self::Cancelled,
    ];

    /// The database and API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingPayment => "pending_payment",
            Self::Paid => "paid",
            Self::Shipped => "shipped",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the state diagram has an edge from `self` to `to` (a change
    /// of status; the fulfillment timeout flags an order and keeps it `paid`).
    pub fn can_become(self, to: OrderStatus) -> bool {
        self != to && DIAGRAM.iter().any(|e| e.from == self && e.to == to)
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
    /// Every action, in the order the API lists them.
    pub const ALL: [Action; 4] = [Self::Pay, Self::Ship, Self::Confirm, Self::Cancel];

    /// The API spelling (`POST /orders/{id}/{action}`) and the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pay => "pay",
            Self::Ship => "ship",
            Self::Confirm => "confirm",
            Self::Cancel => "cancel",
        }
    }

    /// The edge of the state diagram this action walks: `(from, to)`.
    pub fn edge(self) -> (OrderStatus, OrderStatus) {
        let e = edge(Trigger::Action(self));
        (e.from, e.to)
    }
}

impl FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| format!("unknown action '{}'", truncate(s, 32)))
    }
}

/// What moves an order along the diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A client's action.
    Action(Action),
    /// A timeout of this kind.
    Timeout(TimeoutKind),
}

/// One edge of the order state diagram, with everything it does: the layers
/// that apply it (the service's own orders, a shop's mapped table) read these
/// fields and decide nothing per kind or per action themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// What walks it.
    pub by: Trigger,
    /// The status it starts from: the guard of its conditional update.
    pub from: OrderStatus,
    /// The status it leads to (`from` again for a flag-only edge).
    pub to: OrderStatus,
    /// The event its audit row records.
    pub event: &'static str,
    /// The orders column (as the migration names it) stamped with the
    /// transition's time.
    pub stamps: &'static str,
    /// The timeout window it starts: that kind's deadline is set to the
    /// transition's time plus its window, and its timeout is scheduled.
    pub starts: Option<TimeoutKind>,
    /// The timeout it races: the edge is walkable only before that kind's
    /// deadline (unless its timeouts are paused), and an attempt after it
    /// lets the timeout act first.
    pub within: Option<TimeoutKind>,
    /// What it does with the order's reserved stock.
    pub stock: StockMove,
    /// Flags the order instead of moving it: the status stays, `stamps` is
    /// the flag, set once (the update also requires it unset).
    pub flag_only: bool,
}

/// What an edge does with the stock its order reserved at checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockMove {
    /// Nothing.
    Keep,
    /// Reserved becomes sold.
    Sell,
    /// Reserved goes back on sale; the edge's events list what was released.
    Release,
}

/// The order state diagram: every edge, once, with its effects. The allowed
/// transitions, the status each timeout acts on, the guard of each
/// conditional update, the column it stamps, the window it starts, its stock
/// move and the audit event it writes all come from here.
pub const DIAGRAM: [Edge; 7] = {
    use Action::*;
    use OrderStatus::*;
    use StockMove::*;
    use TimeoutKind::*;
    use Trigger::{Action as By, Timeout as After};
    const fn moves(by: Trigger, from: OrderStatus, to: OrderStatus, event: &'static str) -> Edge {
        Edge {
            by,
            from,
            to,
            event,
            stamps: "",
            starts: None,
            within: None,
            stock: Keep,
            flag_only: false,
        }
    }
    [
        Edge {
            stamps: "paid_at_ms",
            starts: Some(Fulfillment),
            within: Some(Payment),
            stock: Sell,
            ..moves(By(Pay), PendingPayment, Paid, "paid")
        },
        Edge {
            stamps: "shipped_at_ms",
            starts: Some(Receipt),
            ..moves(By(Ship), Paid, Shipped, "shipped")
        },
        Edge {
            stamps: "completed_at_ms",
            ..moves(By(Confirm), Shipped, Completed, "completed")
        },
        Edge {
            stamps: "cancelled_at_ms",
            stock: Release,
            ..moves(By(Cancel), PendingPayment, Cancelled, "cancelled")
        },
        Edge {
            stamps: "cancelled_at_ms",
            stock: Release,
            ..moves(After(Payment), PendingPayment, Cancelled, "cancelled")
        },
        // Flagged, not cancelled: the goods are paid for; people must act.
        Edge {
            stamps: "fulfillment_overdue_at_ms",
            flag_only: true,
            ..moves(After(Fulfillment), Paid, Paid, "fulfillment_overdue")
        },
        Edge {
            stamps: "completed_at_ms",
            ..moves(After(Receipt), Shipped, Completed, "completed")
        },
    ]
};

/// The event of a checkout: the order's first status, walked by no edge.
pub const CREATED: &str = "created";

/// The event of a payment refused because a timeout had cancelled its order.
pub const LATE_PAYMENT: &str = "late_payment";

/// Every event name an order's life records (audit rows, domain events):
/// [`CREATED`], each edge's event once in [`DIAGRAM`] order, [`LATE_PAYMENT`].
pub const EVENTS: [&str; EVENT_COUNT] = {
    let mut events = [CREATED; EVENT_COUNT];
    let mut n = 1;
    let mut i = 0;
    while i < DIAGRAM.len() {
        if first_of_its_event(i) {
            events[n] = DIAGRAM[i].event;
            n += 1;
        }
        i += 1;
    }
    events[n] = LATE_PAYMENT;
    events
};

const EVENT_COUNT: usize = {
    let mut n = 2;
    let mut i = 0;
    while i < DIAGRAM.len() {
        if first_of_its_event(i) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// Whether no edge before `DIAGRAM[i]` has its event (const: no iterators,
/// no `==` on strings).
const fn first_of_its_event(i: usize) -> bool {
    let mut j = 0;
    while j < i {
        if same(DIAGRAM[j].event.as_bytes(), DIAGRAM[i].event.as_bytes()) {
            return false;
        }
        j += 1;
    }
    true
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The edge `by` walks. Every trigger has exactly one (a unit test checks).
pub fn edge(by: Trigger) -> Edge {
    let mut found = DIAGRAM[0];
    for e in DIAGRAM {
        if e.by == by {
            found = e;
        }
    }
    found
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OrderStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown order status '{s}'"))
    }
}

impl Serialize for OrderStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The deadlines in an order's life; also the routing key of its timeout.
/// What differs between kinds is in [`KINDS`] and [`DIAGRAM`]: every layer
/// iterates [`TimeoutKind::ALL`] and reads those tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeoutKind {
    /// The payment window ended: cancel an unpaid order and release its stock.
    Payment,
    /// The fulfillment window ended: flag a paid order that was not shipped.
    Fulfillment,
    /// The receipt window ended: complete a shipped order the buyer never confirmed.
    Receipt,
}

/// What names one kind, wherever it is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    /// The kind.
    pub kind: TimeoutKind,
    /// The wire spelling (routing key and body `kind`), also its queue's,
    /// its role's (pause), its metric label's and its settings' name
    /// (`windows.<name>`, `mapping.<name>.*`).
    pub name: &'static str,
    /// The orders column (as the migration names it) holding its deadline.
    pub deadline: &'static str,
}

/// One row per kind, in [`TimeoutKind::ALL`] order (a unit test checks).
pub const KINDS: [KindInfo; 3] = {
    use TimeoutKind::*;
    [
        KindInfo {
            kind: Payment,
            name: "payment",
            deadline: "pay_deadline_ms",
        },
        KindInfo {
            kind: Fulfillment,
            name: "fulfillment",
            deadline: "ship_deadline_ms",
        },
        KindInfo {
            kind: Receipt,
            name: "receipt",
            deadline: "confirm_deadline_ms",
        },
    ]
};

impl TimeoutKind {
    /// Every kind.
    pub const ALL: [TimeoutKind; KINDS.len()] = [Self::Payment, Self::Fulfillment, Self::Receipt];

    /// Its row of [`KINDS`].
    pub fn info(self) -> &'static KindInfo {
        &KINDS[self as usize]
    }

    /// The wire spelling (routing key and body `kind`).
    pub fn as_str(self) -> &'static str {
        self.info().name
    }

    /// The edge its timeout walks.
    pub fn edge(self) -> Edge {
        edge(Trigger::Timeout(self))
    }

    /// The status an order must be in for this timeout to act.
    pub fn acts_on(self) -> OrderStatus {
        self.edge().from
    }

    /// The kinds as a sentence, for messages: `payment, fulfillment or receipt`.
    pub fn names() -> String {
        let names = Self::ALL.map(Self::as_str);
        match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

impl fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TimeoutKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown kind '{}' (expected {})",
                    truncate(s, 64),
                    Self::names()
                )
            })
    }
}

//! Domain types: order ids, statuses and their transitions, timeout kinds, and
//! the millisecond timestamps the database stores.
//!
//! Timestamps are kept as integer milliseconds since the Unix epoch in every
//! database: comparisons (`deadline <= now`) then mean the same thing on SQLite,
//! PostgreSQL and MariaDB, with no time-zone or text-format surprises. The API
//! shows them as RFC 3339.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

mod outcome;
pub use outcome::{Cause, ExpiryOutcome};

/// The longest delay a timer may have, in milliseconds: the delayed-message
/// plugin's (and Erlang's timer) limit, about 49.7 days. The wire contract's
/// `x-delay` and every window setting stop here.
pub const MAX_DELAY_MS: u64 = 4_294_967_295;

/// An order's id: a positive 64-bit integer, always written as a string in JSON
/// (numbers above 2^53 do not survive JSON numbers in other languages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId(i64);

impl OrderId {
    /// Wraps a database id.
    pub fn new(id: i64) -> Self {
        Self(id)
    }
    /// The database value.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for OrderId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<i64>() {
            Ok(n) if n > 0 && !s.starts_with('+') => Ok(Self(n)),
            _ => Err(format!(
                "'{}' is not an order id (a positive integer, as a string)",
                truncate(s, 64)
            )),
        }
    }
}

impl Serialize for OrderId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An order's id as the wire contract carries it: a string. What it may hold
/// (a positive integer for the service's own orders; an integer, a UUID or any
/// text for a shop's own table) is decided by the orders the service acts on
/// (`orders::Orders::accept`), which also puts it in its canonical spelling
/// (`"007"` is order `7`; a UUID in lower case), so that two spellings of one
/// order are one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderKey(String);

/// Longest order id the wire accepts, in bytes.
pub const MAX_ORDER_KEY_BYTES: usize = 255;

impl OrderKey {
    /// A key from the wire: 1 to [`MAX_ORDER_KEY_BYTES`] bytes, no control
    /// characters, no surrounding blanks.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("order_id is empty".into());
        }
        if raw.len() > MAX_ORDER_KEY_BYTES {
            return Err(format!(
                "order_id is {} bytes, the limit is {MAX_ORDER_KEY_BYTES}",
                raw.len()
            ));
        }
        if raw.chars().any(char::is_control) || raw.trim() != raw {
            return Err(format!(
                "order_id '{}' holds control characters or surrounding blanks",
                truncate(&raw.escape_debug().to_string(), 64)
            ));
        }
        Ok(Self(raw.to_string()))
    }
    /// Every answer of [`OrderKey::fault`] but `None`.
    pub const FAULTS: [&str; 4] = [
        "empty",
        "too_long",
        "control_characters",
        "surrounding_blanks",
    ];

    /// Why `raw` is no key ([`OrderKey::parse`] refuses it), as a metric
    /// label: `empty`, `too_long`, `control_characters` or
    /// `surrounding_blanks`; `None` for a key.
    pub fn fault(raw: &str) -> Option<&'static str> {
        if raw.is_empty() {
            Some("empty")
        } else if raw.len() > MAX_ORDER_KEY_BYTES {
            Some("too_long")
        } else if raw.chars().any(char::is_control) {
            Some("control_characters")
        } else if raw.trim() != raw {
            Some("surrounding_blanks")
        } else {
            None
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<OrderId> for OrderKey {
    fn from(id: OrderId) -> Self {
        Self(id.to_string())
    }
}

impl fmt::Display for OrderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

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

/// Milliseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub i64);

impl Millis {
    /// The current wall-clock time.
    pub fn now() -> Self {
        Self(Utc::now().timestamp_millis())
    }

    /// This time plus a duration (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// This time minus a duration (saturating).
    pub fn minus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long from `earlier` to `self`, zero when `earlier` is later.
    pub fn since(self, earlier: Millis) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// Signed milliseconds from `earlier` to `self`.
    pub fn signed_since(self, earlier: Millis) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// As a chrono time, if representable.
    pub fn to_datetime(self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp_millis(self.0)
    }

    /// RFC 3339 with milliseconds, e.g. `2026-11-30T05:30:00.000Z`.
    pub fn to_rfc3339(self) -> String {
        self.to_datetime()
            .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
            .unwrap_or_else(|| self.0.to_string())
    }

    /// Parses RFC 3339 (any offset) into milliseconds.
    pub fn parse_rfc3339(s: &str) -> Result<Self, String> {
        DateTime::parse_from_rfc3339(s)
            .map(|d| Self(d.timestamp_millis()))
            .map_err(|e| format!("'{}' is not an RFC 3339 time ({e})", truncate(s, 64)))
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

/// Shortens untrusted text before it goes into an error message or a header.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_what_parse_refuses() {
        let long = "x".repeat(MAX_ORDER_KEY_BYTES + 1);
        for (raw, fault) in [
            ("", Some("empty")),
            (" 12 ", Some("surrounding_blanks")),
            ("12\n", Some("control_characters")),
            ("1\t2", Some("control_characters")),
            (long.as_str(), Some("too_long")),
            ("12", None),
            ("ORD-7", None),
        ] {
            assert_eq!(OrderKey::fault(raw), fault, "{raw:?}");
            assert_eq!(OrderKey::parse(raw).is_ok(), fault.is_none(), "{raw:?}");
            assert!(fault.is_none_or(|f| OrderKey::FAULTS.contains(&f)));
        }
    }

    #[test]
    fn order_ids_are_positive_integers() {
        assert_eq!("42".parse::<OrderId>().unwrap().get(), 42);
        assert_eq!(
            "9223372036854775807".parse::<OrderId>().unwrap().get(),
            i64::MAX
        );
        for bad in ["0", "-1", "+3", "1.5", "abc", "", "9223372036854775808"] {
            assert!(bad.parse::<OrderId>().is_err(), "{bad}");
        }
        assert_eq!(serde_json::to_string(&OrderId::new(7)).unwrap(), "\"7\"");
    }

    #[test]
    fn order_keys_are_any_short_clean_text() {
        for good in [
            "42",
            "0b1c2d3e-0000-4000-8000-000000000001",
            "202611300001",
            "SN-7 a",
        ] {
            assert_eq!(OrderKey::parse(good).unwrap().as_str(), good);
        }
        let long = "x".repeat(MAX_ORDER_KEY_BYTES + 1);
        for bad in ["", " 42", "42 ", "4\n2", "a\u{0}b", long.as_str()] {
            assert!(OrderKey::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(OrderKey::from(OrderId::new(9)).as_str(), "9");
    }

    #[test]
    fn transitions_follow_the_diagram() {
        use OrderStatus::*;
        assert!(PendingPayment.can_become(Paid));
        assert!(PendingPayment.can_become(Cancelled));
        assert!(!Paid.can_become(Cancelled));
        assert!(!Cancelled.can_become(Paid));
        assert!(!Paid.can_become(Completed));
        assert!(Shipped.can_become(Completed));
        assert!(!Paid.can_become(Paid));
        for st in OrderStatus::ALL {
            assert_eq!(st.as_str().parse::<OrderStatus>().unwrap(), st);
        }
    }

    #[test]
    fn every_trigger_walks_exactly_one_edge() {
        let triggers = Action::ALL
            .map(Trigger::Action)
            .into_iter()
            .chain(TimeoutKind::ALL.map(Trigger::Timeout));
        for by in triggers {
            let edges: Vec<&Edge> = DIAGRAM.iter().filter(|e| e.by == by).collect();
            assert_eq!(edges.len(), 1, "{by:?}: {edges:?}");
            assert_eq!(edge(by), *edges[0]);
        }
        assert_eq!(
            Action::Pay.edge(),
            (OrderStatus::PendingPayment, OrderStatus::Paid)
        );
        assert_eq!(TimeoutKind::Receipt.acts_on(), OrderStatus::Shipped);
        assert_eq!(TimeoutKind::names(), "payment, fulfillment or receipt");
        for a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>(), Ok(a));
        }
    }

    #[test]
    fn every_kind_has_its_row_and_a_coherent_edge() {
        for (i, kind) in TimeoutKind::ALL.into_iter().enumerate() {
            assert_eq!(KINDS[i].kind, kind);
            assert_eq!(kind.as_str().parse::<TimeoutKind>(), Ok(kind));
        }
        for e in DIAGRAM {
            assert!(!e.stamps.is_empty(), "{e:?} stamps nothing");
            assert_eq!(e.flag_only, e.from == e.to, "{e:?}");
            // A flag-only edge stamps a column of its own: set once, it is the flag.
            if e.flag_only {
                assert!(DIAGRAM.iter().all(|o| o == &e || o.stamps != e.stamps));
            }
        }
    }

    #[test]
    fn the_events_are_the_diagrams_once_each() {
        assert_eq!(
            EVENTS,
            [
                "created",
                "paid",
                "shipped",
                "completed",
                "cancelled",
                "fulfillment_overdue",
                "late_payment",
            ]
        );
    }

    #[test]
    fn millis_round_trip_rfc3339() {
        let t = Millis::parse_rfc3339("2026-11-30T05:30:00Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-30T05:30:00.000Z");
        assert_eq!(
            Millis::parse_rfc3339("2026-11-30T06:30:00+01:00").unwrap(),
            t
        );
        assert_eq!(t.plus(Duration::from_secs(1)).signed_since(t), 1000);
        assert_eq!(t.since(t.plus(Duration::from_secs(1))), Duration::ZERO);
    }
}

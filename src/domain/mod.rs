//! Domain types: order ids and keys, the millisecond timestamps the database
//! stores, and (in [`diagram`]) statuses, their transitions and the timeout
//! kinds; what a timeout found ([`outcome`]).
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

mod diagram;
mod outcome;
pub use diagram::{
    Action, CREATED, DIAGRAM, EVENTS, Edge, KINDS, KindInfo, LATE_PAYMENT, OrderStatus, StockMove,
    TimeoutKind, Trigger, edge,
};
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

/// Shortens untrusted text before it goes into an error message, a header
/// or a column: at most `max` characters (as VARCHAR counts them on
/// PostgreSQL and MariaDB), the last an ellipsis when it was cut.
pub fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some(_) => {
            let keep = s
                .char_indices()
                .nth(max.saturating_sub(1))
                .map_or(0, |(i, _)| i);
            format!("{}…", &s[..keep])
        }
    }
}

#[cfg(test)]
mod tests;

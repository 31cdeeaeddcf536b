//! Domain events: what every committed transition tells the shop's other
//! systems (payment, notifications, warehouse), so none of them has to poll.
//!
//! A transition appends its events to the event outbox
//! (`order_timeout_events`) inside its own transaction: an event exists
//! exactly when its transition committed, never for one that rolled back. The
//! relay publishes the rows after commit, with publisher confirms, to
//! `<prefix>.events` (a topic exchange) with the routing key `order.<event>`,
//! and deletes a row once the broker confirmed it. A row is published at
//! least once: a relay that dies between the confirm and the delete publishes
//! it again, with the same `message_id`, so consumers de-duplicate by it.
//!
//! The body is built here, at insert, and stored whole: what goes out is what
//! the transaction saw, whichever version of the service relays it. Its shape
//! is the wire contract v1 for events (docs/wire-contract.md, "Events"):
//!
//! ```json
//! {"version":1,"event":"cancelled","order_id":"42","at":"2026-11-30T05:30:00.004Z",
//!  "cause":"timeout","from":"pending_payment","to":"cancelled",
//!  "released":[{"sku":"A","quantity":2}]}
//! ```

use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set};
use serde::Serialize;

use super::LIST_CHUNK;
use super::entities::order_timeout_events;
use crate::domain::Millis;

/// The version of the events' wire contract, the body's `version`.
pub const CONTRACT_VERSION: u32 = 1;

/// Every event name a transition publishes, each the last word of its
/// routing key `order.<event>`: the state diagram's.
pub use crate::domain::EVENTS;

/// One committed transition (or a late payment refused), as the event that
/// tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEvent {
    /// The order, as on the wire (`"42"`, a UUID, an `order_sn`).
    pub order_id: String,
    /// What happened: one of [`EVENTS`].
    pub event: String,
    /// Who or what caused it: `timeout`, `sweeper`, `buyer` or `shop`.
    pub cause: String,
    /// The status before, as the orders table spells it (none for `created`).
    pub from: Option<String>,
    /// The status after.
    pub to: String,
    /// When the transition committed its change.
    pub at: Millis,
    /// For a cancel, the stock given back: `(sku, quantity)` per line.
    pub released: Option<Vec<(String, i64)>>,
}

/// The body of an event message, field by field in the order it is written.
#[derive(Serialize)]
struct Body<'a> {
    version: u32,
    event: &'a str,
    order_id: &'a str,
    at: String,
    cause: &'a str,
    from: Option<&'a str>,
    to: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<Vec<Released<'a>>>,
}

/// One line of stock given back by a cancel.
#[derive(Serialize)]
struct Released<'a> {
    sku: &'a str,
    quantity: i64,
}

impl DomainEvent {
    /// The JSON message body (wire contract v1 for events); `released` only
    /// when there is a release to tell.
    pub fn body(&self) -> String {
        let body = Body {
            version: CONTRACT_VERSION,
            event: &self.event,
            order_id: &self.order_id,
            at: self.at.to_rfc3339(),
            cause: &self.cause,
            from: self.from.as_deref(),
            to: &self.to,
            released: self.released.as_ref().map(|lines| {
                lines
                    .iter()
                    .map(|(sku, quantity)| Released {
                        sku,
                        quantity: *quantity,
                    })
                    .collect()
            }),
        };
        // Strings and integers only: serializing cannot fail.
        serde_json::to_string(&body).unwrap_or_default()
    }

    /// The body of this event for an order whose numeric id a statement
    /// learns only as it inserts the order, split around that id: `before`,
    /// the id's digits, then `after` is [`body`](Self::body) with that id (an
    /// id is a JSON string, and decimal digits need no escaping in one). The
    /// body is still made here, once, by the same encoder; the statement only
    /// joins the three. `order_id` is ignored. `None` if the body had no
    /// single place for the id (no event this service writes).
    pub fn body_around_id(&self) -> Option<(String, String)> {
        // A NUL is written `\u0000` and is in no other field (fixed names, a
        // time, SKUs of printable characters), so the split is unambiguous.
        let marked = Self {
            order_id: ID_MARK.to_string(),
            ..self.clone()
        }
        .body();
        let (before, after) = marked.split_once(ID_MARK_ENCODED)?;
        (!after.contains(ID_MARK_ENCODED)).then(|| (before.to_string(), after.to_string()))
    }
}

/// Where the order id goes in [`DomainEvent::body_around_id`], and how the
/// encoder writes it.
const ID_MARK: &str = "\u{0}";
const ID_MARK_ENCODED: &str = "\\u0000";

/// A fresh message id for an event row (a UUID): kept for every publish of
/// the row, so consumers de-duplicate by it.
pub fn new_message_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The routing key of an event: `order.<event>`.
pub fn routing_key(event: &str) -> String {
    format!("order.{event}")
}

/// Appends events to the event outbox, in the caller's transaction, one
/// multi-row insert per [`LIST_CHUNK`] events. Each row gets its body and a
/// fresh message id (a UUID) now, and keeps both for every publish.
pub async fn append<C: ConnectionTrait>(db: &C, events: &[DomainEvent]) -> Result<(), DbErr> {
    for chunk in events.chunks(LIST_CHUNK) {
        let rows = chunk.iter().map(|e| order_timeout_events::ActiveModel {
            message_id: Set(new_message_id()),
            order_id: Set(e.order_id.clone()),
            event: Set(e.event.clone()),
            body: Set(e.body()),
            created_at_ms: Set(e.at.0),
            attempts: Set(0),
            trace_context: Set(crate::traces::for_order(&e.order_id)),
            ..Default::default()
        });
        order_timeout_events::Entity::insert_many(rows)
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn cancel() -> DomainEvent {
        DomainEvent {
            order_id: "42".into(),
            event: "cancelled".into(),
            cause: "timeout".into(),
            from: Some("pending_payment".into()),
            to: "cancelled".into(),
            at: Millis::parse_rfc3339("2026-11-30T05:30:00.004Z").unwrap(),
            released: Some(vec![("A".into(), 2), ("B".into(), 1)]),
        }
    }

    #[test]
    fn a_cancel_body_is_the_contract_with_what_it_released() {
        assert_eq!(
            cancel().body(),
            r#"{"version":1,"event":"cancelled","order_id":"42","at":"2026-11-30T05:30:00.004Z","cause":"timeout","from":"pending_payment","to":"cancelled","released":[{"sku":"A","quantity":2},{"sku":"B","quantity":1}]}"#
        );
    }

    #[test]
    fn other_bodies_have_no_released_and_a_null_from_at_creation() {
        let created = DomainEvent {
            order_id: "0b6f3c1e-2a4d-4c2f-9a57-3f1d2c4b5a69".into(),
            event: "created".into(),
            cause: "buyer".into(),
            from: None,
            to: "pending_payment".into(),
            at: Millis(0),
            released: None,
        };
        let body: Value = serde_json::from_str(&created.body()).unwrap();
        assert_eq!(
            body,
            json!({"version": 1, "event": "created", "order_id": "0b6f3c1e-2a4d-4c2f-9a57-3f1d2c4b5a69",
                   "at": "1970-01-01T00:00:00.000Z", "cause": "buyer", "from": null,
                   "to": "pending_payment"})
        );
        assert!(body.get("released").is_none());
    }

    #[test]
    fn text_is_escaped_and_ids_stay_strings() {
        let mut event = cancel();
        event.order_id = "SN\"2026\\11\n".into();
        event.released = Some(vec![("ü \"x\"".into(), 3)]);
        let body: Value = serde_json::from_str(&event.body()).unwrap();
        assert_eq!(body["order_id"], "SN\"2026\\11\n");
        assert_eq!(body["released"], json!([{"sku": "ü \"x\"", "quantity": 3}]));
        // A numeric id above 2^53 survives: it is never a JSON number.
        event.order_id = "9223372036854775807".into();
        let body: Value = serde_json::from_str(&event.body()).unwrap();
        assert_eq!(body["order_id"], "9223372036854775807");
    }

    #[test]
    fn the_body_around_an_id_is_the_body_with_that_id() {
        for id in ["1", "42", "9223372036854775807"] {
            let mut event = cancel();
            let (before, after) = event.body_around_id().unwrap();
            event.order_id = id.into();
            assert_eq!(format!("{before}{id}{after}"), event.body());
        }
    }

    #[test]
    fn routing_keys_are_order_dot_event() {
        for event in EVENTS {
            assert_eq!(routing_key(event), format!("order.{event}"));
            // One word after `order.`: `order.*` matches every event.
            assert!(!event.contains('.') && !event.is_empty());
        }
    }
}

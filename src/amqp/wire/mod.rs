//! The wire contract (v1): what any publisher sends, and how we read it.
//!
//! Exchange `<prefix>`, routing key = kind, header `x-delay` in integer
//! milliseconds (0 < d ≤ 2^32-1), `content_type = application/json`, persistent,
//! a unique `message_id`, a `timestamp`, and a JSON body
//! `{"order_id": "…", "kind": "payment", "due_at": "…"}`. Everything here is pure
//! so that each rule is unit-tested; a message that breaks one is parked with the
//! [`Park`] that says which.

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde::Deserialize;

use crate::domain::{Millis, OrderKey, TimeoutKind, truncate};

/// The delay header, shared with the delayed-message plugin.
pub const X_DELAY: &str = "x-delay";
pub use crate::domain::MAX_DELAY_MS;
/// Bodies larger than this are parked unread; a valid one is under 200 bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// How much of an oversized body ([`MAX_BODY_BYTES`]) its parked copy
/// keeps: enough to see what it was, while the parked queue's 1 GiB bound
/// (`x-max-length-bytes`, oldest dropped first) holds about a million of them
/// instead of sixteen thousand, so a flood of large bodies does not push the
/// earlier parked messages out.
pub const PARKED_KEEP_BYTES: usize = 1024;
/// A parked copy whose body was cut to [`PARKED_KEEP_BYTES`] carries the
/// original body's size in bytes here.
pub const X_ORIGINAL_SIZE: &str = "x-original-size";
/// Our own count of how many times a message was re-delayed because it came early.
pub const X_REDELAYS: &str = "x-order-timeout-redelays";
/// Parked messages carry the reason code here ...
pub const X_PARKED_REASON: &str = "x-parked-reason";
/// ... and a human-readable explanation here.
pub const X_PARKED_DETAIL: &str = "x-parked-detail";
/// When it was parked (RFC 3339).
pub const X_PARKED_AT: &str = "x-parked-at";
/// Which component parked it (`router` or `consumer`).
pub const X_PARKED_BY: &str = "x-parked-by";
/// The exchange and routing key the message had when it was parked.
pub const X_ORIGINAL_EXCHANGE: &str = "x-original-exchange";
/// See [`X_ORIGINAL_EXCHANGE`].
pub const X_ORIGINAL_ROUTING_KEY: &str = "x-original-routing-key";
/// A parked message's original `expiration`, which its copy does not carry.
pub const X_ORIGINAL_EXPIRATION: &str = "x-original-expiration";
/// A parked message's original `user_id`, which its copy does not carry.
pub const X_ORIGINAL_USER_ID: &str = "x-original-user-id";

/// Why a message was parked; the label is a metric label and the header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParkReason {
    /// The body is not the JSON object of the contract.
    InvalidBody,
    /// The body is larger than [`MAX_BODY_BYTES`].
    BodyTooLarge,
    /// `content_type` is present and is not JSON.
    WrongContentType,
    /// The routing key (or body kind) is not a kind we know.
    UnknownKind,
    /// The routing key and the body's `kind` disagree.
    KindMismatch,
    /// No `x-delay` header.
    MissingDelay,
    /// `x-delay` is not an integer in range.
    InvalidDelay,
    /// No order has this id.
    UnknownOrder,
    /// The database refused this timeout's transition every time, alone, while
    /// it answered everything else (a trigger, a constraint, a broken row).
    DatabaseRefused,
}

impl ParkReason {
    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidBody => "invalid_body",
            Self::BodyTooLarge => "body_too_large",
            Self::WrongContentType => "wrong_content_type",
            Self::UnknownKind => "unknown_kind",
            Self::KindMismatch => "kind_mismatch",
            Self::MissingDelay => "missing_delay",
            Self::InvalidDelay => "invalid_delay",
            Self::UnknownOrder => "unknown_order",
            Self::DatabaseRefused => "database_refused",
        }
    }
}

/// A decision to park, with the reason code and an explanation for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    /// The reason code.
    pub reason: ParkReason,
    /// What exactly was wrong.
    pub detail: String,
}

impl Park {
    /// A park decision.
    pub fn new(reason: ParkReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// A decoded, validated timeout message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutMessage {
    /// The order to look at, as sent: what it may hold is for the orders the
    /// service acts on to say (`orders::Orders::accept`).
    pub order_id: OrderKey,
    /// Which deadline passed.
    pub kind: TimeoutKind,
    /// The publisher's idea of the deadline; informative only (the database decides).
    pub due_at: Option<Millis>,
}

#[derive(Deserialize)]
struct Body {
    order_id: serde_json::Value,
    kind: Option<String>,
    due_at: Option<String>,
}

/// Decodes and validates a body against the routing key it came with.
pub fn decode(
    routing_key: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<TimeoutMessage, Park> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Park::new(
            ParkReason::BodyTooLarge,
            format!(
                "body is {} bytes, the limit is {MAX_BODY_BYTES}",
                body.len()
            ),
        ));
    }
    if let Some(ct) = content_type {
        let essence = ct.split(';').next().unwrap_or_default().trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(Park::new(
                ParkReason::WrongContentType,
                format!(
                    "content_type is '{}', expected application/json",
                    truncate(ct, 64)
                ),
            ));
        }
    }
    let kind: TimeoutKind = routing_key
        .parse()
        .map_err(|e| Park::new(ParkReason::UnknownKind, e))?;
    let parsed: Body = serde_json::from_slice(body).map_err(|e| {
        Park::new(
            ParkReason::InvalidBody,
            format!("body is not the contract's JSON object: {e}"),
        )
    })?;
    let order_id = match parsed.order_id {
        serde_json::Value::String(s) => {
            OrderKey::parse(&s).map_err(|e| Park::new(ParkReason::InvalidBody, e))?
        }
        other => {
            return Err(Park::new(
                ParkReason::InvalidBody,
                format!(
                    "order_id must be a string, got {}",
                    truncate(&other.to_string(), 64)
                ),
            ));
        }
    };
    if let Some(body_kind) = parsed.kind {
        let body_kind: TimeoutKind = body_kind
            .parse()
            .map_err(|e| Park::new(ParkReason::UnknownKind, e))?;
        if body_kind != kind {
            return Err(Park::new(
                ParkReason::KindMismatch,
                format!("routing key says '{kind}' but the body says '{body_kind}'"),
            ));
        }
    }
    let due_at = match parsed.due_at {
        Some(s) => Some(
            Millis::parse_rfc3339(&s)
                .map_err(|e| Park::new(ParkReason::InvalidBody, format!("due_at: {e}")))?,
        ),
        None => None,
    };
    Ok(TimeoutMessage {
        order_id,
        kind,
        due_at,
    })
}

/// Encodes a body per the contract.
pub fn encode(message: &TimeoutMessage) -> Vec<u8> {
    let mut body = serde_json::json!({
        "order_id": message.order_id.as_str(),
        "kind": message.kind.as_str(),
    });
    if let Some(due) = message.due_at {
        body["due_at"] = serde_json::Value::String(due.to_rfc3339());
    }
    body.to_string().into_bytes()
}

/// Reads an integer header of any AMQP integer width.
pub fn header_int(headers: Option<&FieldTable>, name: &str) -> Option<Result<i64, String>> {
    let value = headers?.inner().get(name)?;
    Some(match value {
        AMQPValue::ShortShortInt(v) => Ok(i64::from(*v)),
        AMQPValue::ShortShortUInt(v) => Ok(i64::from(*v)),
        AMQPValue::ShortInt(v) => Ok(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Ok(i64::from(*v)),
        AMQPValue::LongInt(v) => Ok(i64::from(*v)),
        AMQPValue::LongUInt(v) => Ok(i64::from(*v)),
        AMQPValue::LongLongInt(v) => Ok(*v),
        AMQPValue::Timestamp(v) => {
            i64::try_from(*v).map_err(|_| format!("{name} is {v}, beyond a signed 64-bit integer"))
        }
        other => Err(format!(
            "{name} must be an integer, got {}",
            describe_value(other)
        )),
    })
}

fn describe_value(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => format!(
            "the string '{}'",
            truncate(&String::from_utf8_lossy(s.as_bytes()), 32)
        ),
        AMQPValue::ShortString(s) => format!("the string '{}'", truncate(s.as_str(), 32)),
        AMQPValue::Float(f) => format!("the float {f}"),
        AMQPValue::Double(f) => format!("the float {f}"),
        AMQPValue::Boolean(b) => format!("the boolean {b}"),
        AMQPValue::DecimalValue(d) => {
            // value × 10^-scale, written out with its decimal point.
            let scale = usize::from(d.scale);
            let digits = format!("{:0>width$}", d.value, width = scale + 1);
            let (whole, fraction) = digits.split_at(digits.len() - scale);
            if fraction.is_empty() {
                format!("the decimal {whole}")
            } else {
                format!("the decimal {whole}.{fraction}")
            }
        }
        AMQPValue::Void => "no value (void)".to_string(),
        other => format!("a value of type {:?}", other.get_type()),
    }
}

/// Validates `x-delay` on a message entering the router, before any delay: an
/// integer in 1..=2^32-1 milliseconds. Anything else would be delivered at once
/// by the plugin, so in both modes it is parked instead of delayed. After the
/// delay nothing reads the header: the plugin negates it for some publishers
/// and not for others (upstream issue #64), and the database deadline decides.
pub fn publish_delay(headers: Option<&FieldTable>) -> Result<u64, Park> {
    match header_int(headers, X_DELAY) {
        None => Err(Park::new(
            ParkReason::MissingDelay,
            "no x-delay header (integer milliseconds)",
        )),
        Some(Err(e)) => Err(Park::new(ParkReason::InvalidDelay, e)),
        Some(Ok(d)) if d <= 0 => Err(Park::new(
            ParkReason::InvalidDelay,
            format!("x-delay is {d}, it must be above 0"),
        )),
        Some(Ok(d)) if d as u64 > MAX_DELAY_MS => Err(Park::new(
            ParkReason::InvalidDelay,
            format!("x-delay is {d}, the most is {MAX_DELAY_MS} (about 49.7 days)"),
        )),
        Some(Ok(d)) => Ok(d as u64),
    }
}

/// Properties of a timeout message as the contract wants them.
pub fn properties(
    message_id: &str,
    now: Millis,
    delay_ms: u64,
    extra: &[(&str, AMQPValue)],
) -> BasicProperties {
    let mut headers = BTreeMap::new();
    // The plugin reads signed integers; i64 carries the full 0..2^32-1 range.
    headers.insert(
        ShortString::from(X_DELAY),
        AMQPValue::LongLongInt(delay_ms as i64),
    );
    for (k, v) in extra {
        headers.insert(ShortString::from(*k), v.clone());
    }
    // Persistent: a timer must survive a broker restart.
    persistent_json(message_id, now).with_headers(FieldTable::from(headers))
}

/// JSON, persistent, with this message id and a timestamp in whole seconds:
/// what every message the service makes carries.
fn persistent_json(message_id: &str, at: Millis) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_message_id(message_id.into())
        .with_timestamp(u64::try_from(at.0 / 1000).unwrap_or(0))
}

/// Header of a domain event message: the event (as in the body).
pub const EVENT_HEADER: &str = "event";
/// Header of a domain event message: the order id (as in the body).
pub const ORDER_ID_HEADER: &str = "order_id";

/// Properties of a domain event message (wire contract v1 for events):
/// JSON, persistent (a consumer's durable queue keeps it through a broker
/// restart), the row's stable message id (the same on every re-publish, for
/// de-duplication), the time of the transition, and the event and order id
/// again as headers, for consumers that filter on headers (an
/// exchange-to-exchange binding into a headers exchange of their own).
pub fn event_properties(
    message_id: &str,
    at: Millis,
    event: &str,
    order_id: &str,
) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (k, v) in [(EVENT_HEADER, event), (ORDER_ID_HEADER, order_id)] {
        headers.insert(
            k.into(),
            AMQPValue::LongString(LongString::from(v.as_bytes().to_vec())),
        );
    }
    persistent_json(message_id, at)
        .with_app_id("order-timeout".into())
        .with_headers(headers)
}

/// A publisher's properties as the service publishes them again (into the
/// delay stage, or parked): persistent whatever the publisher said (a timer
/// and a parked message must survive a broker restart), without `expiration`
/// (a per-message TTL would let the timer expire, early from a TTL level or
/// for good from a work queue, which has no dead-letter exchange), and without
/// `user_id` (the broker refuses a publish whose `user_id` is not the
/// publishing connection's user, closing the channel: one such message would
/// be redelivered and refused for ever) or the deprecated `cluster_id`.
/// Everything else travels on; the headers are passed in.
fn forwardable(
    original: &BasicProperties,
    headers: BTreeMap<ShortString, AMQPValue>,
) -> BasicProperties {
    let mut out = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(FieldTable::from(headers));
    if let Some(v) = original.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        out = out.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        out = out.with_app_id(v.clone());
    }
    out
}

/// The original's headers, as a map to add to.
fn headers_of(original: &BasicProperties) -> BTreeMap<ShortString, AMQPValue> {
    original
        .headers()
        .clone()
        .map(|h| h.inner().clone())
        .unwrap_or_default()
}

/// A validated message's properties as the router sends it into the delay
/// stage (`forwardable`), with `x-delay` set to `delay_ms` as a 64-bit
/// signed integer (the plugin's `long`; it reads every signed and unsigned
/// integer width, but no other type, and delivers any other at once).
///
/// The headers RabbitMQ writes when it dead-letters (`x-death`,
/// `x-first-death-*`, `x-last-death-*`) are dropped: the TTL levels
/// dead-letter every timer, and the broker reads those headers back then, so a
/// publisher's malformed copy would reach the level queue's own process. So is
/// a publisher's `x-opt-delivery-time` and `x-opt-order-timeout-*`: in
/// native mode the service stamps its own, from the validated delay.
pub fn with_delay(original: &BasicProperties, delay_ms: u64) -> BasicProperties {
    let mut headers = headers_of(original);
    headers.retain(|name, _| {
        let name = name.as_str();
        !(name == "x-death"
            || name == "x-opt-delivery-time"
            || name.starts_with("x-first-death-")
            || name.starts_with("x-last-death-")
            || stamped_by_service(name))
    });
    headers.insert(
        X_DELAY.into(),
        AMQPValue::LongLongInt(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
    );
    forwardable(original, headers)
}

/// Whether the service itself writes this header (parking's `x-parked-*`
/// and `x-original-*`, its own counts `x-order-timeout-*`, the native stage's
/// `x-opt-order-timeout-*`): a publisher's copy of one is dropped where the
/// message enters, so that what operators read as the service's was
/// written by it.
pub fn stamped_by_service(name: &str) -> bool {
    [
        "x-parked-",
        "x-original-",
        "x-order-timeout-",
        "x-opt-order-timeout-",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// The properties of a parked copy: what the original had (`forwardable`:
/// persistent, no `expiration`, no `user_id`; those two are kept as headers,
/// as evidence), plus why.
pub fn parked_properties(
    original: &BasicProperties,
    park: &Park,
    by: &str,
    exchange: &str,
    routing_key: &str,
    now: Millis,
) -> BasicProperties {
    let mut headers = headers_of(original);
    // Parking's own headers are written afresh: none the message came with
    // (a publisher's, at the router) stays beside them.
    headers.retain(|name, _| {
        let name = name.as_str();
        !(name.starts_with("x-parked-") || name.starts_with("x-original-"))
    });
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    headers.insert(X_PARKED_REASON.into(), text(park.reason.as_str()));
    headers.insert(X_PARKED_DETAIL.into(), text(&truncate(&park.detail, 1000)));
    headers.insert(X_PARKED_AT.into(), text(&now.to_rfc3339()));
    headers.insert(X_PARKED_BY.into(), text(by));
    headers.insert(X_ORIGINAL_EXCHANGE.into(), text(exchange));
    headers.insert(
        X_ORIGINAL_ROUTING_KEY.into(),
        text(&truncate(routing_key, 200)),
    );
    if let Some(v) = original.expiration() {
        headers.insert(X_ORIGINAL_EXPIRATION.into(), text(v.as_str()));
    }
    if let Some(v) = original.user_id() {
        headers.insert(X_ORIGINAL_USER_ID.into(), text(v.as_str()));
    }
    forwardable(original, headers)
}

/// The body a parked copy carries: the whole body up to [`MAX_BODY_BYTES`],
/// else its first [`PARKED_KEEP_BYTES`] and the original size, which goes in
/// [`X_ORIGINAL_SIZE`].
pub fn parked_body(body: &[u8]) -> (&[u8], Option<usize>) {
    if body.len() > MAX_BODY_BYTES {
        (&body[..PARKED_KEEP_BYTES], Some(body.len()))
    } else {
        (body, None)
    }
}

/// [`parked_properties`] of a copy whose body was cut: the original size
/// added as a 64-bit integer header.
pub fn with_original_size(properties: BasicProperties, size: usize) -> BasicProperties {
    let mut headers = headers_of(&properties);
    headers.insert(
        X_ORIGINAL_SIZE.into(),
        AMQPValue::LongLongInt(i64::try_from(size).unwrap_or(i64::MAX)),
    );
    properties.with_headers(FieldTable::from(headers))
}

/// Reads a text header (long or short string).
pub fn header_text(headers: Option<&FieldTable>, name: &str) -> Option<String> {
    match headers?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

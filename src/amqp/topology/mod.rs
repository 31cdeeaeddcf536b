//! Exchange and queue names, the TTL-level layout, and its declaration.
//!
//! ```text
//! publisher ─► <prefix> (fanout, both modes) ─► <prefix>.ingest ─► router (validates)
//! router, relay, re-delays ─► the delay stage of the mode in effect:
//!   ttl:    <prefix>.out.23 ─► level of the highest set bit ─► … ─► <prefix>.due
//!   plugin: <prefix>.delay (x-delayed-message, direct by kind) ─► <prefix>.due
//!   native: <prefix>.wait (fanout) ─► <prefix>.wait (quorum queue, held until
//!           x-opt-delivery-time by the deferrer) ─► dead-lettered ─► <prefix>.due
//! <prefix>.due (topic, by kind) ─► <prefix>.work.<kind> ─► consumer
//! anything that breaks the contract ─► <prefix>.parked (with x-parked-reason)
//! relay, after each transition's commit ─► <prefix>.events (topic, order.<event>) ─► consumers' own queues
//! ```
//!
//! The three stages have different names and all end in `due`, so they live
//! side by side in one vhost: switching modes changes where new timers go,
//! while the timers already waiting in another stage still drain into `due`
//! (the native stage's through its deferrer, which runs wherever its queue
//! exists). Nothing is deleted on a switch. Validation happens before any
//! stage, so the plugin never sees an `x-delay` it would deliver at once.
//!
//! Native mode (RabbitMQ 4.3 and later): every timer carries the header
//! `x-opt-delivery-time`, its due instant in ms since the epoch, and waits in
//! one quorum queue. The deferrer ([`crate::amqp::deferral`]) takes each one
//! over AMQP 1.0 and settles it `modified` with that annotation, which makes
//! the queue hold it, in its replicated state, until then; back in time, it is
//! rejected, and the queue dead-letters it into `due` (at-least-once, so it
//! is never dropped on the way), routing key and headers unchanged.
//!
//! TTL mode: a delay of D whole seconds is written as [`DIGITS`] octal digits,
//! most significant first, then the kind: `0.0.0.0.0.0.1.5.payment` is 13 s.
//! Level L (L < [`LEVELS`]) is a queue whose messages all live exactly 2^L s (a
//! queue TTL, so the queue is FIFO by expiry and nothing waits behind a longer
//! message), then dead-letter to exchange `<prefix>.out.L`, whose topic bindings
//! send the message straight to the level of the next set bit below L, or to the
//! due exchange when none is left. The router enters at `<prefix>.out.23`, which
//! lands the message in the level of its highest set bit. The sub-second
//! remainder is held by the consumer.
//!
//! Why octal words and no `#`: the broker routes a dead-lettered message inside
//! the level's queue process, and its topic matching costs about 7 µs per word
//! of the key and much more for a `#`. Measured on RabbitMQ 3.10 (one level
//! queue, 20,000 expiring persistent messages): a 24-word key of bits drains at
//! about 5,000/s, a 9-word key at about 11,000/s, and bindings with `#` are
//! slower still. So the key has 9 words and every binding is `*` or a digit.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind};

pub use crate::broker::{Mode, Names};
use crate::domain::{Millis, TimeoutKind};
pub use crate::settings::QueueType;

mod declare;
#[cfg(test)]
mod tests;
mod ttl;

pub use declare::{
    declare, declare_exchange, declare_queue, delete_all, is_precondition_failed, probe_plugin,
};
use ttl::level_args;
pub use ttl::{level_bindings, ttl_routing_key};

/// Number of TTL levels: level 22 holds 2^22 s, and 2^23 - 1 s (97 days) is more
/// than the 49.7 days of the largest `x-delay`.
pub const LEVELS: u32 = 23;

/// The first TTL level in lazy mode (classic queues): 2^8 s, about 4 minutes.
/// Levels from here up hold the long backlog (payment windows of minutes,
/// fulfillment deadlines of days: a million pending timers sit there), and lazy
/// mode keeps their messages on disk instead of in the broker's memory. The short
/// levels, which carry a due burst's last stays, keep the default mode. RabbitMQ
/// 3.10 and 3.11 honour the mode; 3.12 and later ignore it, since every classic
/// queue there pages to disk like a lazy one.
pub const LAZY_FROM: u32 = 8;

/// Most bytes of message bodies the parked queue keeps (1 GiB); past it the
/// oldest are dropped. A policy with a lower `max-length-bytes` lowers it (the
/// broker takes the smaller of the two).
pub const PARKED_MAX_BYTES: i64 = 1 << 30;

/// Bits per word of a TTL routing key.
const DIGIT_BITS: u32 = 3;

/// Octal digits in a TTL routing key (8 × 3 bits cover [`LEVELS`]).
pub const DIGITS: u32 = LEVELS.div_ceil(DIGIT_BITS);

/// Where a timer that passed validation goes to wait: the exchange and routing
/// key of the delay stage of `mode`. The one place that decides it, for the
/// router, the outbox relay and the consumer's re-delays alike. The message
/// carries its `x-delay` header either way (the plugin reads it; the levels
/// need only the key).
pub fn delay_route(
    names: &Names,
    mode: Mode,
    kind: TimeoutKind,
    delay_ms: u64,
) -> (String, String) {
    match mode {
        // Whole seconds in the levels (rounded down, so never late); the
        // consumer holds the sub-second rest against the database deadline.
        Mode::Ttl => (names.out(LEVELS), ttl_routing_key(delay_ms / 1000, kind)),
        Mode::Plugin => (names.delay(), kind.as_str().to_string()),
        // The routing key is kept when the queue dead-letters into `due`.
        Mode::Native => (names.wait(), kind.as_str().to_string()),
    }
}

/// The header of a timer in the native stage: its due instant in ms since
/// the epoch. The broker turns `x-` headers into AMQP 1.0 message
/// annotations, which is where the deferrer reads it and the queue's own
/// name for the instant it holds a message until.
pub const X_DELIVERY_TIME: &str = "x-opt-delivery-time";

/// The properties of a timer going into the delay stage of `mode`, `delay_ms`
/// from now: in native mode, stamped with [`X_DELIVERY_TIME`]. The instant is
/// this host's clock plus the delay (the delay itself was reckoned from the
/// database's clock); a timer the broker returns before the database says it
/// is due is held or re-delayed by the consumer, never applied.
pub fn into_stage(mode: Mode, properties: BasicProperties, delay_ms: u64) -> BasicProperties {
    if mode != Mode::Native {
        return properties;
    }
    let mut headers = properties
        .headers()
        .clone()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    let at = Millis::now()
        .0
        .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
    headers.insert(X_DELIVERY_TIME.into(), AMQPValue::LongLongInt(at));
    properties.with_headers(FieldTable::from(headers))
}

/// Where a binding leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A queue.
    Queue(String),
    /// An exchange (exchange-to-exchange binding).
    Exchange(String),
}

/// One binding of the topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The exchange messages come from.
    pub source: String,
    /// Where they go.
    pub destination: Destination,
    /// The binding key (a topic pattern where the source is a topic exchange).
    pub key: String,
}

/// An exchange type, as the broker spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    /// Every bound queue gets every message.
    Fanout,
    /// Routing by pattern on dotted routing keys.
    Topic,
    /// The delayed-message plugin's exchange (it holds a message for `x-delay` ms).
    DelayedMessage,
}

impl ExchangeType {
    /// The type's name in AMQP and in the management API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fanout => "fanout",
            Self::Topic => "topic",
            Self::DelayedMessage => "x-delayed-message",
        }
    }

    fn to_lapin(self) -> ExchangeKind {
        match self {
            Self::Fanout => ExchangeKind::Fanout,
            Self::Topic => ExchangeKind::Topic,
            Self::DelayedMessage => ExchangeKind::Custom(self.as_str().into()),
        }
    }
}

/// An argument value of an exchange or queue, with its AMQP width kept: the
/// broker compares arguments on redeclaration, so they are sent as they always were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// A 32-bit signed integer (AMQP `long-int`).
    Int(i32),
    /// A 64-bit signed integer (AMQP `long-long-int`).
    Long(i64),
    /// A string (AMQP `long-string`).
    Text(String),
}

impl Arg {
    fn to_amqp(&self) -> AMQPValue {
        match self {
            Self::Int(i) => AMQPValue::LongInt(*i),
            Self::Long(i) => AMQPValue::LongLongInt(*i),
            Self::Text(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        }
    }
}

/// Arguments by name, in declaration order.
pub type Args = Vec<(&'static str, Arg)>;

/// One exchange of the topology. Every one is durable (the topology must
/// outlive a broker restart), never auto-deleted, never internal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeSpec {
    /// Its name.
    pub name: String,
    /// Its type.
    pub kind: ExchangeType,
    /// Its arguments.
    pub arguments: Args,
    /// The arguments an earlier version declared it with, still accepted on a
    /// vhost that version set up (see [`declare`]).
    pub earlier: Option<Args>,
}

/// One queue of the topology. Every one is durable, not exclusive, never auto-deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// Its name.
    pub name: String,
    /// Its arguments.
    pub arguments: Args,
    /// The arguments an earlier version declared it with, still accepted on a
    /// vhost that version set up (see [`declare`]).
    pub earlier: Option<Args>,
}

fn args(pairs: &[(&str, Arg)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in pairs {
        table.insert((*k).into(), v.to_amqp());
    }
    table
}

/// Arguments every queue of ours gets. Classic: version 2, which keeps messages
/// on disk with a small index and moves a due burst out faster than v1.
/// Quorum: replicated on every member of the cluster.
fn queue_args(queue_type: QueueType, extra: Args) -> Args {
    let mut pairs = match queue_type {
        QueueType::Classic => vec![("x-queue-version", Arg::Int(2))],
        QueueType::Quorum => vec![("x-queue-type", Arg::Text("quorum".into()))],
    };
    pairs.extend(extra);
    pairs
}

/// What a message that no binding routes goes to: the parked exchange. Added
/// in this version; a vhost an earlier version set up has exchanges without it
/// (they declare as `earlier`).
fn parking_alternate(names: &Names) -> (Args, Option<Args>) {
    (
        vec![("alternate-exchange", Arg::Text(names.parked()))],
        Some(Vec::new()),
    )
}

/// Where a work or ingest queue dead-letters what it cannot deliver (a
/// message expired by a policy's TTL, dropped by a length limit, rejected by
/// another client, or over a quorum queue's delivery limit): the parked
/// exchange, not the void.
fn parking_dead_letter(names: &Names, queue_type: QueueType) -> (Args, Option<Args>) {
    let earlier = queue_args(queue_type, Vec::new());
    let arguments = queue_args(
        queue_type,
        vec![("x-dead-letter-exchange", Arg::Text(names.parked()))],
    );
    (arguments, Some(earlier))
}

/// The exchanges of `mode`, in the order they are declared: the ones every
/// mode shares, then the delay stage of `mode`.
pub fn exchanges(names: &Names, mode: Mode) -> Vec<ExchangeSpec> {
    let (alternate, earlier) = parking_alternate(names);
    let mut out = vec![
        // The entry exchange, the same in both modes. Fanout: every message
        // reaches the router whatever its routing key, so an unknown kind is
        // parked with a reason instead of being dropped as unroutable; and if
        // the ingest queue is gone, the alternate exchange parks it.
        ExchangeSpec {
            name: names.entry().to_string(),
            kind: ExchangeType::Fanout,
            arguments: alternate.clone(),
            earlier: earlier.clone(),
        },
        // Parked messages: kept until an operator looks at them, and where the
        // others' alternate exchange leads.
        ExchangeSpec {
            name: names.parked(),
            kind: ExchangeType::Fanout,
            arguments: Vec::new(),
            earlier: None,
        },
        // Due side: topic, because TTL routing keys carry the delay bits before
        // the kind. A due timer whose work queue binding is gone is parked.
        ExchangeSpec {
            name: names.due(),
            kind: ExchangeType::Topic,
            arguments: alternate,
            earlier,
        },
        // Domain events, routing key `order.<event>`: topic, so a consumer
        // binds `order.#`, `order.cancelled` or `order.*` to its own queue.
        // Nothing of the service is bound to it, and no alternate exchange:
        // an event nobody listens to is dropped, as on any pub/sub exchange,
        // instead of filling the parked queue.
        ExchangeSpec {
            name: names.events(),
            kind: ExchangeType::Topic,
            arguments: Vec::new(),
            earlier: None,
        },
    ];
    out.extend(stage_exchanges(names, mode));
    out
}

/// The exchanges of one delay stage only.
pub fn stage_exchanges(names: &Names, mode: Mode) -> Vec<ExchangeSpec> {
    match mode {
        // A timer that finds no level or binding on its way down is parked.
        Mode::Ttl => (0..=LEVELS)
            .map(|l| {
                let (arguments, earlier) = parking_alternate(names);
                ExchangeSpec {
                    name: names.out(l),
                    kind: ExchangeType::Topic,
                    arguments,
                    earlier,
                }
            })
            .collect(),
        // The plugin holds each message for its `x-delay`, then routes it as a
        // direct exchange would: by kind, to the due exchange. No alternate
        // exchange: the plugin hands every message it delays to it at once.
        Mode::Plugin => vec![ExchangeSpec {
            name: names.delay(),
            kind: ExchangeType::DelayedMessage,
            arguments: vec![("x-delayed-type", Arg::Text("direct".into()))],
            earlier: None,
        }],
        // Fanout into the one quorum queue, which keeps each routing key.
        Mode::Native => {
            let (arguments, _) = parking_alternate(names);
            vec![ExchangeSpec {
                name: names.wait(),
                kind: ExchangeType::Fanout,
                arguments,
                earlier: None,
            }]
        }
    }
}

/// The queues of `mode`, in the order they are declared.
pub fn queues(names: &Names, mode: Mode, queue_type: QueueType) -> Vec<QueueSpec> {
    let dead_letter = || parking_dead_letter(names, queue_type);
    let (arguments, earlier) = dead_letter();
    let mut out = vec![
        QueueSpec {
            name: names.ingest(),
            arguments,
            earlier,
        },
        // Parked messages never expire, and dead-letter nowhere. Their total
        // size is bounded: past it the oldest go first. What a parked message
        // was for is never only there (every deadline is in the database,
        // where the sweeper keeps it), and a flood of bad messages must not
        // fill the broker's disk.
        QueueSpec {
            name: names.parked(),
            arguments: queue_args(
                queue_type,
                vec![("x-max-length-bytes", Arg::Long(PARKED_MAX_BYTES))],
            ),
            earlier: Some(queue_args(queue_type, Vec::new())),
        },
    ];
    out.extend(TimeoutKind::ALL.map(|kind| {
        let (arguments, earlier) = dead_letter();
        QueueSpec {
            name: names.work(kind),
            arguments,
            earlier,
        }
    }));
    match mode {
        Mode::Ttl => out.extend((0..LEVELS).map(|l| QueueSpec {
            name: names.level(l),
            arguments: queue_args(queue_type, level_args(names, l, queue_type)),
            earlier: None,
        })),
        Mode::Native => out.push(wait_queue(names)),
        Mode::Plugin => {}
    }
    out
}

/// The native stage's queue, a quorum queue whatever `amqp.queue_type` says
/// (holding a message until a time is theirs alone):
/// - no delivery limit: a timer deferred and returned any number of times
///   (restarts of the service, of a node) is never dropped for it;
/// - what is rejected, the deferrer's word for "due", is dead-lettered into
///   `due` with its routing key, at least once: the queue keeps the message
///   until `due` has confirmed it (which needs `reject-publish` overflow).
pub fn wait_queue(names: &Names) -> QueueSpec {
    QueueSpec {
        name: names.wait(),
        arguments: vec![
            ("x-queue-type", Arg::Text("quorum".into())),
            ("x-delivery-limit", Arg::Int(-1)),
            ("x-dead-letter-exchange", Arg::Text(names.due())),
            ("x-dead-letter-strategy", Arg::Text("at-least-once".into())),
            ("x-overflow", Arg::Text("reject-publish".into())),
        ],
        earlier: None,
    }
}

/// The bindings every mode has: entry to ingest, parked to parked, and the due
/// exchange to each work queue by kind: `<kind>` for what leaves the plugin
/// stage, `*.*.*.*.*.*.*.*.<kind>` for what leaves the TTL levels. Both keys are
/// bound in every mode, so either stage drains into the work queues whichever
/// mode the service runs in now.
pub fn core_bindings(names: &Names) -> Vec<Binding> {
    let mut out = vec![
        Binding {
            source: names.entry().to_string(),
            destination: Destination::Queue(names.ingest()),
            key: String::new(),
        },
        Binding {
            source: names.parked(),
            destination: Destination::Queue(names.parked()),
            key: String::new(),
        },
    ];
    for kind in TimeoutKind::ALL {
        for key in [
            kind.as_str().to_string(),
            format!("{}{}", "*.".repeat(DIGITS as usize), kind.as_str()),
        ] {
            out.push(Binding {
                source: names.due(),
                destination: Destination::Queue(names.work(kind)),
                key,
            });
        }
    }
    out
}

/// The bindings of the plugin stage: `<prefix>.delay` to the due exchange,
/// one per kind (exchange-to-exchange, so `due` routes it on like any other).
pub fn plugin_bindings(names: &Names) -> Vec<Binding> {
    TimeoutKind::ALL
        .map(|kind| Binding {
            source: names.delay(),
            destination: Destination::Exchange(names.due()),
            key: kind.as_str().to_string(),
        })
        .to_vec()
}

/// The binding of the native stage: `<prefix>.wait` (fanout) to its queue.
pub fn native_bindings(names: &Names) -> Vec<Binding> {
    vec![Binding {
        source: names.wait(),
        destination: Destination::Queue(names.wait()),
        key: String::new(),
    }]
}

/// The bindings of one delay stage only.
pub fn stage_bindings(names: &Names, mode: Mode) -> Vec<Binding> {
    match mode {
        Mode::Ttl => level_bindings(names),
        Mode::Plugin => plugin_bindings(names),
        Mode::Native => native_bindings(names),
    }
}

/// Every binding of `mode`: the core ones, then those of its delay stage.
pub fn bindings(names: &Names, mode: Mode) -> Vec<Binding> {
    let mut out = core_bindings(names);
    out.extend(stage_bindings(names, mode));
    out
}

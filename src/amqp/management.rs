//! The broker's management HTTP API, for the one thing AMQP cannot tell: how
//! many timers wait in the plugin stage. The delayed-message plugin keeps them
//! in a node-local table, not in a queue, so no queue depth counts them; the
//! plugin reports the number per exchange as `messages_delayed`, which the
//! management API shows (RabbitMQ 3.10 with plugin 3.10.2 and 4.0 with 4.0.7
//! alike).
//!
//! Used by `doctor`, and by [`monitor`], which keeps the
//! `order_timeout_waiting_timers{stage}` gauge: the timers waiting in each
//! delay stage that exists in the vhost (`ttl`: the level queues, `plugin`:
//! the delayed-message exchange, `native`: the wait queue, whose held timers
//! the broker reports as `messages_delayed`). Off when
//! `amqp.management_url = off`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::pause;
use super::topology::{LEVELS, Names};
use crate::context::Context;
use crate::http_client::{JsonClient, StatusCode};
use crate::settings::ManagementApi;

/// How often [`monitor`] reads the stages: the management API's own
/// statistics refresh every 5 s by default.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Why the number could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API did not answer, or answered with an error status.
    #[error("the management API at {base} did not answer: {detail}")]
    Unreachable {
        /// The API's address (never with credentials).
        base: String,
        /// What went wrong.
        detail: String,
    },
    /// The exchange exists but the broker reports no `messages_delayed` for it.
    #[error("the broker reports no messages_delayed for exchange '{0}'")]
    NotReported(String),
    /// The queue cannot be read without changing it.
    #[error("{0}")]
    NotReadable(String),
}

/// Most bytes of a message's body [`Management::peek`] reads: enough for any
/// timeout of the wire contract, whose `order_id` comes early; a longer
/// body is cut, and its id looked for in what was read.
const PEEK_BYTES: u64 = 4096;

/// What [`Management::peek`] read of a queue.
#[derive(Debug, Clone, Default)]
pub struct Peeked {
    /// The messages read, head first.
    pub messages: Vec<Peek>,
    /// How many the queue held, by the broker's statistics (a few seconds old).
    pub in_queue: u64,
    /// Whether every message ready in the queue was read.
    pub complete: bool,
}

/// One message read from a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Peek {
    /// The routing key it was published to the queue with.
    pub routing_key: String,
    /// Its headers (the management API's JSON of the AMQP table).
    pub headers: Value,
    /// Its body as text, cut at [`PEEK_BYTES`]; `None` when it is not UTF-8.
    pub body: Option<String>,
}

impl Peek {
    /// A message of the management API's get answer.
    fn of(m: &Value) -> Self {
        let body = (m["payload_encoding"].as_str() == Some("string"))
            .then(|| m["payload"].as_str().map(str::to_string))
            .flatten();
        Self {
            routing_key: m["routing_key"].as_str().unwrap_or_default().to_string(),
            headers: m["properties"]["headers"].clone(),
            body,
        }
    }

    /// A text header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.as_str()
    }

    /// The top-level `order_id` of its body, when the body is the contract's
    /// JSON, or its start (cut, or followed by garbage) is: a string, or a
    /// number as written. One nested deeper (`{"x": {"order_id": 1}}`) is no
    /// order's.
    pub fn order_id(&self) -> Option<String> {
        let body = self.body.as_deref()?;
        let rest = &body[top_level_value(body, "order_id")?..];
        let value = serde_json::Deserializer::from_str(rest)
            .into_iter::<Value>()
            .next()?
            .ok()?;
        match value {
            Value::String(s) => Some(s),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// The reason the service's parking wrote and which part of it parked
    /// the message (`router` or `consumer`); `None` for a message the
    /// service did not park (the broker dead-lettered it, or routed it to
    /// the parked queue as unroutable). The router drops these headers from
    /// what publishers send, so they are the service's own.
    pub fn parked_by_service(&self) -> Option<(&str, &'static str)> {
        let reason = self.header(super::wire::X_PARKED_REASON)?;
        match self.header(super::wire::X_PARKED_BY)? {
            "router" => Some((reason, "router")),
            "consumer" => Some((reason, "consumer")),
            _ => None,
        }
    }

    /// The `kind` of its body, when it names one.
    pub fn body_kind(&self) -> Option<String> {
        let body: Value = serde_json::from_str(self.body.as_deref()?).ok()?;
        body["kind"].as_str().map(str::to_string)
    }
}

/// Where the value of `key` starts in `body`'s top-level object, read as
/// far as the body goes (a cut one too): strings and nesting are followed,
/// so that a key inside a nested object or a string is not taken.
fn top_level_value(body: &str, key: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.checked_sub(1)?,
            '"' => {
                let start = i + 1;
                let mut end = None;
                while let Some((j, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            end = Some(j);
                            break;
                        }
                        _ => {}
                    }
                }
                let end = end?;
                if depth == 1 && &body[start..end] == key {
                    let after = &body[end + 1..];
                    let trimmed = after.trim_start();
                    if let Some(value) = trimmed.strip_prefix(':') {
                        return Some(body.len() - value.len());
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// A client of one broker's management API, for one vhost.
#[derive(Debug, Clone)]
pub struct Management {
    /// Where and as whom.
    api: ManagementApi,
    /// Short timeouts: this is monitoring, never on a timer's path.
    http: JsonClient,
}

/// Percent-encodes one path segment (a vhost or exchange name).
fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl Management {
    /// A client for the configured API.
    pub fn new(api: ManagementApi) -> Self {
        let http = JsonClient::new(Duration::from_secs(5));
        Self { api, http }
    }

    /// The API's address, without credentials.
    pub fn base(&self) -> &str {
        &self.api.base
    }

    /// GET `/api/{path}` as JSON; `Ok(None)` on 404.
    async fn get(&self, path: &str) -> Result<Option<Value>, Error> {
        self.call(path, None).await
    }

    /// POST `body` to `/api/{path}`; the answer as JSON, `Ok(None)` on 404.
    async fn post(&self, path: &str, body: &Value) -> Result<Option<Value>, Error> {
        self.call(path, Some(body)).await
    }

    /// GET `/api/{path}`, or POST `body` there, with the API's credentials.
    async fn call(&self, path: &str, body: Option<&Value>) -> Result<Option<Value>, Error> {
        let unreachable = |detail: String| Error::Unreachable {
            base: self.api.base.clone(),
            detail,
        };
        let client = self
            .http
            .clone()
            .basic(&self.api.username, self.api.password.expose())
            .map_err(|e| unreachable(e.to_string()))?;
        let url = format!("{}/api/{path}", self.api.base);
        let answer = match body {
            None => client.get(&url).await,
            Some(body) => client.post(&url, body).await,
        }
        .map_err(|e| unreachable(e.to_string()))?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !answer.status.is_success() {
            return Err(unreachable(format!("HTTP {}", answer.status)));
        }
        Ok(Some(answer.body))
    }

    /// Timers waiting in the delayed-message exchange `exchange` of the vhost:
    /// `Ok(None)` when no such exchange exists there.
    pub async fn delayed(&self, exchange: &str) -> Result<Option<u64>, Error> {
        let path = format!(
            "exchanges/{}/{}",
            segment(&self.api.vhost),
            segment(exchange)
        );
        match self.get(&path).await? {
            None => Ok(None),
            Some(body) => messages_delayed(&body)
                .map(Some)
                .ok_or_else(|| Error::NotReported(exchange.to_string())),
        }
    }

    /// Up to `limit` messages from the head of `queue` in the vhost, read
    /// without taking them: the management API's get with `ack_requeue_true`
    /// holds them on one channel and closing it puts each back in its place,
    /// in order (the broker marks them redelivered; nothing consumes the
    /// parked queue but people). Only a classic queue is read: a quorum
    /// queue counts every such return as a delivery, and past a delivery
    /// limit (RabbitMQ 4 sets 20 by default) drops the message, since the
    /// parked queue dead-letters nowhere. No such queue: nothing is parked.
    pub async fn peek(&self, queue: &str, limit: u64) -> Result<Peeked, Error> {
        let path = format!("queues/{}/{}", segment(&self.api.vhost), segment(queue));
        let Some(info) = self.get(&path).await? else {
            return Ok(Peeked::default());
        };
        if info["type"].as_str() == Some("quorum") {
            return Err(Error::NotReadable(format!(
                "'{queue}' is a quorum queue: reading a message there counts as a delivery, and past its delivery limit the broker drops it; read it in the management UI instead"
            )));
        }
        // Statistics a few seconds old (none yet for a queue just
        // declared): told, never trusted to skip the read.
        let in_queue = info["messages"].as_u64().unwrap_or(0);
        let body = serde_json::json!({
            "count": limit,
            "ackmode": "ack_requeue_true",
            "encoding": "auto",
            "truncate": PEEK_BYTES,
        });
        // Gone since it was looked at: nothing is parked.
        let Some(answer) = self.post(&format!("{path}/get"), &body).await? else {
            return Ok(Peeked::default());
        };
        let messages: Vec<Peek> = answer
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(Peek::of)
            .collect();
        Ok(Peeked {
            // Fewer than asked: every message ready was read (one a
            // consumer holds unacknowledged is not ready).
            complete: (messages.len() as u64) < limit,
            messages,
            in_queue,
        })
    }

    /// The connections to the vhost: `(client-provided name, node)` each.
    pub async fn connections(&self) -> Result<Vec<(String, String)>, Error> {
        let path = format!(
            "vhosts/{}/connections?columns=name,node,client_properties",
            segment(&self.api.vhost)
        );
        let body = self.get(&path).await?.unwrap_or_default();
        let mut out: Vec<(String, String)> = body
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let name = c["client_properties"]["connection_name"]
                    .as_str()
                    .or_else(|| c["name"].as_str())
                    .unwrap_or("?");
                (
                    name.to_string(),
                    c["node"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The broker's nodes, as the management API names them (`rabbit@host`):
    /// every node with a listener, else the node that answered. Empty for a
    /// user whose tags do not show them (`monitoring` does).
    pub async fn nodes(&self) -> Result<Vec<String>, Error> {
        let overview = self.get("overview").await?.unwrap_or_default();
        Ok(node_names(&overview))
    }

    /// Timers waiting in each delay stage of `names` that exists in the vhost.
    pub async fn stages(&self, names: &Names) -> Result<Stages, Error> {
        let path = format!(
            "queues/{}?columns=name,messages,messages_ready,messages_unacknowledged,messages_delayed",
            segment(&self.api.vhost)
        );
        let queues = self.get(&path).await?.unwrap_or_default();
        Ok(Stages {
            ttl: level_messages(&queues, names),
            plugin: self.delayed(&names.delay()).await?,
            native: held_messages(&queues, names),
        })
    }
}

/// The timers in each delay stage; `None` where the stage does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages {
    /// Messages in the TTL level queues.
    pub ttl: Option<u64>,
    /// Messages the plugin holds in `<prefix>.delay`.
    pub plugin: Option<u64>,
    /// Timers in the native stage's queue `<prefix>.wait`: held until their
    /// time (`messages_delayed`), or about to be (ready, or with the deferrer).
    pub native: Option<u64>,
}

/// The node names in a `/api/overview` answer: those with a listener (every
/// running node of a cluster), else the answering node alone.
fn node_names(overview: &Value) -> Vec<String> {
    let mut nodes: Vec<String> = overview["listeners"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l["node"].as_str().map(str::to_string))
        .collect();
    nodes.sort();
    nodes.dedup();
    if nodes.is_empty()
        && let Some(node) = overview["node"].as_str()
    {
        nodes.push(node.to_string());
    }
    nodes
}

/// The timers of the native stage's queue in a `/api/queues/{vhost}` answer,
/// or `None` when the vhost has no such queue. Those it has already
/// dead-lettered and is handing to `due` are not counted: they are due.
fn held_messages(queues: &Value, names: &Names) -> Option<u64> {
    let wait = names.wait();
    let queue = queues
        .as_array()?
        .iter()
        .find(|q| q["name"].as_str() == Some(wait.as_str()))?;
    let count = |field: &str| queue[field].as_u64().unwrap_or(0);
    Some(count("messages_delayed") + count("messages_ready") + count("messages_unacknowledged"))
}

/// The sum of the level queues' messages in a `/api/queues/{vhost}` answer,
/// or `None` when the vhost has no level queue of ours.
fn level_messages(queues: &Value, names: &Names) -> Option<u64> {
    let levels: Vec<String> = (0..LEVELS).map(|l| names.level(l)).collect();
    let found: Vec<u64> = queues
        .as_array()?
        .iter()
        .filter(|q| {
            q["name"]
                .as_str()
                .is_some_and(|n| levels.iter().any(|l| l == n))
        })
        // A queue just declared has no statistics yet: count it as empty.
        .map(|q| q["messages"].as_u64().unwrap_or(0))
        .collect();
    (!found.is_empty()).then(|| found.iter().sum())
}

/// Keeps the `waiting_timers` gauge until shutdown. A failure to read is
/// logged when it starts and when it ends, and the gauge of an unknown stage
/// is withdrawn rather than left at a stale value.
pub async fn monitor(ctx: Arc<Context>, management: Management, shutdown: CancellationToken) {
    loop {
        match management.stages(&ctx.names).await {
            Ok(stages) => ctx
                .telemetry
                .stages_read(stages.ttl, stages.plugin, stages.native),
            Err(e) => ctx
                .telemetry
                .stages_unreadable(management.base(), &e.to_string()),
        }
        if !pause(&shutdown, SAMPLE_EVERY).await {
            return;
        }
    }
}

/// The plugin's count in an exchange document of the management API.
fn messages_delayed(exchange: &Value) -> Option<u64> {
    exchange.get("messages_delayed")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peeked_message_says_its_order_even_cut() {
        let peek = |body: &str| Peek {
            routing_key: "payment".into(),
            headers: serde_json::json!({"x-parked-reason": "bad_delay"}),
            body: Some(body.into()),
        };
        let whole = peek(r#"{"order_id": "42", "kind": "payment"}"#);
        assert_eq!(whole.order_id().as_deref(), Some("42"));
        assert_eq!(whole.body_kind().as_deref(), Some("payment"));
        assert_eq!(whole.header("x-parked-reason"), Some("bad_delay"));
        // Cut after the id, or an id written as a number.
        assert_eq!(
            peek(r#"{"order_id":"SN-7","kind":"paym"#)
                .order_id()
                .as_deref(),
            Some("SN-7")
        );
        assert_eq!(
            peek(r#"{"order_id": 42}"#).order_id().as_deref(),
            Some("42")
        );
        assert_eq!(peek("not json").order_id(), None);
        // Only the top level names the order: not a nested object's key, nor
        // a string that reads like one.
        assert_eq!(
            peek(r#"{"meta": {"order_id": "666"}, "order_id": "7"}"#)
                .order_id()
                .as_deref(),
            Some("7")
        );
        assert_eq!(
            peek(r#"{"note": "\"order_id\": 666", "items": [{"order_id": 1}]}"#).order_id(),
            None
        );
        assert_eq!(peek(r#"[{"order_id": "9"}]"#).order_id(), None);
        let of = Peek::of(
            &serde_json::json!({"routing_key": "receipt", "payload": "AAE=",
            "payload_encoding": "base64", "properties": {"headers": {}}}),
        );
        assert_eq!((of.routing_key.as_str(), of.body), ("receipt", None));
    }

    #[test]
    fn reads_the_plugins_count() {
        let doc = serde_json::json!({"name": "p.delay", "type": "x-delayed-message", "messages_delayed": 3});
        assert_eq!(messages_delayed(&doc), Some(3));
        assert_eq!(messages_delayed(&serde_json::json!({"name": "p"})), None);
        assert_eq!(segment("/"), "%2F");
        let names = Names::new("p");
        let queues = serde_json::json!([
            {"name": "p.level.00", "messages": 2},
            {"name": "p.level.07", "messages": 5},
            {"name": "p.level.08"},
            {"name": "p.work.payment", "messages": 100},
            {"name": "other.level.00", "messages": 100},
        ]);
        assert_eq!(level_messages(&queues, &names), Some(7));
        assert_eq!(
            level_messages(&serde_json::json!([{"name": "p.ingest"}]), &names),
            None
        );
        assert_eq!(segment("order.timeouts.delay"), "order%2Etimeouts%2Edelay");
        let queues = serde_json::json!([
            {"name": "p.wait", "messages": 9, "messages_ready": 1, "messages_unacknowledged": 2, "messages_delayed": 5},
            {"name": "p.ingest", "messages": 100},
        ]);
        let overview = serde_json::json!({
            "node": "rabbit@a",
            "listeners": [
                {"node": "rabbit@b", "protocol": "amqp"},
                {"node": "rabbit@a", "protocol": "amqp"},
                {"node": "rabbit@a", "protocol": "http"},
            ],
        });
        assert_eq!(node_names(&overview), ["rabbit@a", "rabbit@b"]);
        assert_eq!(
            node_names(&serde_json::json!({"node": "rabbit@a"})),
            ["rabbit@a"]
        );
        assert!(node_names(&serde_json::json!({"rabbitmq_version": "3.10"})).is_empty());
        // The one dead-lettered on its way to `due` is not waiting.
        assert_eq!(held_messages(&queues, &names), Some(8));
        assert_eq!(
            held_messages(&serde_json::json!([{"name": "p.ingest"}]), &names),
            None
        );
    }
}

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
        let unreachable = |detail: String| Error::Unreachable {
            base: self.api.base.clone(),
            detail,
        };
        let answer = self
            .http
            .clone()
            .basic(&self.api.username, self.api.password.expose())
            .map_err(|e| unreachable(e.to_string()))?
            .get(&format!("{}/api/{path}", self.api.base))
            .await
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
        // The one dead-lettered on its way to `due` is not waiting.
        assert_eq!(held_messages(&queues, &names), Some(8));
        assert_eq!(
            held_messages(&serde_json::json!([{"name": "p.ingest"}]), &names),
            None
        );
    }
}

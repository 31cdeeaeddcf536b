//! The broker's vocabulary, below every layer that talks to it: which delay
//! stage is in use and the name of every exchange and queue, derived from the
//! configured prefix. [`crate::context`] holds both, and the AMQP layer above
//! it declares and uses what they name (`amqp::topology` draws the layout).

use crate::domain::TimeoutKind;

/// The delay mechanism actually in use (`auto` resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The delayed-message exchange plugin.
    Plugin,
    /// Binary TTL levels.
    Ttl,
    /// A quorum queue holding each timer until its delivery time
    /// (RabbitMQ 4.3 and later), deferred by the service.
    Native,
}

impl Mode {
    /// Spelling in logs, metrics and `doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plugin => "plugin",
            Self::Ttl => "ttl",
            Self::Native => "native",
        }
    }
}

/// Every exchange and queue name, derived from the configured prefix.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// Names under `prefix` (the entry exchange is the prefix itself).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }
    /// The exchange publishers use.
    pub fn entry(&self) -> &str {
        &self.prefix
    }
    /// The queue behind the entry exchange, read by the router.
    pub fn ingest(&self) -> String {
        format!("{}.ingest", self.prefix)
    }
    /// TTL level `l` (zero-padded so the management UI lists levels in order).
    pub fn level(&self, l: u32) -> String {
        format!("{}.level.{l:02}", self.prefix)
    }
    /// The exchange a message reaches after leaving level `l`; `out.23` is the entry.
    pub fn out(&self, l: u32) -> String {
        format!("{}.out.{l:02}", self.prefix)
    }
    /// The plugin stage: an `x-delayed-message` exchange routing by kind into `due`.
    pub fn delay(&self) -> String {
        format!("{}.delay", self.prefix)
    }
    /// The native stage: a fanout exchange and the quorum queue behind it, of
    /// the same name, where each timer is held until its delivery time, then
    /// dead-lettered into `due`.
    pub fn wait(&self) -> String {
        format!("{}.wait", self.prefix)
    }
    /// Where due messages go, routed by kind to the work queues.
    pub fn due(&self) -> String {
        format!("{}.due", self.prefix)
    }
    /// The work queue of one kind.
    pub fn work(&self, kind: TimeoutKind) -> String {
        format!("{}.work.{}", self.prefix, kind.as_str())
    }
    /// Exchange and queue of messages that broke the contract.
    pub fn parked(&self) -> String {
        format!("{}.parked", self.prefix)
    }
    /// Where the domain events go (a topic exchange, routing key
    /// `order.<event>`); consumers bind their own queues to it.
    pub fn events(&self) -> String {
        format!("{}.events", self.prefix)
    }
}

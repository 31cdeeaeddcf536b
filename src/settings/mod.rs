//! Typed, validated settings.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config FILE` or
//! `ORDER_TIMEOUT_CONFIG`), then `ORDER_TIMEOUT__SECTION__KEY` environment
//! variables. Every value is read as text and parsed here, so that a wrong value
//! stops start-up with a message naming its key, and an unknown key (a typo) is
//! refused instead of silently ignored.
//!
//! Each key is one entry of the table in `keys.rs` (name, default and why,
//! reader into its field, how `doctor` shows it, its one-line description);
//! the defaults layer, the known-key check, [`Settings::load`],
//! [`Settings::describe`] and the settings file (`file.rs`:
//! `config/order-timeout.toml`, `order-timeout config`) all walk it.
//! Checks across keys (`checks.rs`) run after their section's keys are read.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat, Value, ValueKind};

/// Environment variable prefix; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "ORDER_TIMEOUT";
/// Environment variable naming the TOML file when `--config` is not given.
pub const CONFIG_FILE_ENV: &str = "ORDER_TIMEOUT_CONFIG";
/// The largest delay the wire contract allows (the plugin's limit): 2^32-1 ms.
pub const MAX_DELAY: Duration = Duration::from_millis(crate::domain::MAX_DELAY_MS);

/// How timeouts are delayed in the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayMode {
    /// Probe the broker for the `x-delayed-message` exchange type at start-up.
    Auto,
    /// The delayed-message exchange plugin keeps the messages.
    Plugin,
    /// Binary TTL levels with dead-lettering; needs nothing but RabbitMQ itself.
    Ttl,
}

impl DelayMode {
    /// Every mode, in the order an error lists them.
    pub const ALL: [Self; 3] = [Self::Auto, Self::Plugin, Self::Ttl];

    /// The configuration spelling of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Plugin => "plugin",
            Self::Ttl => "ttl",
        }
    }
}

/// Which kind of queue holds the timers (`amqp.queue_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// Classic queues, version 2: single node, fastest.
    Classic,
    /// Quorum queues: replicated (Raft), so timers survive losing a node.
    Quorum,
}

impl QueueType {
    /// Every queue type, in the order an error lists them.
    pub const ALL: [Self; 2] = [Self::Classic, Self::Quorum];

    /// The configuration spelling of the queue type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines for a terminal.
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
}

impl LogFormat {
    /// Every format, in the order an error lists them.
    pub const ALL: [Self; 2] = [Self::Pretty, Self::Json];

    /// The configuration spelling of the format.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pretty => "pretty",
            Self::Json => "json",
        }
    }
}

mod checks;
mod connections;
mod file;
mod keys;
mod layers;
mod live;
mod mapping;
mod parse;
mod secret;
#[cfg(test)]
mod tests;

use checks::{check_http, check_windows};
pub use connections::scrub_url;
use connections::{
    instance_name, parse_amqp_url, parse_database_url, parse_management, parse_prefix, read_pem,
};
pub use file::{REGENERATE, defaults_file};
use keys::{SECTIONS, keys};
pub use live::{Change, LIVE_KEYS, changes, check_applied, is_live};
pub use mapping::{KindMapping, MappingSettings, OrdersSource, StockMapping, Zone};
use mapping::{check_mapping, parse_ident, parse_release_sql, parse_status, parse_time_zone};
pub use parse::{MIN_TOKEN_LEN, parse_duration, parse_tokens, parse_window};
use parse::{non_empty, parse_bind, parse_bool, parse_choice, parse_log_level, parse_range};
pub use secret::{REDACTED, Secret, redact_url};

/// `database.*`
#[derive(Debug, Clone)]
pub struct DatabaseSettings {
    /// Connection URL: `sqlite://…`, `postgres://…` or `mysql://…`.
    pub url: Secret,
    /// Size of the HTTP API's pool (SQLite always uses one writer connection).
    pub max_connections: u32,
    /// Size of the pool of the consumers, relay and sweeper, apart from the
    /// API's so that requests cannot starve timeouts (SQLite: one connection).
    pub background_connections: u32,
    /// Run pending migrations when `serve` starts.
    pub migrate_on_start: bool,
}

/// `amqp.*`
#[derive(Debug, Clone)]
pub struct AmqpSettings {
    /// Broker URL, `amqp://` or `amqps://`; several, separated by commas,
    /// for the nodes of a cluster ([`AmqpSettings::addresses`]).
    pub url: Secret,
    /// How long opening a connection to one address may take, TCP connect
    /// and AMQP handshake together, before the next address is tried.
    pub connect_timeout: Duration,
    /// The entry exchange's name; every other name is `<prefix>.<role>`.
    pub prefix: String,
    /// Which delay mechanism to use.
    pub delay_mode: DelayMode,
    /// Deliveries the broker may push before an ack (per timeout consumer).
    pub prefetch: u16,
    /// Deliveries the router may have in flight (routed, awaiting the confirm).
    pub router_prefetch: u16,
    /// Classic (fastest, one node) or quorum (replicated) queues.
    pub queue_type: QueueType,
    /// This instance's name in connection names (defaults to host and pid).
    pub instance: String,
    /// Extra CA certificates (PEM) to trust for `amqps://`, from `amqp.tls_ca_file`.
    pub tls_ca_pem: Option<String>,
    /// The file they came from, for `doctor`.
    pub tls_ca_file: Option<PathBuf>,
    /// The broker's management HTTP API (`amqp.management_url`), for what AMQP
    /// cannot tell: how many timers wait in the plugin's exchange. `None`: off.
    pub management: Option<ManagementApi>,
}

impl AmqpSettings {
    /// The broker's addresses, in the order `amqp.url` gives them (secret:
    /// for a connect call; [`redact_url`] any that is shown).
    pub fn addresses(&self) -> Vec<&str> {
        self.url.expose().split(',').collect()
    }
}

/// Where the broker's management HTTP API answers, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementApi {
    /// `http://host:port` and any path prefix, without credentials or `/api`.
    pub base: String,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: Secret,
    /// The vhost of `amqp.url`, whose exchanges it reads.
    pub vhost: String,
}

/// `http.*`
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Address of the HTTP API; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Bearer tokens of the checkout scope: checkout and the buyer's actions.
    pub checkout_tokens: Vec<Secret>,
    /// Bearer tokens of the admin scope: inventory, shipping, and everything
    /// the checkout scope may do.
    pub admin_tokens: Vec<Secret>,
    /// Whether a non-loopback bind without any token is meant (an open API).
    pub allow_anonymous: bool,
    /// Whether `/readyz` and `/metrics` need a token of either scope.
    pub protect_operations: bool,
    /// How long a client may take to send a request head; also how long an
    /// idle keep-alive connection stays open.
    pub header_read_timeout: Duration,
    /// How long a request may take before it is answered 503 and dropped.
    pub request_timeout: Duration,
    /// How long an `Idempotency-Key` is kept: an older one is treated as new,
    /// and the cleaner deletes it.
    pub idempotency_retention: Duration,
    /// Most open connections; at the cap the server stops accepting.
    pub max_connections: usize,
    /// Most requests handled at once; beyond it, 503 with `Retry-After`.
    pub max_in_flight: usize,
}

impl HttpSettings {
    /// Whether any token is configured, so that the API asks for one.
    pub fn has_tokens(&self) -> bool {
        !self.checkout_tokens.is_empty() || !self.admin_tokens.is_empty()
    }
}

/// `windows.*`: how long each stage of an order may take.
#[derive(Debug, Clone)]
pub struct Windows {
    /// From checkout to payment.
    pub payment: Duration,
    /// From payment to shipping.
    pub fulfillment: Duration,
    /// From shipping to the buyer's confirmation.
    pub receipt: Duration,
    /// The longest payment window a checkout may ask for.
    pub max_payment: Duration,
}

/// `consumer.*`
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Most deliveries handled in one database transaction.
    pub batch_size: usize,
    /// How long a batch may wait to fill while messages are flowing.
    pub batch_wait: Duration,
    /// An early message due within this is held in memory; a later one is re-delayed.
    pub hold_max: Duration,
    /// Whether a due delivery also applies every order of its kind already due.
    pub catch_up: bool,
}

/// `relay.*`
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Whether this instance publishes the outbox (off when another system
    /// publishes the timeouts itself and this one only consumes them).
    pub enabled: bool,
    /// Most outbox rows published per round.
    pub batch_size: u64,
    /// Pause between rounds when the outbox is empty.
    pub interval: Duration,
    /// Refusals by the broker after which an outbox row is set aside.
    pub max_attempts: i32,
}

/// `sweeper.*`
#[derive(Debug, Clone)]
pub struct SweeperSettings {
    /// Whether this instance sweeps at all.
    pub enabled: bool,
    /// Time between sweeps.
    pub interval: Duration,
    /// How long past its deadline an order must be before the sweeper acts.
    pub grace: Duration,
    /// Most orders handled per kind per sweep.
    pub batch_size: u64,
}

/// `metrics.*`: the gauges read from the orders table.
#[derive(Debug, Clone)]
pub struct MetricsSettings {
    /// Time between two readings of the order gauges.
    pub gauge_interval: Duration,
    /// How long past its deadline an order still waiting for its timeout
    /// must be to count as overdue.
    pub overdue_after: Duration,
}

/// `log.*`
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// Pretty or JSON lines.
    pub format: LogFormat,
    /// Default filter when `RUST_LOG` is not set.
    pub level: String,
}

/// All settings, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The database.
    pub database: DatabaseSettings,
    /// The broker.
    pub amqp: AmqpSettings,
    /// The HTTP API.
    pub http: HttpSettings,
    /// Default windows.
    pub windows: Windows,
    /// The timeout consumers.
    pub consumer: ConsumerSettings,
    /// The outbox relay.
    pub relay: RelaySettings,
    /// The sweeper.
    pub sweeper: SweeperSettings,
    /// The order gauges.
    pub metrics: MetricsSettings,
    /// Logging.
    pub log: LogSettings,
    /// Whose orders the timeouts act on, and how a shop's table is mapped.
    pub mapping: MappingSettings,
    /// Where each key's value came from, for `doctor`.
    pub sources: BTreeMap<String, Source>,
    /// The text of each key the file or the environment set, as given but with
    /// secrets redacted, for `order-timeout config` ([`Settings::to_toml`]).
    pub given: BTreeMap<String, String>,
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// The TOML file at this path.
    File(PathBuf),
    /// This environment variable.
    Env(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(p) => write!(f, "file {}", p.display()),
            Self::Env(v) => write!(f, "env {v}"),
        }
    }
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse or is out of range.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// The dotted key, e.g. `amqp.delay_mode`.
        key: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A key nobody reads, most likely a typo.
    #[error("unknown setting `{key}` (from {source_name}); known keys: {known}")]
    Unknown {
        /// The dotted key.
        key: String,
        /// The file or environment variable that set it.
        source_name: String,
        /// The keys that exist.
        known: String,
    },
    /// The file could not be read or is not TOML.
    #[error("cannot read config file {path}: {reason}")]
    File {
        /// The path given.
        path: PathBuf,
        /// The parser's or the OS's message.
        reason: String,
    },
}

/// Where to read settings from. Tests pass their own environment map instead of
/// touching the process environment.
#[derive(Debug, Default, Clone)]
pub struct SettingsSource {
    /// The TOML file, if any.
    pub file: Option<PathBuf>,
    /// `None` reads the process environment; `Some` reads only this map.
    pub env: Option<HashMap<String, String>>,
}

impl Settings {
    /// Loads the layers and reads every key of the table in order, each
    /// section's cross-key checks right after its keys; the first wrong value
    /// stops it, named.
    pub fn load(source: &SettingsSource) -> Result<Self, SettingsError> {
        let merged = layers::merge(source)?;
        let mut settings = Settings::unread(merged.sources.clone());
        for section in SECTIONS {
            for key in section.keys {
                let text = merged.value(key.name);
                (key.read)(key.name, text, &mut settings)?;
                if settings.sources.get(key.name) != Some(&Source::Default) {
                    let shown = file::written(key, text);
                    settings.given.insert(key.name.to_string(), shown);
                }
            }
            if let Some(check) = section.check {
                check(&settings)?;
            }
        }
        Ok(settings)
    }

    /// Every key in table order with its value as `doctor` shows it (secrets
    /// redacted) and its source.
    pub fn describe(&self) -> Vec<(String, String, Source)> {
        keys()
            .map(|key| {
                let source = self.sources.get(key.name).cloned();
                let source = source.unwrap_or(Source::Default);
                (key.name.to_string(), (key.show)(self), source)
            })
            .collect()
    }
}

fn invalid(key: &str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Largest batch a setting may ask for: one transaction's worth. Statements
/// are cut into lists the databases accept (`store::LIST_CHUNK`) whatever the
/// batch, but a batch is one transaction, and a longer one holds its locks
/// longer.
pub const MAX_BATCH: u64 = 10_000;

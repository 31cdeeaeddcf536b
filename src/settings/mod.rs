//! Typed, validated settings.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config FILE` or
//! `ORDER_TIMEOUT_CONFIG`), then `ORDER_TIMEOUT__SECTION__KEY` environment
//! variables. Every value is read as text and parsed here, so that a wrong value
//! stops start-up with a message naming its key, and an unknown key (a typo) is
//! refused instead of silently ignored.

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

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines for a terminal.
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
}

mod connections;
mod defaults;
mod layers;
mod parse;
mod secret;
mod sections;
#[cfg(test)]
mod tests;

pub use connections::scrub_url;
use connections::{
    default_instance, parse_amqp_url, parse_database_url, parse_management, parse_prefix, read_pem,
};
use defaults::DEFAULTS;
use layers::{check_known, read_env, read_file};
use parse::{non_empty, parse_bool, parse_range};
pub use parse::{parse_duration, parse_window};
pub use secret::{Secret, redact_url};
pub use sections::{MIN_TOKEN_LEN, parse_tokens};
use sections::{describe_tokens, parse_http, parse_windows};

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
    /// Broker URL, `amqp://` or `amqps://`.
    pub url: Secret,
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
    /// Logging.
    pub log: LogSettings,
    /// Where each key's value came from, for `doctor`.
    pub sources: BTreeMap<String, Source>,
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
    /// Loads the layers and validates every key.
    pub fn load(source: &SettingsSource) -> Result<Self, SettingsError> {
        let env_map: HashMap<String, String> = match &source.env {
            Some(map) => map.clone(),
            None => std::env::vars().collect(),
        };
        let file = source
            .file
            .clone()
            .or_else(|| env_map.get(CONFIG_FILE_ENV).map(PathBuf::from));
        let mut values: BTreeMap<String, String> = DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut sources: BTreeMap<String, Source> = DEFAULTS
            .iter()
            .map(|(k, _)| (k.to_string(), Source::Default))
            .collect();
        if let Some(path) = &file {
            for (key, value) in read_file(path)? {
                check_known(&key, &format!("file {}", path.display()))?;
                sources.insert(key.clone(), Source::File(path.clone()));
                values.insert(key, value);
            }
        }
        for (key, value, var) in read_env(&env_map)? {
            check_known(&key, &format!("env {var}"))?;
            sources.insert(key.clone(), Source::Env(var));
            values.insert(key, value);
        }
        let v = Values(&values);
        Ok(Settings {
            database: database(&v)?,
            amqp: amqp(&v)?,
            http: parse_http(|k| v.raw(k))?,
            windows: parse_windows(|k| v.raw(k))?,
            consumer: ConsumerSettings {
                batch_size: v.range("consumer.batch_size", 1, MAX_BATCH as usize)?,
                batch_wait: v.duration(
                    "consumer.batch_wait",
                    Duration::ZERO,
                    Duration::from_secs(1),
                )?,
                hold_max: v.duration(
                    "consumer.hold_max",
                    Duration::ZERO,
                    Duration::from_secs(60),
                )?,
            },
            relay: RelaySettings {
                enabled: v.bool("relay.enabled")?,
                batch_size: v.range("relay.batch_size", 1, MAX_BATCH)?,
                interval: v.duration(
                    "relay.interval",
                    Duration::from_millis(1),
                    Duration::from_secs(60),
                )?,
                max_attempts: v.range("relay.max_attempts", 1, 1000)?,
            },
            sweeper: SweeperSettings {
                enabled: v.bool("sweeper.enabled")?,
                interval: v.duration("sweeper.interval", Duration::from_millis(100), DAY)?,
                grace: v.duration("sweeper.grace", Duration::ZERO, DAY * 30)?,
                batch_size: v.range("sweeper.batch_size", 1, MAX_BATCH)?,
            },
            log: LogSettings {
                format: v.choice(
                    "log.format",
                    &[("pretty", LogFormat::Pretty), ("json", LogFormat::Json)],
                )?,
                level: {
                    let level = v.raw("log.level");
                    tracing_subscriber::EnvFilter::try_new(level)
                        .map_err(|e| invalid("log.level", format!("'{level}': {e}")))?;
                    level.to_string()
                },
            },
            sources,
        })
    }

    /// Every key with its value as `doctor` shows it (secrets redacted) and its source.
    pub fn describe(&self) -> Vec<(String, String, Source)> {
        let d = self;
        let time = |t: Duration| humantime::format_duration(t).to_string();
        let shown: Vec<(&str, String)> = vec![
            ("database.url", d.database.url.redacted()),
            (
                "database.max_connections",
                d.database.max_connections.to_string(),
            ),
            (
                "database.background_connections",
                d.database.background_connections.to_string(),
            ),
            (
                "database.migrate_on_start",
                d.database.migrate_on_start.to_string(),
            ),
            ("amqp.url", d.amqp.url.redacted()),
            ("amqp.prefix", d.amqp.prefix.clone()),
            ("amqp.delay_mode", d.amqp.delay_mode.as_str().to_string()),
            ("amqp.prefetch", d.amqp.prefetch.to_string()),
            ("amqp.router_prefetch", d.amqp.router_prefetch.to_string()),
            (
                "amqp.queue_type",
                format!("{:?}", d.amqp.queue_type).to_lowercase(),
            ),
            ("amqp.instance", d.amqp.instance.clone()),
            (
                "amqp.tls_ca_file",
                d.amqp
                    .tls_ca_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            (
                "amqp.management_url",
                match &d.amqp.management {
                    Some(m) => format!("{} (as {}, vhost {})", m.base, m.username, m.vhost),
                    None => "off".to_string(),
                },
            ),
            ("http.bind", d.http.bind.to_string()),
            (
                "http.checkout_tokens",
                describe_tokens(&d.http.checkout_tokens),
            ),
            ("http.admin_tokens", describe_tokens(&d.http.admin_tokens)),
            ("http.allow_anonymous", d.http.allow_anonymous.to_string()),
            (
                "http.protect_operations",
                d.http.protect_operations.to_string(),
            ),
            ("http.header_read_timeout", time(d.http.header_read_timeout)),
            ("http.request_timeout", time(d.http.request_timeout)),
            ("http.max_connections", d.http.max_connections.to_string()),
            ("http.max_in_flight", d.http.max_in_flight.to_string()),
            ("windows.payment", time(d.windows.payment)),
            ("windows.fulfillment", time(d.windows.fulfillment)),
            ("windows.receipt", time(d.windows.receipt)),
            ("windows.max_payment", time(d.windows.max_payment)),
            ("consumer.batch_size", d.consumer.batch_size.to_string()),
            ("consumer.batch_wait", time(d.consumer.batch_wait)),
            ("consumer.hold_max", time(d.consumer.hold_max)),
            ("relay.enabled", d.relay.enabled.to_string()),
            ("relay.batch_size", d.relay.batch_size.to_string()),
            ("relay.interval", time(d.relay.interval)),
            ("relay.max_attempts", d.relay.max_attempts.to_string()),
            ("sweeper.enabled", d.sweeper.enabled.to_string()),
            ("sweeper.interval", time(d.sweeper.interval)),
            ("sweeper.grace", time(d.sweeper.grace)),
            ("sweeper.batch_size", d.sweeper.batch_size.to_string()),
            ("log.format", format!("{:?}", d.log.format).to_lowercase()),
            ("log.level", d.log.level.clone()),
        ];
        shown
            .into_iter()
            .map(|(k, v)| {
                let source = self.sources.get(k).cloned().unwrap_or(Source::Default);
                (k.to_string(), v, source)
            })
            .collect()
    }
}

const DAY: Duration = Duration::from_secs(86_400);

/// `database.*`.
fn database(v: &Values) -> Result<DatabaseSettings, SettingsError> {
    Ok(DatabaseSettings {
        url: Secret::new(parse_database_url("database.url", v.raw("database.url"))?),
        max_connections: v.range("database.max_connections", 1, 1000)?,
        background_connections: v.range("database.background_connections", 1, 1000)?,
        migrate_on_start: v.bool("database.migrate_on_start")?,
    })
}

/// `amqp.*`.
fn amqp(v: &Values) -> Result<AmqpSettings, SettingsError> {
    let tls_ca_file = v.raw("amqp.tls_ca_file");
    Ok(AmqpSettings {
        url: Secret::new(parse_amqp_url("amqp.url", v.raw("amqp.url"))?),
        prefix: parse_prefix("amqp.prefix", v.raw("amqp.prefix"))?,
        delay_mode: v.choice(
            "amqp.delay_mode",
            &[
                ("auto", DelayMode::Auto),
                ("plugin", DelayMode::Plugin),
                ("ttl", DelayMode::Ttl),
            ],
        )?,
        prefetch: v.range("amqp.prefetch", 1, 65535)?,
        router_prefetch: v.range("amqp.router_prefetch", 1, 65535)?,
        queue_type: v.choice(
            "amqp.queue_type",
            &[
                ("classic", QueueType::Classic),
                ("quorum", QueueType::Quorum),
            ],
        )?,
        instance: match v.raw("amqp.instance") {
            "" => default_instance(),
            name => name.to_string(),
        },
        tls_ca_pem: read_pem("amqp.tls_ca_file", tls_ca_file)?,
        tls_ca_file: Some(tls_ca_file)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        management: parse_management(
            "amqp.management_url",
            v.raw("amqp.management_url"),
            v.raw("amqp.url"),
        )?,
    })
}

/// The merged layers, read key by key with the parser each key needs; every
/// error names the key.
struct Values<'a>(&'a BTreeMap<String, String>);

impl Values<'_> {
    fn raw(&self, key: &str) -> &str {
        self.0.get(key).map(String::as_str).unwrap_or_default()
    }
    fn bool(&self, key: &str) -> Result<bool, SettingsError> {
        parse_bool(key, self.raw(key))
    }
    fn range<T>(&self, key: &str, min: T, max: T) -> Result<T, SettingsError>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
    {
        parse_range(key, self.raw(key), min, max)
    }
    fn duration(&self, key: &str, min: Duration, max: Duration) -> Result<Duration, SettingsError> {
        parse_duration(key, self.raw(key), min, max)
    }
    /// One of a few spellings.
    fn choice<T: Copy>(&self, key: &str, options: &[(&str, T)]) -> Result<T, SettingsError> {
        let value = self.raw(key);
        options
            .iter()
            .find(|(name, _)| *name == value)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                let (last, rest) = names.split_last().unwrap_or((&"", &[]));
                let expected = if rest.is_empty() {
                    last.to_string()
                } else {
                    format!("{} or {last}", rest.join(", "))
                };
                invalid(key, format!("'{value}' (expected {expected})"))
            })
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

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

pub use crate::amqp::topology::QueueType;

/// Environment variable prefix; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "ORDER_TIMEOUT";
/// Environment variable naming the TOML file when `--config` is not given.
pub const CONFIG_FILE_ENV: &str = "ORDER_TIMEOUT_CONFIG";
/// The largest delay the wire contract allows (the plugin's limit): 2^32-1 ms.
pub const MAX_DELAY: Duration = Duration::from_millis(4_294_967_295);

/// Every key with its built-in default. The order is the order `doctor` prints.
const DEFAULTS: &[(&str, &str)] = &[
    ("database.url", "sqlite://order-timeout.db?mode=rwc"),
    ("database.max_connections", "10"),
    // The consumers, relay and sweeper get their own pool, so a flood of
    // requests cannot starve the timeouts of connections (SQLite: one each).
    ("database.background_connections", "5"),
    ("database.migrate_on_start", "true"),
    ("amqp.url", "amqp://guest:guest@127.0.0.1:5672/%2f"),
    ("amqp.prefix", "order.timeouts"),
    ("amqp.delay_mode", "auto"),
    // Early messages (up to `consumer.hold_max`) are held unacked, so prefetch
    // must exceed rate × hold: 10,000 carries 10,000/s with a 1 s hold.
    ("amqp.prefetch", "10000"),
    // The router needs no hold: its window only has to cover the broker's
    // confirm round trip. Larger windows cost memory, not speed (measured with
    // `bench --million`).
    ("amqp.router_prefetch", "1000"),
    ("amqp.queue_type", "classic"),
    ("amqp.instance", ""),
    ("amqp.tls_ca_file", ""),
    // Empty: the management API on the broker's host (http, port 15672) with
    // the credentials of amqp.url; `off`: not used.
    ("amqp.management_url", ""),
    ("http.bind", "127.0.0.1:8080"),
    // Bearer tokens, comma-separated (old,new while one is rotated). None on a
    // loopback bind leaves the API open, as in development.
    ("http.checkout_tokens", ""),
    ("http.admin_tokens", ""),
    // A non-loopback bind without tokens stops start-up unless this says the
    // API is meant to be open to whoever reaches it.
    ("http.allow_anonymous", "false"),
    // `/readyz` and `/metrics` need a token of either scope (`/healthz` never does).
    ("http.protect_operations", "false"),
    // A client that has not sent its request head in this time (or keeps an
    // idle connection open this long) is disconnected.
    ("http.header_read_timeout", "75s"),
    ("http.request_timeout", "30s"),
    ("http.max_connections", "1024"),
    // Beyond this many requests at once, answer 503 at once rather than queue
    // for the API's database pool.
    ("http.max_in_flight", "100"),
    ("windows.payment", "30m"),
    ("windows.fulfillment", "7d"),
    ("windows.receipt", "14d"),
    // The longest `payment_window` a checkout may ask for: a longer one would
    // hold stock out of sale for that long.
    ("windows.max_payment", "7d"),
    ("consumer.batch_size", "200"),
    ("consumer.batch_wait", "5ms"),
    ("consumer.hold_max", "1s"),
    ("relay.enabled", "true"),
    ("relay.batch_size", "500"),
    ("relay.interval", "200ms"),
    ("relay.max_attempts", "10"),
    ("sweeper.enabled", "true"),
    ("sweeper.interval", "30s"),
    ("sweeper.grace", "60s"),
    ("sweeper.batch_size", "500"),
    ("log.format", "pretty"),
    ("log.level", "info,lapin=off"),
];

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

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines for a terminal.
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
}

/// A value that must never be printed: its `Debug` and `Display` are redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// How much of it may be shown.
    shown: Shown,
}

/// What of a secret may be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// A URL: everything but its password.
    UrlWithoutPassword,
    /// Nothing (a bearer token is secret from end to end).
    Nothing,
}

impl Secret {
    /// Wraps a URL (or a password) whose password part is secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            shown: Shown::UrlWithoutPassword,
        }
    }
    /// Wraps a value that is secret as a whole, such as a bearer token.
    pub fn opaque(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            shown: Shown::Nothing,
        }
    }
    /// The secret itself, for the one place that must use it (a connect call).
    pub fn expose(&self) -> &str {
        &self.value
    }
    /// The value with any password replaced, safe for logs and `doctor`.
    pub fn redacted(&self) -> String {
        match self.shown {
            Shown::UrlWithoutPassword => redact_url(&self.value),
            Shown::Nothing => "***".to_string(),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Replaces the password of a URL (and any `password=` query value) with `***`.
/// Text that is not a URL is returned whole only when it cannot hold a password.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        // `user:pass@host` parses as scheme `user` with an opaque path: hide it all.
        Ok(url) if url.cannot_be_a_base() && raw.contains('@') => "***".to_string(),
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k.eq_ignore_ascii_case("password") {
                        "***".into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            url.to_string()
        }
        // Something like `user:pass@host` that is not a URL: hide everything after
        // the first colon rather than risk printing a password.
        Err(_) if raw.contains('@') => "***".to_string(),
        Err(_) => raw.to_string(),
    }
}

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

        let get = |key: &str| values.get(key).map(String::as_str).unwrap_or_default();
        let settings = Settings {
            database: DatabaseSettings {
                url: Secret::new(parse_database_url("database.url", get("database.url"))?),
                max_connections: parse_range(
                    "database.max_connections",
                    get("database.max_connections"),
                    1,
                    1000,
                )?,
                background_connections: parse_range(
                    "database.background_connections",
                    get("database.background_connections"),
                    1,
                    1000,
                )?,
                migrate_on_start: parse_bool(
                    "database.migrate_on_start",
                    get("database.migrate_on_start"),
                )?,
            },
            amqp: AmqpSettings {
                url: Secret::new(parse_amqp_url("amqp.url", get("amqp.url"))?),
                prefix: parse_prefix("amqp.prefix", get("amqp.prefix"))?,
                delay_mode: match get("amqp.delay_mode") {
                    "auto" => DelayMode::Auto,
                    "plugin" => DelayMode::Plugin,
                    "ttl" => DelayMode::Ttl,
                    other => {
                        return Err(invalid(
                            "amqp.delay_mode",
                            format!("'{other}' (expected auto, plugin or ttl)"),
                        ));
                    }
                },
                prefetch: parse_range("amqp.prefetch", get("amqp.prefetch"), 1, 65535)?,
                router_prefetch: parse_range(
                    "amqp.router_prefetch",
                    get("amqp.router_prefetch"),
                    1,
                    65535,
                )?,
                queue_type: match get("amqp.queue_type") {
                    "classic" => QueueType::Classic,
                    "quorum" => QueueType::Quorum,
                    other => {
                        return Err(invalid(
                            "amqp.queue_type",
                            format!("'{other}' (expected classic or quorum)"),
                        ));
                    }
                },
                instance: match get("amqp.instance") {
                    "" => default_instance(),
                    name => name.to_string(),
                },
                tls_ca_pem: read_pem("amqp.tls_ca_file", get("amqp.tls_ca_file"))?,
                tls_ca_file: Some(get("amqp.tls_ca_file"))
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from),
                management: parse_management(
                    "amqp.management_url",
                    get("amqp.management_url"),
                    get("amqp.url"),
                )?,
            },
            http: parse_http(get)?,
            windows: parse_windows(get)?,
            consumer: ConsumerSettings {
                batch_size: parse_range(
                    "consumer.batch_size",
                    get("consumer.batch_size"),
                    1,
                    MAX_BATCH as usize,
                )?,
                batch_wait: parse_duration(
                    "consumer.batch_wait",
                    get("consumer.batch_wait"),
                    Duration::ZERO,
                    Duration::from_secs(1),
                )?,
                hold_max: parse_duration(
                    "consumer.hold_max",
                    get("consumer.hold_max"),
                    Duration::ZERO,
                    Duration::from_secs(60),
                )?,
            },
            relay: RelaySettings {
                enabled: parse_bool("relay.enabled", get("relay.enabled"))?,
                batch_size: parse_range("relay.batch_size", get("relay.batch_size"), 1, MAX_BATCH)?,
                interval: parse_duration(
                    "relay.interval",
                    get("relay.interval"),
                    Duration::from_millis(1),
                    Duration::from_secs(60),
                )?,
                max_attempts: parse_range(
                    "relay.max_attempts",
                    get("relay.max_attempts"),
                    1,
                    1000,
                )?,
            },
            sweeper: SweeperSettings {
                enabled: parse_bool("sweeper.enabled", get("sweeper.enabled"))?,
                interval: parse_duration(
                    "sweeper.interval",
                    get("sweeper.interval"),
                    Duration::from_millis(100),
                    Duration::from_secs(86_400),
                )?,
                grace: parse_duration(
                    "sweeper.grace",
                    get("sweeper.grace"),
                    Duration::ZERO,
                    Duration::from_secs(86_400 * 30),
                )?,
                batch_size: parse_range(
                    "sweeper.batch_size",
                    get("sweeper.batch_size"),
                    1,
                    MAX_BATCH,
                )?,
            },
            log: LogSettings {
                format: match get("log.format") {
                    "pretty" => LogFormat::Pretty,
                    "json" => LogFormat::Json,
                    other => {
                        return Err(invalid(
                            "log.format",
                            format!("'{other}' (expected pretty or json)"),
                        ));
                    }
                },
                level: {
                    let level = get("log.level");
                    tracing_subscriber::EnvFilter::try_new(level)
                        .map_err(|e| invalid("log.level", format!("'{level}': {e}")))?;
                    level.to_string()
                },
            },
            sources,
        };
        Ok(settings)
    }

    /// Every key with its value as `doctor` shows it (secrets redacted) and its source.
    pub fn describe(&self) -> Vec<(String, String, Source)> {
        let d = &self;
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
            (
                "http.header_read_timeout",
                humantime::format_duration(d.http.header_read_timeout).to_string(),
            ),
            (
                "http.request_timeout",
                humantime::format_duration(d.http.request_timeout).to_string(),
            ),
            ("http.max_connections", d.http.max_connections.to_string()),
            ("http.max_in_flight", d.http.max_in_flight.to_string()),
            (
                "windows.payment",
                humantime::format_duration(d.windows.payment).to_string(),
            ),
            (
                "windows.fulfillment",
                humantime::format_duration(d.windows.fulfillment).to_string(),
            ),
            (
                "windows.receipt",
                humantime::format_duration(d.windows.receipt).to_string(),
            ),
            (
                "windows.max_payment",
                humantime::format_duration(d.windows.max_payment).to_string(),
            ),
            ("consumer.batch_size", d.consumer.batch_size.to_string()),
            (
                "consumer.batch_wait",
                humantime::format_duration(d.consumer.batch_wait).to_string(),
            ),
            (
                "consumer.hold_max",
                humantime::format_duration(d.consumer.hold_max).to_string(),
            ),
            ("relay.enabled", d.relay.enabled.to_string()),
            ("relay.batch_size", d.relay.batch_size.to_string()),
            (
                "relay.interval",
                humantime::format_duration(d.relay.interval).to_string(),
            ),
            ("relay.max_attempts", d.relay.max_attempts.to_string()),
            ("sweeper.enabled", d.sweeper.enabled.to_string()),
            (
                "sweeper.interval",
                humantime::format_duration(d.sweeper.interval).to_string(),
            ),
            (
                "sweeper.grace",
                humantime::format_duration(d.sweeper.grace).to_string(),
            ),
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

fn invalid(key: &str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn check_known(key: &str, source_name: &str) -> Result<(), SettingsError> {
    if DEFAULTS.iter().any(|(k, _)| *k == key) {
        return Ok(());
    }
    Err(SettingsError::Unknown {
        key: key.to_string(),
        source_name: source_name.to_string(),
        known: DEFAULTS
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Reads a TOML file into dotted keys with text values.
fn read_file(path: &Path) -> Result<Vec<(String, String)>, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|e| SettingsError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let config = Config::builder()
        .add_source(File::from_str(&text, FileFormat::Toml))
        .build()
        .map_err(|e| SettingsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let table = config
        .try_deserialize::<config::Map<String, Value>>()
        .map_err(|e| SettingsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let mut out = Vec::new();
    flatten("", table, &mut out)?;
    Ok(out)
}

fn flatten(
    prefix: &str,
    table: config::Map<String, Value>,
    out: &mut Vec<(String, String)>,
) -> Result<(), SettingsError> {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value.kind {
            ValueKind::Table(inner) => flatten(&full, inner, out)?,
            ValueKind::Array(_) => return Err(invalid(&full, "arrays are not accepted here")),
            ValueKind::Nil => {}
            _ => {
                let text = value
                    .into_string()
                    .map_err(|e| invalid(&full, e.to_string()))?;
                out.push((full, text));
            }
        }
    }
    Ok(())
}

/// Reads `ORDER_TIMEOUT__SECTION__KEY` variables into dotted keys.
fn read_env(env: &HashMap<String, String>) -> Result<Vec<(String, String, String)>, SettingsError> {
    // The config crate's Environment source does the prefix and separator work;
    // we feed it the map so tests never have to set process variables.
    let source = Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("__")
        .separator("__")
        .source(Some(env.clone().into_iter().collect()));
    let config = Config::builder()
        .add_source(source)
        .build()
        .map_err(|e| invalid("environment", e.to_string()))?;
    let table = config
        .try_deserialize::<config::Map<String, Value>>()
        .map_err(|e| invalid("environment", e.to_string()))?;
    let mut flat = Vec::new();
    flatten("", table, &mut flat)?;
    Ok(flat
        .into_iter()
        .map(|(key, value)| {
            let var = format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase());
            (key, value, var)
        })
        .collect())
}

fn non_empty(key: &str, value: &str) -> Result<String, SettingsError> {
    if value.trim().is_empty() {
        return Err(invalid(key, "must not be empty"));
    }
    Ok(value.to_string())
}

fn parse_bool(key: &str, value: &str) -> Result<bool, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(key, format!("'{value}' (expected true or false)"))),
    }
}

/// Largest batch a setting may ask for: one transaction's worth. Statements
/// are cut into lists the databases accept (`store::LIST_CHUNK`) whatever the
/// batch, but a batch is one transaction, and a longer one holds its locks
/// longer.
pub const MAX_BATCH: u64 = 10_000;

fn parse_range<T>(key: &str, value: &str, min: T, max: T) -> Result<T, SettingsError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
{
    match value.trim().parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(invalid(
            key,
            format!("'{value}' (expected a whole number from {min} to {max})"),
        )),
    }
}

/// Parses a humantime duration (`30m`, `1h 30m`, `250ms`) within bounds.
pub fn parse_duration(
    key: &str,
    value: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, SettingsError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| {
        invalid(
            key,
            format!("'{value}' is not a duration ({e}); write it like 30s, 15m, 7d or 250ms"),
        )
    })?;
    if d < min || d > max {
        return Err(invalid(
            key,
            format!(
                "'{value}' is out of range ({} to {})",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d)
}

/// A window: at least one millisecond, at most what one `x-delay` can carry.
pub fn parse_window(key: &str, value: &str) -> Result<Duration, SettingsError> {
    parse_duration(key, value, Duration::from_millis(1), MAX_DELAY)
}

/// How `doctor` shows a token list: how many, never what.
fn describe_tokens(tokens: &[Secret]) -> String {
    match tokens.len() {
        0 => String::new(),
        1 => "1 token (redacted)".to_string(),
        n => format!("{n} tokens (redacted)"),
    }
}

/// `http.*`: the bind address, the tokens of each scope, and whether a
/// reachable API without tokens is meant.
fn parse_http<'v>(get: impl Fn(&str) -> &'v str) -> Result<HttpSettings, SettingsError> {
    let bind: SocketAddr = get("http.bind").parse().map_err(|_| {
        invalid(
            "http.bind",
            format!(
                "'{}' (expected host:port, e.g. 127.0.0.1:8080)",
                get("http.bind")
            ),
        )
    })?;
    let http = HttpSettings {
        bind,
        checkout_tokens: parse_tokens("http.checkout_tokens", get("http.checkout_tokens"))?,
        admin_tokens: parse_tokens("http.admin_tokens", get("http.admin_tokens"))?,
        allow_anonymous: parse_bool("http.allow_anonymous", get("http.allow_anonymous"))?,
        protect_operations: parse_bool("http.protect_operations", get("http.protect_operations"))?,
        header_read_timeout: parse_duration(
            "http.header_read_timeout",
            get("http.header_read_timeout"),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?,
        request_timeout: parse_duration(
            "http.request_timeout",
            get("http.request_timeout"),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?,
        max_connections: parse_range(
            "http.max_connections",
            get("http.max_connections"),
            1,
            1_000_000,
        )?,
        max_in_flight: parse_range(
            "http.max_in_flight",
            get("http.max_in_flight"),
            1,
            1_000_000,
        )?,
    };
    if http
        .checkout_tokens
        .iter()
        .any(|t| http.admin_tokens.contains(t))
    {
        return Err(invalid(
            "http.checkout_tokens",
            "a token is also in `http.admin_tokens`: give each scope its own tokens",
        ));
    }
    if http.protect_operations && !http.has_tokens() {
        return Err(invalid(
            "http.protect_operations",
            "true needs a token in `http.admin_tokens` or `http.checkout_tokens` to read /readyz and /metrics with",
        ));
    }
    // Loopback without tokens is development (`make run`, tests); anything
    // reachable from elsewhere must say who may call it, or that anyone may.
    let loopback = bind.ip().to_canonical().is_loopback();
    if !loopback && !http.has_tokens() && !http.allow_anonymous {
        return Err(invalid(
            "http.bind",
            format!(
                "{bind} is reachable from other machines and no token is configured: \
                 set `http.admin_tokens` and/or `http.checkout_tokens`, \
                 or `http.allow_anonymous = true` if anyone who reaches the port may \
                 set stock and act on every order"
            ),
        ));
    }
    Ok(http)
}

/// Shortest bearer token accepted: 16 characters (a uuid without dashes has 32).
pub const MIN_TOKEN_LEN: usize = 16;

/// A comma-separated list of bearer tokens (several while one is rotated:
/// `old,new`). Spaces around the commas are ignored; each token must be at least
/// [`MIN_TOKEN_LEN`] printable ASCII characters without whitespace. Errors say
/// which token (by position) is wrong, never what it is.
pub fn parse_tokens(key: &str, value: &str) -> Result<Vec<Secret>, SettingsError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut tokens: Vec<Secret> = Vec::new();
    for (i, token) in value.split(',').map(str::trim).enumerate() {
        let n = i + 1;
        if token.is_empty() {
            return Err(invalid(
                key,
                format!("token {n} is empty (separate tokens with single commas)"),
            ));
        }
        if token.chars().any(char::is_whitespace) {
            return Err(invalid(key, format!("token {n} contains whitespace")));
        }
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid(
                key,
                format!(
                    "token {n} holds a character that is not printable ASCII (an HTTP header cannot carry it)"
                ),
            ));
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(invalid(
                key,
                format!(
                    "token {n} has {} characters; at least {MIN_TOKEN_LEN} are needed (a random uuid without dashes has 32)",
                    token.len()
                ),
            ));
        }
        let token = Secret::opaque(token);
        if tokens.contains(&token) {
            return Err(invalid(key, format!("token {n} is given twice")));
        }
        tokens.push(token);
    }
    Ok(tokens)
}

/// `windows.*`: the default windows, and the longest payment window a
/// checkout may ask for, which the default must not exceed.
fn parse_windows<'v>(get: impl Fn(&str) -> &'v str) -> Result<Windows, SettingsError> {
    let windows = Windows {
        payment: parse_window("windows.payment", get("windows.payment"))?,
        fulfillment: parse_window("windows.fulfillment", get("windows.fulfillment"))?,
        receipt: parse_window("windows.receipt", get("windows.receipt"))?,
        max_payment: parse_window("windows.max_payment", get("windows.max_payment"))?,
    };
    if windows.payment > windows.max_payment {
        return Err(invalid(
            "windows.payment",
            format!(
                "{} is longer than `windows.max_payment` ({})",
                humantime::format_duration(windows.payment),
                humantime::format_duration(windows.max_payment)
            ),
        ));
    }
    Ok(windows)
}

/// What to do about a URL that does not parse: reserved characters in a
/// password are the usual cause.
const ENCODE_HINT: &str =
    "percent-encode reserved characters (: / ? # [ ] @ %) in the user name and password";

/// `amqp.url`, checked with the parser the AMQP client itself uses, so that
/// no URL reaches the client that it would refuse with an error quoting it
/// whole (password included) on every reconnect.
fn parse_amqp_url(key: &str, value: &str) -> Result<String, SettingsError> {
    let redacted = redact_url(value);
    let url = url::Url::parse(value).map_err(|e| {
        invalid(
            key,
            format!("'{redacted}' is not a URL ({e}); {ENCODE_HINT}"),
        )
    })?;
    if url.scheme() != "amqp" && url.scheme() != "amqps" {
        return Err(invalid(
            key,
            format!("scheme '{}' (expected amqp:// or amqps://)", url.scheme()),
        ));
    }
    // The client's own error text quotes the URL: say what is wrong without it.
    if url.cannot_be_a_base() || value.parse::<lapin::uri::AMQPUri>().is_err() {
        return Err(invalid(
            key,
            format!(
                "'{redacted}' is not an AMQP URL (amqp://user:password@host:port/vhost); {ENCODE_HINT}"
            ),
        ));
    }
    Ok(value.to_string())
}

/// `database.url`: `sqlite:…`, `postgres://…` or `mysql://…`, with a host. The
/// database library quotes a URL it cannot parse or has no driver for whole,
/// password included: such a URL stops start-up here, redacted.
fn parse_database_url(key: &str, value: &str) -> Result<String, SettingsError> {
    let value = non_empty(key, value)?;
    if value.starts_with("sqlite:") {
        return Ok(value);
    }
    let redacted = redact_url(&value);
    let url = url::Url::parse(&value).map_err(|e| {
        invalid(
            key,
            format!("'{redacted}' is not a URL ({e}); {ENCODE_HINT}"),
        )
    })?;
    match url.scheme() {
        "postgres" | "postgresql" | "mysql" => {}
        "mariadb" => {
            return Err(invalid(
                key,
                format!("'{redacted}': MariaDB is reached with mysql://, not mariadb://"),
            ));
        }
        other => {
            return Err(invalid(
                key,
                format!("scheme '{other}' (expected sqlite:, postgres:// or mysql://)"),
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(
            key,
            format!("'{redacted}' has no host; {ENCODE_HINT}"),
        ));
    }
    Ok(value)
}

/// `text` (a library's error message) with the secrets of `raw_url` replaced
/// by `***`: the URL itself, and its password as written and decoded. The last
/// line of defence behind the checks above, for errors quoting what they got.
pub fn scrub_url(text: &str, raw_url: &str) -> String {
    let mut out = text.replace(raw_url, &redact_url(raw_url));
    if let Ok(url) = url::Url::parse(raw_url)
        && let Some(password) = url.password().filter(|p| !p.is_empty())
    {
        let decoded = percent_encoding::percent_decode_str(password).decode_utf8_lossy();
        out = out
            .replace(password, "***")
            .replace(decoded.as_ref(), "***");
    }
    out
}

/// `amqp.management_url`: `off`; empty for the broker's host over http on
/// 15672; or an `http://` URL. Credentials not in the URL are those of
/// `amqp.url`, and so is the vhost. (No https: the service's HTTP client is
/// built without TLS; with an `amqps://` broker and no URL it is off.)
fn parse_management(
    key: &str,
    value: &str,
    amqp_url: &str,
) -> Result<Option<ManagementApi>, SettingsError> {
    if value == "off" {
        return Ok(None);
    }
    // amqp.url was validated first; its parts fill what this URL leaves out.
    let amqp: lapin::uri::AMQPUri = amqp_url
        .parse()
        .map_err(|e| invalid("amqp.url", format!("'{}' ({e})", redact_url(amqp_url))))?;
    let from_amqp = |base: String| ManagementApi {
        base,
        username: amqp.authority.userinfo.username.clone(),
        password: Secret::opaque(amqp.authority.userinfo.password.clone()),
        vhost: amqp.vhost.clone(),
    };
    if value.is_empty() {
        if amqp_url.starts_with("amqps:") {
            return Ok(None);
        }
        let host = &amqp.authority.host;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        return Ok(Some(from_amqp(format!("http://{host}:15672"))));
    }
    let url = url::Url::parse(value)
        .map_err(|e| invalid(key, format!("'{}' is not a URL ({e})", redact_url(value))))?;
    match url.scheme() {
        "http" => {}
        "https" => {
            return Err(invalid(
                key,
                "https is not supported (the service's HTTP client has no TLS): give an http:// listener or 'off'",
            ));
        }
        other => {
            return Err(invalid(
                key,
                format!("scheme '{other}' (expected http://, empty for the default, or off)"),
            ));
        }
    }
    let host = url
        .host_str()
        .ok_or_else(|| invalid(key, format!("'{}' has no host", redact_url(value))))?;
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = url.path().trim_end_matches('/').trim_end_matches("/api");
    let mut api = from_amqp(format!("http://{host}{port}{path}"));
    if !url.username().is_empty() {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        api.username = decode(url.username());
        api.password = Secret::opaque(decode(url.password().unwrap_or_default()));
    }
    Ok(Some(api))
}

fn parse_prefix(key: &str, value: &str) -> Result<String, SettingsError> {
    // Names are AMQP short strings (≤ 255 bytes); the longest derived name adds
    // about 20 characters, so keep the prefix well under that.
    let ok = !value.is_empty()
        && value.len() <= 200
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !ok {
        return Err(invalid(
            key,
            format!("'{value}' (expected 1 to 200 characters of A-Z a-z 0-9 . - _ :)"),
        ));
    }
    Ok(value.to_string())
}

/// Reads a PEM file of CA certificates; empty means none.
fn read_pem(key: &str, path: &str) -> Result<Option<String>, SettingsError> {
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read '{path}': {e}")))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(key, format!("'{path}' holds no PEM certificate")));
    }
    Ok(Some(text))
}

fn default_instance() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load(&SettingsSource {
            file: None,
            env: Some(env),
        })
    }

    #[test]
    fn defaults_load() {
        let s = load(&[]).unwrap();
        assert_eq!(s.amqp.prefix, "order.timeouts");
        assert_eq!(s.windows.payment, Duration::from_secs(1800));
        assert_eq!(s.windows.fulfillment, Duration::from_secs(7 * 86400));
        assert_eq!(s.http.bind.to_string(), "127.0.0.1:8080");
        assert_eq!(s.amqp.delay_mode, DelayMode::Auto);
        assert_eq!(s.http.header_read_timeout, Duration::from_secs(75));
        assert_eq!(s.http.request_timeout, Duration::from_secs(30));
        assert_eq!((s.http.max_connections, s.http.max_in_flight), (1024, 100));
        assert_eq!(
            (
                s.database.max_connections,
                s.database.background_connections
            ),
            (10, 5)
        );
    }

    #[test]
    fn env_overrides_and_is_recorded() {
        let s = load(&[
            ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "ttl"),
            ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "15m"),
        ])
        .unwrap();
        assert_eq!(s.amqp.delay_mode, DelayMode::Ttl);
        assert_eq!(s.windows.payment, Duration::from_secs(900));
        assert_eq!(
            s.sources["amqp.delay_mode"],
            Source::Env("ORDER_TIMEOUT__AMQP__DELAY_MODE".into())
        );
    }

    #[test]
    fn wrong_values_name_their_key() {
        for (var, value, key) in [
            ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "fast", "amqp.delay_mode"),
            ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "soon", "windows.payment"),
            ("ORDER_TIMEOUT__WINDOWS__RECEIPT", "60d", "windows.receipt"),
            ("ORDER_TIMEOUT__HTTP__BIND", "localhost", "http.bind"),
            ("ORDER_TIMEOUT__AMQP__URL", "http://x", "amqp.url"),
            ("ORDER_TIMEOUT__AMQP__PREFETCH", "0", "amqp.prefetch"),
            ("ORDER_TIMEOUT__LOG__FORMAT", "xml", "log.format"),
            (
                "ORDER_TIMEOUT__HTTP__HEADER_READ_TIMEOUT",
                "0s",
                "http.header_read_timeout",
            ),
            (
                "ORDER_TIMEOUT__HTTP__REQUEST_TIMEOUT",
                "forever",
                "http.request_timeout",
            ),
            (
                "ORDER_TIMEOUT__HTTP__MAX_CONNECTIONS",
                "0",
                "http.max_connections",
            ),
            (
                "ORDER_TIMEOUT__HTTP__MAX_IN_FLIGHT",
                "-1",
                "http.max_in_flight",
            ),
            (
                "ORDER_TIMEOUT__DATABASE__BACKGROUND_CONNECTIONS",
                "0",
                "database.background_connections",
            ),
        ] {
            let err = load(&[(var, value)]).unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{err}");
        }
    }

    #[test]
    fn management_api_defaults_to_the_brokers_host_and_credentials() {
        let api = |env: &[(&str, &str)]| load(env).unwrap().amqp.management;
        let default = api(&[]).unwrap();
        assert_eq!(default.base, "http://127.0.0.1:15672");
        assert_eq!(
            (default.username.as_str(), default.password.expose()),
            ("guest", "guest")
        );
        assert_eq!(default.vhost, "/");
        let shop = api(&[(
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://shop:pw@mq.internal:5672/shop%2Fa",
        )])
        .unwrap();
        assert_eq!(shop.base, "http://mq.internal:15672");
        assert_eq!(
            (shop.username.as_str(), shop.vhost.as_str()),
            ("shop", "shop/a")
        );
        let given = api(&[
            ("ORDER_TIMEOUT__AMQP__URL", "amqp://shop:pw@mq:5672/shop"),
            (
                "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
                "http://ops:s%40id@mq-admin:8080/rabbit/api/",
            ),
        ])
        .unwrap();
        assert_eq!(given.base, "http://mq-admin:8080/rabbit");
        assert_eq!(
            (given.username.as_str(), given.password.expose()),
            ("ops", "s@id")
        );
        assert_eq!(given.vhost, "shop");
        assert_eq!(api(&[("ORDER_TIMEOUT__AMQP__MANAGEMENT_URL", "off")]), None);
        // amqps://: the default would be https, which this client cannot speak.
        assert_eq!(
            api(&[("ORDER_TIMEOUT__AMQP__URL", "amqps://u:p@mq:5671/%2f")]),
            None
        );
        for bad in ["https://mq:15671", "ftp://mq", "not a url"] {
            let err = load(&[("ORDER_TIMEOUT__AMQP__MANAGEMENT_URL", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("`amqp.management_url`"), "{bad}: {err}");
        }
        // Shown without the password.
        let shown = load(&[(
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            "http://ops:hunter2@mq:15672",
        )])
        .unwrap()
        .describe();
        assert!(!format!("{shown:?}").contains("hunter2"));
    }

    #[test]
    fn urls_that_libraries_would_quote_whole_stop_here_redacted() {
        for (var, value) in [
            ("ORDER_TIMEOUT__DATABASE__URL", "mariadb://u:hunter2pw@h/db"),
            (
                "ORDER_TIMEOUT__DATABASE__URL",
                "postgres://u:hunter2#pw@h/db",
            ),
            (
                "ORDER_TIMEOUT__DATABASE__URL",
                "postgres://u:hunter2?pw@h/db",
            ),
            (
                "ORDER_TIMEOUT__DATABASE__URL",
                "postgres://u:hunter2/pw@h/db",
            ),
            ("ORDER_TIMEOUT__DATABASE__URL", "oracle://u:hunter2pw@h/db"),
            ("ORDER_TIMEOUT__AMQP__URL", "amqp:u:hunter2pw@h"),
            ("ORDER_TIMEOUT__AMQP__URL", "amqp://u:hunter2#pw@h:5672/%2f"),
        ] {
            let err = load(&[(var, value)]).unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{value}: {err}");
            let key = if var.contains("DATABASE") {
                "database.url"
            } else {
                "amqp.url"
            };
            assert!(err.contains(&format!("`{key}`")), "{value}: {err}");
        }
        // Well-formed URLs pass, percent-encoded passwords included.
        for url in [
            "postgres://u:p%23w@h/db",
            "mysql://root@127.0.0.1:3306/x",
            "sqlite::memory:",
        ] {
            load(&[("ORDER_TIMEOUT__DATABASE__URL", url)]).unwrap();
        }
        let scrubbed = scrub_url(
            "error with 'postgres://u:p%23w@h/db' and p#w",
            "postgres://u:p%23w@h/db",
        );
        assert_eq!(scrubbed, "error with 'postgres://u:***@h/db' and ***");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = load(&[("ORDER_TIMEOUT__AMQP__DELAYMODE", "ttl")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`amqp.delaymode`"), "{err}");
    }

    #[test]
    fn file_layer_sits_between_defaults_and_env() {
        let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "[amqp]\nprefix = \"shop.t\"\nprefetch = 50\n[windows]\npayment = \"10m\"\n",
        )
        .unwrap();
        let env = [(
            "ORDER_TIMEOUT__WINDOWS__PAYMENT".to_string(),
            "5m".to_string(),
        )]
        .into_iter()
        .collect();
        let s = Settings::load(&SettingsSource {
            file: Some(path.clone()),
            env: Some(env),
        })
        .unwrap();
        assert_eq!(s.amqp.prefix, "shop.t");
        assert_eq!(s.amqp.prefetch, 50);
        assert_eq!(s.windows.payment, Duration::from_secs(300));
        assert_eq!(s.sources["amqp.prefix"], Source::File(path));
        std::fs::remove_dir_all(dir).unwrap();
    }

    const TOKEN_A: &str = "aaaaaaaa-0123456789";
    const TOKEN_B: &str = "bbbbbbbb-0123456789";

    #[test]
    fn tokens_parse_as_a_comma_separated_list() {
        let tokens = |v: &str| {
            parse_tokens("http.admin_tokens", v)
                .map(|t| t.iter().map(|s| s.expose().to_string()).collect::<Vec<_>>())
        };
        assert_eq!(tokens("").unwrap(), Vec::<String>::new());
        assert_eq!(tokens("  ").unwrap(), Vec::<String>::new());
        assert_eq!(tokens(TOKEN_A).unwrap(), [TOKEN_A]);
        // Rotation: old,new; spaces around the commas do not count.
        assert_eq!(
            tokens(&format!("{TOKEN_A}, {TOKEN_B}")).unwrap(),
            [TOKEN_A, TOKEN_B]
        );
        for (bad, why) in [
            ("short-token", "11 characters; at least 16"),
            (
                "has a space in it-0123456789",
                "token 1 contains whitespace",
            ),
            ("tab\tinside-0123456789", "token 1 contains whitespace"),
            ("non-ascii-é-0123456789", "not printable ASCII"),
        ] {
            let err = tokens(bad).unwrap_err().to_string();
            assert!(err.contains("`http.admin_tokens`"), "{err}");
            assert!(err.contains(why), "{bad}: {err}");
            assert!(!err.contains(bad), "a token is never shown: {err}");
        }
        let err = tokens(&format!("{TOKEN_A},,{TOKEN_B}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("token 2 is empty"), "{err}");
        let err = tokens(&format!("{TOKEN_A},{TOKEN_A}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("token 2 is given twice"), "{err}");
        assert!(!err.contains(TOKEN_A), "{err}");
    }

    #[test]
    fn one_token_in_both_scopes_is_refused() {
        let err = load(&[
            ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A),
            (
                "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
                &format!("{TOKEN_B},{TOKEN_A}"),
            ),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("`http.checkout_tokens`"), "{err}");
        assert!(err.contains("`http.admin_tokens`"), "{err}");
        assert!(!err.contains(TOKEN_A), "{err}");
    }

    #[test]
    fn a_reachable_bind_needs_tokens_or_an_explicitly_open_api() {
        for bind in [
            "0.0.0.0:8080",
            "10.1.2.3:8080",
            "[::]:8080",
            "[::ffff:10.0.0.1]:80",
        ] {
            let err = load(&[("ORDER_TIMEOUT__HTTP__BIND", bind)])
                .unwrap_err()
                .to_string();
            for key in [
                "`http.bind`",
                "`http.admin_tokens`",
                "`http.checkout_tokens`",
                "`http.allow_anonymous",
            ] {
                assert!(err.contains(key), "{bind}: {err}");
            }
            load(&[
                ("ORDER_TIMEOUT__HTTP__BIND", bind),
                ("ORDER_TIMEOUT__HTTP__ALLOW_ANONYMOUS", "true"),
            ])
            .unwrap();
            load(&[
                ("ORDER_TIMEOUT__HTTP__BIND", bind),
                ("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", TOKEN_A),
            ])
            .unwrap();
        }
        for loopback in [
            "127.0.0.1:0",
            "127.8.9.10:80",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            let s = load(&[("ORDER_TIMEOUT__HTTP__BIND", loopback)]).unwrap();
            assert!(!s.http.has_tokens());
        }
        let err = load(&[("ORDER_TIMEOUT__HTTP__PROTECT_OPERATIONS", "true")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`http.protect_operations`"), "{err}");
    }

    #[test]
    fn the_default_payment_window_stays_within_the_maximum() {
        let s = load(&[]).unwrap();
        assert_eq!(s.windows.max_payment, Duration::from_secs(7 * 86400));
        let err = load(&[("ORDER_TIMEOUT__WINDOWS__PAYMENT", "8d")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`windows.payment`"), "{err}");
        assert!(err.contains("`windows.max_payment` (7days)"), "{err}");
        let s = load(&[
            ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "8d"),
            ("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "10d"),
        ])
        .unwrap();
        assert_eq!(s.windows.payment, Duration::from_secs(8 * 86400));
        let err = load(&[("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "60d")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`windows.max_payment`"), "{err}");
    }

    #[test]
    fn secrets_are_redacted() {
        let s = Secret::new("amqp://shop:hunter2@rabbit:5672/%2f");
        assert!(!format!("{s:?} {s}").contains("hunter2"));
        assert!(!redact_url("postgres://u:hunter2@db/x?password=hunter2").contains("hunter2"));
        assert!(!redact_url("u:hunter2@db").contains("hunter2"));
        let token = Secret::opaque("hunter2-token-0123456789");
        assert_eq!(format!("{token:?} {token}"), "Secret(***) ***");
        let shown = load(&[
            ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A),
            (
                "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
                &format!("{TOKEN_B},hunter2-token-0123456789"),
            ),
        ])
        .unwrap();
        let described = format!("{:?} {shown:?}", shown.describe());
        for token in [TOKEN_A, TOKEN_B, "hunter2"] {
            assert!(!described.contains(token), "{described}");
        }
        assert!(described.contains("2 tokens (redacted)"), "{described}");
    }
}

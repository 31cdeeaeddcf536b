//! Typed, validated settings.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config FILE` or
//! `ORDER_TIMEOUT_CONFIG`), then `ORDER_TIMEOUT__SECTION__KEY` environment
//! variables. Every value is read as text and parsed here, so that a wrong value
//! stops start-up with a message naming its key, and an unknown key (a typo) is
//! refused instead of silently ignored.
//!
//! Each key is declared once, in the table of `keys.rs`: its doc line, type,
//! default, how its text is read, and whether a reload applies it (`[live]`).
//! A macro makes of it the section structs and [`Settings`], and the key
//! entries that the defaults layer, the known-key check, [`Settings::load`],
//! [`Settings::describe`], a reload and the settings file (`file.rs`:
//! `config/order-timeout.toml`, `order-timeout config`) all walk. A value's
//! type says how it is shown and whether it is a secret (`keys::Field`).
//! Checks across keys (`checks.rs`) run after their section's keys are read.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Environment variable prefix; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "ORDER_TIMEOUT";
/// Environment variable naming the TOML file when `--config` is not given.
pub const CONFIG_FILE_ENV: &str = "ORDER_TIMEOUT_CONFIG";
/// The largest delay the wire contract allows (the plugin's limit): 2^32-1 ms.
pub const MAX_DELAY: Duration = Duration::from_millis(crate::domain::MAX_DELAY_MS);

/// An enum read from one of its spellings (`auto`, `plugin`, `ttl`).
macro_rules! choice {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub enum $name {
            #[default]
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// Every value, in the order an error lists them.
            pub const ALL: [Self; [$($text),+].len()] = [$(Self::$variant),+];

            /// The configuration spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl crate::settings::keys::Field for $name {
            fn unset() -> Self {
                Self::default()
            }
            fn show(&self) -> String {
                self.as_str().to_string()
            }
        }
    };
}

choice! {
    /// How timeouts are delayed in the broker.
    DelayMode {
        /// Probe the broker at start-up: native where it holds quorum-queue
        /// delivery times, else the plugin where enabled, else ttl.
        Auto = "auto",
        /// The delayed-message exchange plugin keeps the messages.
        Plugin = "plugin",
        /// Binary TTL levels with dead-lettering; needs nothing but RabbitMQ itself.
        Ttl = "ttl",
        /// Quorum queues hold each timer until its delivery time (RabbitMQ 4.3 and later).
        Native = "native",
    }
}

choice! {
    /// Which kind of queue holds the timers (`amqp.queue_type`).
    QueueType {
        /// Classic queues, version 2: single node, fastest.
        Classic = "classic",
        /// Quorum queues: replicated (Raft), so timers survive losing a node.
        Quorum = "quorum",
    }
}

choice! {
    /// How log lines are written.
    LogFormat {
        /// Human-readable lines for a terminal.
        Pretty = "pretty",
        /// One JSON object per line, for log shippers.
        Json = "json",
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
pub use keys::{
    AmqpSettings, ConsumerSettings, DatabaseSettings, HttpSettings, LogSettings, ManagementApi,
    MetricsSettings, RelaySettings, Settings, SweeperSettings, TracingSettings, Windows,
};
use keys::{SECTIONS, keys};
pub use live::{Change, changes, check_applied, is_live, live_keys};
pub use mapping::{KindMapping, MappingSettings, OrdersSource, StockMapping, Zone};
use mapping::{check_mapping, parse_ident, parse_release_sql, parse_status, parse_time_zone};
pub use parse::{MIN_TOKEN_LEN, parse_duration, parse_tokens, parse_window};
use parse::{
    parse_bind, parse_bool, parse_choice, parse_log_level, parse_otlp_endpoint, parse_range,
    parse_ratio, parse_retention, parse_service_name,
};
pub use secret::{REDACTED, Secret, redact_url};

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
        let sources = merged.iter().map(|(k, (_, s))| (k.clone(), s.clone()));
        let mut settings = Settings::unread(sources.collect());
        for section in SECTIONS {
            for key in section.keys {
                let (text, source) = &merged[key.name];
                (key.read)(key.name, text, &mut settings)?;
                if *source != Source::Default {
                    let shown = (key.written)(text);
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

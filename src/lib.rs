//! order-timeout closes e-commerce orders whose deadline passed: an unpaid order
//! is cancelled when its payment window ends and its stock goes back on sale; a
//! paid order not shipped in time is flagged; a shipped order never confirmed is
//! completed. RabbitMQ keeps the deadlines, the database decides.
//!
//! The map of the crate, one line per module, from the bottom up:
//! - [`domain`]: ids, statuses, the order state diagram as one table, timeout kinds, time;
//! - [`settings`]: typed, validated configuration (defaults, TOML file, environment);
//! - [`broker`]: the delay stage in use and every exchange and queue name;
//! - [`http_client`]: a small JSON client (the broker's management API, `demo`);
//! - [`db`]: the connection, entities, and every transaction by family ([`db::store`]);
//! - [`orders`]: whose orders the timeouts act on: the service's own, or a shop's mapped table;
//! - [`logs`]: log output, and its level changed while running;
//! - [`traces`]: OpenTelemetry spans, and their context carried in message headers and outbox rows;
//! - [`telemetry`]: what operators are told: every event logged and counted in one place, and the metrics table;
//! - [`control`]: which roles are paused (pause and resume while running);
//! - [`reload`]: reading the settings again while running, and what applies;
//! - [`backoff`]: waiting between attempts, cut short by shutdown;
//! - [`context`]: what the components share (settings, pools, telemetry, health, roles);
//! - [`pausing`]: pausing a role for every instance (kept in the database) or for this one, and following other instances' pauses;
//! - [`apply`]: applying a batch of timeouts, halved on refusal: the one loop of the consumer, its catch-up and the sweeper;
//! - [`amqp`]: connections and supervision, topology, wire contract, router, consumer, relay;
//! - [`sweeper`]: the safety net that applies overdue transitions by itself;
//! - [`gauges`]: the on-call gauges of pending and overdue orders, read from the database;
//! - [`retention`]: the audit trail of a mapped table, deleted in bounded batches past `audit.retention`;
//! - [`auth`]: bearer tokens, their scopes, and what each route needs;
//! - [`http`]: the JSON API, its OpenAPI document, and the operator's page `/ui`;
//! - [`server`]: serving the API with timeouts and caps;
//! - [`app`]: build and run every component, and shut them down;
//! - [`commands`]: the command line and the subcommands around the service (`doctor`, `demo`, `ctl`).
//!
//! [`VERSION`] and [`COMMIT`] say which build this is (`--version`, the
//! start-up log, `order_timeout_build_info`).

pub mod amqp;
pub mod app;
pub(crate) mod apply;
pub(crate) mod auth;
pub(crate) mod backoff;
pub mod broker;
pub mod commands;
pub mod context;
pub(crate) mod control;
pub mod db;
pub mod domain;
pub(crate) mod gauges;
pub mod http;
pub(crate) mod http_client;
pub(crate) mod logs;
pub(crate) mod orders;
pub(crate) mod pausing;
pub(crate) mod reload;
pub mod retention;
pub(crate) mod server;
pub mod settings;
pub(crate) mod shadow;
pub mod sweeper;
pub(crate) mod telemetry;
pub mod traces;
pub(crate) mod zone_check;

/// The release this binary is (Cargo.toml's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit it was built from: 12 hex digits from git, what
/// `ORDER_TIMEOUT_COMMIT` said at build time without `.git`, or `unknown`
/// (build.rs).
pub const COMMIT: &str = env!("ORDER_TIMEOUT_BUILD_COMMIT");

/// `VERSION (COMMIT)`, as `--version` prints it after the binary's name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("ORDER_TIMEOUT_BUILD_COMMIT"),
    ")"
);

//! order-timeout closes e-commerce orders whose deadline passed: an unpaid order
//! is cancelled when its payment window ends and its stock goes back on sale; a
//! paid order not shipped in time is flagged; a shipped order never confirmed is
//! completed. RabbitMQ keeps the deadlines, the database decides.
//!
//! The map of the crate, one line per module, from the bottom up:
//! - [`domain`]: ids, statuses, the order state diagram as one table, timeout kinds, time;
//! - [`settings`]: typed, validated configuration (defaults, TOML file, environment);
//! - [`http_client`]: a small JSON client (the broker's management API, `demo`);
//! - [`db`]: the connection, entities, and every transaction by family ([`db::store`]);
//! - [`orders`]: whose orders the timeouts act on: the service's own, or a shop's mapped table;
//! - [`events`]: every event, logged and counted in one place, and the metrics table;
//! - [`control`]: which roles are paused (pause and resume while running);
//! - [`reload`]: reading the settings again while running, and what applies;
//! - [`backoff`]: waiting between attempts, cut short by shutdown;
//! - [`context`]: what the components share (settings, pools, events, health, roles);
//! - [`apply`]: applying a batch of timeouts, halved on refusal: the one loop of the consumer, its catch-up and the sweeper;
//! - [`amqp`]: connections and supervision, topology, wire contract, router, consumer, relay;
//! - [`sweeper`]: the safety net that applies overdue transitions by itself;
//! - [`gauges`]: the on-call gauges of pending and overdue orders, read from the database;
//! - [`auth`]: bearer tokens, their scopes, and what each route needs;
//! - [`http`]: the JSON API and its OpenAPI document;
//! - [`server`]: serving the API with timeouts and caps;
//! - [`telemetry`]: log output;
//! - [`app`]: build and run every component, and shut them down;
//! - [`doctor`]: the `doctor` subcommand's checks;
//! - [`demo`]: the `demo` subcommand;
//! - [`ctl`]: the `ctl` subcommand, a client of a running instance's `/admin` API;
//! - [`cli`]: the command line.

pub mod amqp;
pub mod app;
pub mod apply;
pub mod auth;
pub mod backoff;
pub mod cli;
pub mod context;
pub mod control;
pub mod ctl;
pub mod db;
pub mod demo;
pub mod doctor;
pub mod domain;
pub mod events;
pub mod gauges;
pub mod http;
pub mod http_client;
pub mod orders;
pub mod reload;
pub mod server;
pub mod settings;
pub mod sweeper;
pub mod telemetry;

//! order-timeout closes e-commerce orders whose deadline passed: an unpaid order
//! is cancelled when its payment window ends and its stock goes back on sale; a
//! paid order not shipped in time is flagged; a shipped order never confirmed is
//! completed. RabbitMQ keeps the deadlines, the database decides.
//!
//! The map of the crate:
//! - [`settings`]: typed, validated configuration (defaults, TOML, environment);
//! - [`domain`]: ids, statuses and transitions, timeout kinds, timestamps;
//! - [`db`]: the connection, migrations, and every transaction ([`db::store`]);
//! - [`amqp`]: the wire contract, the topology of both delay modes, the router,
//!   the consumers and the outbox relay, each on a supervised connection;
//! - [`sweeper`]: the safety net that applies overdue transitions by itself;
//! - [`http`]: the JSON API, behind [`auth`] (bearer tokens and their
//!   scopes); [`server`]: serving it, with timeouts and caps; [`metrics`]:
//!   events that log and count;
//! - [`context`]: what the components share (settings, pools, events, health),
//!   below every subsystem that takes it;
//! - [`app`]: wiring and the run loop; [`doctor`] and [`cli`]: the subcommands;
//!   [`demo`]: the live demo;

pub mod amqp;
pub mod app;
pub mod auth;
pub mod cli;
pub mod context;
pub mod db;
pub mod demo;
pub mod doctor;
pub mod domain;
pub mod http;
pub mod metrics;
pub mod server;
pub mod settings;
pub mod sweeper;
pub mod telemetry;

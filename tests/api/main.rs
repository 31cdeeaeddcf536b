//! Integration tests: one binary, real RabbitMQ, real databases.
//! Each test gets its own vhost and database (see `helpers`).

mod helpers;

/// Runs a scenario `async fn name(Backend, DelayMode)` on SQLite and PostgreSQL,
/// in TTL mode always and in plugin mode when the broker offers it.
macro_rules! matrix {
    ($name:ident) => {
        mod $name {
            use crate::helpers::{Backend, DelayMode, run};
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_ttl() {
                run(Backend::Sqlite, DelayMode::Ttl, super::$name).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_ttl() {
                run(Backend::Postgres, DelayMode::Ttl, super::$name).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_plugin() {
                run(Backend::Sqlite, DelayMode::Plugin, super::$name).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_plugin() {
                run(Backend::Postgres, DelayMode::Plugin, super::$name).await
            }
        }
    };
}

mod auth;
mod core;
mod dashboard;
mod examples;
mod hardening;
mod hostile_input;
mod http_limits;
mod idempotency;
mod instances;
mod lifecycle;
mod metrics;
mod openapi;
mod outages;
mod settings;
mod stages;
mod tls;
mod topology;

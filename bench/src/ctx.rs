//! What every phase of a run needs, made once the run's vhost, database and
//! service are up: the HTTP client, the bench's own database connection, the
//! broker URL of the run's vhost, and the service's settings the ceiling reuses.

use anyhow::Context as _;
use sea_orm::DatabaseConnection;

use crate::env::Management;

/// What every phase needs.
pub(crate) struct RunCtx {
    /// HTTP client for the service's API.
    pub(crate) http: reqwest::Client,
    /// The bench's own connection to the service's database.
    pub(crate) db: DatabaseConnection,
    /// The broker URL of the run's vhost.
    pub(crate) amqp_url: String,
    /// The management API.
    pub(crate) management: Management,
    /// The run's vhost.
    pub(crate) vhost: String,
    /// `ttl`, `plugin` or `native`.
    pub(crate) mode: String,
    /// Why that mode (`--mode`, or the service's `auto` on this broker).
    pub(crate) mode_why: String,
    /// The broker under test: `{ "version", "node" }`, as the reports give it.
    pub(crate) broker: serde_json::Value,
    /// The pid of its node on this machine, when known (else every
    /// `beam.smp` counts as the broker's CPU).
    pub(crate) broker_pid: Option<u32>,
    /// `postgres` or `sqlite`.
    pub(crate) db_kind: String,
    /// `amqp.prefetch` of the service (and of the ceiling's consumer).
    pub(crate) prefetch: u16,
    /// `consumer.batch_size` of the service (and of both ceilings).
    pub(crate) batch_size: usize,
    /// `amqp.prefix` (names of the service's queues).
    pub(crate) prefix: String,
}

impl RunCtx {
    /// A connection of the bench's own to the run's vhost, named
    /// `order-timeout bench <role>` in the management UI.
    pub(crate) async fn broker(&self, role: &str) -> anyhow::Result<lapin::Connection> {
        let name = format!("order-timeout bench {role}");
        lapin::Connection::connect(
            &self.amqp_url,
            lapin::ConnectionProperties::default().with_connection_name(name.into()),
        )
        .await
        .with_context(|| format!("connecting the bench's {role} connection to the run's vhost"))
    }
}

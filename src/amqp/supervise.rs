//! Supervision: each broker role runs for ever, reconnecting with backoff,
//! and the router declares the topology on each of its (re)connects.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lapin::Connection;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Error;
use super::connection::{Backoff, close_within, connect_to_any, connection_name, pause};
use super::mode::delay_mode;
use super::topology::{self, Mode};
use crate::context::{Context, Role};

/// The role that declares the topology on each of its (re)connects: the router
/// runs in every mode and every instance, and must exist before anything flows.
pub const DECLARER: Role = Role::Router;

/// Runs a broker worker for ever: connect, resolve the mode, declare the topology,
/// work until the connection fails, then reconnect with backoff. Returns when
/// `shutdown` fires and the worker has finished what it holds.
pub async fn supervise<F, Fut>(
    ctx: Arc<Context>,
    role: Role,
    shutdown: CancellationToken,
    mut work: F,
) where
    F: FnMut(Arc<Connection>, Mode) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    while !shutdown.is_cancelled() {
        let attempt = async {
            let mode = delay_mode(&ctx).await?;
            let (conn, node) = connect_to_any(&ctx.settings.amqp, role.as_str()).await?;
            if role == DECLARER {
                let earlier =
                    topology::declare(&conn, &ctx.names, mode, ctx.settings.amqp.queue_type)
                        .await?;
                if !earlier.is_empty() {
                    ctx.telemetry.earlier_topology(&earlier);
                }
                ctx.topology_declared();
            } else {
                // Declared once per (re)connect by the router, not by every role.
                ctx.wait_topology().await;
            }
            Ok::<_, lapin::Error>((Arc::new(conn), mode, node))
        };
        let connected = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = attempt => r,
        };
        let error = match connected {
            Ok((conn, mode, node)) => {
                ctx.telemetry.broker_connected(
                    role.as_str(),
                    &connection_name(&ctx.settings.amqp, role.as_str()),
                    &node.address,
                );
                ctx.health.set_node(role, Some(node.address));
                ctx.health.set_broker(role, true);
                let started = Instant::now();
                let result = work(conn.clone(), mode).await;
                ctx.health.set_broker(role, false);
                ctx.health.set_node(role, None);
                close_within(conn.close(200, "bye".into())).await;
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                match result {
                    Ok(()) => break,
                    Err(e) => e.to_string(),
                }
            }
            Err(e) => e.to_string(),
        };
        let delay = backoff.next_delay();
        ctx.telemetry.broker_lost(role.as_str(), &error, delay);
        if !pause(&shutdown, delay).await {
            break;
        }
    }
}

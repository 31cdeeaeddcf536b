//! Everything that talks to RabbitMQ: connections (each named, each supervised
//! and re-established with backoff), the topology, the router, the consumers and
//! the outbox relay.

pub mod consumer;
pub mod definitions;
pub mod disposition;
pub mod management;
pub mod relay;
pub mod router;
pub mod topology;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lapin::Confirmation;
use lapin::message::Delivery;
use lapin::options::{BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, Role};
use crate::domain::{Millis, TimeoutKind};
use crate::settings::{AmqpSettings, DelayMode};
use topology::{Mode, Names};
use wire::Park;

/// What stops a broker worker; the supervisor logs it and reconnects.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connection or channel failed.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused to take responsibility for a message.
    #[error("the broker nacked a publish to '{0}'")]
    Nacked(String),
    /// The broker returned a message as unroutable (only a `mandatory` publish
    /// can be returned, and [`publish_options`] never sets it).
    #[error("the broker returned a publish to '{0}' as unroutable")]
    Returned(String),
    /// A publish on a channel without confirms: nobody knows whether it is safe.
    #[error("a publish to '{0}' was made on a channel without publisher confirms")]
    Unconfirmed(String),
    /// The connection's event stream ended: the connection is gone.
    #[error("the broker connection ended")]
    ConnectionEnded,
    /// The broker cancelled our consumer (queue deleted, for example).
    #[error("the broker ended the consumer of '{0}'")]
    ConsumerEnded(String),
}

/// Opens a connection whose name shows in the management UI as
/// `order-timeout <instance> <role>`, so operators (and tests) can tell ours apart.
pub async fn connect(settings: &AmqpSettings, role: &str) -> Result<Connection, lapin::Error> {
    let name = connection_name(settings, role);
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    // For amqps:// URLs: the system's roots, plus the configured CA file if any.
    let tls = lapin::tcp::OwnedTLSConfig {
        identity: None,
        cert_chain: settings.tls_ca_pem.clone(),
    };
    Connection::connect_with_config(
        settings.url.expose(),
        properties,
        tls,
        lapin::runtime::default_runtime()?,
    )
    .await
}

/// The client-provided name of a connection of this instance.
pub fn connection_name(settings: &AmqpSettings, role: &str) -> String {
    format!("order-timeout {} {role}", settings.instance)
}

/// Resolves `amqp.delay_mode`: `plugin` and `ttl` as configured; `auto`
/// probes the broker on a connection of its own.
pub async fn resolve_mode(
    settings: &AmqpSettings,
    names: &Names,
) -> Result<(Mode, String), lapin::Error> {
    let plugin = match settings.delay_mode {
        DelayMode::Auto => {
            let conn = connect(settings, "probe").await?;
            let found = topology::probe_plugin(&conn, names).await;
            // The probe may already have closed the connection; either way it goes.
            let _ = conn.close(200, "probe done".into()).await;
            found?
        }
        // Not probed: declaring the plugin's exchange fails loudly without it.
        DelayMode::Plugin => true,
        DelayMode::Ttl => false,
    };
    Ok(choose_mode(settings.delay_mode, plugin))
}

/// The one decision of the delay mode: what `configured` means on a broker
/// that has the plugin or not, with the reason in words. (`plugin` configured
/// on a broker without it stays `plugin`: the declaration then fails, and
/// `doctor` says why.)
pub fn choose_mode(configured: DelayMode, plugin: bool) -> (Mode, String) {
    match (configured, plugin) {
        (DelayMode::Ttl, _) => (Mode::Ttl, "amqp.delay_mode = ttl".into()),
        (DelayMode::Plugin, _) => (Mode::Plugin, "amqp.delay_mode = plugin".into()),
        (DelayMode::Auto, true) => (
            Mode::Plugin,
            "auto: the broker offers the x-delayed-message exchange type".into(),
        ),
        (DelayMode::Auto, false) => (
            Mode::Ttl,
            "auto: the broker has no x-delayed-message exchange type (plugin not enabled)".into(),
        ),
    }
}

/// Exponential backoff with a cap, for reconnects and database pauses.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, doubles up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }
    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    /// Back to the first wait (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Sleeps unless shutdown comes first; returns false on shutdown.
pub async fn pause(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// The role that declares the topology on each of its (re)connects: the router
/// runs in every mode and every instance, and must exist before anything flows.
pub const DECLARER: Role = Role::Router;

/// The delay mode in effect, resolved on first use (probing the broker for the
/// plugin when `amqp.delay_mode = auto`) and kept in the context.
pub async fn delay_mode(ctx: &Context) -> Result<Mode, lapin::Error> {
    let (mode, _) = ctx
        .mode
        .get_or_try_init(|| async {
            let (mode, why) = resolve_mode(&ctx.settings.amqp, &ctx.names).await?;
            ctx.events
                .delay_mode_chosen(mode.as_str(), &why.to_string());
            Ok::<_, lapin::Error>((mode, why))
        })
        .await?;
    Ok(*mode)
}

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
            let conn = connect(&ctx.settings.amqp, role.as_str()).await?;
            if role == DECLARER {
                let earlier =
                    topology::declare(&conn, &ctx.names, mode, ctx.settings.amqp.queue_type)
                        .await?;
                if !earlier.is_empty() {
                    ctx.events.earlier_topology(&earlier);
                }
                ctx.topology_declared();
            } else {
                // Declared once per (re)connect by the router, not by every role.
                ctx.wait_topology().await;
            }
            Ok::<_, lapin::Error>((Arc::new(conn), mode))
        };
        let connected = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = attempt => r,
        };
        let error = match connected {
            Ok((conn, mode)) => {
                ctx.events.broker_connected(
                    role.as_str(),
                    &connection_name(&ctx.settings.amqp, role.as_str()),
                );
                ctx.health.set_broker(role, true);
                let started = Instant::now();
                let result = work(conn.clone(), mode).await;
                ctx.health.set_broker(role, false);
                let _ = conn.close(200, "bye".into()).await;
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
        ctx.events.broker_lost(role.as_str(), &error, delay);
        if !pause(&shutdown, delay).await {
            break;
        }
    }
}

/// The two channels of a consuming role: one for deliveries, with an explicit
/// prefetch, and one in confirm mode for what it publishes (parked copies,
/// routed and re-delayed messages), so a publish is known safe before the
/// delivery it came from is acked.
pub async fn channels(
    conn: &Connection,
    prefetch: u16,
) -> Result<(Channel, Channel), lapin::Error> {
    let consume = conn.create_channel().await?;
    consume
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let publish = conn.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok((consume, publish))
}

/// The options of every publish the service makes. Never `mandatory`: the
/// delayed-message plugin routes a message to nowhere when it is published (it
/// routes when the delay ends), so it returns every delayed message as
/// unroutable while still scheduling it (seen on 3.10 and 4.0: a return taken
/// for a failure and published again doubles the timer); and every other
/// exchange of ours always has a route. Never
/// `immediate`: RabbitMQ refuses it.
pub fn publish_options() -> BasicPublishOptions {
    BasicPublishOptions {
        mandatory: false,
        immediate: false,
    }
}

/// Publishes and waits for the broker's confirm; a nack, or a message the
/// broker returned, is an error.
pub async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), Error> {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            publish_options(),
            body,
            properties,
        )
        .await?
        .await?;
    confirmed(confirm, exchange)
}

/// What a publisher confirm means: the message is safe with the broker only on
/// a plain ack; anything else is an error naming the exchange.
pub fn confirmed(confirm: Confirmation, exchange: &str) -> Result<(), Error> {
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(Error::Returned(exchange.to_string())),
        Confirmation::Nack(_) => Err(Error::Nacked(exchange.to_string())),
        // Every publishing channel of ours is in confirm mode: this is a bug.
        Confirmation::NotRequested => Err(Error::Unconfirmed(exchange.to_string())),
    }
}

/// Copies a delivery to the parked queue with the reason (confirmed), then acks
/// it. Parking is how bad input is kept: never requeued in a loop, never dropped.
pub async fn park_delivery(
    ctx: &Context,
    channel: &Channel,
    delivery: &Delivery,
    park: &Park,
    by: &'static str,
    kind: Option<TimeoutKind>,
) -> Result<(), Error> {
    let properties = wire::parked_properties(
        &delivery.properties,
        park,
        by,
        delivery.exchange.as_str(),
        delivery.routing_key.as_str(),
        Millis::now(),
    );
    let parked = ctx.names.parked();
    publish_confirmed(
        channel,
        &parked,
        delivery.routing_key.as_str(),
        &delivery.data,
        properties,
    )
    .await?;
    delivery.acker.ack(Default::default()).await?;
    ctx.events.parked(
        park.reason.as_str(),
        &park.detail,
        by,
        delivery.routing_key.as_str(),
        kind,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin returns every `mandatory` publish to a delayed exchange as
    /// unroutable (checked on the real plugin by the integration tests), so
    /// no publish of ours may set it.
    #[test]
    fn no_publish_is_mandatory() {
        let options = publish_options();
        assert!(!options.mandatory);
        assert!(!options.immediate);
    }

    #[test]
    fn only_a_plain_ack_is_safe() {
        assert!(confirmed(Confirmation::Ack(None), "x").is_ok());
        assert!(matches!(
            confirmed(Confirmation::Nack(None), "x"),
            Err(Error::Nacked(x)) if x == "x"
        ));
        assert!(matches!(
            confirmed(Confirmation::NotRequested, "x"),
            Err(Error::Unconfirmed(_))
        ));
    }
}

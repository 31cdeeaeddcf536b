//! Connections to the broker, each named for the management UI; the backoff
//! and the shutdown-aware pause of every retry; the channels of a consuming
//! role.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::{BasicQosOptions, ConfirmSelectOptions};
use lapin::{Channel, Connection, ConnectionProperties, Event};

use super::Error;
pub use crate::backoff::{Backoff, pause};
use crate::settings::{AmqpSettings, redact_url};

/// How long closing a connection or a channel may take. lapin completes a
/// close when the broker answers it, and a connection whose socket has just
/// failed (a broker restart) may not have told its waiters yet: that close
/// would wait for ever, and its role with it. The outcome of a close is never
/// needed, so every close is bounded.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// Waits for `close` (of a connection, a channel or a link) at most
/// [`CLOSE_WITHIN`].
pub async fn close_within<T>(close: impl std::future::Future<Output = T>) {
    let _ = tokio::time::timeout(CLOSE_WITHIN, close).await;
}

/// What an event of a role's own connection means to the role listening for
/// it: the connection's error or end stop the role (its supervisor
/// reconnects); a block by a resource alarm goes to `blocked`; the rest is
/// nothing.
pub(super) fn connection_event(
    event: Option<Event>,
    blocked: impl FnOnce(&str),
) -> Result<(), Error> {
    match event {
        Some(Event::Error(e)) => Err(e.into()),
        Some(Event::ConnectionBlocked(reason)) => {
            blocked(&reason);
            Ok(())
        }
        Some(_) => Ok(()),
        None => Err(Error::ConnectionEnded),
    }
}

/// Opens a connection whose name shows in the management UI as
/// `order-timeout <instance> <role>`, so operators (and tests) can tell ours apart.
pub async fn connect(settings: &AmqpSettings, role: &str) -> Result<Connection, lapin::Error> {
    connect_to_any(settings, role).await.map(|(conn, _)| conn)
}

/// Where a connection went: the address of `amqp.url` it was opened to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `host:port`, no credentials: safe to show.
    pub address: String,
}

/// The next address a connection starts from: each connect of this process
/// starts one further along `amqp.url`, so that the roles of an instance
/// spread over a cluster's nodes, and a reconnect after a node is lost goes
/// to the next one first.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// [`connect`], saying which node it reached. With several addresses (a
/// cluster), each is tried in turn from the next one along, until one
/// accepts; the error is the last address's.
pub async fn connect_to_any(
    settings: &AmqpSettings,
    role: &str,
) -> Result<(Connection, Node), lapin::Error> {
    let addresses = settings.addresses();
    let first = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut last = None;
    for n in 0..addresses.len() {
        let address = addresses[(first + n) % addresses.len()];
        match connect_to_address(settings, role, address).await {
            Ok(conn) => return Ok((conn, node(address))),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(lapin::Error::from(
        lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed),
    )))
}

/// The `host:port` of an address of `amqp.url` (already validated).
fn node(address: &str) -> Node {
    let address = match address.parse::<lapin::uri::AMQPUri>() {
        Ok(uri) => format!("{}:{}", uri.authority.host, uri.authority.port),
        Err(_) => "?".to_string(),
    };
    Node { address }
}

/// A connection to one address of `amqp.url` (`doctor` checks each).
pub async fn connect_to_address(
    settings: &AmqpSettings,
    role: &str,
    address: &str,
) -> Result<Connection, lapin::Error> {
    let name = connection_name(settings, role);
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    // For amqps:// URLs: the system's roots, plus the configured CA file if any.
    let tls = lapin::tcp::OwnedTLSConfig {
        identity: None,
        cert_chain: settings.tls_ca_pem.clone(),
    };
    let connect = Connection::connect_with_config(
        address,
        properties,
        tls,
        lapin::runtime::default_runtime()?,
    );
    // lapin's connect has no deadline of its own (it ignores the URL's
    // `connection_timeout`): a node that drops SYNs would cost the OS's
    // ~2 minutes, one that accepts TCP and never speaks AMQP for ever, and the
    // role's reconnect with it. Past the deadline this address counts as down.
    let limit = settings.connect_timeout;
    match tokio::time::timeout(limit, connect).await {
        Ok(connected) => connected,
        Err(_) => Err(connect_timed_out(address, limit)),
    }
}

/// The error of a connect that took longer than `amqp.connect_timeout`,
/// naming the address (without its password) since it is logged and shown by
/// `doctor`.
fn connect_timed_out(address: &str, limit: Duration) -> lapin::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "{}: no AMQP connection within {} (amqp.connect_timeout): TCP connect or handshake timed out",
            redact_url(address),
            humantime::format_duration(limit)
        ),
    )
    .into()
}

/// The client-provided name of a connection of this instance.
pub fn connection_name(settings: &AmqpSettings, role: &str) -> String {
    format!("order-timeout {} {role}", settings.instance)
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

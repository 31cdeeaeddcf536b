//! The native stage's worker, the deferrer: it holds each timer of
//! `<prefix>.wait` in the quorum queue itself until the timer's delivery time,
//! then lets the queue dead-letter it into `due`.
//!
//! RabbitMQ 4.3 and later keep a message returned with the AMQP 1.0 `modified`
//! outcome (`delivery-failed` false) and the message annotation
//! `x-opt-delivery-time` (a *symbol* key; ms since the epoch) until that
//! instant, in the queue's replicated state, then deliver it again. So every
//! timer passes through here twice: when it arrives (deferred to the instant
//! it carries, [`X_DELIVERY_TIME`]) and when it comes back (rejected, which the
//! queue dead-letters into `due`, at least once). Nothing waits in this
//! process: a restart of the service, or of a node, leaves every timer where
//! it was, and the queue has no delivery limit to drop one that came back
//! many times.
//!
//! AMQP 0-9-1 has neither outcome, so this one worker speaks AMQP 1.0
//! (fe2o3-amqp), on its own connection to a node of `amqp.url`; everything
//! else is lapin. It runs in native mode, and in any other mode while the
//! queue exists, so that switching away from native mode still drains the
//! timers held there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{Body, Message, Modified};
use fe2o3_amqp::types::primitives::{OrderedMap, Symbol, Value};
use fe2o3_amqp::{Connection as Amqp10, Receiver, Session};
use futures_util::StreamExt;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, Event};
use tokio_util::sync::CancellationToken;

use super::Error;
use super::connection::close_within;
use super::topology::{Mode, Names, X_DELIVERY_TIME};
use crate::context::Context;
use crate::domain::Millis;
use crate::settings::AmqpSettings;

/// How many timers the broker may send ahead of the deferrer's settling them.
const CREDIT: u32 = 1000;

/// The AMQP 1.0 connection's idle time-out: the broker sends a frame at
/// least every half of it, and a connection silent for longer is taken as
/// lost (as lapin's heartbeat does on AMQP 0-9-1, RabbitMQ's 60 s).
const IDLE_TIME_OUT_MS: u32 = 60_000;

/// Annotation counting how many times the deferrer held a timer: one that
/// comes back with it set, before its time by this host's clock, was let go
/// early by the broker.
const X_DEFERRALS: &str = "x-opt-order-timeout-deferrals";

/// A timer that comes back at most this much before its time (by this host's
/// clock: the broker's may be a little ahead) is let into `due`: the consumer
/// holds the rest against the database's deadline.
const EARLY_SLACK_MS: i64 = 1000;

/// What the deferrer does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Hold it in the queue until this instant (ms since the epoch).
    Defer(i64),
    /// Its time has come: reject it, so the queue dead-letters it into `due`.
    Release,
}

/// Decides what to do with a timer that carries `at` (its delivery time, if
/// any), has been deferred `deferrals` times, at this host's time `now`.
///
/// A timer the broker lets go well before its time although it was deferred
/// (its clock is ahead of this host's) is deferred again by as much again, so
/// that it comes back at its time by this host's clock instead of spinning
/// between the queue and here; one less than [`EARLY_SLACK_MS`] early goes on
/// (the consumer holds it). A timer without a delivery time (put into the
/// queue by hand, or by a version that did not stamp it) goes on at once:
/// the consumer checks it against the database, which re-delays it if early.
pub fn decide(at: Option<i64>, deferrals: i64, now: i64) -> Decision {
    match at {
        Some(at) if at > now => {
            let early = at - now;
            if deferrals == 0 {
                Decision::Defer(at)
            } else if early <= EARLY_SLACK_MS {
                Decision::Release
            } else {
                Decision::Defer(at.saturating_add(early))
            }
        }
        _ => Decision::Release,
    }
}

/// Reads an integer message annotation (RabbitMQ sends a 64-bit `long`; any
/// integer width or a timestamp is taken).
fn annotation(message: &Message<Body<Value>>, name: &str) -> Option<i64> {
    let annotations = message.message_annotations.as_ref()?;
    let (_, value) = annotations
        .0
        .iter()
        .find(|(k, _)| matches!(k, OwnedKey::Symbol(Symbol(s)) if s == name))?;
    match value {
        Value::Long(v) => Some(*v),
        Value::Int(v) => Some(i64::from(*v)),
        Value::Ulong(v) => i64::try_from(*v).ok(),
        Value::Uint(v) => Some(i64::from(*v)),
        Value::Timestamp(t) => Some(t.milliseconds()),
        _ => None,
    }
}

/// The `modified` outcome that holds a timer until `at`: the annotation keys
/// must be AMQP symbols (a string key is ignored and the message comes back
/// at once).
fn hold_until(at: i64, deferrals: i64) -> Modified {
    let mut annotations = OrderedMap::new();
    annotations.insert(Symbol::from(X_DELIVERY_TIME), Value::Long(at));
    annotations.insert(Symbol::from(X_DEFERRALS), Value::Long(deferrals + 1));
    Modified {
        delivery_failed: Some(false),
        undeliverable_here: Some(false),
        message_annotations: Some(annotations),
    }
}

/// What went wrong on the AMQP 1.0 side, as text (the worker's error type is
/// the AMQP layer's).
fn amqp10(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Amqp10(format!("{what}: {e}"))
}

/// An AMQP 1.0 connection to `address` (an address of `amqp.url`), as
/// `name`, in the URL's vhost, within `amqp.connect_timeout`. `amqps://` is
/// TLS from the first byte, trusting the system's roots and
/// `amqp.tls_ca_file`, as lapin's connections do.
pub async fn open(
    settings: &AmqpSettings,
    address: &str,
    name: &str,
) -> Result<ConnectionHandle<()>, Error> {
    let uri: lapin::uri::AMQPUri = address.parse().map_err(|e| amqp10("amqp.url", e))?;
    let hostname = format!("vhost:{}", uri.vhost);
    let host = uri.authority.host.clone();
    let port = uri.authority.port;
    let at = format!("{host}:{port}");
    let builder = || {
        Amqp10::builder()
            .container_id(name)
            .hostname(hostname.as_str())
            .idle_time_out(IDLE_TIME_OUT_MS)
            .scheme("amqp")
            .sasl_profile(SaslProfile::Plain {
                username: uri.authority.userinfo.username.clone(),
                password: uri.authority.userinfo.password.clone(),
            })
    };
    let open = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| amqp10(&at, e))?;
        let opened = if uri.scheme == lapin::uri::AMQPScheme::AMQPS {
            let tls = tls(stream, &host, settings.tls_ca_pem.as_deref()).await?;
            builder().open_with_stream(tls).await
        } else {
            builder().open_with_stream(stream).await
        };
        opened.map_err(|e| amqp10(&format!("AMQP 1.0 at {at}"), e))
    };
    match tokio::time::timeout(settings.connect_timeout, open).await {
        Ok(opened) => opened,
        Err(_) => Err(Error::Amqp10(format!(
            "{at}: no AMQP 1.0 connection within {} (amqp.connect_timeout)",
            humantime::format_duration(settings.connect_timeout)
        ))),
    }
}

/// TLS over `stream` to `host`, with rustls (ring) as lapin uses it: the
/// system's roots plus the certificates of `amqp.tls_ca_file`.
async fn tls(
    stream: tokio::net::TcpStream,
    host: &str,
    ca_pem: Option<&str>,
) -> Result<
    impl tokio::io::AsyncRead + tokio::io::AsyncWrite + std::fmt::Debug + Send + Unpin + 'static,
    Error,
> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

    let failed = |e: &dyn std::fmt::Display| amqp10(&format!("TLS to {host}"), e);
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system certificate rustls cannot use is skipped, as lapin does.
        let _ = roots.add(cert);
    }
    if let Some(pem) = ca_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| failed(&e))?;
            roots.add(cert).map_err(|e| failed(&e))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| failed(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = ServerName::try_from(host.to_string()).map_err(|e| failed(&e))?;
    let connector = futures_rustls::TlsConnector::from(Arc::new(config));
    let stream = connector
        .connect(server, stream.compat())
        .await
        .map_err(|e| failed(&e))?;
    Ok(stream.compat())
}

/// [`open`] on the first address of `amqp.url` that answers, from `first`.
async fn open_any(
    settings: &AmqpSettings,
    first: Option<&str>,
    name: &str,
) -> Result<ConnectionHandle<()>, Error> {
    let addresses = settings.addresses();
    let start = first
        .and_then(|node| addresses.iter().position(|a| a.contains(node)))
        .unwrap_or(0);
    let mut last = None;
    for n in 0..addresses.len() {
        match open(settings, addresses[(start + n) % addresses.len()], name).await {
            Ok(conn) => return Ok(conn),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Amqp10("amqp.url names no address".into())))
}

/// Does `queue` exist? (A passive declare, on a channel of its own: a missing
/// queue closes the channel.)
async fn queue_exists(conn: &Connection, queue: &str) -> Result<bool, lapin::Error> {
    let channel = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    match channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
    {
        Ok(_) => {
            let _ = channel.close(200, "checked".into()).await;
            Ok(true)
        }
        Err(e) if e.to_string().contains("NOT_FOUND") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs the deferrer until shutdown or a failure, of its AMQP 1.0 connection
/// or of its AMQP 0-9-1 one (`conn`, which it keeps: `/readyz` reports the
/// role down with it, and a reconnect looks for the queue again). Outside
/// native mode it works only while `<prefix>.wait` exists (timers left by
/// native mode, still draining); otherwise it only watches `conn`.
pub async fn run(
    ctx: Arc<Context>,
    conn: Arc<Connection>,
    mode: Mode,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    // Listened to from here on: the passive declare's 404, a channel's error,
    // is behind it.
    let idle = mode != Mode::Native && !queue_exists(&conn, &ctx.names.wait()).await?;
    let mut events = conn.events_listener();
    if idle {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                event = events.next() => connection_event(event)?,
            }
        }
    }
    let node = ctx
        .health
        .nodes()
        .into_iter()
        .find(|(role, _)| *role == crate::context::Role::Deferrer)
        .and_then(|(_, node)| node);
    let name = super::connection_name(&ctx.settings.amqp, "deferrer");
    let mut connection = open_any(&ctx.settings.amqp, node.as_deref(), &name).await?;
    let result = session(&ctx, &mut connection, &mut events, &shutdown).await;
    close_within(connection.close()).await;
    result
}

/// An event of the AMQP 0-9-1 connection (its error or end stop the
/// deferrer, whose supervisor reconnects both connections; it publishes
/// nothing there, so a block is nothing to it).
fn connection_event(event: Option<Event>) -> Result<(), Error> {
    super::connection::connection_event(event, |_| {})
}

async fn session(
    ctx: &Context,
    connection: &mut ConnectionHandle<()>,
    events: &mut (impl futures_util::Stream<Item = Event> + Unpin),
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let names = &ctx.names;
    let mut session: SessionHandle<()> = Session::begin(connection)
        .await
        .map_err(|e| amqp10("session", e))?;
    let mut receiver = Receiver::builder()
        .name(format!("{} deferrer", ctx.settings.amqp.instance))
        .source(format!("/queues/{}", names.wait()))
        .credit_mode(CreditMode::Auto(CREDIT))
        .auto_accept(false)
        .attach(&mut session)
        .await
        .map_err(|e| amqp10(&format!("consume {}", names.wait()), e))?;
    let result = loop {
        let delivery = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            event = events.next() => match connection_event(event) {
                Ok(()) => continue,
                Err(e) => break Err(e),
            },
            d = receiver.recv::<Body<Value>>() => match d {
                Ok(d) => d,
                Err(e) => break Err(amqp10(&format!("receive from {}", names.wait()), e)),
            },
        };
        let message = delivery.message();
        let at = annotation(message, X_DELIVERY_TIME);
        let deferrals = annotation(message, X_DEFERRALS).unwrap_or(0);
        let settled = match decide(at, deferrals, Millis::now().0) {
            Decision::Defer(until) => {
                if deferrals > 0 {
                    ctx.telemetry.returned_early(at.unwrap_or(until), until);
                }
                receiver
                    .modify(&delivery, hold_until(until, deferrals))
                    .await
            }
            Decision::Release => receiver.reject(&delivery, None).await,
        };
        if let Err(e) = settled {
            break Err(amqp10(&format!("settle on {}", names.wait()), e));
        }
    };
    // Bounded: on a connection the broker has dropped, a detach or an end
    // would wait for an answer that never comes.
    close_within(async {
        let _ = receiver.close().await;
        let _ = session.end().await;
    })
    .await;
    result
}

/// Whether the broker behind `amqp.url` holds a quorum-queue message until
/// `x-opt-delivery-time`: `Ok(Err(why not))` when it does not, `Err` when
/// the broker could not be asked. Tried for real on a queue of its own,
/// removed after (and by the broker within a minute if this process dies):
/// one message deferred 400 ms must not come back sooner than 200 ms.
pub async fn probe(
    settings: &AmqpSettings,
    conn: &Connection,
    names: &Names,
) -> Result<Result<(), String>, lapin::Error> {
    let queue = format!("{}.probe.{}", names.entry(), uuid::Uuid::new_v4().simple());
    let channel = conn.create_channel().await?;
    let mut arguments = FieldTable::default();
    for (k, v) in [
        (
            "x-queue-type",
            lapin::types::AMQPValue::LongString("quorum".into()),
        ),
        ("x-expires", lapin::types::AMQPValue::LongInt(60_000)),
    ] {
        arguments.insert(k.into(), v);
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    if let Err(e) = channel
        .queue_declare(queue.as_str().into(), durable, arguments)
        .await
    {
        return Ok(Err(format!("no quorum queue could be declared: {e}")));
    }
    let outcome = try_deferral(settings, &channel, &queue).await;
    let _ = channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    let _ = channel.close(200, "probed".into()).await;
    Ok(outcome)
}

async fn try_deferral(
    settings: &AmqpSettings,
    channel: &lapin::Channel,
    queue: &str,
) -> Result<(), String> {
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            Default::default(),
            b"probe",
            Default::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut connection = open_any(settings, None, &super::connection_name(settings, "probe"))
        .await
        .map_err(|e| format!("no AMQP 1.0 ({e})"))?;
    let result = async {
        let mut session = Session::begin(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        let mut receiver = Receiver::builder()
            .name("probe")
            .source(format!("/queues/{queue}"))
            .credit_mode(CreditMode::Auto(1))
            .auto_accept(false)
            .attach(&mut session)
            .await
            .map_err(|e| e.to_string())?;
        let wait = Duration::from_secs(5);
        let first = tokio::time::timeout(wait, receiver.recv::<Body<Value>>())
            .await
            .map_err(|_| "the probe message was not delivered within 5 s".to_string())?
            .map_err(|e| e.to_string())?;
        let deferred = Instant::now();
        receiver
            .modify(&first, hold_until(Millis::now().0 + 400, 0))
            .await
            .map_err(|e| e.to_string())?;
        let again = tokio::time::timeout(wait, receiver.recv::<Body<Value>>())
            .await
            .map_err(|_| "a message deferred 400 ms did not come back within 5 s".to_string())?
            .map_err(|e| e.to_string())?;
        let back = deferred.elapsed();
        let _ = receiver.accept(&again).await;
        let _ = receiver.close().await;
        let _ = session.end().await;
        if back < Duration::from_millis(200) {
            return Err(format!(
                "a message deferred 400 ms with x-opt-delivery-time came back after {} ms: quorum queues here do not hold messages until a time (RabbitMQ 4.3 or later does)",
                back.as_millis()
            ));
        }
        Ok(())
    }
    .await;
    close_within(connection.close()).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_is_held_until_its_time_then_released() {
        assert_eq!(decide(Some(5_000), 0, 1_000), Decision::Defer(5_000));
        assert_eq!(decide(Some(5_000), 1, 5_000), Decision::Release);
        assert_eq!(decide(Some(5_000), 1, 6_000), Decision::Release);
        // Already due when it first arrives.
        assert_eq!(decide(Some(500), 0, 1_000), Decision::Release);
        // No delivery time: the consumer decides against the database.
        assert_eq!(decide(None, 0, 1_000), Decision::Release);
    }

    #[test]
    fn a_timer_let_go_early_is_held_again_or_passed_to_the_consumer() {
        // Back 300 ms early: within the slack, the consumer holds the rest.
        assert_eq!(decide(Some(5_000), 1, 4_700), Decision::Release);
        // Back 3 s early (the broker's clock is ahead): held as much again.
        assert_eq!(decide(Some(5_000), 1, 2_000), Decision::Defer(8_000));
    }

    #[test]
    fn the_hold_uses_symbol_keys() {
        let modified = hold_until(42, 0);
        let annotations = modified.message_annotations.unwrap();
        assert_eq!(
            annotations.get(&Symbol::from(X_DELIVERY_TIME)),
            Some(&Value::Long(42))
        );
        assert_eq!(
            annotations.get(&Symbol::from(X_DEFERRALS)),
            Some(&Value::Long(1))
        );
        assert_eq!(modified.delivery_failed, Some(false));
    }
}

//! The router consumes `<prefix>.ingest`, checks each message against the wire
//! contract *before* it waits, and sends it into the delay stage of the mode in
//! effect: in TTL mode the level of the highest set bit of its delay, in plugin
//! mode the `x-delayed-message` exchange. A message that breaks the contract is
//! parked with its reason when it is published, not when it would have come
//! due, and the plugin never sees an `x-delay` it would deliver at once.
//!
//! Routing is pipelined: each delivery is published at once and acked when the
//! broker confirms the copy, so many are in flight while confirms come back.
//!
//! Paused by an operator ([`crate::control`]), the router cancels its consumer,
//! finishes what is in flight and closes its channels: publishers' messages
//! wait in the ingest queue until it is resumed.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;

use super::connection::close_within;
use super::disposition::admit;
use super::topology::{Mode, delay_route, into_stage};
use super::wire::{self, Park};
use super::{Ended, Error, channels, park_delivery, publish_confirmed};
use crate::context::Context;
use crate::control::Pausable;
use crate::domain::TimeoutKind;
use crate::traces;

/// Where a valid message goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Exchange to publish to.
    pub exchange: String,
    /// Routing key to publish with.
    pub routing_key: String,
    /// The kind, for metrics.
    pub kind: TimeoutKind,
    /// The validated delay, written back as the `x-delay` the stage reads.
    pub delay_ms: u64,
    /// The canonical body (`wire::encode` of what was validated), not the
    /// publisher's bytes: unknown fields and padding stay behind, so what waits
    /// in the delay stage and what consumers hold up to their prefetch is a
    /// couple of hundred bytes, whatever the publisher sent.
    pub body: Vec<u8>,
}

/// Decides where a message from the ingest queue goes, or why it is parked.
pub fn classify(
    ctx: &Context,
    mode: Mode,
    delivery: &Delivery,
) -> Result<Route, (Park, Option<TimeoutKind>)> {
    let headers = delivery.properties.headers().as_ref();
    let content_type = delivery
        .properties
        .content_type()
        .as_ref()
        .map(|c| c.as_str());
    let message = wire::decode(delivery.routing_key.as_str(), content_type, &delivery.data)
        .map_err(|p| (p, None))?;
    let kind = message.kind;
    let message = admit(&ctx.orders, message).map_err(|p| (p, Some(kind)))?;
    let delay_ms = wire::publish_delay(headers).map_err(|p| (p, Some(kind)))?;
    let (exchange, routing_key) = delay_route(&ctx.names, mode, kind, delay_ms);
    Ok(Route {
        exchange,
        routing_key,
        kind,
        delay_ms,
        body: wire::encode(&message),
    })
}

/// Consumes the ingest queue until shutdown or a connection failure; while
/// paused, consumes nothing.
pub async fn run(
    ctx: Arc<Context>,
    conn: Arc<Connection>,
    mode: Mode,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = ctx.pauses.until(Pausable::Router, false) => {}
        }
        if session(&ctx, &conn, mode, &shutdown).await? == Ended::Shutdown {
            return Ok(());
        }
    }
}

/// Consumes the ingest queue on new channels until shutdown, a pause or a
/// failure.
async fn session(
    ctx: &Arc<Context>,
    conn: &Connection,
    mode: Mode,
    shutdown: &CancellationToken,
) -> Result<Ended, Error> {
    // Prefetch bounds how many messages are in flight between broker and router;
    // confirms: a message is acked from ingest only once its copy is safe.
    let (consume, publish) = channels(conn, ctx.settings.amqp.router_prefetch).await?;
    let tag = format!("router {}", ctx.settings.amqp.instance);
    let mut consumer = consume
        .basic_consume(
            ctx.names.ingest().as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut in_flight = FuturesUnordered::new();
    let result = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break Ok(Ended::Shutdown),
            _ = ctx.pauses.until(Pausable::Router, true) => break Ok(Ended::Paused),
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                if let Err(e) = done {
                    break Err(e);
                }
            }
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    ctx.telemetry.delivery("ingest", delivery.redelivered);
                    in_flight.push(route_one(ctx.clone(), publish.clone(), mode, delivery));
                }
                Some(Err(e)) => break Err(e.into()),
                None => break Err(Error::ConsumerEnded(ctx.names.ingest())),
            },
        }
    };
    // Stop new deliveries, then finish what is in flight (on a broken connection
    // these fail fast and the broker requeues the unacked ones).
    let _ = consume
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await;
    while let Some(done) = in_flight.next().await {
        if let Err(e) = done {
            ctx.telemetry.route_abandoned(&e.to_string());
        }
    }
    if let Ok(Ended::Paused) = result {
        // What the broker had pushed and was not routed goes back to ingest.
        close_within(consume.close(200, "paused".into())).await;
        close_within(publish.close(200, "paused".into())).await;
        ctx.telemetry
            .consumption_stopped(Pausable::Router, &ctx.names.ingest(), 0);
    }
    result
}

async fn route_one(
    ctx: Arc<Context>,
    publish: Channel,
    mode: Mode,
    delivery: Delivery,
) -> Result<(), Error> {
    // With traces on, a child of the message's `traceparent` (the
    // publisher's), whose context the copy in the delay stage carries on.
    let span = traces::span!(
        "router.validate",
        otel.kind = "consumer",
        timeout.kind = tracing::field::Empty,
        timeout.delay_ms = tracing::field::Empty,
        parked.reason = tracing::field::Empty,
    );
    traces::follow_headers(&span, delivery.properties.headers().as_ref());
    match classify(&ctx, mode, &delivery) {
        Ok(route) => {
            if !span.is_none() {
                span.record("timeout.kind", route.kind.as_str());
                span.record("timeout.delay_ms", route.delay_ms);
            }
            publish_confirmed(
                &publish,
                &route.exchange,
                &route.routing_key,
                &route.body,
                // The publisher's properties travel on (message_id, timestamp,
                // headers), with `x-delay` written back as the 64-bit integer
                // that was validated (the plugin delivers at once a delay whose
                // AMQP type it does not take as an integer, a timestamp say),
                // persistent, and without `expiration` or `user_id`: see
                // `wire::with_delay`.
                traces::into_headers(
                    &span,
                    into_stage(
                        mode,
                        wire::with_delay(&delivery.properties, route.delay_ms),
                        route.delay_ms,
                    ),
                ),
            )
            .await?;
            delivery.acker.ack(Default::default()).await?;
            ctx.telemetry.routed(route.kind, &route.routing_key);
            Ok(())
        }
        Err((park, kind)) => {
            span.record("parked.reason", park.reason.as_str());
            park_delivery(&ctx, &publish, &delivery, &park, "router", kind).await
        }
    }
}

//! The timeout consumers, one per kind, each on its own channel.
//!
//! Deliveries are gathered into a batch (as many as are ready, up to
//! `consumer.batch_size`; when messages are flowing, for at most
//! `consumer.batch_wait` more; with an idle queue, no wait at all), decided in
//! one database transaction, and only then acked. What each delivery gets is
//! decided by [`decide`]:
//!
//! - applied, or nothing to do (paid, duplicate, already flagged): ack;
//! - not yet due by the database: held in memory when the rest is short
//!   (`consumer.hold_max`), otherwise sent back to wait, then acked;
//! - unknown order or a body that breaks the contract: parked, then acked;
//! - database error: nothing is acked; the consumer pauses with backoff and
//!   tries the same batch again, taking no new deliveries meanwhile; an
//!   order the database refuses alone is parked ([`crate::apply`]).
//!
//! A consumer paused by an operator ([`crate::control`]) finishes its batch,
//! cancels its AMQP consumer and closes its channel, so that what it had
//! prefetched and what it held goes back to the queue; resumed, it opens a
//! new channel and consumes again. Each transaction passes the kind's gate
//! ([`crate::control::Pauses::enter`]): a pause waits for the one under way,
//! and the rest of a batch that a pause overtook is given back undecided.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key;

use super::catch_up::CatchUp;
use super::connection::{close_within, connection_event};
use super::disposition::{Disposition, admit, decide};
use super::topology::{Mode, delay_route, into_stage};
use super::wire::{self, Park, ParkReason, TimeoutMessage};
use super::{Ended, Error, channels, park_delivery, publish_confirmed};
use crate::apply::{Decided, ISOLATED_ATTEMPTS, OnRefusal, apply};
use crate::context::Context;
use crate::control::Pausable;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::orders::{Cause, ExpiryOutcome};
use crate::traces;

/// A batch that starts this soon after the previous one is part of a flow, and
/// may wait `consumer.batch_wait` to fill even when it holds one delivery.
const FLOWING: Duration = Duration::from_millis(50);

/// How long the consumers have to end on their own once their connection has
/// failed, before they are stopped.
const AFTER_CONNECTION_FAILED: Duration = Duration::from_secs(5);

/// Runs the consumers of every kind on one connection until shutdown or failure.
///
/// Each consumer sees its connection fail on its own channel (its stream ends
/// with the error, its acks and publishes fail) and ends. One that is still
/// waiting [`AFTER_CONNECTION_FAILED`] after the connection reported its
/// failure is stopped, so that the role reconnects: it may be waiting on the
/// database (a row another session holds), or inside lapin, which has been
/// seen leaving a close sent as the connection failed unanswered for ever;
/// and nothing it held is lost by stopping it (the broker has already put
/// every unacked delivery back in its queue, and a transaction cut short is
/// rolled back).
pub async fn run(
    ctx: Arc<Context>,
    conn: Arc<Connection>,
    mode: Mode,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut events = conn.events_listener();
    let consuming = consume(ctx.clone(), conn.clone(), mode, shutdown);
    tokio::pin!(consuming);
    loop {
        tokio::select! {
            result = &mut consuming => return result,
            event = events.next() => {
                let failed = connection_event(event, |reason| {
                    ctx.telemetry.publishing_blocked("consumer", reason)
                });
                if let Err(e) = failed {
                    return match tokio::time::timeout(AFTER_CONNECTION_FAILED, consuming).await {
                        Ok(result) => result.and(Err(e)),
                        Err(_) => {
                            // Dropping the consumers' set aborts them.
                            ctx.telemetry
                                .role_stopped("consumer", AFTER_CONNECTION_FAILED);
                            Err(e)
                        }
                    };
                }
            }
        }
    }
}

/// The consumers of every kind, until shutdown or the first failure.
async fn consume(
    ctx: Arc<Context>,
    conn: Arc<Connection>,
    mode: Mode,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut tasks = tokio::task::JoinSet::new();
    for kind in TimeoutKind::ALL {
        let consumer = KindConsumer::open(ctx.clone(), conn.clone(), kind, mode).await?;
        tasks.spawn(consumer.run(shutdown.clone()));
    }
    // The first failure (a broken connection) ends them all; the supervisor reconnects.
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if result.is_ok() {
                    result = Err(e);
                }
                shutdown_siblings(&conn).await;
            }
            Err(panic) => {
                ctx.telemetry.task_panicked("consumer", &panic.to_string());
                shutdown_siblings(&conn).await;
            }
        }
    }
    result
}

/// Sleeps until `at`; never ends for `None` (the branch is switched off then).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn shutdown_siblings(conn: &Connection) {
    // Closing the connection makes the sibling consumers' streams end with an
    // error; their unacked deliveries go back to the queue.
    close_within(conn.close(320, "consumer failed".into())).await;
}

struct KindConsumer {
    /// Shared services.
    ctx: Arc<Context>,
    /// The connection its channels are on (new ones after a pause).
    conn: Arc<Connection>,
    /// Which timeout this consumer handles.
    kind: TimeoutKind,
    /// The delay stage that re-delayed messages go back to.
    mode: Mode,
    /// Channel the deliveries come on.
    channel: Channel,
    /// Confirm-mode channel for parking and re-delaying.
    publish: Channel,
    /// Consumer tag, to cancel at shutdown.
    tag: String,
    /// Early deliveries waiting in memory for their deadline.
    held: DelayQueue<Delivery>,
    /// Keys of the held deliveries by delivery tag, to give them back at shutdown.
    held_keys: HashMap<u64, Key>,
    /// Every order already due, applied when deliveries say deadlines pass.
    catch_up: CatchUp,
}

impl KindConsumer {
    async fn open(
        ctx: Arc<Context>,
        conn: Arc<Connection>,
        kind: TimeoutKind,
        mode: Mode,
    ) -> Result<Self, Error> {
        // Prefetch caps the unacked deliveries we hold, including those held in
        // memory; it must cover a batch plus the held ones at the target rate.
        let (channel, publish) = channels(&conn, ctx.settings.amqp.prefetch).await?;
        let tag = format!("consumer {} {}", kind.as_str(), ctx.settings.amqp.instance);
        let wakes = ctx.settings.consumer.catch_up && ctx.settings.consumer.wake_at_deadline;
        Ok(Self {
            ctx,
            conn,
            kind,
            mode,
            channel,
            publish,
            tag,
            held: DelayQueue::new(),
            held_keys: HashMap::new(),
            catch_up: CatchUp::new(kind, wakes),
        })
    }

    /// Consumes until shutdown or failure; while paused, waits on no channel.
    async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let role = Pausable::Consumer(self.kind);
        loop {
            if self.ctx.pauses.is_paused(role) {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = self.ctx.pauses.until(role, false) => {}
                }
                let prefetch = self.ctx.settings.amqp.prefetch;
                (self.channel, self.publish) = channels(&self.conn, prefetch).await?;
            }
            if self.session(&shutdown).await? == Ended::Shutdown {
                return Ok(());
            }
        }
    }

    /// One consumer on the channel, until shutdown, a pause or a failure.
    async fn session(&mut self, shutdown: &CancellationToken) -> Result<Ended, Error> {
        let ctx = self.ctx.clone();
        let role = Pausable::Consumer(self.kind);
        let queue = self.ctx.names.work(self.kind);
        let mut deliveries = self
            .channel
            .basic_consume(
                queue.as_str().into(),
                self.tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut last_batch = Instant::now() - FLOWING;
        let result: Result<Ended, Error> = loop {
            let round = self.catch_up.scheduled();
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(Ended::Shutdown),
                // Between batches: the one in hand is settled.
                _ = ctx.pauses.until(role, true) => break Ok(Ended::Paused),
                // Deadlines are passing (the last catch-up applied orders),
                // or the next one does: the next round runs without waiting
                // for a delivery.
                _ = sleep_until_some(round), if round.is_some() => {
                    self.catch_up.run(&self.ctx).await;
                    continue;
                }
                Some(expired) = self.held.next(), if !self.held.is_empty() => {
                    self.released(expired.into_inner())
                }
                // More orders are due than a catch-up round takes: the
                // deliveries wait in the broker meanwhile (see
                // `CatchUp::behind`).
                next = deliveries.next(), if !self.catch_up.behind() => match self.received(next) {
                    Ok(d) => d,
                    Err(e) => break Err(e),
                },
            };
            // Flowing: the last batch was moments ago. A due burst trickles out
            // of the TTL levels one message at a time, and a transaction per
            // message would cap the rate.
            let flowing = last_batch.elapsed() < FLOWING;
            let (batch, ended) = self.gather(first, &mut deliveries, flowing).await;
            last_batch = Instant::now();
            if let Err(e) = self.handle(batch, shutdown).await {
                break Err(e);
            }
            if let Some(e) = ended {
                break Err(e);
            }
        };
        let _ = self
            .channel
            .basic_cancel(self.tag.as_str().into(), BasicCancelOptions::default())
            .await;
        // Held deliveries go back to the queue for whoever runs next; they are
        // not due yet, so this is no retry loop.
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let held = self.held_keys.len();
        for (_, key) in std::mem::take(&mut self.held_keys) {
            if let Some(expired) = self.held.try_remove(&key) {
                let _ = expired.into_inner().acker.nack(requeue).await;
                self.ctx.telemetry.held_changed(-1);
            }
        }
        if let Ok(Ended::Paused) = result {
            // Closing the channel gives back what the broker had pushed and
            // this consumer had not taken: all of it waits in the queue.
            close_within(self.channel.close(200, "paused".into())).await;
            close_within(self.publish.close(200, "paused".into())).await;
            self.ctx.telemetry.consumption_stopped(role, &queue, held);
        }
        result
    }

    /// Gathers a batch after its first delivery: held deliveries now due and
    /// whatever is ready, up to `consumer.batch_size`; while messages flow (or
    /// more than one was ready), waiting up to `consumer.batch_wait` for more.
    /// Also returns the error that ended the stream, if it did.
    async fn gather(
        &mut self,
        first: Delivery,
        deliveries: &mut lapin::Consumer,
        flowing: bool,
    ) -> (Vec<Delivery>, Option<Error>) {
        let live = self.ctx.live();
        let (batch_size, batch_wait) = (live.consumer.batch_size, live.consumer.batch_wait);
        let until = Instant::now() + batch_wait;
        let mut batch = vec![first];
        while batch.len() < batch_size {
            // Held deliveries whose deadline has come join the batch: one
            // transaction for all of them, not one each.
            if !self.held.is_empty()
                && let Some(Some(expired)) = self.held.next().now_or_never()
            {
                batch.push(self.released(expired.into_inner()));
                continue;
            }
            let next = match deliveries.next().now_or_never() {
                // Take whatever is ready now ...
                Some(next) => next,
                // ... and, only while messages are flowing, wait a little for more.
                None if (flowing || batch.len() > 1) && !batch_wait.is_zero() => {
                    match tokio::time::timeout_at(until, deliveries.next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
                None => break,
            };
            match self.received(next) {
                Ok(d) => batch.push(d),
                Err(e) => return (batch, Some(e)),
            }
        }
        (batch, None)
    }

    /// A held delivery whose time has come, taken out of the hold.
    fn released(&mut self, delivery: Delivery) -> Delivery {
        self.ctx.telemetry.held_changed(-1);
        self.held_keys.remove(&delivery.delivery_tag);
        delivery
    }

    /// Counts a delivery from the stream, or says why the stream failed.
    fn received(&self, next: Option<Result<Delivery, lapin::Error>>) -> Result<Delivery, Error> {
        match next {
            Some(Ok(d)) => {
                self.ctx
                    .telemetry
                    .delivery(self.kind.as_str(), d.redelivered);
                Ok(d)
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(Error::ConsumerEnded(self.ctx.names.work(self.kind))),
        }
    }

    /// Decides one batch in one transaction, then acks, holds, re-delays or parks each delivery.
    async fn handle(
        &mut self,
        batch: Vec<Delivery>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let mut valid: Vec<(Delivery, TimeoutMessage)> = Vec::with_capacity(batch.len());
        for delivery in batch {
            let content_type = delivery
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.as_str().to_string());
            let decoded = wire::decode(self.kind.as_str(), content_type.as_deref(), &delivery.data)
                .and_then(|message| admit(&self.ctx.orders, message));
            match decoded {
                Ok(message) => valid.push((delivery, message)),
                Err(park) => {
                    park_delivery(
                        &self.ctx,
                        &self.publish,
                        &delivery,
                        &park,
                        "consumer",
                        Some(self.kind),
                    )
                    .await?
                }
            }
        }
        if valid.is_empty() {
            return Ok(());
        }
        // While catch-ups are applying a due burst, the next one (at most
        // `catch_up::EVERY` away) most likely applies these orders too: wait
        // for it rather than race it for the same rows.
        if self.catch_up.continuing() {
            self.catch_up.run_next(&self.ctx).await;
        }
        // Orders a catch-up applied need no database round trip.
        let ids: Vec<OrderKey> = valid
            .iter()
            .map(|(_, m)| &m.order_id)
            .filter(|id| !self.catch_up.applied(id))
            .cloned()
            .collect();
        // Refused alone: tried again after the rest, then parked; the
        // database away: nothing is acked, and no new delivery taken, until
        // it answers again.
        let on_refusal = OnRefusal::Persist(shutdown);
        let (spans, contexts) = self.apply_spans(&valid);
        let applying = apply(&self.ctx, self.kind, ids, Cause::Timeout, on_refusal);
        let Some(decided) = traces::with_orders(contexts, applying).await else {
            // Shutting down mid-outage: leave them unacked for redelivery.
            return Ok(());
        };
        if self.settle(valid, decided, &spans).await? && self.ctx.settings.consumer.catch_up {
            self.catch_up.run(&self.ctx).await;
        }
        Ok(())
    }

    /// With traces on, a `consumer.apply` span per delivery, a child of its
    /// `traceparent`, by delivery tag; and each span's context by order id,
    /// which the domain event of its transition keeps. Empty when off.
    fn apply_spans(
        &self,
        valid: &[(Delivery, TimeoutMessage)],
    ) -> (HashMap<u64, tracing::Span>, HashMap<String, String>) {
        let mut spans = HashMap::new();
        let mut contexts = HashMap::new();
        if !traces::enabled() {
            return (spans, contexts);
        }
        for (delivery, message) in valid {
            let order_id = message.order_id.to_string();
            let span = traces::span!(
                "consumer.apply",
                otel.kind = "consumer",
                order.id = order_id.as_str(),
                timeout.kind = self.kind.as_str(),
                timeout.cause = Cause::Timeout.as_str(),
                timeout.outcome = tracing::field::Empty,
                timeout.lateness_ms = tracing::field::Empty,
            );
            traces::follow_headers(&span, delivery.properties.headers().as_ref());
            if let Some(context) = traces::stored(&span) {
                contexts.insert(order_id, context);
            }
            spans.insert(delivery.delivery_tag, span);
        }
        (spans, contexts)
    }

    /// Acks, holds, re-delays or parks each delivery as the database decided.
    /// Returns whether deadlines are passing (a delivery was applied, or
    /// found applied by a catch-up): time for the next catch-up.
    async fn settle(
        &mut self,
        valid: Vec<(Delivery, TimeoutMessage)>,
        decided: Decided,
        spans: &HashMap<u64, tracing::Span>,
    ) -> Result<bool, Error> {
        let hold_max = self.ctx.live().consumer.hold_max;
        let mut passing = false;
        let mut seen = HashSet::new();
        // Applied and not-applicable deliveries are acked together at the end.
        let mut settled = Vec::with_capacity(valid.len());
        for (delivery, message) in valid {
            let id = &message.order_id;
            if decided.undecided(id) {
                // A pause came first: back to the queue for the resume, as
                // the pause gives back what it holds; not a retry loop.
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                delivery.acker.nack(requeue).await?;
                continue;
            }
            let action = match (decided.outcomes.get(id), decided.refused.get(id)) {
                (Some((outcome, now)), _) => {
                    decide(outcome.clone(), *now, hold_max, seen.insert(id.clone()))
                }
                (None, Some(error)) => Disposition::Park(Park::new(
                    ParkReason::DatabaseRefused,
                    format!(
                        "the database refused this timeout {ISOLATED_ATTEMPTS} times while it answered the rest: {error}"
                    ),
                )),
                (None, None) if self.catch_up.applied(id) => Disposition::NotApplicable {
                    status: "applied by a catch-up".into(),
                },
                (None, None) => decide(ExpiryOutcome::NotFound, Millis::now(), hold_max, true),
            };
            if let Some(span) = spans.get(&delivery.delivery_tag) {
                action.record_on(span);
            }
            match action {
                Disposition::Applied { lateness_ms } => {
                    passing = true;
                    settled.push(delivery.delivery_tag);
                    self.ctx
                        .telemetry
                        .timeout_applied(self.kind, id, lateness_ms, "message");
                }
                Disposition::NotApplicable { status } => {
                    passing |= self.catch_up.applied(id);
                    settled.push(delivery.delivery_tag);
                    self.ctx
                        .telemetry
                        .timeout_not_applicable(self.kind, id, &status);
                }
                Disposition::Hold(wait) => {
                    self.ctx.telemetry.timeout_early(self.kind, id, wait, true);
                    self.ctx.telemetry.held_changed(1);
                    let tag = delivery.delivery_tag;
                    let key = self.held.insert(delivery, wait);
                    self.held_keys.insert(tag, key);
                }
                Disposition::Redelay(wait) => {
                    let span = spans.get(&delivery.delivery_tag);
                    self.redelay(&delivery, &message, wait, span).await?;
                    delivery.acker.ack(Default::default()).await?;
                    self.ctx.telemetry.timeout_early(self.kind, id, wait, false);
                }
                Disposition::Park(park) => {
                    park_delivery(
                        &self.ctx,
                        &self.publish,
                        &delivery,
                        &park,
                        "consumer",
                        Some(self.kind),
                    )
                    .await?;
                }
            }
        }
        self.ack(settled).await?;
        Ok(passing)
    }

    /// Acks settled deliveries: one `multiple` ack up to the highest tag when no
    /// held delivery sits below it (a multiple ack would take those too),
    /// otherwise one ack each.
    async fn ack(&self, settled: Vec<u64>) -> Result<(), Error> {
        let Some(&highest) = settled.iter().max() else {
            return Ok(());
        };
        if self.held_keys.keys().all(|held| *held > highest) {
            let multiple = BasicAckOptions { multiple: true };
            self.channel.basic_ack(highest, multiple).await?;
        } else {
            for tag in settled {
                self.channel
                    .basic_ack(tag, BasicAckOptions::default())
                    .await?;
            }
        }
        Ok(())
    }

    /// Publishes the message again, straight into the delay stage (it is valid:
    /// it was decoded), with the remaining delay, so it waits in the broker, not
    /// in our memory.
    async fn redelay(
        &self,
        delivery: &Delivery,
        message: &TimeoutMessage,
        wait: Duration,
        span: Option<&tracing::Span>,
    ) -> Result<(), Error> {
        let headers = delivery.properties.headers().as_ref();
        let count = match wire::header_int(headers, wire::X_REDELAYS) {
            Some(Ok(n)) => n + 1,
            _ => 1,
        };
        let delay_ms = (wait.as_millis() as u64).clamp(1, wire::MAX_DELAY_MS);
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str().to_string())
            .unwrap_or_else(|| format!("{}:{}:redelay", message.order_id, message.kind));
        let properties = wire::properties(
            &message_id,
            Millis::now(),
            delay_ms,
            &[(wire::X_REDELAYS, AMQPValue::LongLongInt(count))],
        );
        let (exchange, routing_key) = delay_route(&self.ctx.names, self.mode, self.kind, delay_ms);
        publish_confirmed(
            &self.publish,
            &exchange,
            &routing_key,
            &wire::encode(message),
            // The trace goes on from this attempt's span (traces on).
            match span {
                Some(span) => {
                    traces::into_headers(span, into_stage(self.mode, properties, delay_ms))
                }
                None => into_stage(self.mode, properties, delay_ms),
            },
        )
        .await
    }
}

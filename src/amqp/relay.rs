//! The outbox relay: publishes what transactions wrote to the two outboxes,
//! with publisher confirms, and deletes a row only when the broker has
//! confirmed its message. Nothing is published inside a transaction; with the
//! broker down, rows wait in their table and go out when it is back.
//!
//! - **Timeouts** (`outbox`, [`Timeouts`]): valid by construction, so they
//!   go straight into the delay stage of the mode in effect (the right TTL
//!   level, or the plugin's exchange): no ingest hop, no router hop.
//! - **Domain events** (`order_timeout_events`, [`DomainEvents`]): to
//!   `<prefix>.events`, routing key `order.<event>`, with the body and message
//!   id stored at insert. This part touches no other table: it works
//!   whichever tables hold the orders.
//!
//! Each pass runs one step of timeouts, then one step of events: timeouts go
//! first, and a backlog of events delays them by at most one round. A step
//! claims up to `relay.batch_size` rows (see `store::outbox_claim`) and
//! publishes them without waiting between them, and without waiting for their
//! confirms: up to `relay.rounds_in_flight` rounds of a table are out at once
//! (their rows held by the claim's lease), and with that many out, the oldest
//! is settled (its confirms collected, its confirmed rows deleted, its
//! refusals recorded) while the next one is claimed. So the broker's round
//! trip and the delete no longer stand between two claims. A table with
//! nothing more to claim, a pause and shutdown settle every round out first:
//! an idle relay owes no confirm and holds no row; a broken connection gives
//! back every row of every round out.
//!
//! Pipelining keeps the events of one order in order as well as one round
//! did: rounds are claimed oldest first and published on one channel, which
//! the broker keeps in order; only a refusal (retried later) or a lost
//! connection (every round out given back and published again, oldest first)
//! can put a later event first, and they could within one round already.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::{BasicProperties, Connection, Event, PublisherConfirm};
use sea_orm::EntityTrait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::topology::{Mode, delay_route, into_stage};
use super::wire::{self, TimeoutMessage};
use super::{Backoff, Error, confirmed as amqp_confirmed, connection, pause, publish_options};
use crate::context::Context;
use crate::control::Pausable;
use crate::db::clock;
use crate::db::entities::{order_timeout_events, outbox};
use crate::db::events::routing_key;
use crate::db::store::{self, Relayed};
use crate::domain::{Millis, OrderId, TimeoutKind};
use crate::traces;

/// The message id of an outbox row: stable across re-publishes of the same row.
pub fn message_id(row: &outbox::Model) -> String {
    format!("{}:{}:{}", row.order_id, row.kind, row.id)
}

/// Refreshes the backlog gauges of both outboxes every second, broker or
/// not: a backlog that grows while the broker is away is exactly what
/// operators must see.
pub async fn monitor(ctx: Arc<Context>, shutdown: CancellationToken) {
    loop {
        if ctx.orders.is_owned() {
            report_backlog::<outbox::Entity>(&ctx).await;
        }
        report_backlog::<order_timeout_events::Entity>(&ctx).await;
        if !pause(&shutdown, Duration::from_secs(1)).await {
            return;
        }
    }
}

/// Reads one outbox's backlog into its gauges; a failed read leaves them as
/// they were (the database's trouble is reported by whoever needs it).
async fn report_backlog<T: Relayed>(ctx: &Context) {
    // The rows' ages are reckoned by the clock that stamped them.
    if let Ok(state) = store::outbox_backlog::<T>(&ctx.db).await
        && let Ok(now) = clock::now(&ctx.db).await
    {
        ctx.telemetry.outbox_backlog(T::OUTBOX, state, now);
    }
}

/// Publishes outbox rows until shutdown or a connection failure.
pub async fn run(
    ctx: Arc<Context>,
    conn: Arc<Connection>,
    mode: Mode,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut timeouts = Lane::new(Timeouts { mode });
    let mut domain_events = Lane::new(DomainEvents);
    let relayed = relay(&ctx, &conn, &mut timeouts, &mut domain_events, &shutdown).await;
    if relayed.is_err() {
        // The connection broke: the rounds out of both outboxes are given
        // back now, not left to their lease (the lane whose round failed has
        // given back its own already).
        timeouts.release_all(&ctx).await;
        domain_events.release_all(&ctx).await;
    }
    relayed
}

/// The relay's passes, until shutdown or a connection failure.
async fn relay(
    ctx: &Context,
    conn: &Connection,
    timeouts: &mut Lane<Timeouts>,
    domain_events: &mut Lane<DomainEvents>,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut events = conn.events_listener();
    let mut reloads = ctx.reloader.subscribe();
    loop {
        if shutdown.is_cancelled() {
            // The rounds out are drained, or given back: none is left to
            // wait out its lease.
            finish(ctx, timeouts, domain_events, shutdown).await?;
            return Ok(());
        }
        // Paused: no row is published until resumed; the rows wait in the
        // database, and a lost connection is still noticed. The rounds
        // already out were claimed before the pause was seen: they finish.
        if ctx.pauses.is_paused(Pausable::Relay) {
            if !finish(ctx, timeouts, domain_events, shutdown).await? {
                return Ok(());
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = ctx.pauses.until(Pausable::Relay, false) => {}
                event = events.next() => connection_event(ctx, event)?,
            }
            continue;
        }
        // Timeouts first; a table the database refuses waits out its backoff
        // without holding the other one back.
        let mut busy = false;
        // A shop's own table has no timeout outbox of ours: its checkout
        // publishes the timeouts; only the events are relayed.
        if ctx.orders.is_owned() && timeouts.turn.due() {
            match timeouts.step(ctx, &channel, shutdown).await? {
                Progress::Stopped => continue,
                progress => busy |= progress == Progress::Busy,
            }
        }
        if domain_events.turn.due() {
            match domain_events.step(ctx, &channel, shutdown).await? {
                Progress::Stopped => continue,
                progress => busy |= progress == Progress::Busy,
            }
        }
        if busy {
            continue;
        }
        // No round is out here: a lane that found nothing to claim, or
        // whose database failed, settled its rounds before saying so.
        // Woken at once by a transaction's commit, or by the interval as a
        // fallback (which also ends a table's backoff); a lost connection is
        // noticed here too, not only at the next publish. A pause or a
        // reload ends the wait, to be seen at once.
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = ctx.orders.committed().wait() => {}
            _ = tokio::time::sleep(ctx.live().relay.interval) => {}
            _ = ctx.pauses.until(Pausable::Relay, true) => {}
            _ = reloads.changed() => {}
            event = events.next() => connection_event(ctx, event)?,
        }
    }
}

/// Settles every round of both lanes still out (shutdown, a pause): the
/// confirmed rows are deleted, the others given back. Ok(true) when all were
/// settled; Ok(false) when shutdown came while the database refused a delete
/// (the rest were given back).
async fn finish(
    ctx: &Context,
    timeouts: &mut Lane<Timeouts>,
    domain_events: &mut Lane<DomainEvents>,
    shutdown: &CancellationToken,
) -> Result<bool, Error> {
    let settled = timeouts.drain(ctx, shutdown).await?;
    if !settled {
        domain_events.release_all(ctx).await;
        return Ok(false);
    }
    domain_events.drain(ctx, shutdown).await
}

/// An event of the relay's connection: a block is reported.
fn connection_event(ctx: &Context, event: Option<Event>) -> Result<(), Error> {
    connection::connection_event(event, |reason| {
        ctx.telemetry.publishing_blocked("relay", reason)
    })
}

/// What a round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// It published (or tried to publish) rows: there may be more.
    Busy,
    /// The table had nothing to publish.
    Idle,
    /// The database failed; the table waits out its backoff.
    Paused,
    /// Shutdown came first.
    Stopped,
}

/// One table's turns: after a database failure it waits out a backoff of its
/// own before its next round.
struct Turn {
    backoff: Backoff,
    not_before: Option<Instant>,
}

impl Turn {
    fn new() -> Self {
        Self {
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
            not_before: None,
        }
    }

    /// Whether a round may run now.
    fn due(&self) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// The database answered: the backoff starts over.
    fn answered(&mut self) {
        self.backoff.reset();
        self.not_before = None;
    }

    /// The database failed: no round before the next backoff delay, returned.
    fn failed(&mut self) -> Duration {
        let delay = self.backoff.next_delay();
        self.not_before = Some(Instant::now() + delay);
        delay
    }
}

/// A message ready to go.
struct Outgoing {
    exchange: String,
    routing_key: String,
    body: Vec<u8>,
    properties: BasicProperties,
}

/// A table the relay publishes, and what its rows become.
trait Source {
    /// The table.
    type Table: Relayed;
    /// The message of one row, or why this version cannot publish it (the
    /// row is then set aside, never deleted).
    fn message(
        &self,
        ctx: &Context,
        row: &Row<Self>,
        now: Millis,
    ) -> Result<Outgoing, &'static str>;
    /// Counts the rows the broker confirmed.
    fn published(&self, ctx: &Context, rows: &[&Row<Self>]);
    /// The trace context the row keeps (`crate::traces::stored`), and what
    /// its span says the row is: the order and the timeout kind or event.
    fn traced(row: &Row<Self>) -> (Option<&str>, String, &str);
}

/// A row of a source's table.
type Row<S> = <<S as Source>::Table as EntityTrait>::Model;

/// Timeouts, into the delay stage of the mode in effect.
struct Timeouts {
    mode: Mode,
}

impl Source for Timeouts {
    type Table = outbox::Entity;

    fn message(
        &self,
        ctx: &Context,
        row: &outbox::Model,
        now: Millis,
    ) -> Result<Outgoing, &'static str> {
        // A newer instance may have written a kind this one does not know:
        // an operator must see the row.
        let kind = row.kind.parse::<TimeoutKind>().map_err(
            |_| "a timeout kind this version does not know (written by a newer version?)",
        )?;
        let message = TimeoutMessage {
            order_id: OrderId::new(row.order_id).into(),
            kind,
            due_at: Some(Millis(row.due_at_ms)),
        };
        // The contract wants 0 < x-delay: a deadline already passed goes out at 1 ms.
        let delay_ms = (row.due_at_ms - now.0).clamp(1, wire::MAX_DELAY_MS as i64) as u64;
        let (exchange, routing_key) = delay_route(&ctx.names, self.mode, kind, delay_ms);
        Ok(Outgoing {
            exchange,
            routing_key,
            body: wire::encode(&message),
            properties: into_stage(
                self.mode,
                wire::properties(&message_id(row), now, delay_ms, &[]),
                delay_ms,
            ),
        })
    }

    fn published(&self, ctx: &Context, rows: &[&outbox::Model]) {
        ctx.telemetry.outbox_published(rows.len() as u64);
    }

    fn traced(row: &outbox::Model) -> (Option<&str>, String, &str) {
        (
            row.trace_context.as_deref(),
            row.order_id.to_string(),
            &row.kind,
        )
    }
}

/// Domain events, to `<prefix>.events` with the routing key `order.<event>`.
struct DomainEvents;

impl Source for DomainEvents {
    type Table = order_timeout_events::Entity;

    fn message(
        &self,
        ctx: &Context,
        row: &order_timeout_events::Model,
        _now: Millis,
    ) -> Result<Outgoing, &'static str> {
        // The body and message id were made in the transition's transaction:
        // every publish of the row is the same message.
        Ok(Outgoing {
            exchange: ctx.names.events(),
            routing_key: routing_key(&row.event),
            body: row.body.clone().into_bytes(),
            properties: wire::event_properties(
                &row.message_id,
                Millis(row.created_at_ms),
                &row.event,
                &row.order_id,
            ),
        })
    }

    fn published(&self, ctx: &Context, rows: &[&order_timeout_events::Model]) {
        ctx.telemetry
            .events_published(rows.iter().map(|r| r.event.as_str()));
    }

    fn traced(row: &order_timeout_events::Model) -> (Option<&str>, String, &str) {
        (
            row.trace_context.as_deref(),
            row.order_id.clone(),
            &row.event,
        )
    }
}

/// One table's side of the relay: what its rows become, its backoff, and
/// its rounds out (published, their confirms outstanding), oldest first.
struct Lane<S: Source> {
    /// The table, and what its rows become.
    source: S,
    /// Its backoff after a database failure.
    turn: Turn,
    /// Rounds published and not yet settled: at most `relay.rounds_in_flight`.
    in_flight: VecDeque<InFlight<S>>,
}

/// A round whose rows are claimed (and mostly published): what the broker
/// says about them is still to be collected.
struct InFlight<S: Source> {
    /// Every row the round claimed, in claim order.
    rows: Vec<Row<S>>,
    /// The database's clock read for the claim: the lease, the `x-delay`s
    /// and a refused row's wait are reckoned from it.
    now: Millis,
    /// Each published row (its index in `rows`), its exchange, its confirm.
    confirms: Vec<(usize, String, PublisherConfirm)>,
}

impl<S: Source> Lane<S> {
    fn new(source: S) -> Self {
        Self {
            source,
            turn: Turn::new(),
            in_flight: VecDeque::new(),
        }
    }

    /// Claims and publishes one round; with `relay.rounds_in_flight` out
    /// already, the oldest is settled while the next one is claimed, so a
    /// round waits neither for the broker's confirms of the last ones nor for
    /// their delete. Errors only when the connection or channel broke: then
    /// every row of every round out has been given back.
    async fn step(
        &mut self,
        ctx: &Context,
        channel: &lapin::Channel,
        shutdown: &CancellationToken,
    ) -> Result<Progress, Error> {
        let limit = ctx.live().relay.rounds_in_flight;
        // A reload may have lowered the bound below what is out.
        while self.in_flight.len() > limit {
            if !self.settle_oldest(ctx, shutdown).await? {
                return Ok(Progress::Stopped);
            }
        }
        let mut oldest = if self.in_flight.len() == limit {
            self.in_flight.pop_front()
        } else {
            None
        };
        let (settled, claimed) = tokio::join!(
            async {
                match oldest.as_mut() {
                    Some(round) => settle(ctx, &self.source, round, shutdown).await,
                    None => Ok(true),
                }
            },
            claim::<S>(ctx, &mut self.turn),
        );
        // Every row still held is in `in_flight` from here on, so that one
        // release gives all of them back.
        let kept = claimed.is_some();
        if let Some(round) = claimed {
            self.in_flight.push_back(round);
        }
        match settled {
            Ok(true) => {}
            failed => {
                if let Some(round) = oldest {
                    self.in_flight.push_front(round);
                }
                self.release_all(ctx).await;
                return failed.map(|_| Progress::Stopped);
            }
        }
        let Some(round) = self.in_flight.back_mut().filter(|_| kept) else {
            // The database failed: the rounds out are settled now rather than
            // left waiting out the backoff.
            return self.drained(ctx, shutdown, Progress::Paused).await;
        };
        if round.rows.is_empty() {
            self.in_flight.pop_back();
            // Nothing more to claim: the rounds out are settled, so an idle
            // relay holds no row and owes no confirm. A commit made meanwhile
            // has raised the signal the relay then waits on.
            return self.drained(ctx, shutdown, Progress::Idle).await;
        }
        // A pause that came while the rows were claimed holds them too: a row
        // committed after `pause` answered is not published. The rounds out
        // were claimed before it was seen: they finish.
        if ctx.pauses.is_paused(Pausable::Relay) {
            if let Some(round) = self.in_flight.pop_back() {
                release::<S>(ctx, &round.rows).await;
            }
            return self.drained(ctx, shutdown, Progress::Idle).await;
        }
        if let Err(e) = publish(ctx, channel, &self.source, round).await {
            // The connection broke mid-round: the rows of every round out are
            // given back now rather than at the end of their lease (those
            // already confirmed go out twice: a timeout twice is a no-op for
            // the consumer, an event twice carries the same message id).
            self.release_all(ctx).await;
            return Err(e);
        }
        Ok(Progress::Busy)
    }

    /// Settles the oldest round out; false when shutdown came first. On
    /// false or an error every round out has been given back.
    async fn settle_oldest(
        &mut self,
        ctx: &Context,
        shutdown: &CancellationToken,
    ) -> Result<bool, Error> {
        let Some(round) = self.in_flight.front_mut() else {
            return Ok(true);
        };
        let settled = settle(ctx, &self.source, round, shutdown).await;
        if matches!(settled, Ok(true)) {
            self.in_flight.pop_front();
        } else {
            self.release_all(ctx).await;
        }
        settled
    }

    /// Settles every round out, oldest first; false when shutdown came first.
    /// On false or an error every round out has been given back.
    async fn drain(&mut self, ctx: &Context, shutdown: &CancellationToken) -> Result<bool, Error> {
        while !self.in_flight.is_empty() {
            if !self.settle_oldest(ctx, shutdown).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Settles every round out ([`Lane::drain`]), then reports `progress`;
    /// [`Progress::Stopped`] when shutdown came first.
    async fn drained(
        &mut self,
        ctx: &Context,
        shutdown: &CancellationToken,
        progress: Progress,
    ) -> Result<Progress, Error> {
        Ok(if self.drain(ctx, shutdown).await? {
            progress
        } else {
            Progress::Stopped
        })
    }

    /// Gives back every row of every round out, confirmed or not.
    async fn release_all(&mut self, ctx: &Context) {
        let rows: Vec<Row<S>> = self.in_flight.drain(..).flat_map(|r| r.rows).collect();
        release::<S>(ctx, &rows).await;
    }
}

/// Claims the next round of a source's rows. None when the database failed:
/// the table then waits out its backoff.
async fn claim<S: Source>(ctx: &Context, turn: &mut Turn) -> Option<InFlight<S>> {
    let batch = ctx.live().relay.batch_size;
    // One reading of the database's clock for the round: the claim's lease
    // and each timeout's `x-delay` (its deadline less this) are reckoned from
    // it, so a relay whose host clock runs fast publishes no delay short. It
    // is older still when the round publishes (after the last round's
    // settling): a delay only errs longer.
    let claimed = match clock::now(&ctx.db).await {
        Ok(now) => store::outbox_claim::<S::Table>(&ctx.db, batch, now)
            .await
            .map(|rows| (now, rows)),
        Err(e) => Err(e),
    };
    match claimed {
        Ok((now, rows)) => {
            turn.answered();
            Some(InFlight {
                confirms: Vec::with_capacity(rows.len()),
                rows,
                now,
            })
        }
        Err(e) => {
            let delay = turn.failed();
            ctx.telemetry.paused("relay", &e.to_string(), delay);
            None
        }
    }
}

/// Gives claimed rows back before their lease ends, for the next round.
async fn release<S: Source>(ctx: &Context, rows: &[Row<S>]) {
    if rows.is_empty() {
        return;
    }
    let ids: Vec<i64> = rows.iter().map(S::Table::row_id).collect();
    if let Err(release) = store::outbox_release::<S::Table>(&ctx.db, &ids).await {
        // Then they come back when their lease ends.
        ctx.telemetry
            .paused("relay", &release.to_string(), store::CLAIM_LEASE);
    }
}

/// Collects a round's confirms, deletes the rows the broker confirmed and
/// records the refusals; false when shutdown came while the database refused
/// the delete. Errors only when the connection or channel broke (the caller
/// gives the rows back).
async fn settle<S: Source>(
    ctx: &Context,
    source: &S,
    round: &mut InFlight<S>,
    shutdown: &CancellationToken,
) -> Result<bool, Error> {
    let mut confirmed = Vec::with_capacity(round.confirms.len());
    let mut refused = Vec::new();
    for (i, exchange, confirm) in round.confirms.drain(..) {
        // A broken connection fails here.
        match amqp_confirmed(confirm.await?, &exchange) {
            Ok(()) => confirmed.push(&round.rows[i]),
            Err(e) => refused.push((&round.rows[i], e.to_string())),
        }
    }
    let ids: Vec<i64> = confirmed.iter().map(|r| S::Table::row_id(r)).collect();
    // A failure to delete only means the rows are published again: the
    // consumer treats a duplicate timeout as a no-op, and a duplicate event
    // carries the same message id.
    let mut delete_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while let Err(e) = store::outbox_delete::<S::Table>(&ctx.db, &ids).await {
        let delay = delete_backoff.next_delay();
        ctx.telemetry.paused("relay", &e.to_string(), delay);
        if !pause(shutdown, delay).await {
            return Ok(false);
        }
    }
    source.published(ctx, &confirmed);
    if let Some((_, first)) = refused.first() {
        let outbox = S::Table::OUTBOX;
        ctx.telemetry
            .outbox_failed(outbox, refused.len() as u64, first);
        // Not retried at once: each refused row waits, and the rows behind
        // it go out meanwhile; one refused too often is set aside.
        let max_attempts = ctx.settings.relay.max_attempts;
        match store::outbox_refused::<S::Table>(&ctx.db, &refused, max_attempts, round.now).await {
            Ok(set_aside) if !set_aside.is_empty() => {
                ctx.telemetry.outbox_set_aside(outbox, &set_aside, first);
            }
            Ok(_) => {}
            // The lease ends the claim anyway; the rows come back then.
            Err(e) => ctx
                .telemetry
                .paused("relay", &e.to_string(), Duration::ZERO),
        }
    }
    Ok(true)
}

/// Publishes a round's rows without waiting between them or for their
/// confirms (collected by [`settle`]). Rows the source cannot publish are set
/// aside, not deleted. Errors only when the connection or channel broke.
async fn publish<S: Source>(
    ctx: &Context,
    channel: &lapin::Channel,
    source: &S,
    round: &mut InFlight<S>,
) -> Result<(), Error> {
    let mut unpublishable: BTreeMap<&'static str, Vec<i64>> = BTreeMap::new();
    for (i, row) in round.rows.iter().enumerate() {
        let mut out = match source.message(ctx, row, round.now) {
            Ok(out) => out,
            Err(reason) => {
                let ids = unpublishable.entry(reason).or_default();
                ids.push(S::Table::row_id(row));
                continue;
            }
        };
        // With traces on, a child of the span that wrote the row, whose
        // context the message carries.
        let span = traces::span!(
            "relay.publish",
            otel.kind = "producer",
            outbox = S::Table::OUTBOX.as_str(),
            order.id = tracing::field::Empty,
            message.name = tracing::field::Empty,
            messaging.destination.name = out.exchange.as_str(),
            messaging.rabbitmq.destination.routing_key = out.routing_key.as_str(),
        );
        if !span.is_none() {
            let (stored, order_id, name) = S::traced(row);
            traces::follow_stored(&span, stored);
            span.record("order.id", order_id);
            span.record("message.name", name);
            out.properties = traces::into_headers(&span, out.properties);
        }
        let confirm = channel
            .basic_publish(
                out.exchange.as_str().into(),
                out.routing_key.as_str().into(),
                publish_options(),
                &out.body,
                out.properties,
            )
            .await?;
        round.confirms.push((i, out.exchange, confirm));
    }
    for (reason, ids) in unpublishable {
        match store::outbox_set_aside::<S::Table>(&ctx.db, &ids, reason, round.now).await {
            Ok(()) => ctx
                .telemetry
                .outbox_set_aside(S::Table::OUTBOX, &ids, reason),
            Err(e) => ctx
                .telemetry
                .paused("relay", &e.to_string(), Duration::ZERO),
        }
    }
    Ok(())
}

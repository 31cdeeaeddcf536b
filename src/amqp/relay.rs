//! The outbox relay: publishes what transactions wrote to the two outboxes,
//! with publisher confirms, and deletes a row only when the broker has
//! confirmed its message. Nothing is published inside a transaction; with the
//! broker down, rows wait in their table and go out when it is back.
//!
//! - **Timeouts** (`outbox`, [`timeout_round`]): valid by construction, so they
//!   go straight into the delay stage of the mode in effect (the right TTL
//!   level, or the plugin's exchange): no ingest hop, no router hop.
//! - **Domain events** (`order_timeout_events`, [`event_round`]): to
//!   `<prefix>.events`, routing key `order.<event>`, with the body and message
//!   id stored at insert. This part touches no other table: it works
//!   whichever tables hold the orders.
//!
//! Each pass runs one round of timeouts, then one round of events: timeouts
//! go first, and a backlog of events delays them by at most one round. A round
//! claims up to `relay.batch_size` rows (see `store::outbox_claim`), publishes
//! them without waiting between them, then collects the confirms, so the round
//! trip is paid once per batch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::{BasicProperties, Connection, Event};
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
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut events = conn.events_listener();
    let (mut timeouts, mut domain_events) = (Turn::new(), Turn::new());
    let mut reloads = ctx.reloader.subscribe();
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        // Paused: no row is published until resumed; the rows wait in the
        // database, and a lost connection is still noticed.
        if ctx.pauses.is_paused(Pausable::Relay) {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = ctx.pauses.until(Pausable::Relay, false) => {}
                event = events.next() => connection_event(&ctx, event)?,
            }
            continue;
        }
        // Timeouts first; a table the database refuses waits out its backoff
        // without holding the other one back.
        let mut busy = false;
        // A shop's own table has no timeout outbox of ours: its checkout
        // publishes the timeouts; only the events are relayed.
        if ctx.orders.is_owned() && timeouts.due() {
            match timeout_round(&ctx, &channel, mode, &mut timeouts, &shutdown).await? {
                Progress::Stopped => return Ok(()),
                progress => busy |= progress == Progress::Busy,
            }
        }
        if domain_events.due() {
            match event_round(&ctx, &channel, &mut domain_events, &shutdown).await? {
                Progress::Stopped => return Ok(()),
                progress => busy |= progress == Progress::Busy,
            }
        }
        if busy {
            continue;
        }
        // Woken at once by a transaction's commit, or by the interval as a
        // fallback (which also ends a table's backoff); a lost connection is
        // noticed here too, not only at the next publish. A pause or a
        // reload ends the wait, to be seen at once.
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = ctx.orders.committed().wait() => {}
            _ = tokio::time::sleep(ctx.live().relay.interval) => {}
            _ = ctx.pauses.until(Pausable::Relay, true) => {}
            _ = reloads.changed() => {}
            event = events.next() => connection_event(&ctx, event)?,
        }
    }
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

/// One round of timeout rows (the `outbox` table), into the delay stage of `mode`.
async fn timeout_round(
    ctx: &Context,
    channel: &lapin::Channel,
    mode: Mode,
    turn: &mut Turn,
    shutdown: &CancellationToken,
) -> Result<Progress, Error> {
    round(ctx, channel, &Timeouts { mode }, turn, shutdown).await
}

/// One round of domain event rows (the `order_timeout_events` table), to
/// `<prefix>.events`. Needs no other table of the service.
async fn event_round(
    ctx: &Context,
    channel: &lapin::Channel,
    turn: &mut Turn,
    shutdown: &CancellationToken,
) -> Result<Progress, Error> {
    round(ctx, channel, &DomainEvents, turn, shutdown).await
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
}

/// Claims, publishes and settles one round of a source's rows. Errors only
/// when the connection or channel broke (the claimed rows are given back).
async fn round<S: Source>(
    ctx: &Context,
    channel: &lapin::Channel,
    source: &S,
    turn: &mut Turn,
    shutdown: &CancellationToken,
) -> Result<Progress, Error> {
    let batch = ctx.live().relay.batch_size;
    // One reading of the database's clock for the round: the claim's lease
    // and each timeout's `x-delay` (its deadline less this) are reckoned from
    // it, so a relay whose host clock runs fast publishes no delay short.
    let claimed = match clock::now(&ctx.db).await {
        Ok(now) => store::outbox_claim::<S::Table>(&ctx.db, batch, now)
            .await
            .map(|rows| (now, rows)),
        Err(e) => Err(e),
    };
    let (now, rows) = match claimed {
        Ok(claimed) => {
            turn.answered();
            claimed
        }
        Err(e) => {
            let delay = turn.failed();
            ctx.telemetry.paused("relay", &e.to_string(), delay);
            return Ok(Progress::Paused);
        }
    };
    if rows.is_empty() {
        return Ok(Progress::Idle);
    }
    // A pause that came while the rows were claimed holds them too: a row
    // committed after `pause` answered is not published.
    if ctx.pauses.is_paused(Pausable::Relay) {
        release::<S>(ctx, &rows).await;
        return Ok(Progress::Idle);
    }
    let round = match publish_round(ctx, channel, source, &rows, now).await {
        Ok(round) => round,
        Err(e) => {
            // The connection broke mid-round: give the rows back now rather
            // than at the end of the lease (those already confirmed go out
            // twice: a timeout twice is a no-op for the consumer, an event
            // twice carries the same message id).
            release::<S>(ctx, &rows).await;
            return Err(e);
        }
    };
    Ok(if settle(ctx, source, round, now, shutdown).await {
        Progress::Busy
    } else {
        Progress::Stopped
    })
}

/// Gives claimed rows back before their lease ends, for the next round.
async fn release<S: Source>(ctx: &Context, rows: &[Row<S>]) {
    let ids: Vec<i64> = rows.iter().map(S::Table::row_id).collect();
    if let Err(release) = store::outbox_release::<S::Table>(&ctx.db, &ids).await {
        // Then they come back when their lease ends.
        ctx.telemetry
            .paused("relay", &release.to_string(), store::CLAIM_LEASE);
    }
}

/// Deletes the rows the broker confirmed and records the refusals; false when
/// shutdown came first.
async fn settle<S: Source>(
    ctx: &Context,
    source: &S,
    round: Round<'_, Row<S>>,
    now: Millis,
    shutdown: &CancellationToken,
) -> bool {
    let Round { confirmed, refused } = round;
    let ids: Vec<i64> = confirmed.iter().map(|r| S::Table::row_id(r)).collect();
    // A failure to delete only means the rows are published again: the
    // consumer treats a duplicate timeout as a no-op, and a duplicate event
    // carries the same message id.
    let mut delete_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while let Err(e) = store::outbox_delete::<S::Table>(&ctx.db, &ids).await {
        let delay = delete_backoff.next_delay();
        ctx.telemetry.paused("relay", &e.to_string(), delay);
        if !pause(shutdown, delay).await {
            return false;
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
        match store::outbox_refused::<S::Table>(&ctx.db, &refused, max_attempts, now).await {
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
    true
}

/// What the broker said about one round's rows.
struct Round<'a, M> {
    /// Rows the broker confirmed.
    confirmed: Vec<&'a M>,
    /// Rows the broker refused, with its words.
    refused: Vec<(&'a M, String)>,
}

/// Publishes one round's rows without waiting between them, then collects the
/// confirms. Rows the source cannot publish are set aside, not deleted.
/// Errors only when the connection or channel broke.
async fn publish_round<'a, S: Source>(
    ctx: &Context,
    channel: &lapin::Channel,
    source: &S,
    rows: &'a [Row<S>],
    now: Millis,
) -> Result<Round<'a, Row<S>>, Error> {
    let mut pending = Vec::with_capacity(rows.len());
    let mut unpublishable: BTreeMap<&'static str, Vec<i64>> = BTreeMap::new();
    for row in rows {
        let out = match source.message(ctx, row, now) {
            Ok(out) => out,
            Err(reason) => {
                let ids = unpublishable.entry(reason).or_default();
                ids.push(S::Table::row_id(row));
                continue;
            }
        };
        let confirm = channel
            .basic_publish(
                out.exchange.as_str().into(),
                out.routing_key.as_str().into(),
                publish_options(),
                &out.body,
                out.properties,
            )
            .await?;
        pending.push((row, out.exchange, confirm));
    }
    for (reason, ids) in unpublishable {
        match store::outbox_set_aside::<S::Table>(&ctx.db, &ids, reason, now).await {
            Ok(()) => ctx
                .telemetry
                .outbox_set_aside(S::Table::OUTBOX, &ids, reason),
            Err(e) => ctx
                .telemetry
                .paused("relay", &e.to_string(), Duration::ZERO),
        }
    }
    let mut round = Round {
        confirmed: Vec::with_capacity(pending.len()),
        refused: Vec::new(),
    };
    for (row, exchange, confirm) in pending {
        // A broken connection fails here; the caller gives the rows back.
        match amqp_confirmed(confirm.await?, &exchange) {
            Ok(()) => round.confirmed.push(row),
            Err(e) => round.refused.push((row, e.to_string())),
        }
    }
    Ok(round)
}

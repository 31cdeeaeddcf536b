//! The outbox relay: publishes the timeouts that transactions wrote to the
//! outbox, with publisher confirms, and deletes a row only when the broker has
//! confirmed its message. Its timeouts are valid by construction, so they go
//! straight into the delay stage of the mode in effect (the right TTL level, or
//! the plugin's exchange): no ingest hop, no router hop. A checkout never
//! publishes inside its transaction; with the broker down, rows wait here and
//! go out when it is back.
//!
//! A round publishes up to `relay.batch_size` rows without waiting between
//! them, then collects the confirms, so the round trip is paid once per batch.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::Connection;
use lapin::Event;
use lapin::options::ConfirmSelectOptions;
use tokio_util::sync::CancellationToken;

use super::topology::{Mode, delay_route};
use super::wire::{self, TimeoutMessage};
use super::{Backoff, Error, confirmed as amqp_confirmed, pause, publish_options};
use crate::context::Context;
use crate::db::entities::outbox;
use crate::db::store;
use crate::domain::{Millis, OrderId, TimeoutKind};

/// The message id of an outbox row: stable across re-publishes of the same row.
pub fn message_id(row: &outbox::Model) -> String {
    format!("{}:{}:{}", row.order_id, row.kind, row.id)
}

/// Refreshes the outbox backlog gauges every second, broker or not: a backlog
/// that grows while the broker is away is exactly what operators must see.
pub async fn monitor(ctx: Arc<Context>, shutdown: CancellationToken) {
    loop {
        if let Ok(state) = store::outbox_backlog(&ctx.db).await {
            ctx.events.outbox_backlog(state, Millis::now());
        }
        if !pause(&shutdown, Duration::from_secs(1)).await {
            return;
        }
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
    let mut db_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let claimed =
            store::outbox_claim(&ctx.db, ctx.settings.relay.batch_size, Millis::now()).await;
        let rows = match claimed {
            Ok(rows) => {
                db_backoff.reset();
                rows
            }
            Err(e) => {
                let delay = db_backoff.next_delay();
                ctx.events.paused("relay", &e.to_string(), delay);
                if !pause(&shutdown, delay).await {
                    return Ok(());
                }
                continue;
            }
        };
        if rows.is_empty() {
            // Woken at once by a checkout's commit, or by the interval as a fallback;
            // a lost connection is noticed here too, not only at the next publish.
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = ctx.relay_wakeup.notified() => {}
                _ = tokio::time::sleep(ctx.settings.relay.interval) => {}
                event = events.next() => match event {
                    Some(Event::Error(e)) => return Err(e.into()),
                    Some(Event::ConnectionBlocked(reason)) => {
                        ctx.events.publishing_blocked("relay", &reason);
                    }
                    Some(_) => {}
                    None => return Err(Error::ConnectionEnded),
                },
            }
            continue;
        }
        let round = match publish_round(&ctx, &channel, mode, &rows).await {
            Ok(round) => round,
            Err(e) => {
                // The connection broke mid-round: give the rows back now rather
                // than at the end of the lease (those already confirmed go out
                // twice, which the consumer treats as a no-op).
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                if let Err(release) = store::outbox_release(&ctx.db, &ids).await {
                    // Then they come back when their lease ends.
                    ctx.events
                        .paused("relay", &release.to_string(), store::CLAIM_LEASE);
                }
                return Err(e);
            }
        };
        if !settle(&ctx, round, &shutdown).await {
            return Ok(());
        }
    }
}

/// Deletes the rows the broker confirmed and records the refusals; false when
/// shutdown came first.
async fn settle(ctx: &Context, round: Round<'_>, shutdown: &CancellationToken) -> bool {
    let Round { confirmed, refused } = round;
    // A failure to delete only means the rows are published again: the
    // consumer treats a duplicate as a no-op.
    let mut delete_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while let Err(e) = store::outbox_delete(&ctx.db, &confirmed).await {
        let delay = delete_backoff.next_delay();
        ctx.events.paused("relay", &e.to_string(), delay);
        if !pause(shutdown, delay).await {
            return false;
        }
    }
    ctx.events.outbox_published(confirmed.len() as u64);
    if let Some((_, first)) = refused.first() {
        ctx.events.outbox_failed(refused.len() as u64, first);
        // Not retried at once: each refused row waits, and the rows behind
        // it go out meanwhile; one refused too often is set aside.
        let max_attempts = ctx.settings.relay.max_attempts;
        match store::outbox_refused(&ctx.db, &refused, max_attempts, Millis::now()).await {
            Ok(set_aside) if !set_aside.is_empty() => {
                ctx.events.outbox_set_aside(&set_aside, first);
            }
            Ok(_) => {}
            // The lease ends the claim anyway; the rows come back then.
            Err(e) => ctx.events.paused("relay", &e.to_string(), Duration::ZERO),
        }
    }
    true
}

/// What the broker said about one round's rows.
struct Round<'a> {
    /// Ids of rows the broker confirmed (or that were set aside).
    confirmed: Vec<i64>,
    /// Rows the broker refused, with its words.
    refused: Vec<(&'a outbox::Model, String)>,
}

/// Publishes one round's rows without waiting between them, then collects the
/// confirms. Rows of a kind this version does not know are set aside, not
/// deleted: a newer instance may have written them, and an operator must see
/// them. Errors only when the connection or channel broke.
async fn publish_round<'a>(
    ctx: &Context,
    channel: &lapin::Channel,
    mode: Mode,
    rows: &'a [outbox::Model],
) -> Result<Round<'a>, Error> {
    let now = Millis::now();
    let mut pending = Vec::with_capacity(rows.len());
    let mut unknown = Vec::new();
    for row in rows {
        let Ok(kind) = row.kind.parse::<TimeoutKind>() else {
            unknown.push(row.id);
            continue;
        };
        let message = TimeoutMessage {
            order_id: OrderId::new(row.order_id).into(),
            kind,
            due_at: Some(Millis(row.due_at_ms)),
        };
        // The contract wants 0 < x-delay: a deadline already passed goes out at 1 ms.
        let delay_ms = (row.due_at_ms - now.0).clamp(1, wire::MAX_DELAY_MS as i64) as u64;
        let properties = wire::properties(&message_id(row), now, delay_ms, &[]);
        let (exchange, routing_key) = delay_route(&ctx.names, mode, kind, delay_ms);
        let confirm = channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                publish_options(),
                &wire::encode(&message),
                properties,
            )
            .await?;
        pending.push((row, exchange, confirm));
    }
    if !unknown.is_empty() {
        let reason = "a timeout kind this version does not know (written by a newer version?)";
        match store::outbox_set_aside(&ctx.db, &unknown, reason, now).await {
            Ok(()) => ctx.events.outbox_set_aside(&unknown, reason),
            Err(e) => ctx.events.paused("relay", &e.to_string(), Duration::ZERO),
        }
    }
    let mut round = Round {
        confirmed: Vec::with_capacity(pending.len()),
        refused: Vec::new(),
    };
    for (row, exchange, confirm) in pending {
        // A broken connection fails here; the caller gives the rows back.
        match amqp_confirmed(confirm.await?, &exchange) {
            Ok(()) => round.confirmed.push(row.id),
            Err(e) => round.refused.push((row, e.to_string())),
        }
    }
    Ok(round)
}

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
use crate::app::Context;
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
        if let Ok((rows, oldest)) = store::outbox_backlog(&ctx.db).await {
            let age = oldest.map(|o| Millis::now().since(o)).unwrap_or_default();
            ctx.events.outbox_backlog(rows, age);
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
        let rows = match store::outbox_pending(&ctx.db, ctx.settings.relay.batch_size).await {
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
                        tracing::warn!(reason, "the broker blocked publishing (resource alarm)");
                    }
                    Some(_) => {}
                    None => return Err(Error::ConnectionEnded),
                },
            }
            continue;
        }
        let now = Millis::now();
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let Ok(kind) = row.kind.parse::<TimeoutKind>() else {
                // Only this service writes the outbox; a foreign kind is a bug to surface, not to loop on.
                tracing::error!(outbox_id = row.id, kind = %row.kind, "outbox row with an unknown kind; deleting it");
                pending.push((row.id, None));
                continue;
            };
            let message = TimeoutMessage {
                order_id: OrderId::new(row.order_id),
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
            pending.push((row.id, Some((exchange, confirm))));
        }
        let mut confirmed = Vec::with_capacity(pending.len());
        let mut refused = Vec::new();
        for (id, confirm) in pending {
            match confirm {
                None => confirmed.push(id),
                Some((exchange, confirm)) => {
                    // A broken connection fails here; the rows stay for the next connection.
                    match amqp_confirmed(confirm.await?, &exchange) {
                        Ok(()) => confirmed.push(id),
                        Err(e) => refused.push((id, e)),
                    }
                }
            }
        }
        // A failure to delete only means the rows are published again: the
        // consumer treats a duplicate as a no-op.
        let published = confirmed.len() as u64;
        let mut delete_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        while let Err(e) = store::outbox_delete(&ctx.db, &confirmed).await {
            let delay = delete_backoff.next_delay();
            ctx.events.paused("relay", &e.to_string(), delay);
            if !pause(&shutdown, delay).await {
                return Ok(());
            }
        }
        ctx.events.outbox_published(published);
        if let Some((_, first)) = refused.first() {
            ctx.events
                .outbox_failed(refused.len() as u64, &first.to_string());
            let refused: Vec<i64> = refused.iter().map(|(id, _)| *id).collect();
            let _ = store::outbox_failed(&ctx.db, &refused).await;
            if !pause(&shutdown, Duration::from_secs(1)).await {
                return Ok(());
            }
        }
    }
}

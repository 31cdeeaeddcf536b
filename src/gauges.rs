//! The on-call gauges: every `metrics.gauge_interval`, how many orders wait
//! for a timeout of each kind, how many of them are overdue by more than
//! `metrics.overdue_after` (the number that must be zero), and how late the
//! oldest is, and how many fall due within the next minute, five and sixty
//! (`due_next`). Read from the database, not counted from events, so they hold
//! whatever happened to the messages and whichever instance applies the
//! timeouts; every instance reads the same numbers.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::domain::{Millis, TimeoutKind};
use crate::telemetry::DUE_WINDOWS;

/// Reads the gauges at once, then every interval until shutdown.
/// A reload reads them at once too, with the new settings.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut reloads = ctx.reloader.subscribe();
    loop {
        // One reading of the database's clock: overdue is judged by it, and
        // this host's clock is compared with it for the skew gauge.
        match crate::db::clock::skew(&ctx.db).await {
            Ok(skew) => {
                ctx.telemetry.clock_skew(skew);
                refresh(&ctx, skew.database).await;
            }
            Err(e) => ctx.telemetry.backlog_unreadable(&e.to_string()),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(ctx.live().metrics.gauge_interval) => {}
            _ = reloads.changed() => {}
        }
    }
}

/// One reading of every kind the orders map. All or nothing: a kind that
/// fails withdraws every series, so no gauge shows one reading next to
/// another's.
pub async fn refresh(ctx: &Context, now: Millis) {
    let overdue_after = ctx.live().metrics.overdue_after;
    let horizons = DUE_WINDOWS.map(|(_, window)| window);
    let mut backlogs = Vec::new();
    let mut ahead = Vec::new();
    for kind in TimeoutKind::ALL {
        let read = async {
            let backlog = ctx
                .orders
                .backlog(&ctx.db, kind, now, overdue_after)
                .await?;
            let due = ctx.orders.due_ahead(&ctx.db, kind, now, &horizons).await?;
            Ok::<_, sea_orm::DbErr>(backlog.zip(due))
        };
        match read.await {
            Ok(Some((backlog, due))) => {
                backlogs.push((kind, backlog));
                ahead.push((kind, due));
            }
            Ok(None) => {}
            Err(e) => {
                ctx.telemetry.backlog_unreadable(&e.to_string());
                return;
            }
        }
    }
    ctx.telemetry.backlog_read(&backlogs, &ahead);
}

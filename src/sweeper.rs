//! The sweeper: the safety net under every timer. Every `sweeper.interval` it
//! applies each kind's transition to orders overdue by more than
//! `sweeper.grace`, in bounded batches, whatever happened to their messages.
//! It uses the same conditional transitions as the consumers, so any number of
//! instances may sweep at once without double effects. Each catch is logged
//! and counted: it means a broker-side timer was lost or late.

use std::sync::Arc;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use crate::app::Context;
use crate::db::store::{self, Cause, ExpiryOutcome};
use crate::domain::{Millis, TimeoutKind};

/// Sweeps every interval until shutdown.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let interval = ctx.settings.sweeper.interval;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = sweep(&ctx, Millis::now()).await {
            ctx.health.set_database(false);
            ctx.events.paused("sweeper", &e.to_string(), interval);
        }
    }
}

/// One sweep over every kind; returns how many orders it caught.
pub async fn sweep(ctx: &Context, now: Millis) -> Result<u64, DbErr> {
    let settings = &ctx.settings.sweeper;
    let before = now.minus(settings.grace);
    let mut caught = 0;
    for kind in TimeoutKind::ALL {
        loop {
            let ids = store::overdue(&ctx.db, kind, before, settings.batch_size).await?;
            if ids.is_empty() {
                break;
            }
            let now = Millis::now();
            let outcomes = store::expire(&ctx.db, kind, &ids, now, Cause::Sweeper).await?;
            for (id, outcome) in &outcomes {
                if let ExpiryOutcome::Applied { deadline } = outcome {
                    caught += 1;
                    ctx.events
                        .sweeper_catch(kind, *id, now.signed_since(*deadline));
                }
            }
            if (ids.len() as u64) < settings.batch_size {
                break;
            }
        }
    }
    Ok(caught)
}

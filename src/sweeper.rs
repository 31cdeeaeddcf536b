//! The sweeper: the safety net under every timer. Every `sweeper.interval` it
//! applies each kind's transition to orders overdue by more than
//! `sweeper.grace`, in bounded batches, whatever happened to their messages.
//! It uses the same conditional transitions as the consumers, so any number of
//! instances may sweep at once without double effects. Each catch is logged
//! and counted: it means a broker-side timer was lost or late.
//!
//! A paused sweeper skips its rounds; while the consumer of a kind is paused,
//! the sweeper leaves that kind alone too, so that a pause stops the kind's
//! transitions on this instance (unpaid orders are not cancelled while a
//! payment provider is down, say). Both are checked before every page, and
//! each page's transaction passes both gates ([`crate::control::Pauses::enter`]):
//! once either pause has answered, no page of the sweep starts.

use std::sync::Arc;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use crate::apply::{OnRefusal, apply, gates};
use crate::context::Context;
use crate::control::Pausable;
use crate::db::clock;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::orders::{Cause, Unreadable};

/// Sweeps every `sweeper.interval` until shutdown, unless paused. A reload
/// starts the wait again with the new interval.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut reloads = ctx.reloader.subscribe();
    loop {
        let interval = ctx.live().sweeper.interval;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
            _ = reloads.changed() => continue,
        }
        if ctx.pauses.is_paused(Pausable::Sweeper) {
            continue;
        }
        // Overdue by the database's clock, not this host's (`db::clock`).
        let swept = match clock::now(&ctx.db).await {
            Ok(now) => sweep(&ctx, now).await,
            Err(e) => Err(e),
        };
        if let Err(e) = swept {
            ctx.telemetry.paused("sweeper", &e.to_string(), interval);
        }
    }
}

/// One sweep over every kind; returns how many orders it caught. Each kind is
/// swept on its own: one that fails does not keep the others from their turn.
/// Errs (after every kind had its turn) only when the database is away.
pub async fn sweep(ctx: &Context, now: Millis) -> Result<u64, DbErr> {
    let mut caught = 0;
    let mut failed = None;
    let kinds = TimeoutKind::ALL
        .into_iter()
        .filter(|k| ctx.orders.maps(*k) && !ctx.pauses.any_paused(&gates(*k, Cause::Sweeper)));
    for kind in kinds {
        match sweep_kind(ctx, kind, now).await {
            Ok(n) => caught += n,
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(caught),
    }
}

/// Sweeps one kind, a page at a time, oldest deadline first. Pages follow each
/// other by `(deadline, id)`, so an order the database refuses is passed over
/// in this sweep (and tried again in the next), not taken again and again.
async fn sweep_kind(ctx: &Context, kind: TimeoutKind, now: Millis) -> Result<u64, DbErr> {
    let mut unreadable = Unreadable::default();
    let swept = sweep_pages(ctx, kind, now, &mut unreadable).await;
    // Told once per round, whatever ended it, never once per row.
    if unreadable.total() > 0 {
        ctx.telemetry.unreadable_ids(kind, &unreadable);
    }
    swept
}

/// The pages of [`sweep_kind`]; the unreadable ids read go to `unreadable`.
async fn sweep_pages(
    ctx: &Context,
    kind: TimeoutKind,
    now: Millis,
    unreadable: &mut Unreadable,
) -> Result<u64, DbErr> {
    let settings = ctx.live().sweeper.clone();
    let mut caught = 0;
    let mut after = None;
    // Paused mid-sweep: the rest waits for the resume.
    while !ctx.pauses.any_paused(&gates(kind, Cause::Sweeper)) {
        let page = ctx
            .orders
            .overdue(
                &ctx.db,
                kind,
                now,
                settings.grace,
                after.as_ref(),
                settings.batch_size,
            )
            .await?;
        unreadable.merge(page.unreadable);
        // Pages continue after the last row read, kept or not: a page of
        // unreadable ids does not end the sweep.
        let Some(next) = page.next else {
            return Ok(caught);
        };
        after = Some(next);
        let ids: Vec<OrderKey> = page.orders.into_iter().map(|(id, _)| id).collect();
        if !ids.is_empty() {
            caught += apply_page(ctx, kind, ids).await?;
        }
        if !page.full {
            return Ok(caught);
        }
    }
    Ok(caught)
}

/// Applies a page; when the database answers but refuses it, halves it down
/// to the orders it refuses, which are told and left for the next sweep
/// ([`OnRefusal::PassOver`]). A pause that comes first leaves the rest of the
/// page for the resume. Errs when the database is away.
async fn apply_page(ctx: &Context, kind: TimeoutKind, ids: Vec<OrderKey>) -> Result<u64, DbErr> {
    let decided = apply(ctx, kind, ids, Cause::Sweeper, OnRefusal::PassOver)
        .await
        .unwrap_or_default();
    let mut caught = 0;
    for (id, lateness_ms) in decided.applied() {
        ctx.telemetry.sweeper_catch(kind, id, lateness_ms);
        caught += 1;
    }
    for (id, error) in &decided.refused {
        ctx.telemetry.sweeper_refused(kind, id, error);
    }
    match decided.away {
        Some(e) => Err(e),
        None => Ok(caught),
    }
}

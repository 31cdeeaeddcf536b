//! Shadow mode's watch (`orders.shadow = true`, see
//! `orders::mapped::shadow`): every second, each order the service would
//! have closed is looked up in the shop's table until the shop changes it,
//! so that a close by the shop's cron shows within a second of it; every
//! few seconds the report's counts go to `order_timeout_shadow_orders`.
//! Nothing here writes to the shop's tables.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::domain::{Millis, TimeoutKind};
use crate::orders::mapped::ShadowReport;

/// How often the orders the shop has not changed yet are looked up.
const WATCH: Duration = Duration::from_secs(1);

/// Every how many looks the report is counted for the metrics.
const REPORT_EVERY: u32 = 5;

/// The report of every mapped kind read through `db`, with the database's
/// clock it is reckoned from; `None` outside shadow mode.
pub async fn report(
    ctx: &Context,
    db: &DatabaseConnection,
) -> Result<Option<(Millis, Vec<(TimeoutKind, ShadowReport)>)>, DbErr> {
    let Some(mapped) = ctx.orders.mapped().filter(|m| m.is_shadow()) else {
        return Ok(None);
    };
    let now = crate::db::clock::now(db).await?;
    let mut kinds = Vec::new();
    for kind in TimeoutKind::ALL {
        if let Some(report) = mapped.shadow_report(db, kind, now).await? {
            kinds.push((kind, report));
        }
    }
    Ok(Some((now, kinds)))
}

/// Watches until shutdown; returns at once outside shadow mode.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let Some(mapped) = ctx.orders.mapped().filter(|m| m.is_shadow()).cloned() else {
        return;
    };
    let mut tick = tokio::time::interval(WATCH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looks = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let look = async {
            let now = crate::db::clock::now(&ctx.db).await?;
            for kind in TimeoutKind::ALL {
                let noted = mapped.shadow_watch(&ctx.db, kind, now).await?;
                if noted > 0 {
                    tracing::debug!(
                        kind = kind.as_str(),
                        noted,
                        "shadow: the shop changed orders the service would have closed"
                    );
                }
            }
            Ok::<_, DbErr>(())
        };
        if let Err(e) = look.await {
            tracing::warn!(error = %e, "shadow: could not look up the shop's orders; trying again");
            continue;
        }
        looks = looks.wrapping_add(1);
        if looks % REPORT_EVERY == 1 {
            match report(&ctx, &ctx.db).await {
                Ok(Some((_, kinds))) => {
                    for (kind, r) in kinds {
                        ctx.telemetry.shadow_counted(kind.as_str(), &r);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "shadow: could not count the report"),
            }
        }
    }
}

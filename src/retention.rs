//! The audit trail's retention: in the mapped mode every transition writes
//! a row of `order_timeout_audit` in the shop's database, which would
//! otherwise grow for ever. Once at start and then every hundredth of
//! `audit.retention` (at least a minute apart, at most an hour), the rows
//! older than the retention by the database's clock are deleted, [`BATCH`]
//! rows per statement with [`PAUSE`] between statements, so that the shop's
//! database never sees a long statement or a long lock, even on the first
//! run over years of rows.
//!
//! Every instance runs it: each statement is bounded, so instances running
//! at once only share (or wait for) the same batches; none deletes a row
//! that is not past its retention.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::db;

/// Most rows one statement deletes.
pub const BATCH: u64 = 5_000;

/// The wait between two statements of a round: the shop's own writes and
/// replication catch up in between.
pub const PAUSE: Duration = Duration::from_millis(200);

/// Rounds until shutdown. A reload (a new `audit.retention`) starts a round
/// at once; `off` leaves the trail alone.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut reloads = ctx.reloader.subscribe();
    loop {
        let retention = ctx.live().audit.retention;
        if let Some(retention) = retention
            && let Err(e) = round(&ctx, retention, BATCH, PAUSE, &shutdown).await
        {
            ctx.telemetry.audit_cleanup_failed(&e.to_string());
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every(retention)) => {}
            _ = reloads.changed() => {}
        }
    }
}

/// How long between rounds: a hundredth of the retention (a row then
/// outlives its retention by at most 1 %), at least a minute, at most an
/// hour; an hour while the trail is kept for ever (a reload wakes it).
pub fn every(retention: Option<Duration>) -> Duration {
    match retention {
        Some(retention) => {
            (retention / 100).clamp(Duration::from_secs(60), Duration::from_secs(3600))
        }
        None => Duration::from_secs(3600),
    }
}

/// One round: the rows written more than `retention` before the database's
/// now, `batch` per statement with `pause` between, until a statement
/// deletes fewer than `batch` (none older are left) or shutdown. Returns
/// how many it deleted; each statement's count is counted as it commits.
pub async fn round(
    ctx: &Context,
    retention: Duration,
    batch: u64,
    pause: Duration,
    shutdown: &CancellationToken,
) -> Result<u64, DbErr> {
    // Judged by the database's clock, which stamped the rows (`at_ms`).
    let before = db::clock::now(&ctx.db).await?.minus(retention);
    let mut deleted = 0;
    loop {
        let n = db::store::delete_old_audit(&ctx.db, before, batch).await?;
        deleted += n;
        if n > 0 {
            ctx.telemetry.audit_rows_deleted(n, before);
        }
        if n < batch {
            return Ok(deleted);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(deleted),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_come_a_hundredth_of_the_retention_apart_within_bounds() {
        let day = Duration::from_secs(86_400);
        assert_eq!(every(Some(day * 90)), Duration::from_secs(3600));
        assert_eq!(every(Some(day)), Duration::from_secs(864));
        assert_eq!(
            every(Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
        assert_eq!(every(None), Duration::from_secs(3600));
    }
}

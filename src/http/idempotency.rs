//! The cleaner of idempotency keys: a key is kept `http.idempotency_retention`
//! after its checkout (a retry comes within minutes), then deleted, in
//! batches of [`BATCH`] rows per statement so that no statement holds many
//! locks or runs long, even on the first run after an upgrade.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::db;

/// Most rows one DELETE removes.
pub const BATCH: u64 = 1_000;

/// Deletes expired keys at once, then every quarter of the retention (at
/// least every 250 ms, at most every 5 minutes), until shutdown. The age is
/// judged by the database's clock, as the checkout that wrote the key did.
pub async fn clean(ctx: Arc<Context>, shutdown: CancellationToken) {
    let retention = ctx.settings.http.idempotency_retention;
    let every = (retention / 4).clamp(Duration::from_millis(250), Duration::from_secs(300));
    loop {
        if let Err(e) = round(&ctx, retention, &shutdown).await {
            ctx.telemetry.idempotency_cleanup_failed(&e.to_string());
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One round: batches until one is short (nothing older is left).
async fn round(
    ctx: &Context,
    retention: Duration,
    shutdown: &CancellationToken,
) -> Result<(), sea_orm::DbErr> {
    let before = db::clock::now(&ctx.db).await?.minus(retention);
    let mut deleted = 0;
    loop {
        let n = db::store::delete_expired_keys(&ctx.db, before, BATCH).await?;
        deleted += n;
        if n < BATCH || shutdown.is_cancelled() {
            break;
        }
        // Let the checkouts in between the batches.
        tokio::task::yield_now().await;
    }
    if deleted > 0 {
        ctx.telemetry.idempotency_keys_expired(deleted);
    }
    Ok(())
}

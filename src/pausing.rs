//! Pausing and resuming a role, in either scope, and following the pauses
//! other instances make.
//!
//! A shared pause (the default) is a row of `order_timeout_pauses`
//! ([`db::pauses`]): the instance that is asked writes it (one conditional
//! `INSERT`; a role already paused keeps its first pauser) and applies it at
//! once; every other instance reads the table every `control.poll_interval`
//! ([`follow`]) and applies what changed exactly as a local pause, gate
//! included. Every instance reads it at start ([`load`]), before any of its
//! roles acts, so a restart, a rescheduled pod or a new instance starts
//! paused. When the table cannot be read the last known pauses stay: a pause
//! is never lifted because the database did not answer.
//!
//! An instance-scoped pause lives in this process's memory only
//! ([`crate::control::Pauses`]) and works while the database is away.
//!
//! Every change, whichever way it comes, goes through here and is logged and
//! counted once, by the instance it applies to.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::control::{Changed, Pausable, Pause, PauseScope};
use crate::db;
use crate::db::pauses::Row;
use crate::domain::Millis;

/// How long an instance-scoped pause waits for the database's clock before
/// it stamps the pause with the process's.
const CLOCK_WAIT: Duration = Duration::from_secs(1);

/// Why a shared pause or resume could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PausingError {
    /// The database did not answer: nothing was written, and this
    /// instance's state did not change.
    #[error("the shared pauses could not be {what} in the database: {source}")]
    Database {
        /// `written` or `read`.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: DbErr,
    },
}

impl PausingError {
    fn written(source: DbErr) -> Self {
        Self::Database {
            what: "written",
            source,
        }
    }

    fn read(source: DbErr) -> Self {
        Self::Database {
            what: "read",
            source,
        }
    }
}

/// The pause a row stands for.
fn pause_of(row: &Row) -> Pause {
    Pause {
        since: Millis(row.paused_at_ms),
        by: row.paused_by.clone(),
        instance: row.instance.clone(),
        reason: row.reason.clone(),
    }
}

/// Pauses `role` in `scope` for `by` (who asked), with an optional reason;
/// returns once the role's transactions under way have ended. `scope` in
/// the answer says whether that scope's pause is new (false: it already
/// was paused, and its first pauser stays).
pub async fn pause(
    ctx: &Context,
    role: Pausable,
    scope: PauseScope,
    by: String,
    reason: Option<String>,
) -> Result<Changed, PausingError> {
    let instance = ctx.settings.amqp.instance.clone();
    match scope {
        PauseScope::Instance => {
            // A pause of this instance must work while the database is away
            // (that may be why it is asked for): its stamp then comes from
            // the process's clock, without waiting for a connection that
            // may never come. It decides nothing, it is shown.
            let since = tokio::time::timeout(CLOCK_WAIT, db::clock::now(&ctx.api_db))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_else(Millis::now);
            let pause = Pause {
                since,
                by,
                instance,
                reason,
            };
            let changed = ctx.pauses.pause(role, scope, pause.clone(), false).await;
            if changed.scope {
                ctx.telemetry.role_paused(role, scope, &pause);
            }
            Ok(changed)
        }
        PauseScope::Shared => {
            let mut writes = ctx.pauses.shared_lock().await;
            *writes += 1;
            let since = db::clock::now(&ctx.api_db)
                .await
                .map_err(PausingError::written)?;
            let row = Row {
                role: role.as_str().to_string(),
                paused_at_ms: since.0,
                paused_by: by,
                instance,
                reason,
            };
            let inserted = db::pauses::insert(&ctx.api_db, row.clone())
                .await
                .map_err(PausingError::written)?;
            // Paused already: the row that stays says by whom. Read only to
            // show it here before the next reading would.
            let row = if inserted {
                Some(row)
            } else {
                db::pauses::get(&ctx.api_db, role.as_str())
                    .await
                    .map_err(PausingError::read)?
            };
            let Some(row) = row else {
                // Resumed between the two statements by another instance:
                // nothing is paused, as the table says.
                return Ok(Changed {
                    scope: false,
                    paused: ctx.pauses.is_paused(role),
                });
            };
            let pause = pause_of(&row);
            let local = ctx.pauses.pause(role, scope, pause.clone(), true).await;
            if local.scope {
                ctx.telemetry.role_paused(role, scope, &pause);
            }
            Ok(Changed {
                scope: inserted,
                paused: local.paused,
            })
        }
    }
}

/// Lifts the pause of `role` in `scope`; it runs again unless the other
/// scope still holds it (`paused` in the answer).
pub async fn resume(
    ctx: &Context,
    role: Pausable,
    scope: PauseScope,
) -> Result<Changed, PausingError> {
    match scope {
        PauseScope::Instance => Ok(apply_resume(ctx, role, scope)),
        PauseScope::Shared => {
            // Held until applied, counted: the follower does not apply a
            // reading it began before the DELETE.
            let mut writes = ctx.pauses.shared_lock().await;
            *writes += 1;
            let deleted = db::pauses::delete(&ctx.api_db, role.as_str())
                .await
                .map_err(PausingError::written)?;
            // Cleared here even when no row was deleted: another instance
            // resumed it and this one had not read that yet.
            let local = apply_resume(ctx, role, scope);
            Ok(Changed {
                scope: deleted || local.scope,
                paused: local.paused,
            })
        }
    }
}

fn apply_resume(ctx: &Context, role: Pausable, scope: PauseScope) -> Changed {
    let local = ctx.pauses.resume(role, scope);
    if local.scope {
        ctx.telemetry.role_resumed(role, scope, local.paused);
    }
    local
}

/// Reads the shared pauses and applies them: at start, before any role
/// runs. An error stops the start: an instance that cannot tell whether
/// its roles are paused must not run them.
pub async fn load(ctx: &Context) -> Result<(), DbErr> {
    let _shared = ctx.pauses.shared_lock().await;
    let rows = db::pauses::all(&ctx.db).await?;
    apply(ctx, &rows).await;
    Ok(())
}

/// Longest the follower waits for one reading of the shared pauses.
const READ_LIMIT: Duration = Duration::from_secs(5);

/// Follows the shared pauses until shutdown: every `control.poll_interval`,
/// applies what other instances paused and resumed.
pub async fn follow(ctx: Arc<Context>, shutdown: CancellationToken) {
    let interval = ctx.settings.control.poll_interval;
    let mut failed: u64 = 0;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        // The read holds nothing the API needs: a pause or resume asked
        // meanwhile writes and answers at once, and this reading, begun
        // before that write, is dropped (the next one sees it). A read that
        // hangs (a stuck connection, a lock) is given up at READ_LIMIT.
        let before = *ctx.pauses.shared_lock().await;
        let read = match tokio::time::timeout(READ_LIMIT, db::pauses::all(&ctx.db)).await {
            Ok(Ok(rows)) => {
                let writes = ctx.pauses.shared_lock().await;
                if *writes == before {
                    apply(&ctx, &rows).await;
                }
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {READ_LIMIT:?}")),
        };
        match read {
            Ok(()) if failed > 0 => {
                ctx.telemetry.shared_pauses_read_again(failed);
                failed = 0;
            }
            Ok(()) => {}
            Err(e) => {
                failed += 1;
                ctx.telemetry.shared_pauses_unread(&e, failed);
            }
        }
    }
}

/// Makes this instance's shared pauses what `rows` say: a role with a row is
/// paused (gate included), one without is resumed from its shared pause.
/// Rows of roles this version does not know are left alone. Called with the
/// shared lock held.
async fn apply(ctx: &Context, rows: &[Row]) {
    for (role, state) in ctx.pauses.snapshot() {
        let read = rows.iter().find(|r| r.role == role.as_str()).map(pause_of);
        match (read, &state.shared) {
            (Some(read), shown) if shown.as_ref() != Some(&read) => {
                let changed = ctx
                    .pauses
                    .pause(role, PauseScope::Shared, read.clone(), true)
                    .await;
                if changed.scope {
                    ctx.telemetry.role_paused(role, PauseScope::Shared, &read);
                }
            }
            (None, Some(_)) => {
                apply_resume(ctx, role, PauseScope::Shared);
            }
            _ => {}
        }
    }
}

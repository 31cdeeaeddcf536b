//! A shop's zone-less time columns read in the database server's default
//! zone are read in a guess: the zone the shop's own sessions get when they
//! set none, which need not be the one its code writes in. A wrong guess
//! west of the shop makes every stamp look hours old and would close live
//! orders early, so the guess is checked against evidence a shop cannot
//! fake: an order that appears while the service watches was written just
//! now, so the newest stamp among a kind's waiting orders must lie within
//! [`TOLERANCE`] of the database's now in the zone in use.
//!
//! Until a new order has confirmed the zone, each such kind is held (an
//! instance pause by [`HOLDER`], shown as paused with the reason): a first
//! start closes nothing of the backlog a cron left, nor any timer. A new
//! order that fits releases it; one that does not keeps it held, fails
//! `/readyz`, and says in the log, `doctor` and `order_timeout_time_zone_check`
//! the offset it saw and the UTC offset that would fit. The verdict is kept
//! in `order_timeout_zone_checks`, so a restart resumes at once after a
//! confirmation and stays held after a mismatch. `mapping.time_zone` set
//! explicitly is trusted: nothing here runs.

pub mod verdicts;

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait, Value};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::control::{Pausable, Pause, PauseScope};
use crate::domain::{Millis, TimeoutKind};
use crate::orders::mapped::sql::{Dialect, Sql};
use crate::orders::mapped::{Mapped, Stamp, StampValue};
pub use verdicts::Verdict;

/// How far a just-written stamp may lie from the database's now.
pub const TOLERANCE: Duration = Duration::from_secs(15 * 60);

/// How often the newest stamps are read.
const WATCH: Duration = Duration::from_secs(1);

/// Who holds a kind whose zone is not confirmed, as its pause says.
pub const HOLDER: &str = "order-timeout time zone check";

/// Whether a stamp that appeared within the last `elapsed_ms` fits the zone:
/// a `since_column` (written as the order enters the status) lies within
/// [`TOLERANCE`] of now; a `deadline_column` (a time ahead) is not more than
/// that in the past.
pub fn fits(ahead_ms: i64, since: bool, elapsed_ms: i64) -> bool {
    let tolerance = TOLERANCE.as_millis() as i64;
    let not_before = ahead_ms >= -(tolerance + elapsed_ms.max(0));
    not_before && (!since || ahead_ms <= tolerance)
}

/// The UTC offset a writer had whose wall clock lay `offset_ms` after UTC,
/// to the quarter hour, as `mapping.time_zone` takes it (`-05:00`).
pub fn offset_text(offset_ms: i64) -> String {
    let quarter = 15 * 60 * 1000;
    let minutes = ((offset_ms as f64 / quarter as f64).round() as i64) * 15;
    let sign = if minutes < 0 { '-' } else { '+' };
    format!("{sign}{:02}:{:02}", minutes.abs() / 60, minutes.abs() % 60)
}

/// The verdict's sentence, for the pause's reason, the log and `doctor`.
pub fn describe(mapped: &Mapped, kind: TimeoutKind, verdict: &Verdict) -> String {
    let zone = &mapped.zone.used;
    match verdict {
        Verdict::Unconfirmed => format!(
            "time zone unconfirmed: mapping.time_zone is empty and the server's default zone '{zone}' is a guess; nothing of {kind} is closed until an order written now confirms it (or set mapping.time_zone to the zone the shop writes in)"
        ),
        Verdict::Fits => format!("time zone '{zone}' confirmed for {kind} by a new order"),
        Verdict::Off {
            ahead_ms,
            fitting,
            stamp,
        } => {
            let hours = *ahead_ms as f64 / 3_600_000.0;
            format!(
                "time zone mismatch: a new {kind} order's stamp {stamp} lies {hours:+.2} h from now in '{zone}'; it fits UTC{fitting}: set mapping.time_zone to the zone the shop writes in; nothing of {kind} is closed meanwhile"
            )
        }
    }
}

fn dialect(db: &DatabaseConnection) -> Result<Dialect, DbErr> {
    Dialect::of(db.get_database_backend())
        .ok_or_else(|| DbErr::Custom("a mapped table needs PostgreSQL or MySQL/MariaDB".into()))
}

/// The verdict kept for `kind` about `zone`; `None` when there is none (or
/// it was about another zone).
pub async fn recorded(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    zone: &str,
) -> Result<Option<Verdict>, DbErr> {
    let d = dialect(db)?;
    let mut sql = Sql::new(d);
    sql.push("SELECT zone, verdict, ahead_ms, fitting, stamp FROM order_timeout_zone_checks WHERE kind = ")
        .bind(Value::from(kind.as_str()));
    let Some(row) = db.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    let seen: String = row.try_get_by_index(0)?;
    if seen != zone {
        return Ok(None);
    }
    let verdict: String = row.try_get_by_index(1)?;
    Ok(Some(if verdict == "fits" {
        Verdict::Fits
    } else {
        Verdict::Off {
            ahead_ms: row.try_get_by_index(2)?,
            fitting: row
                .try_get_by_index::<Option<String>>(3)?
                .unwrap_or_default(),
            stamp: row
                .try_get_by_index::<Option<String>>(4)?
                .unwrap_or_default(),
        }
    }))
}

/// Keeps a verdict (fits or off) for `kind`.
async fn record(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    zone: &str,
    verdict: &Verdict,
    at: Millis,
) -> Result<(), DbErr> {
    let d = dialect(db)?;
    let (ahead, fitting, stamp) = match verdict {
        Verdict::Off {
            ahead_ms,
            fitting,
            stamp,
        } => (
            *ahead_ms,
            Some(fitting.clone()),
            Some(crate::domain::truncate(stamp, 60)),
        ),
        _ => (0, None, None),
    };
    let txn = db.begin().await?;
    let mut delete = Sql::new(d);
    delete
        .push("DELETE FROM order_timeout_zone_checks WHERE kind = ")
        .bind(Value::from(kind.as_str()));
    txn.execute_raw(delete.build()).await?;
    let mut insert = Sql::new(d);
    insert
        .push("INSERT INTO order_timeout_zone_checks (kind, zone, verdict, ahead_ms, fitting, stamp, at_ms) VALUES ")
        .bind_list([
            Value::from(kind.as_str()),
            Value::from(zone),
            Value::from(verdict.state()),
            Value::from(ahead),
            Value::from(fitting),
            Value::from(stamp),
            Value::from(at.0),
        ]);
    txn.execute_raw(insert.build()).await?;
    txn.commit().await
}

/// Applies a verdict: kept in memory and in the metric, the kind held or
/// released (only a hold of [`HOLDER`]'s own: an operator's instance pause
/// stays).
async fn apply(ctx: &Context, mapped: &Mapped, kind: TimeoutKind, verdict: Verdict, at: Millis) {
    let role = Pausable::Consumer(kind);
    let reason = describe(mapped, kind, &verdict);
    ctx.telemetry
        .time_zone_check(kind.as_str(), verdict.state(), &reason);
    ctx.zone_checks.set(kind, verdict.clone());
    match verdict {
        Verdict::Fits => {
            let ours = ctx
                .pauses
                .instance_pause(role)
                .is_some_and(|p| p.by == HOLDER);
            if ours {
                ctx.pauses.resume(role, PauseScope::Instance);
            }
        }
        Verdict::Unconfirmed | Verdict::Off { .. } => {
            let pause = Pause {
                since: at,
                by: HOLDER.to_string(),
                instance: ctx.settings.amqp.instance.clone(),
                reason: Some(crate::domain::truncate(&reason, 480)),
            };
            // A newer verdict replaces the reason of our own hold.
            let ours = ctx
                .pauses
                .instance_pause(role)
                .is_none_or(|p| p.by == HOLDER);
            if ours {
                ctx.pauses
                    .pause(role, PauseScope::Instance, pause, true)
                    .await;
            }
        }
    }
}

/// What the stamps at start alone prove: a `since_column` cannot lie ahead
/// of now, so a newest one more than [`TOLERANCE`] ahead is a mismatch
/// whenever it was written; anything else proves nothing.
fn judge_backlog(stamp: &Stamp) -> Option<Verdict> {
    let value = stamp.value.as_ref()?;
    let tolerance = TOLERANCE.as_millis() as i64;
    (stamp.since && value.ahead_ms > tolerance).then(|| off(value))
}

fn off(value: &StampValue) -> Verdict {
    Verdict::Off {
        ahead_ms: value.ahead_ms,
        fitting: offset_text(value.offset_ms),
        stamp: value.text.clone(),
    }
}

/// At start, before any role runs: each guarded kind as its kept verdict
/// says, held unless a new order confirmed the zone before, and held at
/// once when its newest stamp already lies in the future. The stamps read
/// here are what the watch compares the next ones with.
pub async fn load(ctx: &Context) -> Result<(), DbErr> {
    let Some(mapped) = ctx.orders.mapped() else {
        return Ok(());
    };
    let zone = mapped.zone.used.to_string();
    for kind in mapped.zone_guarded() {
        let Some(stamp) = mapped.newest_waiting(&ctx.db, kind).await? else {
            continue;
        };
        let kept = recorded(&ctx.db, kind, &zone).await?;
        let verdict = match judge_backlog(&stamp) {
            Some(found) => {
                if kept.as_ref() != Some(&found) {
                    record(&ctx.db, kind, &zone, &found, stamp.now).await?;
                }
                found
            }
            None => kept.unwrap_or(Verdict::Unconfirmed),
        };
        apply(ctx, mapped, kind, verdict, stamp.now).await;
        ctx.zone_checks.set_baseline(kind, stamp);
    }
    Ok(())
}

/// Watches the newest stamp of each guarded kind's waiting orders; each one
/// that appears is judged.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let Some(mapped) = ctx.orders.mapped().cloned() else {
        return;
    };
    let zone = mapped.zone.used.to_string();
    let mut last = ctx.zone_checks.take_baselines();
    if last.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(WATCH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for (&kind, before) in last.iter_mut() {
            let stamp = match mapped.newest_waiting(&ctx.db, kind).await {
                Ok(Some(stamp)) => stamp,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(kind = kind.as_str(), error = %e, "time zone check: could not read the newest stamp");
                    continue;
                }
            };
            let before = std::mem::replace(before, stamp.clone());
            let Some(value) = &stamp.value else {
                continue;
            };
            let appeared = before
                .value
                .as_ref()
                .is_none_or(|b| value.instant > b.instant);
            if !appeared {
                continue;
            }
            let elapsed = stamp.now.0.saturating_sub(before.now.0);
            let verdict = if fits(value.ahead_ms, stamp.since, elapsed) {
                Verdict::Fits
            } else {
                off(value)
            };
            // A mismatch is kept as first seen until an order fits.
            let current = ctx.zone_checks.get(kind);
            if current.as_ref() == Some(&verdict)
                || (verdict != Verdict::Fits && matches!(current, Some(Verdict::Off { .. })))
            {
                continue;
            }
            if let Err(e) = record(&ctx.db, kind, &zone, &verdict, stamp.now).await {
                tracing::warn!(kind = kind.as_str(), error = %e, "time zone check: could not keep the verdict");
            }
            apply(&ctx, &mapped, kind, verdict, stamp.now).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_fits_within_a_quarter_hour() {
        let q = TOLERANCE.as_millis() as i64;
        assert!(fits(0, true, 1_000));
        assert!(fits(-900, true, 1_000));
        assert!(fits(q, true, 1_000));
        assert!(!fits(q + 1, true, 1_000), "east of the guess");
        assert!(!fits(-5 * 3_600_000, true, 1_000), "west of the guess");
        assert!(
            fits(-q - 1_000, true, 1_000),
            "written within the last look"
        );
        // A deadline lies ahead: only one far in the past contradicts.
        assert!(fits(8 * 3_600_000, false, 1_000));
        assert!(!fits(-5 * 3_600_000, false, 1_000));
    }

    fn stamp(since: bool, ahead_ms: i64) -> Stamp {
        Stamp {
            since,
            value: Some(StampValue {
                text: "2026-03-29 02:30:00".into(),
                ahead_ms,
                instant: Millis(0),
                offset_ms: ahead_ms,
            }),
            now: Millis(0),
        }
    }

    #[test]
    fn only_a_since_stamp_in_the_future_proves_a_mismatch_at_start() {
        let q = TOLERANCE.as_millis() as i64;
        // Old stamps prove nothing: the shop may just have been quiet.
        assert_eq!(judge_backlog(&stamp(true, -5 * 3_600_000)), None);
        assert_eq!(judge_backlog(&stamp(true, q)), None);
        assert!(matches!(
            judge_backlog(&stamp(true, 8 * 3_600_000)),
            Some(Verdict::Off { fitting, .. }) if fitting == "+08:00"
        ));
        // A deadline column lies ahead by its nature.
        assert_eq!(judge_backlog(&stamp(false, 8 * 3_600_000)), None);
        let empty = Stamp {
            since: true,
            value: None,
            now: Millis(0),
        };
        assert_eq!(judge_backlog(&empty), None);
    }

    #[test]
    fn offsets_are_given_to_the_quarter_hour() {
        assert_eq!(offset_text(-5 * 3_600_000 + 700), "-05:00");
        assert_eq!(offset_text(8 * 3_600_000 - 2_000), "+08:00");
        assert_eq!(offset_text(19_800_000), "+05:30");
        assert_eq!(offset_text(0), "+00:00");
    }
}

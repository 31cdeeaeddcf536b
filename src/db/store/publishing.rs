//! The outbox: rows claimed by one relay round, published, deleted, refused
//! or set aside.

use super::*;

/// How long a relay round holds the rows it claimed. A relay that dies
/// mid-round delays those rows by at most this; the relays of other instances
/// skip them meanwhile.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// Longest wait before a refused row is tried again.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// Rows no relay round holds and nobody set aside.
fn publishable(now: Millis) -> Condition {
    Condition::all()
        .add(outbox::Column::SetAsideAtMs.is_null())
        .add(
            Condition::any()
                .add(outbox::Column::ClaimedUntilMs.is_null())
                .add(outbox::Column::ClaimedUntilMs.lt(now.0)),
        )
}

/// Claims up to `limit` publishable outbox rows for one relay round, oldest
/// first, and returns them. Rows another round holds are skipped (`FOR UPDATE
/// SKIP LOCKED` on PostgreSQL and MariaDB/MySQL, then a conditional update that
/// only takes rows still free, on every backend), so the relays of several
/// instances publish disjoint rows.
pub async fn outbox_claim(
    db: &DatabaseConnection,
    limit: u64,
    now: Millis,
) -> Result<Vec<outbox::Model>, DbErr> {
    // MariaDB may pick a table scan for the claim's update and deadlock it
    // against another relay's delete; the loser is rolled back whole, so
    // claiming again is safe.
    let mut attempts = 0;
    loop {
        match claim_once(db, limit, now).await {
            Err(e) if is_deadlock(&e) && attempts < 3 => attempts += 1,
            result => return result,
        }
    }
}

/// The database chose this transaction as a deadlock's victim (or, on
/// PostgreSQL, a serialization failure): it was rolled back and may be retried.
pub fn is_deadlock(e: &DbErr) -> bool {
    let text = e.to_string();
    text.contains("40001")
        || text.contains("40P01")
        || text.to_ascii_lowercase().contains("deadlock")
}

async fn claim_once(
    db: &DatabaseConnection,
    limit: u64,
    now: Millis,
) -> Result<Vec<outbox::Model>, DbErr> {
    let claim = uuid::Uuid::new_v4().to_string();
    let lease_end = now.plus(CLAIM_LEASE).0;
    let candidates = outbox::Entity::find()
        .select_only()
        .column(outbox::Column::Id)
        .filter(publishable(now))
        .order_by_asc(outbox::Column::Id)
        .limit(limit);
    let ids: Vec<i64> = if db.get_database_backend() == DbBackend::Sqlite {
        // One writer at a time, and a read that later writes could not upgrade
        // past another connection's commit: no transaction, the conditional
        // update decides.
        let ids = candidates.into_tuple().all(db).await?;
        take_claim(db, &ids, &claim, lease_end, now).await?;
        ids
    } else {
        // Read committed: MariaDB's default (repeatable read) would also lock
        // the gaps the scan passes, and deadlock relays against each other.
        let txn = db
            .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
            .await?;
        let ids = candidates
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .into_tuple()
            .all(&txn)
            .await?;
        take_claim(&txn, &ids, &claim, lease_end, now).await?;
        txn.commit().await?;
        ids
    };
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(LIST_CHUNK) {
        rows.extend(
            outbox::Entity::find()
                .filter(outbox::Column::Id.is_in(chunk.iter().copied()))
                .filter(outbox::Column::Claim.eq(claim.as_str()))
                .order_by_asc(outbox::Column::Id)
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

/// Runs one statement per [`LIST_CHUNK`] of `ids`: `statement` builds it for
/// the rows whose id is in the chunk.
async fn per_chunk<C, Q>(
    db: &C,
    ids: &[i64],
    statement: impl Fn(Condition) -> Q,
) -> Result<(), DbErr>
where
    C: ConnectionTrait,
    Q: QueryTrait,
{
    for chunk in ids.chunks(LIST_CHUNK) {
        let rows = Condition::all().add(outbox::Column::Id.is_in(chunk.iter().copied()));
        db.execute_raw(statement(rows).build(db.get_database_backend()))
            .await?;
    }
    Ok(())
}

async fn take_claim<C: ConnectionTrait>(
    db: &C,
    ids: &[i64],
    claim: &str,
    lease_end: i64,
    now: Millis,
) -> Result<(), DbErr> {
    per_chunk(db, ids, |rows| {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Claim, Expr::value(claim))
            .col_expr(outbox::Column::ClaimedUntilMs, Expr::value(lease_end))
            .filter(rows)
            .filter(publishable(now))
    })
    .await
}

/// Removes rows the broker confirmed.
pub async fn outbox_delete(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    per_chunk(db, ids, |rows| outbox::Entity::delete_many().filter(rows)).await
}

/// Gives claimed rows back at once (the round could not publish them: the
/// connection broke), so the next round need not wait for the lease to end.
pub async fn outbox_release(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    per_chunk(db, ids, |rows| {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(Option::<i64>::None),
            )
            .filter(rows)
    })
    .await
}

/// Counts a refused publish on each row. A row refused
/// `max_attempts` times (`relay.max_attempts`) is set aside with its reason; the others wait
/// (1 s, 2 s, 4 s … at most a minute) before any relay takes them again, and
/// the rows behind them go out meanwhile. Returns the ids set aside.
pub async fn outbox_refused(
    db: &DatabaseConnection,
    rows: &[(&outbox::Model, String)],
    max_attempts: i32,
    now: Millis,
) -> Result<Vec<i64>, DbErr> {
    let mut set_aside = Vec::new();
    for (row, reason) in rows {
        let attempts = row.attempts.saturating_add(1);
        let mut update = outbox::Entity::update_many()
            .col_expr(outbox::Column::Attempts, Expr::value(attempts))
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .filter(outbox::Column::Id.eq(row.id));
        if attempts >= max_attempts {
            set_aside.push(row.id);
            let reason = format!("refused {attempts} times by the broker: {reason}");
            update = update
                .col_expr(
                    outbox::Column::ClaimedUntilMs,
                    Expr::value(Option::<i64>::None),
                )
                .col_expr(outbox::Column::SetAsideAtMs, Expr::value(now.0))
                .col_expr(
                    outbox::Column::SetAsideReason,
                    Expr::value(crate::domain::truncate(&reason, 250)),
                );
        } else {
            let wait = Duration::from_secs(1 << attempts.clamp(0, 6)).min(MAX_RETRY_WAIT);
            update = update.col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(now.plus(wait).0),
            );
        }
        update.exec(db).await?;
    }
    Ok(set_aside)
}

/// Sets rows aside for an operator: no relay takes them again. Their orders'
/// deadlines are still kept by the sweeper.
pub async fn outbox_set_aside(
    db: &DatabaseConnection,
    ids: &[i64],
    reason: &str,
    now: Millis,
) -> Result<(), DbErr> {
    let reason = crate::domain::truncate(reason, 250);
    per_chunk(db, ids, |rows| {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::SetAsideAtMs, Expr::value(now.0))
            .col_expr(outbox::Column::SetAsideReason, Expr::value(reason.as_str()))
            .col_expr(outbox::Column::Claim, Expr::value(Option::<String>::None))
            .col_expr(
                outbox::Column::ClaimedUntilMs,
                Expr::value(Option::<i64>::None),
            )
            .filter(rows)
    })
    .await
}

/// The outbox now, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxState {
    /// Rows waiting to be published (claimed ones included).
    pub waiting: u64,
    /// Creation time of the oldest waiting row.
    pub oldest: Option<Millis>,
    /// Rows set aside.
    pub set_aside: u64,
}

/// Rows waiting, the creation time of the oldest, and rows set aside: one
/// pass over the table (the relay's monitor reads it every second).
pub async fn outbox_backlog(db: &DatabaseConnection) -> Result<OutboxState, DbErr> {
    // Plain SQL that reads the same on every backend; COUNT(column) counts
    // the rows where it is not null.
    let sql = "SELECT COUNT(*) - COUNT(set_aside_at_ms), COUNT(set_aside_at_ms), \
               MIN(CASE WHEN set_aside_at_ms IS NULL THEN created_at_ms END) FROM outbox";
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom("an aggregate query returned no row".into()))?;
    let count = |i: usize| -> Result<u64, DbErr> {
        let n: i64 = row.try_get_by_index(i)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    Ok(OutboxState {
        waiting: count(0)?,
        set_aside: count(1)?,
        oldest: row.try_get_by_index::<Option<i64>>(2)?.map(Millis),
    })
}

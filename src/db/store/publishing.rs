//! The outboxes: rows claimed by one relay round, published, deleted, refused
//! or set aside. Two tables work this way, the timeout `outbox` and the event
//! outbox `order_timeout_events`, with the same claim, lease, attempt and
//! set-aside columns: every function here serves both ([`Relayed`]).

use super::super::entities::order_timeout_events;
use super::*;

/// Which outbox, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbox {
    /// `outbox`: timeouts to schedule.
    Timeouts,
    /// `order_timeout_events`: domain events to tell.
    Events,
}

impl Outbox {
    /// The table's name, as spans and logs say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeouts => "outbox",
            Self::Events => "order_timeout_events",
        }
    }
}

/// A table the relay publishes from: its rows are claimed, published, then
/// deleted, refused or set aside, all through the columns named here.
pub trait Relayed: EntityTrait {
    /// Which outbox it is.
    const OUTBOX: Outbox;
    /// The primary key (the claim order: oldest first).
    const ID: Self::Column;
    /// The relay round that holds a row.
    const CLAIM: Self::Column;
    /// The end of that round's lease.
    const CLAIMED_UNTIL: Self::Column;
    /// When a row was set aside.
    const SET_ASIDE_AT: Self::Column;
    /// Why.
    const SET_ASIDE_REASON: Self::Column;
    /// Refused publishes so far.
    const ATTEMPTS: Self::Column;
    /// A row's id.
    fn row_id(row: &Self::Model) -> i64;
    /// A row's refused publishes so far.
    fn attempts(row: &Self::Model) -> i32;
}

/// Both outboxes name these columns alike.
macro_rules! relayed {
    ($table:ident, $outbox:expr) => {
        impl Relayed for $table::Entity {
            const OUTBOX: Outbox = $outbox;
            const ID: Self::Column = $table::Column::Id;
            const CLAIM: Self::Column = $table::Column::Claim;
            const CLAIMED_UNTIL: Self::Column = $table::Column::ClaimedUntilMs;
            const SET_ASIDE_AT: Self::Column = $table::Column::SetAsideAtMs;
            const SET_ASIDE_REASON: Self::Column = $table::Column::SetAsideReason;
            const ATTEMPTS: Self::Column = $table::Column::Attempts;
            fn row_id(row: &$table::Model) -> i64 {
                row.id
            }
            fn attempts(row: &$table::Model) -> i32 {
                row.attempts
            }
        }
    };
}

relayed!(outbox, Outbox::Timeouts);
relayed!(order_timeout_events, Outbox::Events);

/// How long a relay round holds the rows it claimed. A relay that dies
/// mid-round delays those rows by at most this; the relays of other instances
/// skip them meanwhile.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// Longest wait before a refused row is tried again.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// Rows no relay round holds and nobody set aside.
fn publishable<E: Relayed>(now: Millis) -> Condition {
    Condition::all().add(E::SET_ASIDE_AT.is_null()).add(
        Condition::any()
            .add(E::CLAIMED_UNTIL.is_null())
            .add(E::CLAIMED_UNTIL.lt(now.0)),
    )
}

/// Claims up to `limit` publishable rows of outbox `E` for one relay round, oldest
/// first, and returns them. Rows another round holds are skipped (`FOR UPDATE
/// SKIP LOCKED` on PostgreSQL and MariaDB/MySQL, then a conditional update that
/// only takes rows still free, on every backend), so the relays of several
/// instances publish disjoint rows.
pub async fn outbox_claim<E: Relayed>(
    db: &DatabaseConnection,
    limit: u64,
    now: Millis,
) -> Result<Vec<E::Model>, DbErr> {
    // MariaDB may pick a table scan for the claim's update and deadlock it
    // against another relay's delete; the loser is rolled back whole, so
    // claiming again is safe.
    let mut attempts = 0;
    loop {
        match claim_once::<E>(db, limit, now).await {
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

async fn claim_once<E: Relayed>(
    db: &DatabaseConnection,
    limit: u64,
    now: Millis,
) -> Result<Vec<E::Model>, DbErr> {
    let claim = uuid::Uuid::new_v4().to_string();
    let lease_end = now.plus(CLAIM_LEASE).0;
    let candidates = E::find()
        .select_only()
        .column(E::ID)
        .filter(publishable::<E>(now))
        .order_by_asc(E::ID)
        .limit(limit);
    if db.get_database_backend() == DbBackend::Sqlite {
        // One writer at a time, and a read that later writes could not upgrade
        // past another connection's commit: no transaction, the conditional
        // update decides.
        let ids = candidates.into_tuple().all(db).await?;
        take_claim::<E, _>(db, &ids, &claim, lease_end, now).await?;
        return claimed::<E, _>(db, &ids, &claim).await;
    }
    // Read committed: MariaDB's default (repeatable read) would also lock
    // the gaps the scan passes, and deadlock relays against each other.
    let txn = db
        .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
        .await?;
    if db.get_database_backend() == DbBackend::Postgres {
        // A backlog written faster than autovacuum analyzes the table (a
        // burst, an outage's worth, a bulk load) has no statistics yet:
        // PostgreSQL then guesses that few rows are publishable and reads the
        // whole table for each statement of the claim (the scan for free rows
        // sorted too: 40 ms at 50,000 rows, growing with the backlog) instead
        // of walking the primary key (under 1 ms). Only for this
        // transaction, whose statements all find their rows by id.
        txn.execute_unprepared("SET LOCAL enable_seqscan = off")
            .await?;
    }
    let ids = candidates
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .into_tuple()
        .all(&txn)
        .await?;
    take_claim::<E, _>(&txn, &ids, &claim, lease_end, now).await?;
    let rows = claimed::<E, _>(&txn, &ids, &claim).await?;
    txn.commit().await?;
    Ok(rows)
}

/// The rows among `ids` that `claim` took, oldest first.
async fn claimed<E: Relayed, C: ConnectionTrait>(
    db: &C,
    ids: &[i64],
    claim: &str,
) -> Result<Vec<E::Model>, DbErr> {
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(LIST_CHUNK) {
        rows.extend(
            E::find()
                .filter(E::ID.is_in(chunk.iter().copied()))
                .filter(E::CLAIM.eq(claim))
                .order_by_asc(E::ID)
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

/// Runs one statement per [`LIST_CHUNK`] of `ids`: `statement` builds it for
/// the rows whose id is in the chunk.
async fn per_chunk<E, C, Q>(
    db: &C,
    ids: &[i64],
    statement: impl Fn(Condition) -> Q,
) -> Result<(), DbErr>
where
    E: Relayed,
    C: ConnectionTrait,
    Q: QueryTrait,
{
    for chunk in ids.chunks(LIST_CHUNK) {
        let rows = Condition::all().add(E::ID.is_in(chunk.iter().copied()));
        db.execute_raw(statement(rows).build(db.get_database_backend()))
            .await?;
    }
    Ok(())
}

async fn take_claim<E: Relayed, C: ConnectionTrait>(
    db: &C,
    ids: &[i64],
    claim: &str,
    lease_end: i64,
    now: Millis,
) -> Result<(), DbErr> {
    per_chunk::<E, _, _>(db, ids, |rows| {
        E::update_many()
            .col_expr(E::CLAIM, Expr::value(claim))
            .col_expr(E::CLAIMED_UNTIL, Expr::value(lease_end))
            .filter(rows)
            .filter(publishable::<E>(now))
    })
    .await
}

/// Removes rows the broker confirmed.
pub async fn outbox_delete<E: Relayed>(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    per_chunk::<E, _, _>(db, ids, |rows| E::delete_many().filter(rows)).await
}

/// Gives claimed rows back at once (the round could not publish them: the
/// connection broke), so the next round need not wait for the lease to end.
pub async fn outbox_release<E: Relayed>(db: &DatabaseConnection, ids: &[i64]) -> Result<(), DbErr> {
    per_chunk::<E, _, _>(db, ids, |rows| {
        E::update_many()
            .col_expr(E::CLAIM, Expr::value(Option::<String>::None))
            .col_expr(E::CLAIMED_UNTIL, Expr::value(Option::<i64>::None))
            .filter(rows)
    })
    .await
}

/// Counts a refused publish on each row. A row refused
/// `max_attempts` times (`relay.max_attempts`) is set aside with its reason; the others wait
/// (1 s, 2 s, 4 s … at most a minute) before any relay takes them again, and
/// the rows behind them go out meanwhile. Returns the ids set aside.
pub async fn outbox_refused<E: Relayed>(
    db: &DatabaseConnection,
    rows: &[(&E::Model, String)],
    max_attempts: i32,
    now: Millis,
) -> Result<Vec<i64>, DbErr> {
    let mut set_aside = Vec::new();
    for (row, reason) in rows {
        let (id, attempts) = (E::row_id(row), E::attempts(row).saturating_add(1));
        let mut update = E::update_many()
            .col_expr(E::ATTEMPTS, Expr::value(attempts))
            .col_expr(E::CLAIM, Expr::value(Option::<String>::None))
            .filter(E::ID.eq(id));
        if attempts >= max_attempts {
            set_aside.push(id);
            let reason = format!("refused {attempts} times by the broker: {reason}");
            update = update
                .col_expr(E::CLAIMED_UNTIL, Expr::value(Option::<i64>::None))
                .col_expr(E::SET_ASIDE_AT, Expr::value(now.0))
                .col_expr(
                    E::SET_ASIDE_REASON,
                    Expr::value(crate::domain::truncate(&reason, 250)),
                );
        } else {
            let wait = Duration::from_secs(1 << attempts.clamp(0, 6)).min(MAX_RETRY_WAIT);
            update = update.col_expr(E::CLAIMED_UNTIL, Expr::value(now.plus(wait).0));
        }
        update.exec(db).await?;
    }
    Ok(set_aside)
}

/// Sets rows aside for an operator: no relay takes them again. Their orders'
/// deadlines are still kept by the sweeper.
pub async fn outbox_set_aside<E: Relayed>(
    db: &DatabaseConnection,
    ids: &[i64],
    reason: &str,
    now: Millis,
) -> Result<(), DbErr> {
    let reason = crate::domain::truncate(reason, 250);
    per_chunk::<E, _, _>(db, ids, |rows| {
        E::update_many()
            .col_expr(E::SET_ASIDE_AT, Expr::value(now.0))
            .col_expr(E::SET_ASIDE_REASON, Expr::value(reason.as_str()))
            .col_expr(E::CLAIM, Expr::value(Option::<String>::None))
            .col_expr(E::CLAIMED_UNTIL, Expr::value(Option::<i64>::None))
            .filter(rows)
    })
    .await
}

/// An outbox now, for metrics.
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
pub async fn outbox_backlog<E: Relayed>(db: &DatabaseConnection) -> Result<OutboxState, DbErr> {
    // Plain SQL that reads the same on every backend (both tables name these
    // columns alike); COUNT(column) counts the rows where it is not null.
    let sql = format!(
        "SELECT COUNT(*) - COUNT(set_aside_at_ms), COUNT(set_aside_at_ms), \
         MIN(CASE WHEN set_aside_at_ms IS NULL THEN created_at_ms END) FROM {}",
        E::default().table_name()
    );
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

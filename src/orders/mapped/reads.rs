//! What the sweeper, the gauges and `doctor` read from a mapped table: the
//! overdue orders page by page, the backlog, ids the service cannot read, the
//! newest row.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};

use super::sql::{self, Dialect, Sql, Ty};
use super::{Mapped, Newest};
use crate::db::store::{Backlog, DueAhead, MINUTE_MS, OVERDUE_BAND};
use crate::domain::{MAX_ORDER_KEY_BYTES, Millis, OrderKey, TimeoutKind};
use crate::orders::{Cursor, OverduePage};

impl Mapped {
    /// Orders in the status `kind` acts on whose deadline passed more than
    /// `grace` ago by the database's clock, with their deadlines (reckoned
    /// from the service's `now`), in id order; `after` continues from the
    /// last id of the previous page.
    pub async fn overdue(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        grace: Duration,
        after: Option<&str>,
        limit: u64,
    ) -> Result<OverduePage, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(OverduePage::default());
        };
        let d = self.dialect;
        let clock = &self.clock;
        let mut sql = Sql::new(d);
        // Named apart: PostgreSQL calls `CAST(id AS TEXT)` `id` too, and an
        // ORDER BY name takes an output column first, so pages would go in
        // text order (1, 10, 100, 2) while `id > after` compares the column,
        // and a sweep would pass over most of an integer-keyed backlog.
        sql.push(&format!(
            "SELECT {} AS order_timeout_key, {} AS order_timeout_ms FROM {} WHERE {} = ",
            d.as_text(&self.id),
            d.millis_until(&k.deadline(d, clock), clock.instant_now()),
            self.table,
            self.status
        ));
        self.bind_status(&mut sql, &k.from)
            .push(" AND ")
            .push(&k.passed(clock, grace.as_millis()));
        sql.push(&k.unflagged());
        sql.push(&self.unshadowed(kind));
        if let Some(after) = after {
            sql.push(&format!(" AND {} > ", self.id))
                .bind(self.raw_value(after, &self.id_ty));
        }
        sql.push(&format!(" ORDER BY {} LIMIT {limit}", self.id));
        let rows = db.query_all_raw(sql.build()).await?;
        let mut page = OverduePage {
            full: rows.len() as u64 >= limit,
            ..OverduePage::default()
        };
        for row in rows {
            let id: String = row.try_get_by_index(0)?;
            let remaining: i64 = row.try_get_by_index(1)?;
            let deadline = Millis(now.0.saturating_add(remaining));
            // An id the service cannot read is passed over, counted and told
            // by the caller; the page still continues after it.
            match OrderKey::fault(&id) {
                Some(reason) => page.unreadable.add(reason, &id),
                None => page
                    .orders
                    .push((OrderKey::parse(&id).map_err(DbErr::Custom)?, deadline)),
            }
            page.next = Some(Cursor::new(id, deadline));
        }
        Ok(page)
    }

    /// How many rows of the table have an id the service cannot read
    /// ([`OrderKey::fault`]), whatever their status; `None` when the id
    /// column is not text (any integer or UUID is readable).
    pub async fn unreadable_ids(&self, db: &DatabaseConnection) -> Result<Option<u64>, DbErr> {
        if self.id_ty != Ty::Text {
            return Ok(None);
        }
        let id = &self.id;
        let control = match self.dialect {
            Dialect::Postgres => format!("{id} ~ '[[:cntrl:]]'"),
            Dialect::MySql => format!("{id} REGEXP '[[:cntrl:]]'"),
        };
        // Lengths, not comparisons: MariaDB's PAD SPACE collations find
        // 'a ' equal to 'a'.
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE CHAR_LENGTH({id}) = 0 \
             OR CHAR_LENGTH({id}) <> CHAR_LENGTH(TRIM({id})) \
             OR OCTET_LENGTH({id}) > {MAX_ORDER_KEY_BYTES} OR {control}",
            self.table
        );
        let row = db
            .query_one_raw(Statement::from_string(self.dialect.backend(), sql))
            .await?;
        let n: i64 = match row {
            Some(row) => row.try_get_by_index(0)?,
            None => 0,
        };
        Ok(Some(u64::try_from(n).unwrap_or(0)))
    }

    /// The orders waiting for a timeout of `kind`, overdue meaning past the
    /// deadline by more than `overdue_after` by the database's clock (as the
    /// sweeper reckons it); `None` when the mapping has no such kind.
    pub async fn backlog(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        overdue_after: Duration,
    ) -> Result<Option<Backlog>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        let d = self.dialect;
        let clock = &self.clock;
        let overdue = format!(
            "COUNT(CASE WHEN {} THEN 1 END)",
            k.passed(clock, overdue_after.as_millis())
        );
        let earliest = clock.earliest(&k.column, &k.deadline_ty);
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {}, {}, {} FROM {} WHERE {} = ",
            d.as_bigint("COUNT(*)"),
            d.as_bigint(&overdue),
            d.millis_until(&sql::plus(d, &earliest, k.after_ms), clock.instant_now()),
            self.table,
            self.status
        ));
        self.bind_status(&mut sql, &k.from);
        sql.push(&k.unflagged());
        sql.push(&self.unshadowed(kind));
        let row = db
            .query_one_raw(sql.build())
            .await?
            .ok_or_else(|| DbErr::Custom("an aggregate query returned no row".into()))?;
        let count = |i: usize| -> Result<u64, DbErr> {
            Ok(u64::try_from(row.try_get_by_index::<i64>(i)?).unwrap_or(0))
        };
        let overdue = count(1)?;
        // Milliseconds until the oldest deadline: negative once it passed.
        let until: Option<i64> = row.try_get_by_index(2)?;
        Ok(Some(Backlog {
            pending: count(0)?,
            overdue,
            oldest_overdue: match until {
                Some(ms) if overdue > 0 => {
                    Duration::from_millis(u64::try_from(ms.saturating_neg()).unwrap_or(0))
                }
                _ => Duration::ZERO,
            },
        }))
    }

    /// How long until the earliest deadline of `kind` not yet passed, by the
    /// database's clock in the shop's zone (as [`Self::backlog`] reckons
    /// it); `None` when none is ahead or the mapping has no such kind. An
    /// index on the status and the deadline's column answers it from its
    /// first entry past now (see [`Mapped::indexes`]).
    pub async fn until_next(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
    ) -> Result<Option<Duration>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        let d = self.dialect;
        let clock = &self.clock;
        let ahead = clock.not_passed(&k.column, &k.deadline_ty, k.after_ms);
        let mut sql = Sql::new(d);
        // The first row in the column's order: where the wall clock runs
        // back, the instants follow the same order (the later instant of a
        // repeated time is after every time before it).
        sql.push(&format!(
            "SELECT {} FROM {} WHERE {ahead} AND {} = ",
            d.millis_until(&k.deadline(d, clock), clock.instant_now()),
            self.table,
            self.status
        ));
        self.bind_status(&mut sql, &k.from);
        sql.push(&k.unflagged());
        sql.push(&format!(" ORDER BY {} LIMIT 1", k.column));
        let until: Option<i64> = match db.query_one_raw(sql.build()).await? {
            Some(row) => row.try_get_by_index(0)?,
            None => None,
        };
        Ok(until.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// How many orders of `kind` fall due within each of `horizons`
    /// (ascending; the last bounds the read) by the database's clock in the
    /// shop's zone, minute by minute, and how many are overdue already;
    /// `None` when the mapping has no such kind. One `GROUP BY` over the
    /// band and the minute; the rows are found by the status and a bound on
    /// the bare column, which an index on both serves (see
    /// [`Mapped::indexes`]).
    pub async fn due_ahead(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        horizons: &[Duration],
    ) -> Result<Option<DueAhead>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        let Some(longest) = horizons.last() else {
            return Ok(Some(DueAhead::default()));
        };
        let d = self.dialect;
        let clock = &self.clock;
        // Milliseconds until each deadline, and the clock's own instant: the
        // deadline's instant is their sum, whatever zone the column is in.
        let until = "due_in";
        let mut band = format!("CASE WHEN {until} < 0 THEN {OVERDUE_BAND}");
        for (i, horizon) in horizons.iter().enumerate() {
            band.push_str(&format!(" WHEN {until} < {} THEN {i}", horizon.as_millis()));
        }
        band.push_str(" END");
        let at = format!("(due_now + {until})");
        // Overdue orders share one group, as in the service's own tables.
        let minute = format!("CASE WHEN {until} < 0 THEN 0 ELSE {at} - {at} % {MINUTE_MS} END");
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {}, {}, {} FROM (SELECT {} AS {until}, {} AS due_now FROM {} WHERE {} AND {} = ",
            d.as_bigint(&band),
            d.as_bigint(&minute),
            d.as_bigint("COUNT(*)"),
            d.millis_until(&k.deadline(d, clock), clock.instant_now()),
            d.epoch_ms_now(),
            self.table,
            clock.before(&k.column, &k.deadline_ty, k.after_ms, longest.as_millis()),
            self.status
        ));
        self.bind_status(&mut sql, &k.from);
        sql.push(&k.unflagged());
        sql.push(") AS ahead GROUP BY 1, 2");
        let rows = db.query_all_raw(sql.build()).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get_by_index::<i64>(0)?,
                    row.try_get_by_index::<i64>(1)?,
                    row.try_get_by_index::<i64>(2)?,
                ))
            })
            .collect::<Result<Vec<_>, DbErr>>()?;
        Ok(Some(DueAhead::from_rows(horizons.len(), rows)))
    }

    /// The newest value of `kind`'s `since_column` in the whole table, against
    /// the database's now in the shop's zone: a row written after now means
    /// the zone is not the one the shop writes in (`doctor` says so). `None`
    /// when the kind is not mapped or has a deadline column instead.
    pub async fn newest(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
    ) -> Result<Option<Newest>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        if !k.since {
            return Ok(None);
        }
        let (since, name) = (&k.column, &k.column_name);
        let d = self.dialect;
        let now = self.clock.now(&k.deadline_ty);
        let newest = format!("MAX({since})");
        let sql = format!(
            "SELECT {}, {}, {} FROM {}",
            d.as_text(&newest),
            d.as_text(&now),
            d.millis_until(
                &self.clock.instant(&newest, &k.deadline_ty),
                self.clock.instant_now()
            ),
            self.table
        );
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(d.backend(), sql))
            .await?
            .ok_or_else(|| DbErr::Custom("an aggregate query returned no row".into()))?;
        let value: Option<String> = row.try_get_by_index(0)?;
        let now: Option<String> = row.try_get_by_index(1)?;
        let ahead_ms: Option<i64> = row.try_get_by_index(2)?;
        Ok(Some(Newest {
            column: name.clone(),
            value,
            now: now.unwrap_or_default(),
            ahead_ms,
        }))
    }

    /// The newest deadline column's value among the orders waiting for
    /// `kind` (in its status, not yet flagged), as the zone check reads it
    /// (see [`Mapped::zone_guarded`]); `None` when the kind is not mapped.
    /// An index on the status and the column answers it from one entry.
    pub async fn newest_waiting(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
    ) -> Result<Option<Stamp>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        let d = self.dialect;
        let newest = format!("MAX({})", k.column);
        // The column's wall clock taken as UTC, against UTC now: the
        // offset from UTC of whoever wrote it, if it was written now.
        let utc_now = match d {
            Dialect::Postgres => "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')",
            Dialect::MySql => "UTC_TIMESTAMP(3)",
        };
        let instant = self.clock.instant(&newest, &k.deadline_ty);
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {}, {}, {}, {}, {} FROM {} WHERE {} = ",
            d.as_text(&newest),
            d.millis_until(&instant, self.clock.instant_now()),
            d.millis_until(&newest, utc_now),
            d.epoch_ms_now(),
            // Exact: now plus the time until it could round two readings apart.
            d.epoch_ms(&instant),
            self.table,
            self.status
        ));
        self.bind_status(&mut sql, &k.from);
        sql.push(&k.unflagged());
        let row = db
            .query_one_raw(sql.build())
            .await?
            .ok_or_else(|| DbErr::Custom("an aggregate query returned no row".into()))?;
        let value: Option<String> = row.try_get_by_index(0)?;
        let ahead_ms: Option<i64> = row.try_get_by_index(1)?;
        let utc_ahead_ms: Option<i64> = row.try_get_by_index(2)?;
        let now: i64 = row.try_get_by_index(3)?;
        let instant: Option<i64> = row.try_get_by_index(4)?;
        Ok(Some(Stamp {
            since: k.since,
            value: match (value, ahead_ms, utc_ahead_ms, instant) {
                (Some(text), Some(ahead), Some(utc), Some(instant)) => Some(StampValue {
                    text,
                    ahead_ms: ahead,
                    instant: Millis(instant),
                    offset_ms: utc,
                }),
                _ => None,
            },
            now: Millis(now),
        }))
    }
}

/// The newest deadline column's value among a kind's waiting orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Whether the column is a `since_column` (written when the order
    /// enters the status), else a `deadline_column` (a time ahead).
    pub since: bool,
    /// The value; `None` when no order waits.
    pub value: Option<StampValue>,
    /// The database's clock when it was read.
    pub now: Millis,
}

/// A stamp of a zone-less column, read in the zone in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampValue {
    /// As the database spells it.
    pub text: String,
    /// How far its instant lies after the database's now (negative: before).
    pub ahead_ms: i64,
    /// Its instant in the zone in use.
    pub instant: Millis,
    /// How far its wall clock, taken as UTC, lies after UTC now: the
    /// writer's offset from UTC when it was written just now.
    pub offset_ms: i64,
}

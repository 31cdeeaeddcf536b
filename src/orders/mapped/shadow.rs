//! Shadow mode (`orders.shadow = true`): the service decides exactly as
//! `serve` does (the same timers, catch-up, sweeper, clock and zone), but
//! writes nothing to the shop's tables and publishes no domain events. Where
//! the conditional `UPDATE` would have changed an order, the same `WHERE` is
//! read instead, and the decision goes to the service's own
//! `order_timeout_shadow`; the watch ([`Mapped::shadow_watch`]) then notes
//! when and to what the shop (its cron) changed each such order, and the
//! report ([`Mapped::shadow_report`]) sets one beside the other.
//!
//! An order the shop had moved on before the service acted (its timer found
//! it closed) is kept too, with the shop's own stamp of the change when
//! `mapping.stamp_column` names one: that is how a cron that closes orders
//! before their deadline shows. Recorded orders are left out of the overdue
//! reads (the catch-up, the sweeper, the gauges), which would otherwise find
//! them again and again, nothing having changed them.

use std::collections::HashMap;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait, Value,
};
use serde::{Deserialize, Serialize};

use super::sql::{Dialect, Sql};
use super::{KindSql, Mapped, Target};
use crate::domain::{Cause, ExpiryOutcome, Millis, OrderKey, TimeoutKind};

/// Ids read per statement by the watch.
const WATCH_PAGE: usize = 500;

/// How many ids of each list the report shows.
const FIRST: usize = 20;

/// One order as the shop's table has it now, for the shadow's bookkeeping.
struct ShopSide {
    /// The status, as text.
    status: String,
    /// Whether the kind's flag column is set (flag-only kinds).
    flagged: bool,
    /// The deadline, epoch milliseconds by the database's clock.
    deadline_ms: Option<i64>,
    /// The shop's stamp (`mapping.stamp_column`), epoch milliseconds.
    stamp_ms: Option<i64>,
}

impl ShopSide {
    /// Whether the shop has moved the order on from where the kind acts.
    fn moved(&self, k: &KindSql) -> bool {
        self.status != k.from_text || self.flagged
    }
}

impl Mapped {
    /// Whether this mapping runs in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// ` AND` the order has no shadow row of `kind` yet; empty outside
    /// shadow mode. The shop's id is qualified: the subquery's table has
    /// an `order_id` of its own.
    pub(super) fn unshadowed(&self, kind: TimeoutKind) -> String {
        if !self.shadow {
            return String::new();
        }
        format!(
            " AND NOT EXISTS (SELECT 1 FROM order_timeout_shadow s WHERE s.kind = '{}' AND s.order_id = {})",
            kind.as_str(),
            self.dialect.as_text(&format!("{}.{}", self.table, self.id))
        )
    }

    /// The transition's `WHERE`, read instead of written: a row, with the
    /// order's deadline (epoch milliseconds, exactly), when the conditional
    /// update would change the order.
    fn would(&self, k: &KindSql, key: &OrderKey) -> sea_orm::Statement {
        let d = self.dialect;
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {} FROM {}",
            d.epoch_ms(&k.deadline(d, &self.clock)),
            self.table
        ));
        self.push_due(&mut sql, k, key);
        sql.build()
    }

    /// [`Mapped::expire`] in shadow mode: the same decision for each order,
    /// by the same predicate and clock, kept in `order_timeout_shadow`
    /// instead of applied. No lock is taken and nothing of the shop's is
    /// written; an order the shop moved on is kept as such, with its stamp.
    pub(super) async fn shadow_expire(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        k: &KindSql,
        keys: &[OrderKey],
        now: Millis,
        cause: Cause,
    ) -> Result<HashMap<OrderKey, ExpiryOutcome>, DbErr> {
        let sorted = self.sorted(keys);
        let txn = db.begin().await?;
        let mut outcomes = HashMap::with_capacity(sorted.len());
        for key in &sorted {
            // The deadline exactly, not reckoned from `now` as the outcome's.
            let exact: Option<Option<i64>> = match txn.query_one_raw(self.would(k, key)).await? {
                Some(row) => Some(row.try_get_by_index(0)?),
                None => None,
            };
            let outcome = self.outcome(&txn, k, key, exact.is_some(), now).await?;
            match &outcome {
                ExpiryOutcome::Applied { deadline } => {
                    let row = [
                        Value::from(kind.as_str()),
                        Value::from(key.as_str()),
                        Value::from(exact.flatten().unwrap_or(deadline.0)),
                        Value::from(now.0),
                        Value::from(cause.as_str()),
                        Value::from(None::<String>),
                        Value::from(None::<i64>),
                        Value::from(None::<i64>),
                    ];
                    self.keep(&txn, row).await?;
                }
                ExpiryOutcome::Inapplicable { .. } => {
                    if let Some(side) = self
                        .shop_side(&txn, k, std::slice::from_ref(key))
                        .await?
                        .remove(key.as_str())
                        && side.moved(k)
                    {
                        let row = [
                            Value::from(kind.as_str()),
                            Value::from(key.as_str()),
                            Value::from(side.deadline_ms),
                            Value::from(None::<i64>),
                            Value::from(None::<String>),
                            Value::from(crate::domain::truncate(&side.status, 64)),
                            Value::from(now.0),
                            Value::from(side.stamp_ms),
                        ];
                        self.keep(&txn, row).await?;
                    }
                }
                _ => {}
            }
            outcomes.insert(key.clone(), outcome);
        }
        txn.commit().await?;
        Ok(outcomes)
    }

    /// Inserts a shadow row, unless the order has one for the kind already
    /// (the first decision stands).
    async fn keep(&self, txn: &DatabaseTransaction, row: [Value; 8]) -> Result<(), DbErr> {
        let (insert, tail) = match self.dialect {
            Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
            Dialect::MySql => ("INSERT IGNORE INTO", ""),
        };
        let mut sql = Sql::new(self.dialect);
        sql.push(&format!(
            "{insert} order_timeout_shadow (kind, order_id, deadline_ms, would_at_ms, cause, shop_status, shop_seen_at_ms, shop_at_ms) VALUES "
        ))
        .bind_list(row)
        .push(tail);
        txn.execute_raw(sql.build()).await?;
        Ok(())
    }

    /// The orders among `keys` as the shop's table has them, by id.
    async fn shop_side<C: ConnectionTrait>(
        &self,
        conn: &C,
        k: &KindSql,
        keys: &[OrderKey],
    ) -> Result<HashMap<String, ShopSide>, DbErr> {
        let d = self.dialect;
        let flagged = match &k.target {
            Target::Flag(column, _) => format!("CASE WHEN {column} IS NULL THEN 0 ELSE 1 END"),
            Target::Status(..) => "0".to_string(),
        };
        let stamp = match &self.stamp {
            Some((column, ty)) => d.epoch_ms(&self.clock.instant(column, ty)),
            None => "NULL".to_string(),
        };
        let mut sides = HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(WATCH_PAGE) {
            let mut sql = Sql::new(d);
            sql.push(&format!(
                "SELECT {}, {}, {}, {}, {} FROM {} WHERE {} IN ",
                d.as_text(&self.id),
                d.as_text(&self.status),
                d.as_bigint(&flagged),
                d.epoch_ms(&k.deadline(d, &self.clock)),
                stamp,
                self.table,
                self.id
            ))
            .bind_list(chunk.iter().map(|key| self.key_value(key, &self.id_ty)));
            for row in conn.query_all_raw(sql.build()).await? {
                let id: String = row.try_get_by_index(0)?;
                let status: Option<String> = row.try_get_by_index(1)?;
                let flagged: i64 = row.try_get_by_index(2)?;
                sides.insert(
                    id,
                    ShopSide {
                        status: status.unwrap_or_default(),
                        flagged: flagged != 0,
                        deadline_ms: row.try_get_by_index(3)?,
                        stamp_ms: row.try_get_by_index(4)?,
                    },
                );
            }
        }
        Ok(sides)
    }

    /// One look at the orders the service would have closed and the shop
    /// has not changed yet: each one the shop moved on since is noted with
    /// its new status, the database's clock now and the shop's stamp. A
    /// row gone from the shop's table is noted as `(deleted)`. Returns how
    /// many were noted.
    pub async fn shadow_watch(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
    ) -> Result<u64, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(0);
        };
        let d = self.dialect;
        let mut noted = 0;
        let mut after = String::new();
        loop {
            let mut sql = Sql::new(d);
            sql.push("SELECT order_id FROM order_timeout_shadow WHERE kind = ")
                .bind(Value::from(kind.as_str()))
                .push(" AND shop_seen_at_ms IS NULL AND order_id > ")
                .bind(Value::from(after.clone()))
                .push(&format!(" ORDER BY order_id LIMIT {WATCH_PAGE}"));
            let mut ids = Vec::new();
            for row in db.query_all_raw(sql.build()).await? {
                ids.push(row.try_get_by_index::<String>(0)?);
            }
            let Some(last) = ids.last().cloned() else {
                return Ok(noted);
            };
            let keys: Vec<OrderKey> = ids
                .iter()
                .filter_map(|id| OrderKey::parse(id).ok())
                .collect();
            let sides = self.shop_side(db, k, &keys).await?;
            for id in &ids {
                let (status, stamp) = match sides.get(id) {
                    Some(side) if side.moved(k) => (side.status.clone(), side.stamp_ms),
                    Some(_) => continue,
                    None => ("(deleted)".to_string(), None),
                };
                let mut sql = Sql::new(d);
                sql.push("UPDATE order_timeout_shadow SET shop_status = ")
                    .bind(Value::from(crate::domain::truncate(&status, 64)))
                    .push(", shop_seen_at_ms = ")
                    .bind(Value::from(now.0))
                    .push(", shop_at_ms = ")
                    .bind(Value::from(stamp))
                    .push(" WHERE kind = ")
                    .bind(Value::from(kind.as_str()))
                    .push(" AND order_id = ")
                    .bind(Value::from(id.as_str()))
                    .push(" AND shop_seen_at_ms IS NULL");
                noted += db.execute_raw(sql.build()).await?.rows_affected();
            }
            if ids.len() < WATCH_PAGE {
                return Ok(noted);
            }
            after = last;
        }
    }

    /// What shadow mode recorded of `kind`, beside what the shop did, by
    /// the database's clock `now`; `None` when the kind is not mapped.
    pub async fn shadow_report(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
    ) -> Result<Option<ShadowReport>, DbErr> {
        let Some(k) = self.kind(kind) else {
            return Ok(None);
        };
        let closed_text = match &k.target {
            Target::Status(_, to) => Some(to.as_str()),
            // A flag-only kind: the shop "closes" by setting the flag, its
            // status staying where it was.
            Target::Flag(..) => None,
        };
        let mut sql = Sql::new(self.dialect);
        sql.push("SELECT order_id, deadline_ms, would_at_ms, shop_status, shop_seen_at_ms, shop_at_ms FROM order_timeout_shadow WHERE kind = ")
            .bind(Value::from(kind.as_str()))
            .push(" ORDER BY order_id");
        let rows = db.query_all_raw(sql.build()).await?;
        let mut rows_read = Vec::with_capacity(rows.len());
        for row in rows {
            rows_read.push(ShadowRow {
                order_id: row.try_get_by_index(0)?,
                deadline_ms: row.try_get_by_index(1)?,
                would_at_ms: row.try_get_by_index(2)?,
                shop_status: row.try_get_by_index(3)?,
                shop_seen_at_ms: row.try_get_by_index(4)?,
                shop_at_ms: row.try_get_by_index(5)?,
            });
        }
        Ok(Some(ShadowReport::of(
            &rows_read,
            closed_text,
            &k.from_text,
            now,
        )))
    }
}

/// One row of `order_timeout_shadow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowRow {
    pub order_id: String,
    pub deadline_ms: Option<i64>,
    pub would_at_ms: Option<i64>,
    pub shop_status: Option<String>,
    pub shop_seen_at_ms: Option<i64>,
    pub shop_at_ms: Option<i64>,
}

/// Milliseconds at the 50th and 99th percentile and the largest, of `n`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spread {
    pub n: usize,
    pub p50: Option<i64>,
    pub p99: Option<i64>,
    pub max: Option<i64>,
}

impl Spread {
    fn of(mut values: Vec<i64>) -> Self {
        values.sort_unstable();
        let at = |q: f64| {
            (!values.is_empty()).then(|| values[((values.len() - 1) as f64 * q).round() as usize])
        };
        Self {
            n: values.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: values.last().copied(),
        }
    }
}

/// An order and what stands out about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Noted {
    pub order_id: String,
    /// The shop's status, when it changed the order.
    pub status: Option<String>,
    /// How far after its deadline (negative: before) the shop closed it,
    /// or it is still open.
    pub after_deadline_ms: Option<i64>,
}

/// Shadow mode's record of one kind, beside the shop's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// Orders the service would have closed.
    pub would_close: u64,
    /// Of those, closed by the shop after the service would have.
    pub shop_closed_after_us: u64,
    /// Orders the shop had closed before the service acted (their timers
    /// found them closed).
    pub shop_closed_before_us: u64,
    /// Orders the shop closed before their deadline (by its stamp, or as
    /// seen): a cron that closes early.
    pub closed_early: u64,
    /// Orders the service would have closed that the shop has not changed.
    pub still_open: u64,
    /// Orders the service would have closed that the shop moved elsewhere
    /// (paid, say): the two disagree.
    pub disagreements: u64,
    /// The shop's lateness against each deadline, where its time is known.
    pub shop_late_ms: Spread,
    /// The service's lateness: when it would have closed each.
    pub our_late_ms: Spread,
    /// The first orders of each list, by id.
    pub first_disagreements: Vec<Noted>,
    pub first_early: Vec<Noted>,
    pub first_still_open: Vec<Noted>,
}

impl ShadowReport {
    /// Its counts in one line, as `doctor` and `ctl shadow` print them.
    pub fn counts(&self) -> String {
        format!(
            "would close {}; the shop closed {} after us, {} before us, {} before their deadline; {} still open; {} disagreements",
            self.would_close,
            self.shop_closed_after_us,
            self.shop_closed_before_us,
            self.closed_early,
            self.still_open,
            self.disagreements
        )
    }

    /// The report of a kind's rows: `closed` is the status the kind sets
    /// (`None`: a flag, whatever the shop's status then), `from` the one it
    /// acts on.
    pub fn of(rows: &[ShadowRow], closed: Option<&str>, from: &str, now: Millis) -> Self {
        let mut report = Self::default();
        let (mut shop_late, mut our_late) = (Vec::new(), Vec::new());
        for row in rows {
            let closed_by_shop = match (&row.shop_status, closed) {
                (Some(status), Some(to)) => status == to,
                (Some(status), None) => status == from,
                (None, _) => false,
            };
            if let (Some(would), Some(deadline)) = (row.would_at_ms, row.deadline_ms) {
                report.would_close += 1;
                our_late.push(would - deadline);
            }
            // When the shop closed it: its own stamp, else when the watch
            // saw it (only for an order watched since the service decided).
            let shop_at = row.shop_at_ms.or(row.would_at_ms.and(row.shop_seen_at_ms));
            let after = shop_at.zip(row.deadline_ms).map(|(at, d)| at - d);
            let noted = || Noted {
                order_id: row.order_id.clone(),
                status: row.shop_status.clone(),
                after_deadline_ms: after.or(row.deadline_ms.map(|d| now.0 - d)),
            };
            match &row.shop_status {
                None => {
                    report.still_open += 1;
                    if report.first_still_open.len() < FIRST {
                        report.first_still_open.push(noted());
                    }
                }
                Some(_) if closed_by_shop => {
                    if row.would_at_ms.is_some() {
                        report.shop_closed_after_us += 1;
                    } else {
                        report.shop_closed_before_us += 1;
                    }
                    if let Some(after) = after {
                        shop_late.push(after);
                        if after < 0 {
                            report.closed_early += 1;
                            if report.first_early.len() < FIRST {
                                report.first_early.push(noted());
                            }
                        }
                    }
                }
                Some(_) if row.would_at_ms.is_some() => {
                    report.disagreements += 1;
                    if report.first_disagreements.len() < FIRST {
                        report.first_disagreements.push(noted());
                    }
                }
                // Moved elsewhere before the service acted (paid before its
                // deadline, say): nothing to compare.
                Some(_) => {}
            }
        }
        report.shop_late_ms = Spread::of(shop_late);
        report.our_late_ms = Spread::of(our_late);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        id: &str,
        would: Option<i64>,
        status: Option<&str>,
        seen: Option<i64>,
        stamp: Option<i64>,
    ) -> ShadowRow {
        ShadowRow {
            order_id: id.into(),
            deadline_ms: Some(10_000),
            would_at_ms: would,
            shop_status: status.map(str::to_string),
            shop_seen_at_ms: seen,
            shop_at_ms: stamp,
        }
    }

    #[test]
    fn the_report_sets_the_shop_beside_the_service() {
        let rows = [
            // Would close at +5 ms; the cron closed it 40 s late, by its stamp.
            row("1", Some(10_005), Some("4"), Some(50_900), Some(50_000)),
            // Would close; the cron closed it, seen 1 s late, no stamp.
            row("2", Some(10_003), Some("4"), Some(11_000), None),
            // Would close; the shop took a late payment.
            row("3", Some(10_004), Some("1"), Some(12_000), None),
            // Would close; still open.
            row("4", Some(10_002), None, None, None),
            // Closed by the cron 3 s before its deadline, by its stamp.
            row("5", None, Some("4"), Some(10_001), Some(7_000)),
            // Closed before the timer, no stamp: when is unknown.
            row("6", None, Some("4"), Some(10_001), None),
        ];
        let r = ShadowReport::of(&rows, Some("4"), "0", Millis(70_000));
        assert_eq!(r.would_close, 4);
        assert_eq!(r.shop_closed_after_us, 2);
        assert_eq!(r.shop_closed_before_us, 2);
        assert_eq!(r.disagreements, 1);
        assert_eq!(r.first_disagreements[0].order_id, "3");
        assert_eq!(r.still_open, 1);
        assert_eq!(r.first_still_open[0].after_deadline_ms, Some(60_000));
        assert_eq!(r.closed_early, 1);
        assert_eq!(r.first_early[0].after_deadline_ms, Some(-3_000));
        assert_eq!(r.shop_late_ms.n, 3);
        assert_eq!(r.shop_late_ms.max, Some(40_000));
        assert_eq!(r.our_late_ms.p50, Some(4));
    }

    #[test]
    fn a_spread_of_nothing_is_empty() {
        assert_eq!(Spread::of(vec![]), Spread::default());
        let s = Spread::of((1..=100).collect());
        assert_eq!((s.p50, s.p99, s.max), (Some(51), Some(99), Some(100)));
    }
}

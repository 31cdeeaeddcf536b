//! A shop's own orders table, as `mapping.*` describes it: the timeouts'
//! conditional transitions spoken in its columns and status values.
//!
//! The rule is the owned mode's: one conditional `UPDATE … WHERE id = … AND
//! status = <from> AND <column> <= <the database's now> - <span>` (the
//! deadline is the column plus the span; compared on the bare column, so
//! that an index serves the sweeper's and the gauges' reads, see
//! `indexes`), whose row count is the answer; stock is given back in the
//! same transaction, only for the orders that changed; the transaction
//! commits before the delivery is acked.
//! Deadlines are compared with the database's own clock. A zone-less column
//! (`datetime`, `timestamp without time zone`) is read in the zone the shop
//! writes it in: `mapping.time_zone`, or else the database server's default,
//! which is what the shop's own sessions get when they set nothing. The
//! service's sessions are pinned to UTC by sqlx, so their `NOW()` is not the
//! shop's. Deadlines are compared as instants: the bare column against the
//! wall-clock rendering of the instant `now − span` in that zone, and, in a
//! zone with daylight saving, the column's own instant as well (a repeated
//! autumn time is its later instant; see [`sql::Clock`]), so that no change
//! of the clocks closes an order early. `stamp_column` is written in the
//! zone too. A deadline stored coarser than milliseconds is rounded towards later
//! (see [`sql::coarseness_ms`]), so that no order is closed early by the
//! column's truncation or rounding.
//!
//! The service never creates or alters the shop's tables; what it writes of
//! its own (audit, events) goes to its `order_timeout_*` tables.

mod indexes;
pub mod needs;
mod reads;
mod record;
mod schema;
#[cfg(test)]
mod seasons;
mod shadow;
pub mod sql;
mod stock;
mod story;

use std::collections::{BTreeMap, HashMap};

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait, Value,
};

use crate::db::store::{Cause, ExpiryOutcome, LIST_CHUNK};
use crate::domain::{Millis, OrderKey, StockMove, TimeoutKind};
pub use indexes::IndexNeed;
pub use reads::{Stamp, StampValue};
pub use schema::MappingError;
pub use shadow::{ShadowReport, Spread};
use sql::{Clock, Dialect, Sql, Ty};

/// A mapping checked against the database, with its statements' pieces.
#[derive(Debug)]
pub struct Mapped {
    dialect: Dialect,
    /// The database's clock in the shop's zone.
    clock: Clock,
    /// Where the zone came from, for `doctor`.
    pub zone: ZoneFound,
    /// The orders table, quoted, and as named (`name` or `schema.name`).
    table: String,
    table_name: String,
    /// Its id column, quoted, and what it holds.
    id: String,
    id_ty: Ty,
    /// Its status column, quoted, and as named.
    status: String,
    status_name: String,
    /// The PostgreSQL enum type of the status column, quoted: a status
    /// value is bound as text and cast to it.
    status_cast: Option<String>,
    /// The column stamped with the database's now by every transition.
    stamp: Option<(String, Ty)>,
    /// Per kind the mapping maps, how it moves an order.
    kinds: BTreeMap<TimeoutKind, KindSql>,
    /// Stock given back by a payment timeout.
    stock: Option<StockSql>,
    /// The operator's release statements.
    release_sql: Vec<String>,
    /// Shadow mode: decisions recorded, nothing of the shop's written.
    shadow: bool,
    /// What `load` found, one line each, for `doctor`.
    pub findings: Vec<String>,
}

/// The zone of the shop's zone-less columns, and where it came from.
#[derive(Debug, Clone)]
pub struct ZoneFound {
    /// The zone the statements use.
    pub used: crate::settings::Zone,
    /// Whether `mapping.time_zone` set it (else it is the server's default).
    pub from_setting: bool,
    /// The server's default zone as it spells it, or why it could not be read.
    pub server: Result<String, String>,
    /// Whether any column the mapping compares or writes has no zone.
    pub needed: bool,
}

impl ZoneFound {
    /// One line for `doctor`.
    pub fn describe(&self) -> String {
        let server = match &self.server {
            Ok(zone) => zone.clone(),
            Err(e) => format!("unknown ({e})"),
        };
        if !self.needed && !self.from_setting && self.server.is_err() {
            return format!(
                "time zone: none needed (every time column mapped has its own); the server's default: {server}"
            );
        }
        let from = if self.from_setting {
            "mapping.time_zone"
        } else {
            "the server's default"
        };
        format!(
            "time zone of datetime / timestamp-without-zone columns: {} ({from}); the server's default: {server}",
            self.used
        )
    }
}

/// The newest start of a kind's window in the shop's table, against the
/// database's now in the shop's zone (see [`Mapped::newest`]).
#[derive(Debug, Clone)]
pub struct Newest {
    /// The `since_column`.
    pub column: String,
    /// Its newest value, as the database spells it; `None` for an empty table.
    pub value: Option<String>,
    /// The database's now, in the column's convention.
    pub now: String,
    /// How far the newest value lies after now, in milliseconds (negative: before).
    pub ahead_ms: Option<i64>,
}

/// One kind's transition.
#[derive(Debug)]
struct KindSql {
    /// The status it acts on, bound, and as the database reads it back as text.
    from: Value,
    from_text: String,
    /// What it sets.
    target: Target,
    /// The time column the deadline is reckoned from (the `deadline_column`,
    /// or the `since_column`), quoted, and as named.
    column: String,
    column_name: String,
    /// Its type: the clock it is compared with.
    deadline_ty: Ty,
    /// How long after the column's value the deadline falls: the window
    /// when it is a `since_column`, plus one unit of a column coarser than
    /// milliseconds ([`sql::coarseness_ms`]).
    after_ms: u128,
    /// Whether the column is a `since_column` (the window starts there).
    since: bool,
}

impl KindSql {
    /// The deadline's instant, as an expression for a select list.
    fn deadline(&self, dialect: Dialect, clock: &Clock) -> String {
        sql::plus(
            dialect,
            &clock.instant(&self.column, &self.deadline_ty),
            self.after_ms,
        )
    }

    /// The condition "the deadline passed `by_ms` or more before now",
    /// written on the bare column (see [`Clock::passed`]), so that an index
    /// on the status and this column serves it.
    fn passed(&self, clock: &Clock, by_ms: u128) -> String {
        clock.passed(&self.column, &self.deadline_ty, self.after_ms + by_ms)
    }

    /// The condition that leaves alone the orders a flag-only timeout has
    /// flagged already (` AND <flag> IS NULL`); empty for one that moves
    /// the status.
    fn unflagged(&self) -> String {
        match &self.target {
            Target::Flag(column, _) => format!(" AND {column} IS NULL"),
            Target::Status(..) => String::new(),
        }
    }
}

#[derive(Debug)]
enum Target {
    /// Sets the status: the value bound, and as text.
    Status(Value, String),
    /// Stamps this nullable time column once.
    Flag(String, Ty),
}

/// The stock mapping, quoted.
#[derive(Debug)]
struct StockSql {
    items: String,
    order: String,
    order_ty: Ty,
    sku: String,
    quantity: String,
    table: String,
    key: String,
    reserved: String,
    available: Option<String>,
}

impl Mapped {
    /// The kind's transition, when the mapping has one.
    fn kind(&self, kind: TimeoutKind) -> Option<&KindSql> {
        self.kinds.get(&kind)
    }

    /// The kinds whose deadline is reckoned from a zone-less column while
    /// the zone is the server's default (no `mapping.time_zone`): a guess,
    /// checked against the rows that appear before they are closed
    /// (`crate::zone_check`).
    pub fn zone_guarded(&self) -> Vec<TimeoutKind> {
        if self.zone.from_setting {
            return Vec::new();
        }
        self.kinds
            .iter()
            .filter(|(_, k)| matches!(k.deadline_ty, Ty::Time { zoned: false }))
            .map(|(kind, _)| *kind)
            .collect()
    }

    /// Whether timeouts of `kind` act on the shop's table.
    pub fn maps(&self, kind: TimeoutKind) -> bool {
        self.kind(kind).is_some()
    }

    /// The canonical spelling of an id the id column can hold: an integer in
    /// decimal, a UUID in lower case with hyphens, text as it is.
    pub fn accept(&self, key: &OrderKey) -> Result<OrderKey, String> {
        let raw = key.as_str();
        let canonical = match self.id_ty {
            Ty::Int => raw.parse::<i64>().map(|n| n.to_string()).map_err(|_| {
                format!(
                    "order_id '{}' is not an integer, and the id column is",
                    crate::domain::truncate(raw, 64)
                )
            })?,
            Ty::Uuid => uuid::Uuid::parse_str(raw)
                .map(|u| u.hyphenated().to_string())
                .map_err(|_| {
                    format!(
                        "order_id '{}' is not a UUID, and the id column is",
                        crate::domain::truncate(raw, 64)
                    )
                })?,
            _ => raw.to_string(),
        };
        OrderKey::parse(&canonical)
    }

    /// The value binding an id (already [`accept`](Self::accept)ed) for a
    /// column of type `ty`.
    fn key_value(&self, key: &OrderKey, ty: &Ty) -> Value {
        self.raw_value(key.as_str(), ty)
    }

    /// An id as the database spelled it, bound as its column's type.
    fn raw_value(&self, raw: &str, ty: &Ty) -> Value {
        match (ty, self.dialect) {
            (Ty::Int, _) => Value::from(raw.parse::<i64>().unwrap_or(i64::MIN)),
            (Ty::Uuid, Dialect::Postgres) => match uuid::Uuid::parse_str(raw) {
                Ok(u) => Value::from(u),
                Err(_) => Value::from(raw),
            },
            _ => Value::from(raw),
        }
    }

    /// Appends a status value, bound (and cast to the column's enum type).
    fn bind_status<'a>(&self, sql: &'a mut Sql, value: &Value) -> &'a mut Sql {
        match &self.status_cast {
            Some(ty) => sql
                .push("CAST(")
                .bind(value.clone())
                .push(&format!(" AS {ty})")),
            None => sql.bind(value.clone()),
        }
    }

    /// Keys in the order the id column sorts them, without repeats: every
    /// transaction locks its orders in one order.
    fn sorted(&self, keys: &[OrderKey]) -> Vec<OrderKey> {
        let mut sorted = keys.to_vec();
        if self.id_ty == Ty::Int {
            sorted.sort_by_key(|k| k.as_str().parse::<i64>().unwrap_or(i64::MIN));
        } else {
            sorted.sort();
        }
        sorted.dedup();
        sorted
    }

    /// Applies the timeout of `kind` to each order whose deadline has passed
    /// by the database's clock, in one transaction, and says for every id
    /// what it found. `now` is the service's clock, from which the deadlines
    /// it reports are reckoned.
    pub async fn expire(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        now: Millis,
        cause: Cause,
        instance: &str,
    ) -> Result<HashMap<OrderKey, ExpiryOutcome>, DbErr> {
        let Some(k) = self.kind(kind) else {
            let unmapped = ExpiryOutcome::Inapplicable {
                status: format!("{kind} not mapped"),
            };
            return Ok(keys
                .iter()
                .map(|key| (key.clone(), unmapped.clone()))
                .collect());
        };
        if self.shadow {
            return self.shadow_expire(db, kind, k, keys, now, cause).await;
        }
        let sorted = self.sorted(keys);
        let txn = db.begin().await?;
        self.lock(&txn, &sorted).await?;
        let mut applied = Vec::new();
        for key in &sorted {
            if txn
                .execute_raw(self.transition(k, key))
                .await?
                .rows_affected()
                == 1
            {
                applied.push(key.clone());
            }
        }
        let mut outcomes = HashMap::with_capacity(sorted.len());
        for key in &sorted {
            let outcome = self
                .outcome(&txn, k, key, applied.contains(key), now)
                .await?;
            outcomes.insert(key.clone(), outcome);
        }
        let released = if kind.edge().stock == StockMove::Release && !applied.is_empty() {
            self.release(&txn, &applied).await?
        } else {
            HashMap::new()
        };
        // Each with the deadline its row read, for the audit's lateness.
        let applied: Vec<(OrderKey, Option<Millis>)> = applied
            .into_iter()
            .map(|key| match outcomes.get(&key) {
                Some(ExpiryOutcome::Applied { deadline }) => (key, Some(*deadline)),
                _ => (key, None),
            })
            .collect();
        self.record(&txn, kind, k, &applied, &released, cause, now, instance)
            .await?;
        txn.commit().await?;
        Ok(outcomes)
    }

    /// The orders among `keys` that an earlier, failed attempt of this
    /// timeout applied after all (its commit's answer lost): found by their
    /// `order_timeout_audit` row at one of the `attempts`' clock readings
    /// (see [`crate::db::store::applied_earlier`]). Each with the attempt's
    /// time and its outcome, `Applied` with the deadline.
    pub async fn applied_earlier(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        attempts: &[Millis],
        cause: Cause,
    ) -> Result<HashMap<OrderKey, (Millis, ExpiryOutcome)>, DbErr> {
        let mut found = HashMap::new();
        let Some(k) = self.kind(kind) else {
            return Ok(found);
        };
        if attempts.is_empty() {
            return Ok(found);
        }
        let event = kind.edge().event;
        let mut at: HashMap<String, i64> = HashMap::new();
        for chunk in keys.chunks(LIST_CHUNK) {
            let mut sql = Sql::new(self.dialect);
            sql.push("SELECT order_id, at_ms FROM order_timeout_audit WHERE event = ")
                .bind(Value::from(event))
                .push(" AND cause = ")
                .bind(Value::from(cause.as_str()))
                .push(" AND order_id IN ")
                .bind_list(chunk.iter().map(|k| Value::from(k.as_str())))
                .push(" AND at_ms IN ")
                .bind_list(attempts.iter().map(|m| Value::from(m.0)));
            for row in db.query_all_raw(sql.build()).await? {
                let id: String = row.try_get_by_index(0)?;
                let ms: i64 = row.try_get_by_index(1)?;
                at.insert(id, ms);
            }
        }
        if at.is_empty() {
            return Ok(found);
        }
        let txn = db.begin().await?;
        // The deadlines are reckoned from the database's clock, like the rest.
        let now = crate::db::clock::now(&txn).await?;
        for key in keys {
            if let Some(ms) = at.get(key.as_str()) {
                let outcome = self.outcome(&txn, k, key, true, now).await?;
                if matches!(outcome, ExpiryOutcome::Applied { .. }) {
                    found.insert(key.clone(), (Millis(*ms), outcome));
                }
            }
        }
        txn.commit().await?;
        Ok(found)
    }

    /// Whether the database accepts a transition of `kind` at all: the same
    /// statements as [`expire`](Self::expire), for an id no order has.
    pub async fn probe(&self, db: &DatabaseConnection, kind: TimeoutKind) -> Result<(), DbErr> {
        let key = self.probe_key();
        // An id no shop uses: no audit row names an instance.
        self.expire(db, kind, &[key], Millis::now(), Cause::Timeout, "")
            .await
            .map(|_| ())
    }

    /// An id of the id column's type that no shop uses.
    fn probe_key(&self) -> OrderKey {
        let raw = match self.id_ty {
            Ty::Int => i64::MIN.to_string(),
            Ty::Uuid => uuid::Uuid::nil().hyphenated().to_string(),
            _ => "order-timeout:probe".to_string(),
        };
        OrderKey::parse(&raw).expect("a valid key")
    }

    /// Locks the orders, in the id column's order.
    async fn lock(&self, txn: &DatabaseTransaction, sorted: &[OrderKey]) -> Result<(), DbErr> {
        for chunk in sorted.chunks(LIST_CHUNK) {
            let mut sql = Sql::new(self.dialect);
            sql.push(&format!(
                "SELECT {} FROM {} WHERE {} IN ",
                self.id, self.table, self.id
            ))
            .bind_list(chunk.iter().map(|k| self.key_value(k, &self.id_ty)))
            .push(&format!(" ORDER BY {} FOR UPDATE", self.id));
            txn.query_all_raw(sql.build()).await?;
        }
        Ok(())
    }

    /// The conditional update of one order.
    fn transition(&self, k: &KindSql, key: &OrderKey) -> sea_orm::Statement {
        let mut sql = Sql::new(self.dialect);
        sql.push(&format!("UPDATE {} SET ", self.table));
        match &k.target {
            Target::Status(to, _) => {
                sql.push(&format!("{} = ", self.status));
                self.bind_status(&mut sql, to);
            }
            Target::Flag(column, ty) => {
                sql.push(&format!("{column} = {}", self.clock.now(ty)));
            }
        }
        if let Some((stamp, ty)) = &self.stamp {
            sql.push(&format!(", {stamp} = {}", self.clock.now(ty)));
        }
        self.push_due(&mut sql, k, key);
        sql.build()
    }

    /// ` WHERE` the order is `key`, in the status `k` acts on, past its
    /// deadline and not flagged: the transition's condition, which shadow
    /// mode reads instead of writing.
    fn push_due(&self, sql: &mut Sql, k: &KindSql, key: &OrderKey) {
        sql.push(&format!(" WHERE {} = ", self.id))
            .bind(self.key_value(key, &self.id_ty))
            .push(&format!(" AND {} = ", self.status));
        self.bind_status(sql, &k.from)
            .push(" AND ")
            .push(&k.passed(&self.clock, 0));
        sql.push(&k.unflagged());
    }

    /// What one order's row says after the transitions: applied (with its
    /// deadline), not due yet, moved on, or not there.
    async fn outcome(
        &self,
        txn: &DatabaseTransaction,
        k: &KindSql,
        key: &OrderKey,
        applied: bool,
        now: Millis,
    ) -> Result<ExpiryOutcome, DbErr> {
        let flagged = match &k.target {
            Target::Flag(column, _) => format!("CASE WHEN {column} IS NULL THEN 0 ELSE 1 END"),
            Target::Status(..) => "0".to_string(),
        };
        let mut sql = Sql::new(self.dialect);
        sql.push(&format!(
            "SELECT {}, {}, {} FROM {} WHERE {} = ",
            self.dialect.as_text(&self.status),
            self.dialect.millis_until(
                &k.deadline(self.dialect, &self.clock),
                self.clock.instant_now()
            ),
            self.dialect.as_bigint(&flagged),
            self.table,
            self.id
        ))
        .bind(self.key_value(key, &self.id_ty));
        let Some(row) = txn.query_one_raw(sql.build()).await? else {
            return Ok(ExpiryOutcome::NotFound);
        };
        let status: Option<String> = row.try_get_by_index(0)?;
        let status = status.unwrap_or_default();
        let remaining: Option<i64> = row.try_get_by_index(1)?;
        let flagged: i64 = row.try_get_by_index(2)?;
        let deadline = remaining.map(|ms| Millis(now.0.saturating_add(ms)));
        Ok(match deadline {
            Some(deadline) if applied => ExpiryOutcome::Applied { deadline },
            Some(deadline) if status == k.from_text && flagged == 0 && deadline > now => {
                ExpiryOutcome::NotDue { deadline }
            }
            _ => ExpiryOutcome::Inapplicable { status },
        })
    }

    /// One of the operator's statements with the order id bound: once as `$1`
    /// on PostgreSQL, once per `?` on MySQL/MariaDB.
    fn operator_statement(&self, statement: &str, key: &OrderKey) -> sea_orm::Statement {
        let value = self.key_value(key, &self.id_ty);
        let values = match self.dialect {
            Dialect::Postgres => vec![value],
            Dialect::MySql => vec![value; statement.matches('?').count()],
        };
        sea_orm::Statement::from_sql_and_values(self.dialect.backend(), statement, values)
    }
}

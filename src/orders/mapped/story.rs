//! One mapped order's story: its status as the shop spells it and as the
//! mapping names it, each mapped kind's deadline reckoned by the database's
//! clock in the shop's zone (as the transitions reckon it), and the audit
//! trail the service keeps of the shop's table (`order_timeout_audit`).

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
};

use super::sql::Sql;
use super::{KindSql, Mapped, Target};
use crate::db::entities::order_timeout_audit;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::orders::{Story, Transition};

/// One mapped kind's deadline on the order's row.
struct Read {
    kind: TimeoutKind,
    /// Milliseconds from the database's now to the deadline (negative:
    /// passed); `None` when its column is null.
    remaining: Option<i64>,
    /// Whether a flag-only kind has flagged the order already.
    flagged: bool,
}

impl Mapped {
    /// See [`crate::orders::OrderStore::story`]; `now` is the database's
    /// clock, from which the deadlines are reckoned.
    pub async fn story(
        &self,
        db: &DatabaseConnection,
        key: &OrderKey,
        now: Millis,
    ) -> Result<Option<Story>, DbErr> {
        let d = self.dialect;
        let kinds: Vec<(TimeoutKind, &KindSql)> = self.kinds.iter().map(|(k, s)| (*k, s)).collect();
        let mut columns = vec![d.as_text(&self.status)];
        for (_, k) in &kinds {
            columns.push(d.millis_until(&k.deadline(d, &self.clock), self.clock.instant_now()));
            let flagged = match &k.target {
                Target::Flag(column, _) => format!("CASE WHEN {column} IS NULL THEN 0 ELSE 1 END"),
                Target::Status(..) => "0".to_string(),
            };
            columns.push(d.as_bigint(&flagged));
        }
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {} FROM {} WHERE {} = ",
            columns.join(", "),
            self.table,
            self.id
        ))
        .bind(self.key_value(key, &self.id_ty));
        let Some(row) = db.query_one_raw(sql.build()).await? else {
            return Ok(None);
        };
        let raw: Option<String> = row.try_get_by_index(0)?;
        let raw = raw.unwrap_or_default();
        let mut reads = Vec::with_capacity(kinds.len());
        for (i, (kind, _)) in kinds.iter().enumerate() {
            let remaining: Option<i64> = row.try_get_by_index(1 + 2 * i)?;
            let flagged: i64 = row.try_get_by_index(2 + 2 * i)?;
            reads.push(Read {
                kind: *kind,
                remaining,
                flagged: flagged != 0,
            });
        }
        let deadlines: Vec<(TimeoutKind, Millis)> = reads
            .iter()
            .filter_map(|r| Some((r.kind, Millis(now.0.saturating_add(r.remaining?)))))
            .collect();
        // The transition's own condition, here for the deadlines still ahead.
        let waiting = reads
            .iter()
            .filter(|r| {
                self.kinds[&r.kind].from_text == raw
                    && !r.flagged
                    && r.remaining.is_some_and(|ms| ms > 0)
            })
            .filter_map(|r| Some((r.kind, Millis(now.0.saturating_add(r.remaining?)))))
            .collect();
        let transitions = order_timeout_audit::Entity::find()
            .filter(order_timeout_audit::Column::OrderId.eq(key.as_str()))
            .order_by_asc(order_timeout_audit::Column::Id)
            .all(db)
            .await?
            .into_iter()
            .map(|row| Transition {
                at: Millis(row.at_ms),
                kind: Transition::kind_of(&row.event, &row.cause),
                event: row.event,
                from: row.from_status,
                to: row.to_status,
                cause: row.cause,
                late_ms: row.late_ms,
                instance: row.instance,
                detail: row.detail,
            })
            .collect();
        Ok(Some(Story {
            key: key.clone(),
            status: self.status_name_of(&raw),
            status_raw: Some(raw),
            deadlines,
            transitions,
            waiting,
        }))
    }

    /// The service's name of a status the shop spells `raw`: the status a
    /// mapped kind acts on or leads to; `raw` itself when the mapping names
    /// it nowhere.
    fn status_name_of(&self, raw: &str) -> String {
        for (kind, k) in &self.kinds {
            if k.from_text == raw {
                return kind.acts_on().as_str().to_string();
            }
            if let Target::Status(_, to) = &k.target
                && to == raw
            {
                return kind.edge().to.as_str().to_string();
            }
        }
        raw.to_string()
    }
}

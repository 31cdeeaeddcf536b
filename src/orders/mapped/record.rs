//! What a mapped transition writes of the service's own, in its transaction:
//! a row of `order_timeout_audit` and a domain event (`order_timeout_events`,
//! published after commit by the relay) for each order it changed.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Value};

use super::sql::Sql;
use super::{KindSql, Mapped, Target};
use crate::db::events::{self, DomainEvent};
use crate::db::store::{Cause, LIST_CHUNK};
use crate::domain::{Millis, OrderKey, StockMove, TimeoutKind};

impl Mapped {
    /// Audit rows and events for the orders a timeout of `kind` changed,
    /// each with its deadline; `released` is what each cancelled order gave
    /// back by the stock mapping. A row says how late (`now` minus the
    /// deadline, both by the database's clock) and which `instance` applied it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn record(
        &self,
        txn: &DatabaseTransaction,
        kind: TimeoutKind,
        k: &KindSql,
        changed: &[(OrderKey, Option<Millis>)],
        released: &HashMap<OrderKey, Vec<(String, i64)>>,
        cause: Cause,
        now: Millis,
        instance: &str,
    ) -> Result<(), DbErr> {
        let event = kind.edge().event;
        let to = match &k.target {
            Target::Status(_, to) => to.clone(),
            Target::Flag(..) => k.from_text.clone(),
        };
        for chunk in changed.chunks(LIST_CHUNK) {
            let mut sql = Sql::new(self.dialect);
            sql.push(
                "INSERT INTO order_timeout_audit \
                 (order_id, event, from_status, to_status, cause, at_ms, late_ms, instance) \
                 VALUES ",
            );
            for (i, (key, deadline)) in chunk.iter().enumerate() {
                sql.push(if i == 0 { "(" } else { ", (" });
                for (j, value) in [
                    Value::from(key.as_str()),
                    Value::from(event),
                    Value::from(k.from_text.as_str()),
                    Value::from(to.as_str()),
                    Value::from(cause.as_str()),
                    Value::from(now.0),
                    Value::from(deadline.map(|d| now.0 - d.0)),
                    Value::from(crate::domain::truncate(instance, 255)),
                ]
                .into_iter()
                .enumerate()
                {
                    if j > 0 {
                        sql.push(", ");
                    }
                    sql.bind(value);
                }
                sql.push(")");
            }
            txn.execute_raw(sql.build()).await?;
        }
        let domain: Vec<DomainEvent> = changed
            .iter()
            .map(|(key, _)| DomainEvent {
                order_id: key.as_str().to_string(),
                event: event.to_string(),
                cause: cause.as_str().to_string(),
                from: Some(k.from_text.clone()),
                to: to.clone(),
                at: now,
                released: (kind.edge().stock == StockMove::Release)
                    .then(|| released.get(key).cloned().unwrap_or_default()),
            })
            .collect();
        events::append(txn, &domain).await
    }
}

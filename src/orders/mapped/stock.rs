//! Giving a mapped order's stock back: the items of the orders a timeout
//! moved, and the statement that puts them back on sale, in the transaction
//! of the transition.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};

use super::sql::{Dialect, Sql};
use super::{Mapped, StockSql};
use crate::db::store::LIST_CHUNK;
use crate::domain::OrderKey;

impl Mapped {
    /// Gives the stock of cancelled orders back: the mapping's items →
    /// reserved column (stock rows locked in key order first), then the
    /// operator's statements, once per order. Returns what each order gave
    /// back by the mapping, as `(sku, quantity)`.
    pub(super) async fn release(
        &self,
        txn: &DatabaseTransaction,
        cancelled: &[OrderKey],
    ) -> Result<HashMap<OrderKey, Vec<(String, i64)>>, DbErr> {
        let mut released: HashMap<OrderKey, Vec<(String, i64)>> = HashMap::new();
        if let Some(s) = &self.stock {
            for chunk in cancelled.chunks(LIST_CHUNK) {
                released.extend(self.items(txn, s, chunk).await?);
                let orders = |sql: &mut Sql| {
                    sql.bind_list(chunk.iter().map(|k| self.key_value(k, &s.order_ty)));
                };
                let mut lock = Sql::new(self.dialect);
                lock.push(&format!(
                    "SELECT {key} FROM {table} WHERE {key} IN (SELECT {sku} FROM {items} WHERE {order} IN ",
                    key = s.key, table = s.table, sku = s.sku, items = s.items, order = s.order
                ));
                orders(&mut lock);
                lock.push(&format!(") ORDER BY {} FOR UPDATE", s.key));
                txn.query_all_raw(lock.build()).await?;
                let mut update = Sql::new(self.dialect);
                update.push(&self.release_head(s));
                orders(&mut update);
                update.push(&self.release_tail(s));
                txn.execute_raw(update.build()).await?;
            }
        }
        for key in cancelled {
            for statement in &self.release_sql {
                txn.execute_raw(self.operator_statement(statement, key))
                    .await?;
            }
        }
        Ok(released)
    }

    /// The items of some orders, by order.
    async fn items(
        &self,
        txn: &DatabaseTransaction,
        s: &StockSql,
        chunk: &[OrderKey],
    ) -> Result<HashMap<OrderKey, Vec<(String, i64)>>, DbErr> {
        let d = self.dialect;
        let mut sql = Sql::new(d);
        sql.push(&format!(
            "SELECT {}, {}, {} FROM {} WHERE {} IN ",
            d.as_text(&s.order),
            d.as_text(&s.sku),
            d.as_bigint(&s.quantity),
            s.items,
            s.order
        ))
        .bind_list(chunk.iter().map(|k| self.key_value(k, &s.order_ty)))
        .push(&format!(" ORDER BY {}", s.sku));
        // Rows come back spelled as the column stores them; match them to the
        // keys asked for (MySQL compares text without regard to case).
        let by_text: HashMap<String, &OrderKey> = chunk
            .iter()
            .map(|k| (k.as_str().to_lowercase(), k))
            .collect();
        let mut items: HashMap<OrderKey, Vec<(String, i64)>> = HashMap::new();
        for row in txn.query_all_raw(sql.build()).await? {
            let order: String = row.try_get_by_index(0)?;
            let sku: String = row.try_get_by_index(1)?;
            let quantity: i64 = row.try_get_by_index(2)?;
            if let Some(key) = by_text.get(&order.to_lowercase()) {
                items
                    .entry((*key).clone())
                    .or_default()
                    .push((sku, quantity));
            }
        }
        Ok(items)
    }

    /// `UPDATE stock … (SELECT sku, SUM(quantity) … WHERE order IN ` — the
    /// order list goes between this and [`release_tail`](Self::release_tail).
    fn release_head(&self, s: &StockSql) -> String {
        let given_back = format!(
            "(SELECT {sku} AS k, SUM({q}) AS q FROM {items} WHERE {order} IN ",
            sku = s.sku,
            q = s.quantity,
            items = s.items,
            order = s.order
        );
        match self.dialect {
            Dialect::Postgres => {
                let mut set = format!("{r} = s.{r} - r.q", r = s.reserved);
                if let Some(a) = &s.available {
                    set.push_str(&format!(", {a} = s.{a} + r.q"));
                }
                format!("UPDATE {} AS s SET {set} FROM {given_back}", s.table)
            }
            Dialect::MySql => format!("UPDATE {} AS s JOIN {given_back}", s.table),
        }
    }

    fn release_tail(&self, s: &StockSql) -> String {
        match self.dialect {
            Dialect::Postgres => format!(" GROUP BY {}) AS r WHERE s.{} = r.k", s.sku, s.key),
            Dialect::MySql => {
                let mut set = format!("s.{r} = s.{r} - r.q", r = s.reserved);
                if let Some(a) = &s.available {
                    set.push_str(&format!(", s.{a} = s.{a} + r.q"));
                }
                format!(" GROUP BY {}) AS r ON s.{} = r.k SET {set}", s.sku, s.key)
            }
        }
    }
}

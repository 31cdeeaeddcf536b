//! The index a mapped kind needs on the shop's table. Every statement the
//! sweeper, the catch-up, the deadline wake and the gauges send for a kind
//! filters on `status = <from>` and compares the bare deadline column with
//! a value fixed for the statement (`column <= now - span`, `column >= now -
//! span`, `MIN(column)`): one index whose key is the status column, then
//! that column, serves them all, reading only the rows in that status (the
//! few orders waiting, not the whole history of the shop). Without it each
//! of them scans the table, every few seconds, on every instance.
//!
//! `doctor` looks for it in the catalog and prints the statement below when
//! it is missing (`commands::doctor::mapped_indexes`).

use super::Mapped;
use super::sql::Dialect;
use crate::domain::TimeoutKind;

/// PostgreSQL's and MySQL's longest identifier, in bytes.
const MAX_NAME: usize = 63;

/// An index that serves the statements of one or more kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexNeed {
    /// The kinds whose statements it serves (kinds with the same status
    /// column and deadline column share it).
    pub kinds: Vec<TimeoutKind>,
    /// The status value each of those kinds acts on, as the settings spell it.
    pub statuses: Vec<String>,
    /// Its key, as the columns are named: the status column, then the
    /// column the deadline is reckoned from.
    pub columns: [String; 2],
    /// The statement that creates it without holding up the shop's writes.
    pub create: String,
}

impl Mapped {
    /// The dialect the mapping is spoken in.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The orders table, as `mapping.table` names it.
    pub fn table_name(&self) -> &str {
        &self.table_name
    }

    /// The orders table, quoted for a statement.
    pub fn table_quoted(&self) -> &str {
        &self.table
    }

    /// One index per distinct (status column, deadline column) of the
    /// mapped kinds, in the kinds' order.
    pub fn indexes(&self) -> Vec<IndexNeed> {
        let mut needs: Vec<IndexNeed> = Vec::new();
        for (kind, k) in &self.kinds {
            let columns = [self.status_name.clone(), k.column_name.clone()];
            if let Some(need) = needs.iter_mut().find(|n| n.columns == columns) {
                need.kinds.push(*kind);
                need.statuses.push(k.from_text.clone());
                continue;
            }
            let create = create_index(self.dialect, &self.table_name, &columns, *kind);
            needs.push(IndexNeed {
                kinds: vec![*kind],
                statuses: vec![k.from_text.clone()],
                columns,
                create,
            });
        }
        needs
    }
}

/// `CREATE INDEX` for `table (columns)`, built so that it does not block
/// the shop's writes while it runs: `CONCURRENTLY` on PostgreSQL (which
/// cannot run inside a transaction block), `LOCK = NONE` on MySQL/MariaDB
/// (an online build, or an error rather than a locked table).
pub fn create_index(
    dialect: Dialect,
    table: &str,
    columns: &[String; 2],
    kind: TimeoutKind,
) -> String {
    let name = index_name(table, columns, kind);
    let key = columns
        .iter()
        .map(|c| dialect.quote(c))
        .collect::<Vec<_>>()
        .join(", ");
    let (name, table) = (dialect.quote(&name), dialect.quote(table));
    match dialect {
        Dialect::Postgres => {
            format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({key})")
        }
        Dialect::MySql => format!("CREATE INDEX {name} ON {table} ({key}) LOCK = NONE"),
    }
}

/// `<table>_<status>_<column>_idx` (the table without its schema: an index
/// lives in its table's), or `order_timeout_<kind>_idx` when that is longer
/// than an identifier may be.
fn index_name(table: &str, columns: &[String; 2], kind: TimeoutKind) -> String {
    let bare = table.rsplit('.').next().unwrap_or(table);
    let name = format!("{bare}_{}_{}_idx", columns[0], columns[1]);
    if name.len() <= MAX_NAME {
        name
    } else {
        format!("order_timeout_{kind}_idx")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(a: &str, b: &str) -> [String; 2] {
        [a.to_string(), b.to_string()]
    }

    #[test]
    fn the_statement_builds_without_blocking_writes() {
        assert_eq!(
            create_index(
                Dialect::Postgres,
                "shop.oms_order",
                &cols("status", "create_time"),
                TimeoutKind::Payment
            ),
            r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "oms_order_status_create_time_idx" ON "shop"."oms_order" ("status", "create_time")"#
        );
        assert_eq!(
            create_index(
                Dialect::MySql,
                "oms_order",
                &cols("status", "delivery_time"),
                TimeoutKind::Receipt
            ),
            "CREATE INDEX `oms_order_status_delivery_time_idx` ON `oms_order` (`status`, `delivery_time`) LOCK = NONE"
        );
    }

    #[test]
    fn a_long_name_falls_back_to_the_kind() {
        let long = "t".repeat(60);
        assert_eq!(
            index_name(&long, &cols("status", "c"), TimeoutKind::Fulfillment),
            "order_timeout_fulfillment_idx"
        );
    }
}

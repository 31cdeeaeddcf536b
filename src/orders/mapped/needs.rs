//! What the service's statements need of the shop's tables, column by
//! column: `SELECT` on each column they compare or read, `UPDATE` on each
//! they set. These are the grants `config/postgres-mapped-roles.sql` and
//! `config/mariadb-mapped-roles.sql` give the serving user for the mall, and
//! what `doctor` checks the connected user holds
//! (`commands::doctor::grants`).
//!
//! `mapping.release_sql` is not among them: what its statements touch is
//! the operator's SQL, and start-up runs them (rolled back) for an id no
//! order has, so a missing privilege there stops it already.

use super::sql::Dialect;
use super::{Mapped, Target};

/// A privilege on a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Select,
    Update,
}

impl Privilege {
    /// As SQL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Select => "SELECT",
            Self::Update => "UPDATE",
        }
    }
}

/// One privilege the mapping's statements need on a column of the shop's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnNeed {
    /// The table, as the mapping names it (`name` or `schema.name`).
    pub table: String,
    /// The column, as named.
    pub column: String,
    pub privilege: Privilege,
    /// The setting that names the column (the first, when several do).
    pub setting: String,
}

impl ColumnNeed {
    /// `GRANT <privilege> (<column>) ON <table> TO <grantee>`, the table
    /// qualified with `database` when the mapping names it bare (MySQL's
    /// grants name the database; PostgreSQL's run in it, so pass `None`).
    /// `grantee` goes in as given: the caller spells it for the dialect.
    pub fn grant(&self, dialect: Dialect, database: Option<&str>, grantee: &str) -> String {
        let table = match database {
            Some(db) if !self.table.contains('.') => format!("{db}.{}", self.table),
            _ => self.table.clone(),
        };
        format!(
            "GRANT {} ({}) ON {} TO {grantee}",
            self.privilege.as_str(),
            dialect.quote(&self.column),
            dialect.quote(&table)
        )
    }
}

impl Mapped {
    /// Every column privilege the statements of this mapping use, each
    /// once, the orders table's first, then the items' and the stock's.
    /// A `SELECT … FOR UPDATE` of an order or a stock row needs no more on
    /// PostgreSQL than `UPDATE` on one of its columns, which each of these
    /// tables but the items has here.
    pub fn column_needs(&self) -> Vec<ColumnNeed> {
        let mut needs = Needs {
            dialect: self.dialect,
            list: Vec::new(),
        };
        let orders = self.table_name.as_str();
        needs.add(orders, &self.id, Privilege::Select, "mapping.id_column");
        needs.add_bare(
            orders,
            &self.status_name,
            Privilege::Select,
            "mapping.status_column",
        );
        for (kind, k) in &self.kinds {
            let field = if k.since {
                "since_column"
            } else {
                "deadline_column"
            };
            let setting = format!("mapping.{kind}.{field}");
            needs.add_bare(orders, &k.column_name, Privilege::Select, &setting);
            match &k.target {
                Target::Status(..) => needs.add_bare(
                    orders,
                    &self.status_name,
                    Privilege::Update,
                    "mapping.status_column",
                ),
                // Compared with NULL (flagged once), then set.
                Target::Flag(column, _) => {
                    let setting = format!("mapping.{kind}.flag_column");
                    needs.add(orders, column, Privilege::Select, &setting);
                    needs.add(orders, column, Privilege::Update, &setting);
                }
            }
        }
        if let Some((stamp, _)) = &self.stamp {
            needs.add(orders, stamp, Privilege::Update, "mapping.stamp_column");
        }
        if let Some(s) = &self.stock {
            let items = needs.bare(&s.items);
            for (column, field) in [
                (&s.order, "items_order_column"),
                (&s.sku, "items_sku_column"),
                (&s.quantity, "items_quantity_column"),
            ] {
                let setting = format!("mapping.stock.{field}");
                needs.add(&items, column, Privilege::Select, &setting);
            }
            let stock = needs.bare(&s.table);
            needs.add(&stock, &s.key, Privilege::Select, "mapping.stock.id_column");
            // Given back as `reserved = reserved - n`: read, then written.
            let mut given_back = vec![(&s.reserved, "mapping.stock.reserved_column")];
            if let Some(available) = &s.available {
                given_back.push((available, "mapping.stock.available_column"));
            }
            for (column, setting) in given_back {
                needs.add(&stock, column, Privilege::Select, setting);
                needs.add(&stock, column, Privilege::Update, setting);
            }
        }
        if self.shadow {
            // Shadow mode reads (the orders, the shop's stamp of a change,
            // the stock mapping's columns, checked at start) and writes
            // nothing: no status, no stock, no lock.
            if let Some((stamp, _)) = &self.stamp {
                needs.add(orders, stamp, Privilege::Select, "mapping.stamp_column");
            }
            needs.list.retain(|n| n.privilege == Privilege::Select);
        }
        needs.list
    }
}

/// The list being built: the mapping keeps most names quoted for its
/// statements, and the needs are told as named.
struct Needs {
    dialect: Dialect,
    list: Vec<ColumnNeed>,
}

impl Needs {
    /// A name as [`Dialect::quote`] gave it, back as named: it adds no
    /// escapes, so removing its quotes is the whole inverse.
    fn bare(&self, quoted: &str) -> String {
        let q = match self.dialect {
            Dialect::Postgres => '"',
            Dialect::MySql => '`',
        };
        quoted.replace(q, "")
    }

    /// A column held quoted.
    fn add(&mut self, table: &str, quoted: &str, privilege: Privilege, setting: &str) {
        let column = self.bare(quoted);
        self.add_bare(table, &column, privilege, setting);
    }

    /// A column held as named; once, whichever settings name it.
    fn add_bare(&mut self, table: &str, column: &str, privilege: Privilege, setting: &str) {
        let need = ColumnNeed {
            table: table.to_string(),
            column: column.to_string(),
            privilege,
            setting: setting.to_string(),
        };
        let seen = self.list.iter().any(|n| {
            (&n.table, &n.column, n.privilege) == (&need.table, &need.column, need.privilege)
        });
        if !seen {
            self.list.push(need);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sea_orm::Value;

    use super::super::sql::{Clock, Ty};
    use super::super::{KindSql, StockSql, ZoneFound};
    use super::*;
    use crate::domain::TimeoutKind;
    use crate::settings::Zone;

    fn kind(column: &str, target: Target, since: bool) -> KindSql {
        KindSql {
            from: Value::from(0),
            from_text: "0".into(),
            target,
            column: Dialect::MySql.quote(column),
            column_name: column.into(),
            deadline_ty: Ty::Time { zoned: false },
            after_ms: 0,
            since,
        }
    }

    /// The mall's mapping (config/mall.toml), with a fulfillment flag and
    /// an available column added, on MySQL.
    fn mall() -> Mapped {
        let q = |name: &str| Dialect::MySql.quote(name);
        let status = |to: i64| Target::Status(Value::from(to), to.to_string());
        let mut kinds = BTreeMap::new();
        kinds.insert(TimeoutKind::Payment, kind("create_time", status(4), true));
        kinds.insert(TimeoutKind::Receipt, kind("delivery_time", status(3), true));
        kinds.insert(
            TimeoutKind::Fulfillment,
            kind(
                "ship_by",
                Target::Flag(q("overdue_at"), Ty::Time { zoned: false }),
                false,
            ),
        );
        Mapped {
            dialect: Dialect::MySql,
            clock: Clock::new(Dialect::MySql, Zone::Offset(0)),
            zone: ZoneFound {
                used: Zone::Offset(0),
                from_setting: true,
                server: Ok("SYSTEM".into()),
                needed: true,
            },
            table: q("shop.oms_order"),
            table_name: "shop.oms_order".into(),
            id: q("id"),
            id_ty: Ty::Int,
            status: q("status"),
            status_name: "status".into(),
            status_cast: None,
            stamp: Some((q("modify_time"), Ty::Time { zoned: false })),
            shadow: false,
            kinds,
            stock: Some(StockSql {
                items: q("oms_order_item"),
                order: q("order_id"),
                order_ty: Ty::Int,
                sku: q("product_sku_id"),
                quantity: q("product_quantity"),
                table: q("pms_sku_stock"),
                key: q("id"),
                reserved: q("lock_stock"),
                available: Some(q("stock")),
            }),
            release_sql: Vec::new(),
            findings: Vec::new(),
        }
    }

    fn said(needs: &[ColumnNeed]) -> Vec<String> {
        needs
            .iter()
            .map(|n| {
                format!(
                    "{} {}.{} ({})",
                    n.privilege.as_str(),
                    n.table,
                    n.column,
                    n.setting
                )
            })
            .collect()
    }

    #[test]
    fn each_column_compared_is_read_and_each_set_is_written_once() {
        assert_eq!(
            said(&mall().column_needs()),
            [
                "SELECT shop.oms_order.id (mapping.id_column)",
                "SELECT shop.oms_order.status (mapping.status_column)",
                "SELECT shop.oms_order.create_time (mapping.payment.since_column)",
                "UPDATE shop.oms_order.status (mapping.status_column)",
                "SELECT shop.oms_order.ship_by (mapping.fulfillment.deadline_column)",
                "SELECT shop.oms_order.overdue_at (mapping.fulfillment.flag_column)",
                "UPDATE shop.oms_order.overdue_at (mapping.fulfillment.flag_column)",
                "SELECT shop.oms_order.delivery_time (mapping.receipt.since_column)",
                "UPDATE shop.oms_order.modify_time (mapping.stamp_column)",
                "SELECT oms_order_item.order_id (mapping.stock.items_order_column)",
                "SELECT oms_order_item.product_sku_id (mapping.stock.items_sku_column)",
                "SELECT oms_order_item.product_quantity (mapping.stock.items_quantity_column)",
                "SELECT pms_sku_stock.id (mapping.stock.id_column)",
                "SELECT pms_sku_stock.lock_stock (mapping.stock.reserved_column)",
                "UPDATE pms_sku_stock.lock_stock (mapping.stock.reserved_column)",
                "SELECT pms_sku_stock.stock (mapping.stock.available_column)",
                "UPDATE pms_sku_stock.stock (mapping.stock.available_column)",
            ]
        );
    }

    #[test]
    fn without_stock_or_stamp_only_the_orders_table_is_needed() {
        let mut m = mall();
        m.stock = None;
        m.stamp = None;
        m.kinds.remove(&TimeoutKind::Fulfillment);
        assert_eq!(
            said(&m.column_needs()),
            [
                "SELECT shop.oms_order.id (mapping.id_column)",
                "SELECT shop.oms_order.status (mapping.status_column)",
                "SELECT shop.oms_order.create_time (mapping.payment.since_column)",
                "UPDATE shop.oms_order.status (mapping.status_column)",
                "SELECT shop.oms_order.delivery_time (mapping.receipt.since_column)",
            ]
        );
    }

    #[test]
    fn shadow_mode_only_reads() {
        let mut m = mall();
        m.shadow = true;
        assert_eq!(
            said(&m.column_needs()),
            [
                "SELECT shop.oms_order.id (mapping.id_column)",
                "SELECT shop.oms_order.status (mapping.status_column)",
                "SELECT shop.oms_order.create_time (mapping.payment.since_column)",
                "SELECT shop.oms_order.ship_by (mapping.fulfillment.deadline_column)",
                "SELECT shop.oms_order.overdue_at (mapping.fulfillment.flag_column)",
                "SELECT shop.oms_order.delivery_time (mapping.receipt.since_column)",
                "SELECT oms_order_item.order_id (mapping.stock.items_order_column)",
                "SELECT oms_order_item.product_sku_id (mapping.stock.items_sku_column)",
                "SELECT oms_order_item.product_quantity (mapping.stock.items_quantity_column)",
                "SELECT pms_sku_stock.id (mapping.stock.id_column)",
                "SELECT pms_sku_stock.lock_stock (mapping.stock.reserved_column)",
                "SELECT pms_sku_stock.stock (mapping.stock.available_column)",
                "SELECT shop.oms_order.modify_time (mapping.stamp_column)",
            ]
        );
    }

    #[test]
    fn the_grant_names_the_database_where_mysql_needs_it() {
        let need = ColumnNeed {
            table: "pms_sku_stock".into(),
            column: "lock_stock".into(),
            privilege: Privilege::Update,
            setting: "mapping.stock.reserved_column".into(),
        };
        assert_eq!(
            need.grant(Dialect::MySql, Some("mall"), "'serve'@'%'"),
            "GRANT UPDATE (`lock_stock`) ON `mall`.`pms_sku_stock` TO 'serve'@'%'"
        );
        assert_eq!(
            need.grant(Dialect::Postgres, None, "\"serve\""),
            r#"GRANT UPDATE ("lock_stock") ON "pms_sku_stock" TO "serve""#
        );
        let qualified = ColumnNeed {
            table: "shop.pms_sku_stock".into(),
            ..need
        };
        assert_eq!(
            qualified.grant(Dialect::MySql, Some("mall"), "'serve'@'%'"),
            "GRANT UPDATE (`lock_stock`) ON `shop`.`pms_sku_stock` TO 'serve'@'%'"
        );
    }
}

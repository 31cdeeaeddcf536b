//! A mapping checked against the database, read-only: every table and column
//! it names exists and holds a type it can use, every status value fits the
//! status column, and the operator's release statements run (in a transaction
//! that is rolled back). What does not match stops start-up with the setting
//! and the table or column named; what matches is kept as the findings
//! `doctor` prints.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait, Value};

use super::sql::{Dialect, Sql, Ty};
use super::{KindSql, Mapped, StockSql, Target};
use crate::domain::TimeoutKind;
use crate::settings::{KindMapping, MappingSettings, Windows};

/// A mapping that does not match the database (or the database could not be
/// asked): the setting at fault and what was found.
#[derive(Debug, thiserror::Error)]
#[error("`{key}`: {message}")]
pub struct MappingError {
    /// The setting.
    pub key: String,
    /// What is wrong, naming the table or column.
    pub message: String,
}

fn error(key: &str, message: impl Into<String>) -> MappingError {
    MappingError {
        key: key.to_string(),
        message: message.into(),
    }
}

/// A table's columns and their types, as the database describes them.
struct Columns {
    table: String,
    types: BTreeMap<String, String>,
}

impl Columns {
    /// Reads `information_schema.columns` for a table (`name` or `schema.name`).
    async fn read(
        db: &DatabaseConnection,
        dialect: Dialect,
        key: &str,
        table: &str,
    ) -> Result<Self, MappingError> {
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Some(schema.to_string()), name),
            None => (None, table),
        };
        let current = match dialect {
            Dialect::Postgres => "current_schema()",
            Dialect::MySql => "DATABASE()",
        };
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT {}, {} FROM information_schema.columns WHERE table_schema = COALESCE(",
            dialect.as_text("column_name"),
            dialect.as_text("data_type")
        ))
        .bind(Value::from(schema))
        .push(&format!(", {current}) AND table_name = "))
        .bind(Value::from(name));
        let rows = db
            .query_all_raw(sql.build())
            .await
            .map_err(|e| error(key, format!("could not read the columns of {table}: {e}")))?;
        let mut types = BTreeMap::new();
        for row in rows {
            let column: String = row
                .try_get_by_index(0)
                .map_err(|e| error(key, e.to_string()))?;
            let ty: String = row
                .try_get_by_index(1)
                .map_err(|e| error(key, e.to_string()))?;
            types.insert(column, ty);
        }
        if types.is_empty() {
            return Err(error(
                key,
                format!("no table {table} in the database (or it has no column this user can see)"),
            ));
        }
        Ok(Self {
            table: table.to_string(),
            types,
        })
    }

    /// A column that must exist and hold one of the types `fits` accepts
    /// (`expected` says which, for the error).
    fn column(
        &self,
        key: &str,
        name: &str,
        fits: fn(&Ty) -> bool,
        expected: &str,
    ) -> Result<Ty, MappingError> {
        let Some(raw) = self.types.get(name) else {
            let known: Vec<&str> = self.types.keys().map(String::as_str).collect();
            return Err(error(
                key,
                format!(
                    "no column {name} in {} (it has {})",
                    self.table,
                    known.join(", ")
                ),
            ));
        };
        let ty = Ty::classify(raw);
        if !fits(&ty) {
            return Err(error(
                key,
                format!("{}.{name} is {raw}; expected {expected}", self.table),
            ));
        }
        Ok(ty)
    }
}

fn is_time(ty: &Ty) -> bool {
    matches!(ty, Ty::Time { .. })
}

fn is_status(ty: &Ty) -> bool {
    matches!(ty, Ty::Int | Ty::Text)
}

fn any(_: &Ty) -> bool {
    true
}

impl Mapped {
    /// Checks `mapping` against the database and builds its statements'
    /// pieces. Changes nothing.
    pub async fn load(
        m: &MappingSettings,
        windows: &Windows,
        db: &DatabaseConnection,
    ) -> Result<Self, MappingError> {
        let dialect = Dialect::of(db.get_database_backend())
            .ok_or_else(|| error("orders.source", "mapped needs PostgreSQL or MySQL/MariaDB"))?;
        let orders = Columns::read(db, dialect, "mapping.table", &m.table).await?;
        let id_ty = orders.column(
            "mapping.id_column",
            &m.id_column,
            Ty::is_key,
            "an integer, text or UUID",
        )?;
        let status_ty = orders.column(
            "mapping.status_column",
            &m.status_column,
            is_status,
            "an integer or text",
        )?;
        let stamp = if m.stamp_column.is_empty() {
            None
        } else {
            let ty = orders.column(
                "mapping.stamp_column",
                &m.stamp_column,
                is_time,
                "a date and time",
            )?;
            Some((dialect.quote(&m.stamp_column), ty))
        };
        let mut findings = vec![format!(
            "orders table {}: id {} ({}), status {} ({})",
            m.table,
            m.id_column,
            orders.types[&m.id_column],
            m.status_column,
            orders.types[&m.status_column]
        )];
        let mut kinds = [None, None, None];
        for kind in TimeoutKind::ALL {
            let km = m.kind(kind);
            if !km.is_mapped() {
                findings.push(format!("{kind}: not mapped (its timeouts are parked)"));
                continue;
            }
            let window = match kind {
                TimeoutKind::Payment => windows.payment,
                TimeoutKind::Fulfillment => windows.fulfillment,
                TimeoutKind::Receipt => windows.receipt,
            };
            let (k, found) = kind_sql(dialect, &orders, kind, km, &status_ty, window)?;
            findings.push(found);
            kinds[kind as usize] = Some(k);
        }
        let stock = if m.stock.is_set() {
            let (s, found) = stock_sql(db, dialect, m).await?;
            findings.push(found);
            Some(s)
        } else {
            None
        };
        let mapped = Self {
            dialect,
            table: dialect.quote(&m.table),
            id: dialect.quote(&m.id_column),
            id_ty,
            status: dialect.quote(&m.status_column),
            stamp,
            kinds,
            stock,
            release_sql: m.release_sql.clone(),
            findings,
        };
        mapped.try_release_sql(db).await?;
        Ok(mapped)
    }

    /// Runs each release statement for an id no order has, in a transaction
    /// rolled back: a typo or a missing table stops start-up, not the first
    /// cancel.
    async fn try_release_sql(&self, db: &DatabaseConnection) -> Result<(), MappingError> {
        if self.release_sql.is_empty() {
            return Ok(());
        }
        let key = "mapping.release_sql";
        let fail = |e: sea_orm::DbErr| error(key, e.to_string());
        let txn = db.begin().await.map_err(fail)?;
        let probe = self.probe_key();
        for statement in &self.release_sql {
            if let Err(e) = txn
                .execute_raw(self.operator_statement(statement, &probe))
                .await
            {
                let _ = txn.rollback().await;
                return Err(error(
                    key,
                    format!("'{}' fails: {e}", crate::domain::truncate(statement, 120)),
                ));
            }
        }
        txn.rollback().await.map_err(fail)?;
        Ok(())
    }

    /// The operator's statements, for `doctor`.
    pub fn release_statements(&self) -> usize {
        self.release_sql.len()
    }
}

/// One kind's transition, checked: its status values fit the status column,
/// its target and deadline columns exist and hold times.
fn kind_sql(
    dialect: Dialect,
    orders: &Columns,
    kind: TimeoutKind,
    km: &KindMapping,
    status_ty: &Ty,
    window: std::time::Duration,
) -> Result<(KindSql, String), MappingError> {
    let key = |field: &str| format!("mapping.{kind}.{field}");
    let status_value = |field: &str, value: &str| -> Result<(Value, String), MappingError> {
        match status_ty {
            Ty::Int => value
                .trim()
                .parse::<i64>()
                .map(|n| (Value::from(n), n.to_string()))
                .map_err(|_| {
                    error(
                        &key(field),
                        format!(
                            "'{value}' is not an integer, and {}.status is",
                            orders.table
                        ),
                    )
                }),
            _ => Ok((Value::from(value), value.to_string())),
        }
    };
    let (from, from_text) = status_value("from", &km.from)?;
    let (target, target_said) = if km.flag_column.is_empty() {
        let (to, to_text) = status_value("to", &km.to)?;
        let said = format!("status {from_text} → {to_text}");
        (Target::Status(to, to_text), said)
    } else {
        let ty = orders.column(
            &key("flag_column"),
            &km.flag_column,
            is_time,
            "a date and time",
        )?;
        (
            Target::Flag(dialect.quote(&km.flag_column), ty),
            format!("status {from_text}, {} stamped once", km.flag_column),
        )
    };
    let (deadline, deadline_ty, deadline_said) = if km.deadline_column.is_empty() {
        let ty = orders.column(
            &key("since_column"),
            &km.since_column,
            is_time,
            "a date and time",
        )?;
        let expr = format!(
            "({} + {})",
            dialect.quote(&km.since_column),
            dialect.interval_ms(window.as_millis())
        );
        let said = format!(
            "{} + windows.{kind} ({})",
            km.since_column,
            humantime::format_duration(window)
        );
        (expr, ty, said)
    } else {
        let ty = orders.column(
            &key("deadline_column"),
            &km.deadline_column,
            is_time,
            "a date and time",
        )?;
        (
            dialect.quote(&km.deadline_column),
            ty,
            km.deadline_column.clone(),
        )
    };
    let found = format!("{kind}: {target_said} when {deadline_said} has passed");
    Ok((
        KindSql {
            from,
            from_text,
            target,
            deadline,
            deadline_ty,
        },
        found,
    ))
}

/// The stock mapping, checked.
async fn stock_sql(
    db: &DatabaseConnection,
    dialect: Dialect,
    m: &MappingSettings,
) -> Result<(StockSql, String), MappingError> {
    let s = &m.stock;
    let items = Columns::read(db, dialect, "mapping.stock.items_table", &s.items_table).await?;
    let order_ty = items.column(
        "mapping.stock.items_order_column",
        &s.items_order_column,
        Ty::is_key,
        "an integer, text or UUID",
    )?;
    items.column(
        "mapping.stock.items_sku_column",
        &s.items_sku_column,
        any,
        "",
    )?;
    items.column(
        "mapping.stock.items_quantity_column",
        &s.items_quantity_column,
        Ty::is_number,
        "a number",
    )?;
    let stock = Columns::read(db, dialect, "mapping.stock.table", &s.table).await?;
    stock.column("mapping.stock.id_column", &s.id_column, any, "")?;
    stock.column(
        "mapping.stock.reserved_column",
        &s.reserved_column,
        Ty::is_number,
        "a number",
    )?;
    let available = if s.available_column.is_empty() {
        None
    } else {
        stock.column(
            "mapping.stock.available_column",
            &s.available_column,
            Ty::is_number,
            "a number",
        )?;
        Some(dialect.quote(&s.available_column))
    };
    let mut found = format!(
        "stock: {items}.{qty} per {items}.{order} given back from {stock}.{reserved} (matched by {items}.{sku} = {stock}.{id})",
        items = s.items_table,
        qty = s.items_quantity_column,
        order = s.items_order_column,
        stock = s.table,
        reserved = s.reserved_column,
        sku = s.items_sku_column,
        id = s.id_column
    );
    if !s.available_column.is_empty() {
        found.push_str(&format!(" and added to {}.{}", s.table, s.available_column));
    }
    Ok((
        StockSql {
            items: dialect.quote(&s.items_table),
            order: dialect.quote(&s.items_order_column),
            order_ty,
            sku: dialect.quote(&s.items_sku_column),
            quantity: dialect.quote(&s.items_quantity_column),
            table: dialect.quote(&s.table),
            key: dialect.quote(&s.id_column),
            reserved: dialect.quote(&s.reserved_column),
            available,
        },
        found,
    ))
}

//! A mapping checked against the database, read-only: every table and column
//! it names exists and holds a type it can use, every status value fits the
//! status column, and the operator's release statements run (in a transaction
//! that is rolled back). What does not match stops start-up with the setting
//! and the table or column named; what matches is kept as the findings
//! `doctor` prints.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait, Value};

use super::sql::{self, Clock, Dialect, Sql, Ty};
use super::{KindSql, Mapped, StockSql, Target, ZoneFound};
use crate::domain::TimeoutKind;
use crate::settings::{KindMapping, MappingSettings, Windows, Zone};

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
    /// The fractional-second digits of each time column.
    precision: BTreeMap<String, u32>,
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
            "SELECT {}, {}, {} FROM information_schema.columns WHERE table_schema = COALESCE(",
            dialect.as_text("column_name"),
            dialect.as_text("data_type"),
            dialect.as_bigint("datetime_precision")
        ))
        .bind(Value::from(schema))
        .push(&format!(", {current}) AND table_name = "))
        .bind(Value::from(name));
        let rows = db
            .query_all_raw(sql.build())
            .await
            .map_err(|e| error(key, format!("could not read the columns of {table}: {e}")))?;
        let mut types = BTreeMap::new();
        let mut precision = BTreeMap::new();
        for row in rows {
            let column: String = row
                .try_get_by_index(0)
                .map_err(|e| error(key, e.to_string()))?;
            let ty: String = row
                .try_get_by_index(1)
                .map_err(|e| error(key, e.to_string()))?;
            let digits: Option<i64> = row
                .try_get_by_index(2)
                .map_err(|e| error(key, e.to_string()))?;
            if let Some(digits) = digits.and_then(|d| u32::try_from(d).ok()) {
                precision.insert(column.clone(), digits);
            }
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
            precision,
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

impl Columns {
    /// What `doctor` says of a time column coarser than milliseconds.
    fn rounding(&self, column: &str) -> String {
        match self.precision.get(column) {
            Some(0) => format!(" ({column} holds whole seconds: read as 1 s later)"),
            Some(1) => format!(" ({column} holds tenths of a second: read as 0.1 s later)"),
            Some(2) => format!(" ({column} holds hundredths of a second: read as 0.01 s later)"),
            _ => String::new(),
        }
    }
}

/// The zone the shop writes its zone-less columns in: `mapping.time_zone`,
/// or else the server's default; checked by converting the database's now
/// into it, so that a zone the database does not know stops start-up instead
/// of comparing every deadline with NULL.
async fn shop_zone(
    db: &DatabaseConnection,
    dialect: Dialect,
    m: &MappingSettings,
) -> Result<ZoneFound, MappingError> {
    let key = "mapping.time_zone";
    let server = server_zone(db, dialect).await;
    let (used, from_setting) = match &m.time_zone {
        Some(zone) => (zone.clone(), true),
        None => {
            let text = server.clone().map_err(|e| {
                error(
                    key,
                    format!("is empty, and the database server's default zone could not be read: {e}; set it to the zone the shop writes its times in"),
                )
            })?;
            let zone = Zone::verbatim(&text).map_err(|e| {
                error(
                    key,
                    format!("is empty, and the database server's default zone {e}; set it to the zone the shop writes its times in"),
                )
            })?;
            (zone, false)
        }
    };
    let whose = if from_setting {
        format!("'{used}'")
    } else {
        format!("is empty, and the server's default zone '{used}'")
    };
    let now = Clock::new(dialect, used.clone()).now(&Ty::Time { zoned: false });
    let probe = format!("SELECT {}", dialect.as_text(&now));
    let found: Option<String> = match db
        .query_one_raw(sea_orm::Statement::from_string(dialect.backend(), probe))
        .await
    {
        Ok(Some(row)) => row
            .try_get_by_index(0)
            .map_err(|e| error(key, e.to_string()))?,
        Ok(None) => None,
        Err(e) => {
            return Err(error(
                key,
                format!("{whose} is not a zone the database knows: {e}"),
            ));
        }
    };
    if found.is_none() {
        let hint = match dialect {
            Dialect::MySql => {
                " (CONVERT_TZ gives NULL: this server has no time zone tables; load them with mysql_tzinfo_to_sql, or set mapping.time_zone to the offset, like +08:00)"
            }
            Dialect::Postgres => "",
        };
        return Err(error(
            key,
            format!("{whose} is not a zone the database knows{hint}"),
        ));
    }
    Ok(ZoneFound {
        used,
        from_setting,
        server,
        needed: true,
    })
}

/// The zone a session of the server gets when it sets none, as the server
/// spells it. MySQL/MariaDB: `@@global.time_zone` (`SYSTEM`, an offset, or a
/// name). PostgreSQL: sqlx's startup parameter hides it from the session, so
/// it is read where the server takes it from, in the order a new session
/// would apply it: the setting for this role in this database, for this
/// role, for this database, for every role (`pg_db_role_setting`); then the
/// configuration files (`pg_file_settings`, readable by superusers and
/// roles granted it and its function, not by `pg_read_all_settings`); then
/// the built-in default.
async fn server_zone(db: &DatabaseConnection, dialect: Dialect) -> Result<String, String> {
    let text = |sql: &str| {
        let statement = sea_orm::Statement::from_string(dialect.backend(), sql.to_string());
        async move {
            match db.query_one_raw(statement).await {
                Ok(Some(row)) => row
                    .try_get_by_index::<Option<String>>(0)
                    .map_err(|e| e.to_string()),
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match dialect {
        Dialect::MySql => text("SELECT CAST(@@global.time_zone AS CHAR)")
            .await?
            .ok_or_else(|| "@@global.time_zone is NULL".to_string()),
        Dialect::Postgres => {
            let per_role_or_database = text(
                "SELECT substr(c, strpos(c, '=') + 1) FROM pg_db_role_setting s \
                 CROSS JOIN LATERAL unnest(s.setconfig) AS c \
                 WHERE lower(split_part(c, '=', 1)) = 'timezone' \
                 AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) \
                 AND s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user)) \
                 ORDER BY (s.setrole = 0), (s.setdatabase = 0) LIMIT 1",
            )
            .await?;
            if let Some(zone) = per_role_or_database {
                return Ok(zone);
            }
            let file = text(
                "SELECT setting FROM pg_file_settings \
                 WHERE lower(name) = 'timezone' AND applied ORDER BY seqno DESC LIMIT 1",
            )
            .await
            .map_err(|e| {
                format!(
                    "pg_file_settings is not readable ({e}): grant SELECT on it and EXECUTE on pg_show_all_file_settings() to this role (config/postgres-mapped-roles.sql), or set mapping.time_zone"
                )
            })?;
            if let Some(zone) = file {
                return Ok(zone);
            }
            text("SELECT boot_val FROM pg_settings WHERE name = 'TimeZone'")
                .await?
                .ok_or_else(|| "no TimeZone in pg_settings".to_string())
        }
    }
}

fn is_time(ty: &Ty) -> bool {
    matches!(ty, Ty::Time { .. })
}

fn is_status(ty: &Ty) -> bool {
    matches!(ty, Ty::Int | Ty::Text | Ty::Enum)
}

/// The values a status column may hold, when its type lists them, and the
/// cast a bound text value needs to compare with it on PostgreSQL: an enum
/// type's labels in their order, quoted type name; MySQL's `ENUM(…)`
/// members, no cast; PostgreSQL's `character(n)` (no list) is compared as
/// `bpchar`, which keeps an index on it usable. `None` for the rest.
async fn status_members(
    db: &DatabaseConnection,
    dialect: Dialect,
    m: &MappingSettings,
    ty: &Ty,
    raw: &str,
) -> Result<(Option<Vec<String>>, Option<String>), MappingError> {
    let key = "mapping.status_column";
    let fail = |e: sea_orm::DbErr| {
        error(
            key,
            format!(
                "could not read the values of {}.{}: {e}",
                m.table, m.status_column
            ),
        )
    };
    let (schema, name) = match m.table.split_once('.') {
        Some((schema, name)) => (Some(schema.to_string()), name),
        None => (None, m.table.as_str()),
    };
    match (dialect, ty) {
        (Dialect::Postgres, Ty::Text) if raw.eq_ignore_ascii_case("character") => {
            Ok((None, Some("bpchar".to_string())))
        }
        (Dialect::Postgres, Ty::Enum) => {
            let mut sql = Sql::new(dialect);
            sql.push(
                "SELECT CAST(e.enumlabel AS TEXT), CAST(quote_ident(n.nspname) || '.' || quote_ident(t.typname) AS TEXT) \
                 FROM information_schema.columns c \
                 JOIN pg_namespace n ON n.nspname = c.udt_schema \
                 JOIN pg_type t ON t.typnamespace = n.oid AND t.typname = c.udt_name \
                 JOIN pg_enum e ON e.enumtypid = t.oid \
                 WHERE c.table_schema = COALESCE(",
            )
            .bind(Value::from(schema))
            .push(", current_schema()) AND c.table_name = ")
            .bind(Value::from(name))
            .push(" AND c.column_name = ")
            .bind(Value::from(m.status_column.as_str()))
            .push(" ORDER BY e.enumsortorder");
            let rows = db.query_all_raw(sql.build()).await.map_err(fail)?;
            let mut labels = Vec::with_capacity(rows.len());
            let mut cast = None;
            for row in rows {
                labels.push(row.try_get_by_index::<String>(0).map_err(fail)?);
                cast = Some(row.try_get_by_index::<String>(1).map_err(fail)?);
            }
            if cast.is_none() {
                return Err(error(
                    key,
                    format!(
                        "{}.{} is of a user-defined type that is not an enum; expected an integer, text or an enum",
                        m.table, m.status_column
                    ),
                ));
            }
            Ok((Some(labels), cast))
        }
        (Dialect::MySql, Ty::Enum) => {
            let mut sql = Sql::new(dialect);
            sql.push(
                "SELECT CAST(column_type AS CHAR) FROM information_schema.columns WHERE table_schema = COALESCE(",
            )
            .bind(Value::from(schema))
            .push(", DATABASE()) AND table_name = ")
            .bind(Value::from(name))
            .push(" AND column_name = ")
            .bind(Value::from(m.status_column.as_str()));
            let row = db.query_one_raw(sql.build()).await.map_err(fail)?;
            let column_type: String = match row {
                Some(row) => row.try_get_by_index(0).map_err(fail)?,
                None => String::new(),
            };
            Ok((Some(enum_members(&column_type)), None))
        }
        _ => Ok((None, None)),
    }
}

/// The members of MySQL's `enum('a','b''c')`, as written (`''` is a quote).
fn enum_members(column_type: &str) -> Vec<String> {
    let Some(list) = column_type
        .trim()
        .strip_prefix("enum(")
        .or_else(|| column_type.trim().strip_prefix("ENUM("))
        .and_then(|rest| rest.strip_suffix(')'))
    else {
        return Vec::new();
    };
    let mut members = Vec::new();
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    member.push('\'');
                }
                '\'' => break,
                '\\' => {
                    if let Some(next) = chars.next() {
                        member.push(next);
                    }
                }
                c => member.push(c),
            }
        }
        members.push(member);
    }
    members
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
            "an integer, text or an enum",
        )?;
        let (members, status_cast) =
            status_members(db, dialect, m, &status_ty, &orders.types[&m.status_column]).await?;
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
        let mut kinds = BTreeMap::new();
        for kind in TimeoutKind::ALL {
            let km = m.kind(kind);
            if !km.is_mapped() {
                findings.push(format!("{kind}: not mapped (its timeouts are parked)"));
                continue;
            }
            let window = windows.of(kind);
            let (k, found) = kind_sql(
                dialect,
                &orders,
                kind,
                km,
                (&m.status_column, &status_ty, members.as_deref()),
                window,
            )?;
            findings.push(found);
            kinds.insert(kind, k);
        }
        // The zone matters only to a column without one; a mapping with none
        // such starts whatever the server lets this role read of its default.
        let zone_less = |ty: &Ty| matches!(ty, Ty::Time { zoned: false });
        let needed = stamp.as_ref().is_some_and(|(_, ty)| zone_less(ty))
            || kinds.values().any(|k: &KindSql| {
                zone_less(&k.deadline_ty)
                    || matches!(&k.target, Target::Flag(_, ty) if zone_less(ty))
            });
        let zone = match shop_zone(db, dialect, m).await {
            Ok(zone) => zone,
            Err(e) if !needed && m.time_zone.is_none() => ZoneFound {
                used: Zone::Offset(0),
                from_setting: false,
                server: Err(e.message),
                needed,
            },
            Err(e) => return Err(e),
        };
        findings.push(zone.describe());
        let clock = Clock::new(dialect, zone.used.clone());
        let stock = if m.stock.is_set() {
            let (s, found) = stock_sql(db, dialect, m).await?;
            findings.push(found);
            Some(s)
        } else {
            None
        };
        let mapped = Self {
            dialect,
            clock,
            zone,
            table: dialect.quote(&m.table),
            table_name: m.table.clone(),
            id: dialect.quote(&m.id_column),
            id_ty,
            status: dialect.quote(&m.status_column),
            status_name: m.status_column.clone(),
            status_cast,
            stamp,
            kinds,
            stock,
            release_sql: m.release_sql.clone(),
            findings,
            shadow: m.shadow,
        };
        mapped.try_release_sql(db).await?;
        Ok(mapped)
    }

    /// Runs each release statement for an id no order has, in a transaction
    /// rolled back: a typo or a missing table stops start-up, not the first
    /// cancel. Not in shadow mode, which never runs them (and may serve as
    /// a role that can only read): they are tried when it is turned off.
    async fn try_release_sql(&self, db: &DatabaseConnection) -> Result<(), MappingError> {
        if self.release_sql.is_empty() || self.shadow {
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
    (status_name, status_ty, members): (&str, &Ty, Option<&[String]>),
    window: std::time::Duration,
) -> Result<(KindSql, String), MappingError> {
    let key = |field: &str| format!("mapping.{kind}.{field}");
    let status_value = |field: &str, value: &str| -> Result<(Value, String), MappingError> {
        if let Some(members) = members
            && !members.iter().any(|m| m == value)
        {
            return Err(error(
                &key(field),
                format!(
                    "'{value}' is not one of the values {}.{status_name} can hold ({})",
                    orders.table,
                    members.join(", ")
                ),
            ));
        }
        match status_ty {
            Ty::Int => value
                .trim()
                .parse::<i64>()
                .map(|n| (Value::from(n), n.to_string()))
                .map_err(|_| {
                    error(
                        &key(field),
                        format!(
                            "'{value}' is not an integer, and {}.{status_name} is",
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
    // The deadline is a column plus a span: the window from a
    // `since_column`, none for a `deadline_column`.
    let (field, column, span) = if km.deadline_column.is_empty() {
        ("since_column", &km.since_column, window)
    } else {
        (
            "deadline_column",
            &km.deadline_column,
            std::time::Duration::ZERO,
        )
    };
    let deadline_ty = orders.column(&key(field), column, is_time, "a date and time")?;
    let since = km.deadline_column.is_empty();
    let deadline_said = if since {
        format!(
            "{column} + windows.{kind} ({})",
            humantime::format_duration(window)
        )
    } else {
        column.clone()
    };
    let found = format!(
        "{kind}: {target_said} when {deadline_said} has passed{}",
        orders.rounding(column)
    );
    Ok((
        KindSql {
            from,
            from_text,
            target,
            column: dialect.quote(column),
            column_name: column.clone(),
            deadline_ty,
            after_ms: span.as_millis() + sql::coarseness_ms(orders.precision.get(column).copied()),
            since,
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

#[cfg(test)]
mod tests {
    #[test]
    fn enum_members_are_read_as_written() {
        assert_eq!(
            super::enum_members("enum('pending','paid','it''s','a,b')"),
            ["pending", "paid", "it's", "a,b"]
        );
        assert!(super::enum_members("varchar(10)").is_empty());
    }
}

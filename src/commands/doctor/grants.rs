//! The `doctor` check of the connected user's privileges on the shop's
//! tables: each column privilege the mapping's statements need
//! ([`Mapped::column_needs`]), held or not, and for one that is not, the
//! `GRANT` that gives it. Without it the service starts and then fails at
//! the first timeout, sweep or stock given back that touches the column.
//!
//! PostgreSQL answers for a role with `has_column_privilege`, which counts
//! table and column grants, to the role or to any it belongs to. MySQL and
//! MariaDB have no such function: a grant at any level counts (global,
//! database, wildcard database, table, column), read from
//! `information_schema`'s `USER_PRIVILEGES`, `SCHEMA_PRIVILEGES`,
//! `TABLE_PRIVILEGES` and `COLUMN_PRIVILEGES` for `CURRENT_USER()`. Those do
//! not show a MariaDB role's grants to its members, so a privilege not
//! found while a role is enabled is a warning, not a failure.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};

use super::Report;
use crate::orders::Mapped;
use crate::orders::mapped::needs::ColumnNeed;
use crate::orders::mapped::sql::{Dialect, Sql};

/// Who the checks are for, as the database names them.
#[derive(Debug)]
struct Who {
    /// In a `GRANT … TO`: `'user'@'host'` (MySQL), `"role"` (PostgreSQL).
    grantee: String,
    /// MariaDB's enabled role, whose grants `information_schema` hides.
    role: Option<String>,
    /// The current database, to qualify a MySQL grant's table.
    database: Option<String>,
}

/// `user@host`, as MySQL's `CURRENT_USER()` gives it, spelled as
/// `information_schema` spells a grantee: `'user'@'host'`. The host follows
/// the last `@` (a user name may hold one, a host may not).
fn mysql_grantee(current_user: &str) -> String {
    let (user, host) = current_user.rsplit_once('@').unwrap_or((current_user, "%"));
    format!("'{user}'@'{host}'")
}

/// Who is connected, and where.
async fn who(db: &DatabaseConnection, dialect: Dialect) -> Result<Who, DbErr> {
    let sql = match dialect {
        Dialect::Postgres => {
            "SELECT CAST(current_user AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT)"
        }
        Dialect::MySql => {
            "SELECT CAST(CURRENT_USER() AS CHAR), CAST(CURRENT_ROLE() AS CHAR), CAST(DATABASE() AS CHAR)"
        }
    };
    let row = db
        .query_one_raw(Statement::from_string(dialect.backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom("the current user: no row".into()))?;
    let user: String = row.try_get_by_index(0)?;
    Ok(Who {
        grantee: match dialect {
            Dialect::Postgres => dialect.quote(&user),
            Dialect::MySql => mysql_grantee(&user),
        },
        role: row.try_get_by_index(1)?,
        database: row.try_get_by_index(2)?,
    })
}

/// Whether the connected user holds `need`.
async fn holds(
    db: &DatabaseConnection,
    dialect: Dialect,
    who: &Who,
    need: &ColumnNeed,
) -> Result<bool, DbErr> {
    let privilege = || Value::from(need.privilege.as_str());
    let mut sql = Sql::new(dialect);
    match dialect {
        Dialect::Postgres => {
            // The table text is parsed as a name: quoted, as the mapping's
            // statements write it; the column is taken as it is.
            sql.push("SELECT has_column_privilege(")
                .bind(Value::from(dialect.quote(&need.table)))
                .push(", ")
                .bind(Value::from(need.column.as_str()))
                .push(", ")
                .bind(privilege())
                .push(")");
        }
        Dialect::MySql => {
            let (schema, table) = match need.table.split_once('.') {
                Some((schema, table)) => (Some(schema.to_string()), table),
                None => (None, need.table.as_str()),
            };
            let grantee = || Value::from(who.grantee.as_str());
            let schema = || Value::from(schema.clone());
            // A database-level grant names a pattern (`shop%`, `shop\_1`):
            // the database's name is matched against it.
            sql.push(
                "SELECT EXISTS (SELECT 1 FROM information_schema.USER_PRIVILEGES \
                 WHERE GRANTEE = ",
            )
            .bind(grantee())
            .push(" AND PRIVILEGE_TYPE = ")
            .bind(privilege())
            .push(
                ") OR EXISTS (SELECT 1 FROM information_schema.SCHEMA_PRIVILEGES \
                 WHERE GRANTEE = ",
            )
            .bind(grantee())
            .push(" AND PRIVILEGE_TYPE = ")
            .bind(privilege())
            .push(" AND COALESCE(")
            .bind(schema())
            .push(", DATABASE()) LIKE TABLE_SCHEMA");
            for (view, column) in [("TABLE_PRIVILEGES", None), ("COLUMN_PRIVILEGES", Some(()))] {
                sql.push(&format!(
                    ") OR EXISTS (SELECT 1 FROM information_schema.{view} WHERE GRANTEE = "
                ))
                .bind(grantee())
                .push(" AND PRIVILEGE_TYPE = ")
                .bind(privilege())
                .push(" AND TABLE_SCHEMA = COALESCE(")
                .bind(schema())
                .push(", DATABASE()) AND TABLE_NAME = ")
                .bind(Value::from(table));
                if column.is_some() {
                    sql.push(" AND COLUMN_NAME = ")
                        .bind(Value::from(need.column.as_str()));
                }
            }
            sql.push(")");
        }
    }
    let row = db
        .query_one_raw(sql.build())
        .await?
        .ok_or_else(|| DbErr::Custom("a privilege check: no row".into()))?;
    // PostgreSQL answers a boolean, MySQL an integer.
    match dialect {
        Dialect::Postgres => row.try_get_by_index::<bool>(0),
        Dialect::MySql => Ok(row.try_get_by_index::<i64>(0)? != 0),
    }
}

/// What to say about a privilege not held: who lacks what, where, why it
/// is needed, and the statement that gives it.
fn missing(dialect: Dialect, who: &Who, need: &ColumnNeed) -> String {
    format!(
        "{} may not {} {}.{} ({}): {}",
        who.grantee,
        need.privilege.as_str(),
        need.table,
        need.column,
        need.setting,
        need.grant(dialect, who.database.as_deref(), &who.grantee)
    )
}

/// One line if every privilege the mapping needs is held, else one per
/// missing privilege, with its `GRANT`.
pub(super) async fn check(report: &mut Report, mapped: &Mapped, conn: &DatabaseConnection) {
    let dialect = mapped.dialect();
    let needs = mapped.column_needs();
    let who = match who(conn, dialect).await {
        Ok(who) => who,
        Err(e) => return report.fail("grants", format!("cannot tell who is connected: {e}")),
    };
    let mut lacking = Vec::new();
    for need in &needs {
        match holds(conn, dialect, &who, need).await {
            Ok(true) => {}
            Ok(false) => lacking.push(need),
            Err(e) => {
                return report.fail(
                    "grants",
                    format!(
                        "cannot read the privileges of {} on {}.{}: {e}",
                        who.grantee, need.table, need.column
                    ),
                );
            }
        }
    }
    if lacking.is_empty() {
        let mut tables: Vec<&str> = needs.iter().map(|n| n.table.as_str()).collect();
        tables.dedup();
        return report.ok(
            "grants",
            format!(
                "{} holds the {} column privileges the mapping needs on {}",
                who.grantee,
                needs.len(),
                tables.join(", ")
            ),
        );
    }
    for need in lacking {
        let line = missing(dialect, &who, need);
        match &who.role {
            Some(role) => report.warn(
                "grants",
                format!(
                    "{line} (not among the user's own grants; the grants of its enabled role {role} cannot be read here)"
                ),
            ),
            None => report.fail("grants", line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orders::mapped::needs::Privilege;

    #[test]
    fn the_grantee_is_spelled_as_information_schema_spells_it() {
        assert_eq!(mysql_grantee("serve@%"), "'serve'@'%'");
        assert_eq!(mysql_grantee("serve@10.0.0.%"), "'serve'@'10.0.0.%'");
        assert_eq!(mysql_grantee("a@b@localhost"), "'a@b'@'localhost'");
    }

    #[test]
    fn a_missing_privilege_is_named_with_its_grant() {
        let who = Who {
            grantee: "'serve'@'%'".into(),
            role: None,
            database: Some("mall".into()),
        };
        let need = ColumnNeed {
            table: "pms_sku_stock".into(),
            column: "lock_stock".into(),
            privilege: Privilege::Update,
            setting: "mapping.stock.reserved_column".into(),
        };
        assert_eq!(
            missing(Dialect::MySql, &who, &need),
            "'serve'@'%' may not UPDATE pms_sku_stock.lock_stock (mapping.stock.reserved_column): \
             GRANT UPDATE (`lock_stock`) ON `mall`.`pms_sku_stock` TO 'serve'@'%'"
        );
    }
}

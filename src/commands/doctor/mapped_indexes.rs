//! The `doctor` check of a mapped table's indexes: for each kind, whether an
//! index serves the reads the sweeper, the catch-up, the deadline wake and
//! the gauges send every few seconds ([`Mapped::indexes`]), read from the
//! catalog (`pg_index` on PostgreSQL, `information_schema.statistics` on
//! MySQL/MariaDB). A missing one is a warning with the statement that
//! creates it, not a failure: everything works, at the cost of a scan of
//! the shop's table per read.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::Report;
use crate::orders::Mapped;
use crate::orders::mapped::IndexNeed;
use crate::orders::mapped::sql::{Dialect, Sql};

/// An index of the table, as the catalog describes it.
#[derive(Debug, Default)]
struct Index {
    name: String,
    /// Its key columns in order; `None` for an expression.
    columns: Vec<Option<String>>,
    /// A partial index's condition (PostgreSQL), as the server prints it.
    predicate: Option<String>,
}

impl Index {
    /// Whether it serves `need`: its key starts with the status column and
    /// then the deadline's column; or, on PostgreSQL, it starts with the
    /// deadline's column and holds only rows in the kinds' statuses (a
    /// partial index `WHERE status = …`, judged from its condition's text).
    fn serves(&self, need: &IndexNeed, dialect: Dialect) -> bool {
        let same = |found: Option<&Option<String>>, wanted: &str| match found {
            Some(Some(column)) if dialect == Dialect::MySql => column.eq_ignore_ascii_case(wanted),
            Some(Some(column)) => column == wanted,
            _ => false,
        };
        let [status, column] = &need.columns;
        if same(self.columns.first(), status) && same(self.columns.get(1), column) {
            return true;
        }
        match &self.predicate {
            Some(predicate) if same(self.columns.first(), column) => {
                predicate.contains(status.as_str())
                    && need.statuses.iter().all(|s| predicate.contains(s.as_str()))
            }
            _ => false,
        }
    }
}

/// Reads the valid indexes of the mapped table from the catalog.
async fn indexes(db: &DatabaseConnection, mapped: &Mapped) -> Result<Vec<Index>, DbErr> {
    let dialect = mapped.dialect();
    let mut sql = Sql::new(dialect);
    match dialect {
        // Key columns only (not INCLUDE ones), of indexes usable now (not
        // one a failed CREATE INDEX CONCURRENTLY left invalid).
        Dialect::Postgres => {
            sql.push(
                "SELECT CAST(c.relname AS TEXT), CAST(a.attname AS TEXT), \
                 pg_get_expr(i.indpred, i.indrelid) \
                 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
                 LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 WHERE i.indrelid = to_regclass(",
            )
            .bind(Value::from(mapped.table_quoted()))
            .push(
                ") AND i.indisvalid AND i.indisready AND k.ord <= i.indnkeyatts \
                 ORDER BY c.relname, k.ord",
            );
        }
        Dialect::MySql => {
            let table = mapped.table_name();
            let (schema, name) = match table.split_once('.') {
                Some((schema, name)) => (Some(schema.to_string()), name),
                None => (None, table),
            };
            sql.push(
                "SELECT CAST(index_name AS CHAR), CAST(column_name AS CHAR), CAST(NULL AS CHAR) \
                 FROM information_schema.statistics WHERE table_schema = COALESCE(",
            )
            .bind(Value::from(schema))
            .push(", DATABASE()) AND table_name = ")
            .bind(Value::from(name))
            .push(" ORDER BY index_name, seq_in_index");
        }
    }
    let mut found: Vec<Index> = Vec::new();
    for row in db.query_all_raw(sql.build()).await? {
        let name: String = row.try_get_by_index(0)?;
        let column: Option<String> = row.try_get_by_index(1)?;
        let predicate: Option<String> = row.try_get_by_index(2)?;
        match found.last_mut() {
            Some(index) if index.name == name => index.columns.push(column),
            _ => found.push(Index {
                name,
                columns: vec![column],
                predicate,
            }),
        }
    }
    Ok(found)
}

/// One line per index the mapping needs: which index serves it, or a
/// warning with the statement that creates it.
pub(super) async fn check(report: &mut Report, mapped: &Mapped, db: &DatabaseConnection) {
    let needs = mapped.indexes();
    if needs.is_empty() {
        return;
    }
    let table = mapped.table_name();
    let found = match indexes(db, mapped).await {
        Ok(found) => found,
        Err(e) => {
            return report.warn(
                "indexes",
                format!("cannot read the indexes of {table} from the catalog: {e}"),
            );
        }
    };
    for need in needs {
        let kinds = need
            .kinds
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let key = need.columns.join(", ");
        match found.iter().find(|i| i.serves(&need, mapped.dialect())) {
            Some(index) => report.ok(
                "indexes",
                format!("{kinds}: {table} ({key}) is served by index {}", index.name),
            ),
            None => report.warn(
                "indexes",
                format!(
                    "{kinds}: no index of {table} starts with ({key}): the sweeper, the catch-up, \
                     the deadline wake and the gauges each read the whole table, every few \
                     seconds on every instance; create it (it does not block the shop's writes): {}",
                    need.create
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TimeoutKind;

    fn need() -> IndexNeed {
        IndexNeed {
            kinds: vec![TimeoutKind::Payment],
            statuses: vec!["0".into()],
            columns: ["status".into(), "create_time".into()],
            create: String::new(),
        }
    }

    fn index(columns: &[&str], predicate: Option<&str>) -> Index {
        Index {
            name: "i".into(),
            columns: columns.iter().map(|c| Some(c.to_string())).collect(),
            predicate: predicate.map(str::to_string),
        }
    }

    #[test]
    fn an_index_serves_when_its_key_starts_with_status_then_the_column() {
        let pg = Dialect::Postgres;
        assert!(index(&["status", "create_time"], None).serves(&need(), pg));
        assert!(index(&["status", "create_time", "id"], None).serves(&need(), pg));
        assert!(!index(&["create_time", "status"], None).serves(&need(), pg));
        assert!(!index(&["status"], None).serves(&need(), pg));
        assert!(!index(&["create_time"], None).serves(&need(), pg));
        // MySQL's column names are not case-sensitive; PostgreSQL's quoted ones are.
        assert!(index(&["STATUS", "Create_Time"], None).serves(&need(), Dialect::MySql));
        assert!(!index(&["STATUS", "Create_Time"], None).serves(&need(), pg));
    }

    #[test]
    fn a_partial_index_serves_when_it_holds_the_status() {
        let pg = Dialect::Postgres;
        assert!(index(&["create_time"], Some("(status = 0)")).serves(&need(), pg));
        assert!(!index(&["create_time"], Some("(status = 2)")).serves(&need(), pg));
        assert!(!index(&["create_time"], Some("(deleted = 0)")).serves(&need(), pg));
    }
}

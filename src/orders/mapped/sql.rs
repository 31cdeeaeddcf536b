//! The SQL a mapping is spoken in: identifiers quoted, values bound, the
//! database's clock, and the column types a mapping can use, for PostgreSQL
//! and MySQL/MariaDB. Nothing from the settings is spliced into a statement
//! except identifiers, which `settings` only lets through as letters, digits
//! and `_`, and which are quoted here as well.

use sea_orm::{DbBackend, Statement, Value};

/// Which SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
}

impl Dialect {
    /// The dialect of a SeaORM backend; SQLite has none (refused by the settings).
    pub fn of(backend: DbBackend) -> Option<Self> {
        match backend {
            DbBackend::Postgres => Some(Self::Postgres),
            DbBackend::MySql => Some(Self::MySql),
            _ => None,
        }
    }

    /// The SeaORM backend.
    pub fn backend(self) -> DbBackend {
        match self {
            Self::Postgres => DbBackend::Postgres,
            Self::MySql => DbBackend::MySql,
        }
    }

    /// `name` or `schema.name`, quoted part by part.
    pub fn quote(self, dotted: &str) -> String {
        let q = match self {
            Self::Postgres => '"',
            Self::MySql => '`',
        };
        dotted
            .split('.')
            .map(|part| format!("{q}{part}{q}"))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The database's clock, in the time zone convention of a column of
    /// this type: `timestamptz` is compared with an instant, a plain
    /// `timestamp`/`datetime` with the session's local time (as the shop's
    /// own `NOW()` wrote it).
    pub fn now(self, ty: &Ty) -> &'static str {
        match (self, ty) {
            (Self::Postgres, Ty::Time { zoned: true }) => "CURRENT_TIMESTAMP",
            (Self::Postgres, _) => "LOCALTIMESTAMP",
            (Self::MySql, _) => "NOW(3)",
        }
    }

    /// A literal interval of `ms` milliseconds (a number of ours, not text
    /// from anyone).
    pub fn interval_ms(self, ms: u128) -> String {
        match self {
            Self::Postgres => format!("INTERVAL '{ms} milliseconds'"),
            Self::MySql => format!("INTERVAL {} MICROSECOND", ms * 1000),
        }
    }

    /// Whole milliseconds from `now` to `deadline` (negative once passed), as a BIGINT.
    pub fn millis_until(self, deadline: &str, now: &str) -> String {
        match self {
            Self::Postgres => {
                format!("CAST(FLOOR(EXTRACT(EPOCH FROM (({deadline}) - {now})) * 1000) AS BIGINT)")
            }
            Self::MySql => format!("(TIMESTAMPDIFF(MICROSECOND, {now}, {deadline}) DIV 1000)"),
        }
    }

    /// A column read as text (ids and statuses of any type come back as the
    /// wire and the settings spell them).
    pub fn as_text(self, expr: &str) -> String {
        match self {
            Self::Postgres => format!("CAST({expr} AS TEXT)"),
            Self::MySql => format!("CAST({expr} AS CHAR)"),
        }
    }

    /// An integer expression read as a BIGINT.
    pub fn as_bigint(self, expr: &str) -> String {
        match self {
            Self::Postgres => format!("CAST({expr} AS BIGINT)"),
            Self::MySql => format!("CAST({expr} AS SIGNED)"),
        }
    }
}

/// What a column holds, as far as a mapping cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// Any integer type.
    Int,
    /// `numeric`/`decimal`: a quantity may be one.
    Decimal,
    /// Any character type.
    Text,
    /// PostgreSQL's (or MariaDB's) `uuid`.
    Uuid,
    /// A point in time; `zoned` for PostgreSQL's `timestamptz`.
    Time {
        /// `timestamp with time zone`.
        zoned: bool,
    },
    /// Anything else, by its name in the database.
    Other(String),
}

impl Ty {
    /// Classifies `information_schema.columns.data_type`.
    pub fn classify(data_type: &str) -> Self {
        let t = data_type.to_ascii_lowercase();
        match t.as_str() {
            "smallint" | "integer" | "int" | "bigint" | "tinyint" | "mediumint" => Self::Int,
            "numeric" | "decimal" => Self::Decimal,
            "character varying" | "varchar" | "character" | "char" | "text" | "tinytext"
            | "mediumtext" | "longtext" => Self::Text,
            "uuid" => Self::Uuid,
            "timestamp with time zone" => Self::Time { zoned: true },
            "timestamp without time zone" | "timestamp" | "datetime" => Self::Time { zoned: false },
            _ => Self::Other(t),
        }
    }

    /// Whether it can be an order id.
    pub fn is_key(&self) -> bool {
        matches!(self, Self::Int | Self::Text | Self::Uuid)
    }

    /// Whether it can be a quantity.
    pub fn is_number(&self) -> bool {
        matches!(self, Self::Int | Self::Decimal)
    }
}

/// A statement's text and the values it binds, in order.
pub struct Sql {
    dialect: Dialect,
    /// The text so far.
    pub text: String,
    values: Vec<Value>,
}

impl Sql {
    /// An empty statement.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            text: String::new(),
            values: Vec::new(),
        }
    }

    /// Appends text.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind(&mut self, value: Value) -> &mut Self {
        self.values.push(value);
        let placeholder = match self.dialect {
            Dialect::Postgres => format!("${}", self.values.len()),
            Dialect::MySql => "?".to_string(),
        };
        self.push(&placeholder)
    }

    /// Appends `(v1, v2, …)`, each bound.
    pub fn bind_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        self.push("(");
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(v);
        }
        self.push(")")
    }

    /// The statement to run.
    pub fn build(self) -> Statement {
        Statement::from_sql_and_values(self.dialect.backend(), self.text, self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_part_by_part() {
        assert_eq!(
            Dialect::Postgres.quote("shop.oms_order"),
            r#""shop"."oms_order""#
        );
        assert_eq!(Dialect::MySql.quote("oms_order"), "`oms_order`");
    }

    #[test]
    fn values_are_bound_never_spliced() {
        let mut sql = Sql::new(Dialect::Postgres);
        sql.push("SELECT 1 WHERE id IN ")
            .bind_list([Value::from("a'; DROP"), Value::from("b")]);
        assert_eq!(sql.text, "SELECT 1 WHERE id IN ($1, $2)");
        let mut sql = Sql::new(Dialect::MySql);
        sql.push("x = ").bind(Value::from(7i64));
        assert_eq!(sql.text, "x = ?");
        assert_eq!(sql.build().values.map(|v| v.0.len()), Some(1));
    }

    #[test]
    fn column_types_are_classified() {
        assert_eq!(Ty::classify("bigint"), Ty::Int);
        assert_eq!(Ty::classify("tinyint"), Ty::Int);
        assert_eq!(Ty::classify("character varying"), Ty::Text);
        assert_eq!(Ty::classify("uuid"), Ty::Uuid);
        assert_eq!(Ty::classify("datetime"), Ty::Time { zoned: false });
        assert_eq!(
            Ty::classify("timestamp with time zone"),
            Ty::Time { zoned: true }
        );
        assert_eq!(Ty::classify("jsonb"), Ty::Other("jsonb".into()));
    }
}

//! The SQL a mapping is spoken in: identifiers quoted, values bound, the
//! database's clock in the shop's zone, deadlines rounded towards later, and
//! the column types a mapping can use, for PostgreSQL and MySQL/MariaDB.
//! Nothing from the settings is spliced into a statement except identifiers,
//! which `settings` only lets through as letters, digits and `_` (and which
//! are quoted here as well), and a time zone, which it only lets through as
//! letters, digits and `_ / + - :` (quoted here as a literal).

use sea_orm::{DbBackend, Statement, Value};

use crate::settings::Zone;

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

    /// The statement's clock as whole milliseconds since the Unix epoch, a
    /// BIGINT: the same instant as every [`Clock::now`] of the statement
    /// (PostgreSQL's `CURRENT_TIMESTAMP` and MySQL's `NOW()` and
    /// `UTC_TIMESTAMP()` are fixed for a statement).
    pub fn epoch_ms_now(self) -> String {
        match self {
            Self::Postgres => {
                "CAST(FLOOR(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000) AS BIGINT)".to_string()
            }
            Self::MySql => {
                "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)"
                    .to_string()
            }
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

/// The database's clock, as each kind of time column is compared with it.
///
/// The service's sessions are in UTC whatever the shop's are (sqlx sets
/// `time_zone = '+00:00'` on MySQL/MariaDB and the `TimeZone=UTC` startup
/// parameter on PostgreSQL), so the session's local time (`NOW()`,
/// `LOCALTIMESTAMP`) is not the shop's: a zone-less column is compared with
/// the database's instant converted to the shop's zone, explicitly, in the
/// statement. Columns with a zone (`timestamptz`; MySQL's `timestamp`, stored
/// in UTC and read in the session's zone) are compared with the instant as
/// the session reads it, as before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    dialect: Dialect,
    /// The zone the shop writes its zone-less columns in.
    zone: Zone,
}

impl Clock {
    /// The clock of `dialect` for a shop writing in `zone`.
    pub fn new(dialect: Dialect, zone: Zone) -> Self {
        Self { dialect, zone }
    }

    /// The database's now, to compare with (or write into) a column of type `ty`.
    pub fn now(&self, ty: &Ty) -> String {
        let zoned = matches!(ty, Ty::Time { zoned: true });
        match (self.dialect, zoned, &self.zone) {
            (Dialect::Postgres, true, _) => "CURRENT_TIMESTAMP".to_string(),
            // PostgreSQL reads a text offset POSIX-style (west positive), so
            // an offset goes in as an interval, which it reads east positive.
            (Dialect::Postgres, false, Zone::Offset(minutes)) => {
                format!("(CURRENT_TIMESTAMP AT TIME ZONE INTERVAL '{minutes} minutes')")
            }
            (Dialect::Postgres, false, Zone::Named(name)) => {
                format!("(CURRENT_TIMESTAMP AT TIME ZONE '{name}')")
            }
            (Dialect::MySql, true, _) => "NOW(3)".to_string(),
            (Dialect::MySql, false, zone) => {
                format!("CONVERT_TZ(UTC_TIMESTAMP(3), '+00:00', '{zone}')")
            }
        }
    }
}

/// How much later than a column's value the shop's own time may be: one
/// unit of a column coarser than milliseconds (`datetime`, `timestamp(0)`,
/// precision 0 to 2), which holds a time truncated (MariaDB) or rounded
/// (MySQL, PostgreSQL) to that unit; 0 for milliseconds or finer. A deadline
/// reckoned from such a column is taken as this much later, so that it is
/// never taken to have passed before it did.
pub fn coarseness_ms(precision: Option<u32>) -> u128 {
    match precision {
        Some(p) if p < 3 => 10u128.pow(3 - p),
        _ => 0,
    }
}

/// `expr` plus `ms` milliseconds: the deadline a column (or an aggregate of
/// it, `MIN(column)`) gives, for a select list.
pub fn plus(dialect: Dialect, expr: &str, ms: u128) -> String {
    match ms {
        0 => expr.to_string(),
        ms => format!("({expr} + {})", dialect.interval_ms(ms)),
    }
}

/// `column + ms <= now`, written `column <= now - ms`: the same instants (an
/// interval of milliseconds is exact arithmetic on every type of time column
/// and both dialects: no day or month in it, no zone), but the bare column
/// compared with a value fixed for the statement, which an index whose key
/// has the column can serve; `column + ms` is computed row by row, which no
/// index serves.
pub fn at_or_before(dialect: Dialect, column: &str, ms: u128, now: &str) -> String {
    match ms {
        0 => format!("{column} <= {now}"),
        ms => format!("{column} <= {now} - {}", dialect.interval_ms(ms)),
    }
}

/// `column + ms >= now`, written `column >= now - ms`, for the same reason
/// as [`at_or_before`].
pub fn at_or_after(dialect: Dialect, column: &str, ms: u128, now: &str) -> String {
    match ms {
        0 => format!("{column} >= {now}"),
        ms => format!("{column} >= {now} - {}", dialect.interval_ms(ms)),
    }
}

/// `column + after_ms < now + ahead_ms`, written on the bare column as
/// `column < now ± interval`, for the same reason as [`at_or_before`].
pub fn before(dialect: Dialect, column: &str, after_ms: u128, ahead_ms: u128, now: &str) -> String {
    if ahead_ms >= after_ms {
        match ahead_ms - after_ms {
            0 => format!("{column} < {now}"),
            ms => format!("{column} < {now} + {}", dialect.interval_ms(ms)),
        }
    } else {
        format!(
            "{column} < {now} - {}",
            dialect.interval_ms(after_ms - ahead_ms)
        )
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
    /// A point in time; `zoned` for PostgreSQL's `timestamptz` and MySQL's
    /// `timestamp` (an instant, read in the session's zone).
    Time {
        /// `timestamp with time zone`, or MySQL's `timestamp`.
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
            // PostgreSQL spells its types in full: a bare `timestamp` is MySQL's.
            "timestamp with time zone" | "timestamp" => Self::Time { zoned: true },
            "timestamp without time zone" | "datetime" => Self::Time { zoned: false },
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
        assert_eq!(Ty::classify("timestamp"), Ty::Time { zoned: true });
        assert_eq!(
            Ty::classify("timestamp without time zone"),
            Ty::Time { zoned: false }
        );
        assert_eq!(Ty::classify("jsonb"), Ty::Other("jsonb".into()));
    }

    #[test]
    fn the_clock_is_read_in_the_shops_zone() {
        let local = Ty::Time { zoned: false };
        let zoned = Ty::Time { zoned: true };
        let pg = |zone| Clock::new(Dialect::Postgres, zone);
        let my = |zone| Clock::new(Dialect::MySql, zone);
        let bogota = Zone::Named("America/Bogota".into());
        assert_eq!(pg(bogota.clone()).now(&zoned), "CURRENT_TIMESTAMP");
        assert_eq!(
            pg(bogota.clone()).now(&local),
            "(CURRENT_TIMESTAMP AT TIME ZONE 'America/Bogota')"
        );
        // East positive, not PostgreSQL's POSIX reading of '-05:00'.
        assert_eq!(
            pg(Zone::Offset(-300)).now(&local),
            "(CURRENT_TIMESTAMP AT TIME ZONE INTERVAL '-300 minutes')"
        );
        assert_eq!(my(Zone::Offset(480)).now(&zoned), "NOW(3)");
        assert_eq!(
            my(Zone::Offset(-300)).now(&local),
            "CONVERT_TZ(UTC_TIMESTAMP(3), '+00:00', '-05:00')"
        );
        assert_eq!(
            my(Zone::Named("SYSTEM".into())).now(&local),
            "CONVERT_TZ(UTC_TIMESTAMP(3), '+00:00', 'SYSTEM')"
        );
    }

    #[test]
    fn coarse_deadlines_are_rounded_towards_later() {
        let pg = Dialect::Postgres;
        let my = Dialect::MySql;
        // Milliseconds or finer, or unknown: as stored.
        assert_eq!(coarseness_ms(Some(6)), 0);
        assert_eq!(coarseness_ms(Some(3)), 0);
        assert_eq!(coarseness_ms(None), 0);
        // Whole seconds: one second later; tenths and hundredths likewise.
        assert_eq!(coarseness_ms(Some(0)), 1_000);
        assert_eq!(coarseness_ms(Some(1)), 100);
        assert_eq!(coarseness_ms(Some(2)), 10);
        assert_eq!(plus(pg, "\"pay_by\"", 0), "\"pay_by\"");
        assert_eq!(
            plus(pg, "MIN(\"c\")", 3_000),
            "(MIN(\"c\") + INTERVAL '3000 milliseconds')"
        );
        assert_eq!(
            plus(my, "`create_time`", 6_000),
            "(`create_time` + INTERVAL 6000000 MICROSECOND)"
        );
    }

    #[test]
    fn deadlines_are_compared_on_the_bare_column() {
        let pg = Dialect::Postgres;
        let my = Dialect::MySql;
        assert_eq!(
            at_or_before(pg, "\"pay_by\"", 0, "CURRENT_TIMESTAMP"),
            "\"pay_by\" <= CURRENT_TIMESTAMP"
        );
        assert_eq!(
            at_or_before(
                pg,
                "\"c\"",
                1_801_000,
                "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')"
            ),
            "\"c\" <= (CURRENT_TIMESTAMP AT TIME ZONE 'UTC') - INTERVAL '1801000 milliseconds'"
        );
        assert_eq!(
            at_or_before(my, "`create_time`", 3_601_000, "NOW(3)"),
            "`create_time` <= NOW(3) - INTERVAL 3601000000 MICROSECOND"
        );
        assert_eq!(at_or_after(my, "`c`", 0, "NOW(3)"), "`c` >= NOW(3)");
        assert_eq!(
            before(pg, "\"c\"", 1_000, 3_600_000, "CURRENT_TIMESTAMP"),
            "\"c\" < CURRENT_TIMESTAMP + INTERVAL '3599000 milliseconds'"
        );
        assert_eq!(
            before(my, "`c`", 1_801_000, 60_000, "NOW(3)"),
            "`c` < NOW(3) - INTERVAL 1741000000 MICROSECOND"
        );
        assert_eq!(before(my, "`c`", 0, 0, "NOW(3)"), "`c` < NOW(3)");

        assert_eq!(
            at_or_after(pg, "\"c\"", 250, "CURRENT_TIMESTAMP"),
            "\"c\" >= CURRENT_TIMESTAMP - INTERVAL '250 milliseconds'"
        );
    }
}

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

    /// An instant (as [`Clock::instant`] gives one) as whole milliseconds
    /// since the Unix epoch, a BIGINT: exact, where now plus the time until
    /// it could round two readings of one value apart.
    pub fn epoch_ms(self, instant: &str) -> String {
        match self {
            Self::Postgres => self.millis_until(instant, "TIMESTAMPTZ '1970-01-01 00:00:00+00'"),
            Self::MySql => self.millis_until(instant, "'1970-01-01 00:00:00'"),
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
/// `LOCALTIMESTAMP`) is not the shop's. Deadlines are compared as instants:
/// a zone-less column holds the shop's wall-clock time, so it is compared
/// with the wall-clock rendering of the *instant* `now − span` (never with
/// `wall(now) − span`, which leaps with the clocks at a daylight-saving
/// change), and, in a zone that has such changes, also read as the instant
/// it names ([`Clock::instant`]): a time in the repeated autumn hour is
/// taken as its later instant, one in the skipped spring hour as the
/// zone's offset before the jump reads it (after the jump), as PostgreSQL
/// reads both. The comparison on the bare column is what an index serves;
/// the instant's is exact. Columns with a zone (`timestamptz`; MySQL's
/// `timestamp`, stored in UTC and read in the session's zone) are instants
/// already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    dialect: Dialect,
    /// The zone the shop writes its zone-less columns in.
    zone: Zone,
    /// An instant to take for now instead of the database's (tests).
    now: Option<String>,
}

/// How far the wall clock of a zone can run back at a change of offset, and
/// more: a bound on the bare column that must take in every row an instant
/// comparison `>=` takes is widened by it (the largest change in the time
/// zone database is two hours).
const WIDEST_SHIFT: &str = "6";

impl Clock {
    /// The clock of `dialect` for a shop writing in `zone`.
    pub fn new(dialect: Dialect, zone: Zone) -> Self {
        Self {
            dialect,
            zone,
            now: None,
        }
    }

    /// The same clock stopped at `instant` (an expression of the type
    /// [`Clock::instant_now`] gives), to run the statements at a chosen
    /// moment.
    #[cfg(test)]
    pub fn at(self, instant: &str) -> Self {
        Self {
            now: Some(instant.to_string()),
            ..self
        }
    }

    /// The statement's instant, as [`Clock::instant`] gives a column's:
    /// PostgreSQL's `CURRENT_TIMESTAMP`, MySQL's `UTC_TIMESTAMP(3)` (the
    /// session is in UTC, so a `timestamp` column reads in UTC too).
    pub fn instant_now(&self) -> &str {
        if let Some(now) = &self.now {
            return now;
        }
        match self.dialect {
            Dialect::Postgres => "CURRENT_TIMESTAMP",
            Dialect::MySql => "UTC_TIMESTAMP(3)",
        }
    }

    /// Whether a column of type `ty` maps one to one onto instants, so that
    /// a comparison on the bare column is exact: it has a zone, or the
    /// shop's zone is a fixed offset.
    fn one_to_one(&self, ty: &Ty) -> bool {
        matches!(ty, Ty::Time { zoned: true }) || matches!(self.zone, Zone::Offset(_))
    }

    /// The instant `now + ms` (`ms` may be negative), fixed for the statement.
    fn shifted(&self, ms: i128) -> String {
        let now = self.instant_now();
        match ms {
            0 => now.to_string(),
            ms if ms > 0 => format!("{now} + {}", self.dialect.interval_ms(ms.unsigned_abs())),
            ms => format!("{now} - {}", self.dialect.interval_ms(ms.unsigned_abs())),
        }
    }

    /// The instant a column (or an aggregate of one) of type `ty` holds.
    pub fn instant(&self, column: &str, ty: &Ty) -> String {
        if matches!(ty, Ty::Time { zoned: true }) {
            return column.to_string();
        }
        match (self.dialect, &self.zone) {
            (Dialect::Postgres, Zone::Offset(minutes)) => {
                format!("({column} AT TIME ZONE INTERVAL '{minutes} minutes')")
            }
            // PostgreSQL takes a repeated time as its later instant, a
            // skipped one with the offset before the jump.
            (Dialect::Postgres, Zone::Named(name)) => format!("({column} AT TIME ZONE '{name}')"),
            (Dialect::MySql, Zone::Offset(_)) => {
                format!("CONVERT_TZ({column}, '{}', '+00:00')", self.zone)
            }
            // MySQL's CONVERT_TZ takes a repeated time as its earlier
            // instant and a skipped one as the jump's: read as PostgreSQL
            // reads them, from the offsets three hours either side (which
            // the CASE checks name the time).
            (Dialect::MySql, Zone::Named(name)) => {
                let to_utc = |expr: &str| format!("CONVERT_TZ({expr}, '{name}', '+00:00')");
                let to_wall = |expr: &str| format!("CONVERT_TZ({expr}, '+00:00', '{name}')");
                let own = to_utc(column);
                let later = format!(
                    "{} - INTERVAL 3 HOUR",
                    to_utc(&format!("{column} + INTERVAL 3 HOUR"))
                );
                let before = format!(
                    "{} + INTERVAL 3 HOUR",
                    to_utc(&format!("{column} - INTERVAL 3 HOUR"))
                );
                format!(
                    "(CASE WHEN {} <> {column} THEN {before} WHEN {} = {column} THEN GREATEST({own}, {later}) ELSE {own} END)",
                    to_wall(&own),
                    to_wall(&format!("({later})"))
                )
            }
        }
    }

    /// The earliest instant a column of type `ty` holds among the rows: of
    /// its `MIN` where the two are one to one (an index serves `MIN` of the
    /// bare column), else the `MIN` of the instants.
    pub fn earliest(&self, column: &str, ty: &Ty) -> String {
        if self.one_to_one(ty) {
            self.instant(&format!("MIN({column})"), ty)
        } else {
            format!("MIN({})", self.instant(column, ty))
        }
    }

    /// An instant rendered as a column of type `ty` holds it: for a
    /// zone-less column, the wall-clock time in the shop's zone.
    pub fn wall(&self, instant: &str, ty: &Ty) -> String {
        if matches!(ty, Ty::Time { zoned: true }) {
            return instant.to_string();
        }
        match (self.dialect, &self.zone) {
            // PostgreSQL reads a text offset POSIX-style (west positive), so
            // an offset goes in as an interval, which it reads east positive.
            (Dialect::Postgres, Zone::Offset(minutes)) => {
                format!("(({instant}) AT TIME ZONE INTERVAL '{minutes} minutes')")
            }
            (Dialect::Postgres, Zone::Named(name)) => {
                format!("(({instant}) AT TIME ZONE '{name}')")
            }
            (Dialect::MySql, zone) => format!("CONVERT_TZ({instant}, '+00:00', '{zone}')"),
        }
    }

    /// The database's now, to compare with (or write into) a column of type `ty`.
    pub fn now(&self, ty: &Ty) -> String {
        match (self.dialect, ty) {
            (Dialect::MySql, Ty::Time { zoned: true }) => "NOW(3)".to_string(),
            _ => self.wall(self.instant_now(), ty),
        }
    }

    /// `instant(column) + ms <= now`: on the bare column against the wall
    /// clock of `now − ms` (which an index whose key has the column
    /// serves), and, where that is not one to one, on the instant too.
    pub fn passed(&self, column: &str, ty: &Ty, ms: u128) -> String {
        let at = self.shifted(-(ms as i128));
        let bare = format!("{column} <= {}", self.wall(&at, ty));
        if self.one_to_one(ty) {
            bare
        } else {
            format!("{bare} AND {} <= {at}", self.instant(column, ty))
        }
    }

    /// `instant(column) + ms >= now`, likewise; the bound on the bare
    /// column is widened by [`WIDEST_SHIFT`] hours where the wall clock can
    /// run back.
    pub fn not_passed(&self, column: &str, ty: &Ty, ms: u128) -> String {
        let at = self.shifted(-(ms as i128));
        if self.one_to_one(ty) {
            return format!("{column} >= {}", self.wall(&at, ty));
        }
        let widened = match self.dialect {
            Dialect::Postgres => format!("{at} - INTERVAL '{WIDEST_SHIFT} hours'"),
            Dialect::MySql => format!("{at} - INTERVAL {WIDEST_SHIFT} HOUR"),
        };
        format!(
            "{column} >= {} AND {} >= {at}",
            self.wall(&widened, ty),
            self.instant(column, ty)
        )
    }

    /// `instant(column) + after_ms < now + ahead_ms`, likewise.
    pub fn before(&self, column: &str, ty: &Ty, after_ms: u128, ahead_ms: u128) -> String {
        let at = self.shifted(ahead_ms as i128 - after_ms as i128);
        let bare = format!("{column} < {}", self.wall(&at, ty));
        if self.one_to_one(ty) {
            bare
        } else {
            format!("{bare} AND {} < {at}", self.instant(column, ty))
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
    /// MySQL's `ENUM(…)`, or a PostgreSQL user-defined type (an enum type
    /// when its labels can be read).
    Enum,
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
            "enum" | "user-defined" => Self::Enum,
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
            "((CURRENT_TIMESTAMP) AT TIME ZONE 'America/Bogota')"
        );
        // East positive, not PostgreSQL's POSIX reading of '-05:00'.
        assert_eq!(
            pg(Zone::Offset(-300)).now(&local),
            "((CURRENT_TIMESTAMP) AT TIME ZONE INTERVAL '-300 minutes')"
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
        let zoned = Ty::Time { zoned: true };
        let local = Ty::Time { zoned: false };
        let pg = Clock::new(Dialect::Postgres, Zone::Named("UTC".into()));
        let my = Clock::new(Dialect::MySql, Zone::Offset(480));
        assert_eq!(
            pg.passed("\"pay_by\"", &zoned, 0),
            "\"pay_by\" <= CURRENT_TIMESTAMP"
        );
        assert_eq!(
            my.passed("`create_time`", &zoned, 3_601_000),
            "`create_time` <= UTC_TIMESTAMP(3) - INTERVAL 3601000000 MICROSECOND"
        );
        // A fixed offset: the wall clock of the instant, nothing more.
        assert_eq!(
            my.passed("`c`", &local, 1_000),
            "`c` <= CONVERT_TZ(UTC_TIMESTAMP(3) - INTERVAL 1000000 MICROSECOND, '+00:00', '+08:00')"
        );
        assert_eq!(my.not_passed("`c`", &zoned, 0), "`c` >= UTC_TIMESTAMP(3)");
        assert_eq!(
            pg.before("\"c\"", &zoned, 1_000, 3_600_000),
            "\"c\" < CURRENT_TIMESTAMP + INTERVAL '3599000 milliseconds'"
        );
        // A zone with daylight saving: the wall clock of the instant `now -
        // span` bounds the bare column; the column's instant decides.
        assert_eq!(
            pg.passed("\"c\"", &local, 1_801_000),
            "\"c\" <= ((CURRENT_TIMESTAMP - INTERVAL '1801000 milliseconds') AT TIME ZONE 'UTC') \
             AND (\"c\" AT TIME ZONE 'UTC') <= CURRENT_TIMESTAMP - INTERVAL '1801000 milliseconds'"
        );
        assert_eq!(
            pg.not_passed("\"c\"", &local, 250),
            "\"c\" >= ((CURRENT_TIMESTAMP - INTERVAL '250 milliseconds' - INTERVAL '6 hours') AT TIME ZONE 'UTC') \
             AND (\"c\" AT TIME ZONE 'UTC') >= CURRENT_TIMESTAMP - INTERVAL '250 milliseconds'"
        );
        assert_eq!(
            pg.earliest("\"c\"", &zoned),
            "MIN(\"c\")",
            "an index serves MIN of the bare column"
        );
        assert_eq!(
            pg.earliest("\"c\"", &local),
            "MIN((\"c\" AT TIME ZONE 'UTC'))"
        );
    }
}

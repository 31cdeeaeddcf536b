//! The deadline predicates of a zone-less column across a daylight-saving
//! change, run on the local PostgreSQL and MariaDB servers (the integration
//! tests' servers; MariaDB with its time zone tables loaded, as the Makefile
//! does) with the database's instant set at each side of the change: a spring
//! and an autumn one, in a northern zone (Europe/Berlin) and a southern one
//! (Australia/Sydney). Rows hold wall-clock times every ten minutes from an
//! hour and a half before the change to an hour and a half after, those of
//! the skipped and the repeated hour included, and each predicate is held to
//! the truth reckoned here: a repeated time is its later instant, a skipped
//! one is read with the offset before the jump (after the jump).

use chrono::{Duration as Span, NaiveDate, NaiveDateTime};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

use super::sql::{Clock, Dialect, Ty, plus};
use crate::settings::Zone;

/// One change of offset.
struct Change {
    zone: &'static str,
    /// When it happens, UTC.
    at: NaiveDateTime,
    /// The offsets before and after it, minutes east of UTC.
    before: i64,
    after: i64,
}

fn utc(y: i32, m: u32, d: u32, h: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, m, d)
        .and_then(|d| d.and_hms_opt(h, 0, 0))
        .expect("a date")
}

fn changes() -> [Change; 4] {
    [
        // 02:00 → 03:00 local.
        Change {
            zone: "Europe/Berlin",
            at: utc(2024, 3, 31, 1),
            before: 60,
            after: 120,
        },
        // 03:00 → 02:00 local.
        Change {
            zone: "Europe/Berlin",
            at: utc(2024, 10, 27, 1),
            before: 120,
            after: 60,
        },
        // The southern spring: 02:00 → 03:00 local on 6 October.
        Change {
            zone: "Australia/Sydney",
            at: utc(2024, 10, 5, 16),
            before: 600,
            after: 660,
        },
        // The southern autumn: 03:00 → 02:00 local on 7 April.
        Change {
            zone: "Australia/Sydney",
            at: utc(2024, 4, 6, 16),
            before: 660,
            after: 600,
        },
    ]
}

impl Change {
    /// The instant a wall-clock time names, by the rule the statements keep.
    fn instant(&self, wall: NaiveDateTime) -> NaiveDateTime {
        // The wall clock at the change, by the old offset, moved by the
        // change: in spring the end of the skipped hour (which is read with
        // the old offset), in autumn the start of the repeated hour (read
        // with the new one: the later instant).
        let edge = self.at + Span::minutes(self.after);
        let old = wall < edge;
        wall - Span::minutes(if old { self.before } else { self.after })
    }

    /// Wall-clock times every ten minutes around the change, and a second
    /// either side of each edge of the skipped or repeated hour.
    fn walls(&self) -> Vec<NaiveDateTime> {
        let edge = self.at + Span::minutes(self.before);
        let shift = Span::minutes(self.after - self.before);
        let mut walls: Vec<NaiveDateTime> =
            (-9..=9).map(|i| edge + Span::minutes(10 * i)).collect();
        for e in [edge, edge + shift] {
            walls.push(e - Span::seconds(1));
            walls.push(e + Span::seconds(1));
        }
        walls.sort();
        walls.dedup();
        walls
    }

    /// Instants every five minutes from two hours before the change to two
    /// hours after, and a millisecond either side of it.
    fn nows(&self) -> Vec<NaiveDateTime> {
        let mut nows: Vec<NaiveDateTime> =
            (-24..=24).map(|i| self.at + Span::minutes(5 * i)).collect();
        nows.push(self.at - Span::milliseconds(1));
        nows.push(self.at + Span::milliseconds(1));
        nows
    }
}

fn text(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

async fn connect(dialect: Dialect) -> DatabaseConnection {
    let url = match dialect {
        Dialect::Postgres => "postgres://postgres@127.0.0.1:5432/postgres",
        Dialect::MySql => "mysql://root@127.0.0.1:3306/mysql",
    };
    let mut options = sea_orm::ConnectOptions::new(url);
    options.max_connections(1).sqlx_logging(false);
    Database::connect(options)
        .await
        .unwrap_or_else(|e| panic!("{url} reachable: {e}"))
}

/// The rows as a derived table `t (id, c)`, `c` a zone-less time.
fn rows(dialect: Dialect, walls: &[NaiveDateTime]) -> String {
    let ty = match dialect {
        Dialect::Postgres => "TIMESTAMP(3)",
        Dialect::MySql => "DATETIME(3)",
    };
    let selects: Vec<String> = walls
        .iter()
        .enumerate()
        .map(|(i, w)| {
            format!(
                "SELECT {} AS id, CAST('{}' AS {ty}) AS c",
                dialect.as_bigint(&i.to_string()),
                text(*w)
            )
        })
        .collect();
    format!("({}) AS t", selects.join(" UNION ALL "))
}

/// An instant as the clock of `dialect` takes it.
fn instant_literal(dialect: Dialect, t: NaiveDateTime) -> String {
    match dialect {
        Dialect::Postgres => format!("CAST('{}+00' AS TIMESTAMPTZ)", text(t)),
        Dialect::MySql => format!("CAST('{}' AS DATETIME(3))", text(t)),
    }
}

/// Every predicate a mapped kind's statements are built from, against the
/// truth, at every instant around each change.
async fn predicates_hold(dialect: Dialect) {
    let db = connect(dialect).await;
    let local = Ty::Time { zoned: false };
    for change in changes() {
        let walls = change.walls();
        let table = rows(dialect, &walls);
        let base = Clock::new(dialect, Zone::Named(change.zone.to_string()));
        // The instant each wall-clock time names.
        let epoch = dialect.millis_until(
            &base.instant("c", &local),
            &instant_literal(dialect, chrono::DateTime::UNIX_EPOCH.naive_utc()),
        );
        let sql = format!("SELECT id, {epoch} FROM {table} ORDER BY id");
        let found = db
            .query_all_raw(Statement::from_string(dialect.backend(), sql))
            .await
            .unwrap();
        assert_eq!(found.len(), walls.len());
        for row in found {
            let id: i64 = row.try_get_by_index(0).unwrap();
            let ms: Option<i64> = row.try_get_by_index(1).unwrap();
            let wall = walls[id as usize];
            let want = change.instant(wall).and_utc().timestamp_millis();
            assert_eq!(
                ms,
                Some(want),
                "{dialect:?} {}: {wall} names {} UTC",
                change.zone,
                change.instant(wall)
            );
        }
        let flag = |p: &str| dialect.as_bigint(&format!("CASE WHEN {p} THEN 1 ELSE 0 END"));
        for now in change.nows() {
            let clock = base.clone().at(&instant_literal(dialect, now));
            for span_ms in [0u128, 60_000, 1_800_000] {
                let ahead_ms = 600_000u128;
                let sql = format!(
                    "SELECT id, {}, {}, {}, {} FROM {table} ORDER BY id",
                    flag(&clock.passed("c", &local, span_ms)),
                    flag(&clock.not_passed("c", &local, span_ms)),
                    flag(&clock.before("c", &local, span_ms, ahead_ms)),
                    dialect.millis_until(
                        &plus(dialect, &clock.instant("c", &local), span_ms),
                        clock.instant_now()
                    ),
                );
                let found = db
                    .query_all_raw(Statement::from_string(dialect.backend(), sql))
                    .await
                    .unwrap();
                for row in found {
                    let id: i64 = row.try_get_by_index(0).unwrap();
                    let wall = walls[id as usize];
                    let deadline = change.instant(wall) + Span::milliseconds(span_ms as i64);
                    let flag = |i: usize| row.try_get_by_index::<i64>(i).unwrap() == 1;
                    let what = format!(
                        "{dialect:?} {}, now {now} UTC, {wall} + {span_ms} ms (due {deadline} UTC)",
                        change.zone
                    );
                    assert_eq!(flag(1), deadline <= now, "passed: {what}");
                    assert_eq!(flag(2), deadline >= now, "not passed: {what}");
                    assert_eq!(
                        flag(3),
                        deadline < now + Span::milliseconds(ahead_ms as i64),
                        "due within 10 minutes: {what}"
                    );
                    let until: i64 = row.try_get_by_index(4).unwrap();
                    assert_eq!(
                        until,
                        (deadline - now).num_milliseconds(),
                        "milliseconds until the deadline: {what}"
                    );
                }
            }
        }
    }
    db.close().await.unwrap();
}

#[tokio::test]
#[ignore = "needs the local PostgreSQL: the integration tier runs it (make test)"]
async fn deadlines_are_instants_on_postgres() {
    predicates_hold(Dialect::Postgres).await;
}

#[tokio::test]
#[ignore = "needs the local MariaDB: the integration tier runs it (make test)"]
async fn deadlines_are_instants_on_mariadb() {
    let db = connect(Dialect::MySql).await;
    let zones = db
        .query_one_raw(Statement::from_string(
            sea_orm::DbBackend::MySql,
            "SELECT COUNT(*) FROM mysql.time_zone_name".to_string(),
        ))
        .await
        .unwrap()
        .and_then(|row| row.try_get_by_index::<i64>(0).ok())
        .unwrap_or(0);
    db.close().await.unwrap();
    assert!(
        zones > 0,
        "MariaDB has no time zone tables: `make databases` loads them (mariadb-tzinfo-to-sql)"
    );
    predicates_hold(Dialect::MySql).await;
}

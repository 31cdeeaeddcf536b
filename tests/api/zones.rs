//! A shop's zone-less time columns (`datetime`, `timestamp without time
//! zone`) are read in the zone the shop writes them in, and a deadline stored
//! in whole seconds is never taken to have passed early (issue 25).
//!
//! The shop writes its rows from its own session in its own zone (its
//! `NOW()`), west of UTC and east of it. The service learns the zone from the
//! database server's default, as a DBA sets it (PostgreSQL: per database;
//! MariaDB: `SET GLOBAL`, server-wide, so those tests are `#[ignore]`d and
//! run alone, `server_zone` in their names, by the Makefile's serial stage),
//! or from `mapping.time_zone`. With a 5 s window every unpaid order is
//! closed between its deadline and 1.5 s after it by the database's own
//! stamps, by its timeout, by the catch-up and by the sweeper; `modify_time`
//! is written in the shop's zone; `doctor` says which zone and fails when the
//! newest order lies in the future by it.

use std::time::Duration;

use crate::control::readyz;
use crate::helpers::*;
use crate::mapped::{Mall, Shop, mall_mapping, mall_schema};

/// The payment window, and how late a close may come after it.
const WINDOW_MS: i64 = 5_000;
const LATE_MS: i64 = 1_500;

/// Where the service learns the shop's zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZoneFrom {
    /// The server's default, as a DBA set it.
    Server,
    /// `mapping.time_zone`.
    Setting,
}

/// What closes the orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// Each order's own timeout.
    Timeout,
    /// One timeout, for the last order; the catch-up closes the others.
    CatchUp,
    /// No timeout at all: the sweeper, with no grace.
    Sweeper,
}

struct Case {
    /// As the shop's session (and `mapping.time_zone`) spell it.
    zone: &'static str,
    /// Its offset from UTC, east positive, in minutes (these zones have no DST).
    offset_minutes: i64,
    from: ZoneFrom,
    drive: Drive,
}

/// The mall's tables with its times to the millisecond, so that a close can
/// be timed by the database's own stamps.
fn precise_schema(backend: Backend) -> Vec<String> {
    mall_schema(backend)
        .into_iter()
        .map(|s| {
            s.replace("DATETIME", "DATETIME(3)")
                .replace("TIMESTAMP(0)", "TIMESTAMP(3)")
        })
        .collect()
}

/// Milliseconds from `a` to `b`, two columns or expressions of the same type.
fn millis_between(backend: Backend, a: &str, b: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("CAST(FLOOR(EXTRACT(EPOCH FROM ({b} - {a})) * 1000) AS TEXT)")
        }
        _ => format!("CAST(TIMESTAMPDIFF(MICROSECOND, {a}, {b}) DIV 1000 AS CHAR)"),
    }
}

/// MariaDB's server-wide default zone, set for one test and put back when it
/// ends, however it ends.
struct GlobalZone {
    before: String,
}

impl GlobalZone {
    async fn set(zone: &str) -> Self {
        let admin = sea_orm::Database::connect(MARIADB_ADMIN).await.unwrap();
        let row = sea_orm::ConnectionTrait::query_one_raw(
            &admin,
            sea_orm::Statement::from_string(
                sea_orm::DbBackend::MySql,
                "SELECT CAST(@@global.time_zone AS CHAR)",
            ),
        )
        .await
        .unwrap()
        .unwrap();
        let before: String = row.try_get_by_index(0).unwrap();
        admin.close().await.ok();
        admin_sql(&format!("SET GLOBAL time_zone = '{zone}'")).await;
        Self { before }
    }
}

async fn admin_sql(sql: &str) {
    admin(MARIADB_ADMIN, sql).await
}

impl Drop for GlobalZone {
    fn drop(&mut self) {
        let restore = format!("SET GLOBAL time_zone = '{}'", self.before);
        // Drop cannot await: a helper thread with its own runtime puts it back.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(admin_sql(&restore));
        })
        .join();
    }
}

/// The shop and the service in `case`'s zone: seven orders, the first paid
/// at once, the other six closed by `case.drive` in time by the database's
/// clock, stamped in the shop's zone, their stock given back once. Returns
/// the app and the shop for the caller's `doctor` checks.
async fn zoned(backend: Backend, mode: DelayMode, case: Case) -> (TestApp, Shop) {
    let schema = precise_schema(backend);
    let mut spawn = Spawn::new(backend, mode)
        .setup(&schema.iter().map(String::as_str).collect::<Vec<_>>())
        .env(
            "ORDER_TIMEOUT__CONSUMER__CATCH_UP",
            (case.drive == Drive::CatchUp).to_string(),
        );
    if case.from == ZoneFrom::Server && backend == Backend::Postgres {
        // As a DBA sets it for the shop's database: every new session's zone.
        spawn = spawn.setup(&[&format!(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', current_database(), '{}'); END $$",
            case.zone
        )]);
    }
    if case.from == ZoneFrom::Setting {
        spawn = spawn.env("ORDER_TIMEOUT__MAPPING__TIME_ZONE", case.zone);
    }
    if case.drive == Drive::Sweeper {
        spawn = spawn
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s");
    }
    let app =
        spawn_app(mall_mapping(spawn, false).env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "5s")).await;
    let session = match (backend, case.from) {
        (Backend::Postgres, _) => format!("SET TIME ZONE '{}'", case.zone),
        // A session that sets nothing gets the global zone.
        (_, ZoneFrom::Server) => "SET time_zone = DEFAULT".to_string(),
        (_, ZoneFrom::Setting) => format!("SET time_zone = '{}'", case.zone),
    };
    let shop = Shop::open_session(&app, backend, &session).await;
    // The shop's clock really is that far from UTC.
    let utc = match backend {
        Backend::Postgres => "CAST(CURRENT_TIMESTAMP AT TIME ZONE 'UTC' AS TIMESTAMP(3))",
        _ => "UTC_TIMESTAMP(3)",
    };
    let offset: i64 = shop
        .one(
            &format!("SELECT {}", millis_between(backend, utc, shop.now())),
            vec![],
        )
        .await
        .parse()
        .unwrap();
    assert!(
        (offset - case.offset_minutes * 60_000).abs() < 2_000,
        "the shop's session is {offset} ms from UTC"
    );

    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    let publisher = app.publisher().await;
    mall.checkout(1).await;
    assert!(mall.pay(1).await);
    for n in 2..=7 {
        mall.checkout(n).await;
        let last = n == 7;
        if case.drive == Drive::Timeout || (case.drive == Drive::CatchUp && last) {
            publisher.timeout(&mall.key(n), "payment", WINDOW_MS).await;
        }
    }
    for n in 2..=7 {
        mall.wait_status(n, "4", Duration::from_secs(20)).await;
    }
    // When the service stamped each close, after `create_time`, both in the
    // shop's zone by the database's clock: never before the deadline, never
    // hours after it.
    let closed = shop
        .rows(
            &format!(
                "SELECT {}, {} FROM oms_order WHERE status = 4 ORDER BY id",
                shop.text("id"),
                millis_between(backend, "create_time", "modify_time")
            ),
            vec![],
        )
        .await;
    assert_eq!(closed.len(), 6, "{closed:?}");
    for row in &closed {
        let (id, after) = row.split_once('|').unwrap();
        let after: i64 = after.parse().unwrap();
        assert!(
            (WINDOW_MS..=WINDOW_MS + LATE_MS).contains(&after),
            "order {id} closed {after} ms after it was placed; its window is {WINDOW_MS} ms ({closed:?})"
        );
    }
    // `modify_time` is the shop's local time: its own clock reads about the same.
    let since_stamp: i64 = shop
        .one(
            &format!(
                "SELECT {} FROM oms_order",
                millis_between(backend, "MAX(modify_time)", shop.now())
            ),
            vec![],
        )
        .await
        .parse()
        .unwrap();
    assert!(
        (-1_000..=3_000).contains(&since_stamp),
        "the newest modify_time is {since_stamp} ms before the shop's own now"
    );
    assert_eq!(mall.status(1).await, "1", "the paid order is left alone");
    // Every unpaid order's items left lock_stock once; the paid one's were sold.
    let stock = mall.stock().await;
    assert!(stock.values().all(|(_, lock)| *lock == 0), "{stock:?}");
    let sold: i64 = Mall::items(1).iter().map(|(_, q)| *q as i64).sum();
    assert_eq!(
        stock.values().map(|(s, _)| 100 - s).sum::<i64>(),
        sold,
        "{stock:?}"
    );
    let audit = shop
        .one(
            &format!("SELECT {} FROM order_timeout_audit", shop.text("COUNT(*)")),
            vec![],
        )
        .await;
    assert_eq!(audit, "6", "each order closed once");
    (app, shop)
}

/// The zone finding `doctor` prints, and its verdict on the newest order.
fn assert_doctor_passes(app: &TestApp, zone_line: &str) {
    let (ok, report) = doctor(app, &[]);
    assert!(ok, "{report}");
    assert!(report.contains(zone_line), "{zone_line}\n{report}");
    assert!(
        report.contains("payment: the newest create_time (")
            && report.contains("s before the database's now"),
        "{report}"
    );
}

// ----------------------------------------------------- PostgreSQL

/// The DBA's `ALTER DATABASE … SET timezone`, west of UTC; each order's own timeout.
async fn postgres_database_zone_west(backend: Backend, mode: DelayMode) {
    let case = Case {
        zone: "America/Bogota",
        offset_minutes: -300,
        from: ZoneFrom::Server,
        drive: Drive::Timeout,
    };
    let (app, _shop) = zoned(backend, mode, case).await;
    assert_doctor_passes(
        &app,
        "time zone of datetime / timestamp-without-zone columns: America/Bogota (the server's default); the server's default: America/Bogota",
    );
}

/// `mapping.time_zone` east of UTC, the database's default left as it is;
/// one timeout and the catch-up. `doctor` fails with a zone west of the
/// shop's (its newest order then lies hours in the future) and with a zone
/// PostgreSQL does not know.
async fn postgres_setting_east(backend: Backend, mode: DelayMode) {
    let case = Case {
        zone: "Asia/Shanghai",
        offset_minutes: 480,
        from: ZoneFrom::Setting,
        drive: Drive::CatchUp,
    };
    let (app, _shop) = zoned(backend, mode, case).await;
    assert_doctor_passes(&app, "columns: Asia/Shanghai (mapping.time_zone)");
    let (ok, report) = doctor(&app, &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "+00:00")]);
    assert!(
        !ok && report.contains("FAIL  time zone: payment: the newest create_time"),
        "{report}"
    );
    let (ok, report) = doctor(
        &app,
        &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "Nowhere/Land")],
    );
    assert!(
        !ok && report
            .contains("`mapping.time_zone`: 'Nowhere/Land' is not a zone the database knows"),
        "{report}"
    );
}

/// The DBA's zone east of UTC; the sweeper alone.
async fn postgres_database_zone_east(backend: Backend, mode: DelayMode) {
    let case = Case {
        zone: "Asia/Shanghai",
        offset_minutes: 480,
        from: ZoneFrom::Server,
        drive: Drive::Sweeper,
    };
    zoned(backend, mode, case).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_database_zone_west_timeout_ttl() {
    run(
        Backend::Postgres,
        DelayMode::Ttl,
        postgres_database_zone_west,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_setting_east_catch_up_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, postgres_setting_east).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_database_zone_east_sweeper_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        postgres_database_zone_east,
    )
    .await
}

// ----------------------------------------------------- MariaDB

/// `mapping.time_zone` east of UTC, the server's default (UTC here) left as
/// it is; each order's own timeout.
async fn mariadb_setting_east(backend: Backend, mode: DelayMode) {
    let case = Case {
        zone: "+08:00",
        offset_minutes: 480,
        from: ZoneFrom::Setting,
        drive: Drive::Timeout,
    };
    zoned(backend, mode, case).await;
}

/// `mapping.time_zone` west of UTC; the sweeper alone. `doctor` fails when
/// the newest order lies an hour in the future, and for a named zone this
/// server cannot convert to (it has no time zone tables: `CONVERT_TZ` gives
/// NULL, which must never be compared with).
async fn mariadb_setting_west(backend: Backend, mode: DelayMode) {
    let case = Case {
        zone: "-05:00",
        offset_minutes: -300,
        from: ZoneFrom::Setting,
        drive: Drive::Sweeper,
    };
    let (app, shop) = zoned(backend, mode, case).await;
    assert_doctor_passes(&app, "columns: -05:00 (mapping.time_zone)");
    let (ok, report) = doctor(
        &app,
        &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "Mars/Olympus_Mons")],
    );
    assert!(
        !ok && report.contains("`mapping.time_zone`: 'Mars/Olympus_Mons' is not a zone the database knows (CONVERT_TZ gives NULL"),
        "{report}"
    );
    // A paid order dated an hour ahead: the zone cannot be the shop's.
    shop.exec(
        "INSERT INTO oms_order (id, member_id, order_sn, status, create_time) \
         VALUES (99, 990, '99', 1, NOW(3) + INTERVAL 1 HOUR)",
        vec![],
    )
    .await;
    let (ok, report) = doctor(&app, &[]);
    assert!(
        !ok && report.contains("FAIL  time zone: payment: the newest create_time")
            && report.contains(" after the database's now ("),
        "{report}"
    );
}

/// `SET GLOBAL time_zone`, west of UTC: the shop's sessions take it; one
/// timeout and the catch-up.
async fn mariadb_server_zone_west(backend: Backend, mode: DelayMode) {
    let _zone = GlobalZone::set("-05:00").await;
    let case = Case {
        zone: "-05:00",
        offset_minutes: -300,
        from: ZoneFrom::Server,
        drive: Drive::CatchUp,
    };
    zoned(backend, mode, case).await;
}

/// `SET GLOBAL time_zone`, east of UTC; each order's own timeout.
async fn mariadb_server_zone_east(backend: Backend, mode: DelayMode) {
    let _zone = GlobalZone::set("+08:00").await;
    let case = Case {
        zone: "+08:00",
        offset_minutes: 480,
        from: ZoneFrom::Server,
        drive: Drive::Timeout,
    };
    let (app, _shop) = zoned(backend, mode, case).await;
    assert_doctor_passes(
        &app,
        "columns: +08:00 (the server's default); the server's default: +08:00",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_setting_east_timeout_plugin() {
    run(Backend::MariaDb, DelayMode::Plugin, mariadb_setting_east).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_setting_west_sweeper_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, mariadb_setting_west).await
}

/// Server-wide: alone, in the Makefile's serial stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "sets MariaDB's global time zone: run alone (make test's serial stage)"]
async fn mariadb_server_zone_west_catch_up_plugin() {
    run(
        Backend::MariaDb,
        DelayMode::Plugin,
        mariadb_server_zone_west,
    )
    .await
}

/// Server-wide: alone, in the Makefile's serial stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "sets MariaDB's global time zone: run alone (make test's serial stage)"]
async fn mariadb_server_zone_east_timeout_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, mariadb_server_zone_east).await
}

// ----------------------------------------------------- whole seconds

/// A `datetime` column (whole seconds; MariaDB truncates what the shop's
/// `NOW(3)` writes into it): 500 orders placed at scattered sub-second
/// offsets, their true time kept in a `datetime(3)` column beside it; the
/// catch-up and the sweeper with no grace close them all, none before its
/// true deadline.
async fn whole_seconds(backend: Backend, mode: DelayMode) {
    const ORDERS: i64 = 500;
    const BATCH: i64 = 25;
    let schema: Vec<String> = mall_schema(backend)
        .into_iter()
        .map(|s| {
            s.replace(
                "modify_time DATETIME,",
                "modify_time DATETIME(3), true_time DATETIME(3),",
            )
        })
        .collect();
    let spawn = Spawn::new(backend, mode)
        .setup(&schema.iter().map(String::as_str).collect::<Vec<_>>())
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "100ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s");
    let app =
        spawn_app(mall_mapping(spawn, false).env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "2s")).await;
    let shop = Shop::open(&app, backend).await;
    for batch in 0..ORDERS / BATCH {
        let values: Vec<String> = (1..=BATCH)
            .map(|i| {
                let n = batch * BATCH + i;
                format!("({n}, {n}, '{n}', 0, NOW(3), NOW(3))")
            })
            .collect();
        shop.exec(
            &format!(
                "INSERT INTO oms_order (id, member_id, order_sn, status, create_time, true_time) VALUES {}",
                values.join(", ")
            ),
            vec![],
        )
        .await;
        // Scattered over the second: some batches just before a whole one.
        tokio::time::sleep(Duration::from_millis((batch as u64 * 37) % 90)).await;
        if batch == 0 {
            app.publish_timeout("1", "payment", 2_000).await;
        }
    }
    let truncated = shop
        .one(
            "SELECT CAST(COUNT(*) AS CHAR) FROM oms_order WHERE create_time < true_time",
            vec![],
        )
        .await;
    assert_ne!(truncated, "0", "create_time keeps whole seconds only");
    wait_until(Duration::from_secs(30), "every order closed", || async {
        let open = shop
            .one(
                "SELECT CAST(COUNT(*) AS CHAR) FROM oms_order WHERE status = 0",
                vec![],
            )
            .await;
        (open == "0").then_some(())
    })
    .await;
    let early = shop
        .rows(
            "SELECT CAST(id AS CHAR), CAST(true_time AS CHAR), CAST(modify_time AS CHAR) FROM oms_order \
             WHERE modify_time < true_time + INTERVAL 2 SECOND ORDER BY id",
            vec![],
        )
        .await;
    assert!(
        early.is_empty(),
        "{} closed before their true deadline: {early:?}",
        early.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_seconds_mariadb_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, whole_seconds).await
}

// ----------------------------------------------------- a role that cannot read the default

/// A role of the database's own with row rights only, dropped with its grants.
struct Reader {
    role: String,
    database_url: String,
}

impl Drop for Reader {
    fn drop(&mut self) {
        let (role, url) = (self.role.clone(), self.database_url.clone());
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    admin(&url, &format!("DROP OWNED BY {role}")).await;
                    admin(POSTGRES_ADMIN, &format!("DROP ROLE {role}")).await;
                });
        })
        .join();
    }
}

/// On PostgreSQL the configuration files' zone is readable by superusers and
/// roles granted `pg_file_settings` only: a role without either, and no per-role or
/// per-database zone, is refused a mapping with zone-less columns, saying
/// what to do, rather than guessing; with `mapping.time_zone` it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_default_zone_unreadable() {
    let schema = precise_schema(Backend::Postgres);
    let app = spawn_app(mall_mapping(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .setup(&schema.iter().map(String::as_str).collect::<Vec<_>>()),
        false,
    ))
    .await;
    let database_url = app.env["ORDER_TIMEOUT__DATABASE__URL"].clone();
    let database = database_url.rsplit('/').next().unwrap().to_string();
    let role = format!("{database}_reader");
    let reader = Reader {
        role: role.clone(),
        database_url: database_url.clone(),
    };
    admin(POSTGRES_ADMIN, &format!("CREATE ROLE {role} LOGIN")).await;
    admin(
        &database_url,
        &format!("GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO {role}"),
    )
    .await;
    let as_reader = format!("postgres://{role}@127.0.0.1:5432/{database}");
    let (ok, report) = doctor(&app, &[("ORDER_TIMEOUT__DATABASE__URL", &as_reader)]);
    assert!(
        !ok && report.contains("FAIL  mapping: `mapping.time_zone`: is empty, and the database server's default zone could not be read: pg_file_settings is not readable")
            && report.contains("grant SELECT on it and EXECUTE on pg_show_all_file_settings() to this role (config/postgres-mapped-roles.sql), or set mapping.time_zone"),
        "{report}"
    );
    let (_, report) = doctor(
        &app,
        &[
            ("ORDER_TIMEOUT__DATABASE__URL", &as_reader),
            ("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "Asia/Shanghai"),
        ],
    );
    assert!(
        report.contains("columns: Asia/Shanghai (mapping.time_zone); the server's default: unknown (pg_file_settings is not readable")
            && !report.contains("FAIL  mapping")
            && !report.contains("FAIL  time zone"),
        "{report}"
    );
    drop(reader);
}

// ------------------------------------------- a zone guessed wrong

/// A shop writing at its own offset (its session's zone) on a server left at
/// UTC, with no `mapping.time_zone`: the server's default is a guess, and
/// this one reads every stamp hours off. A cron backlog is there at the
/// first start: one order placed 2 minutes ago (its window, 10 minutes, far
/// from over), one placed 20 minutes ago (overdue: the cron's tail). Their
/// timers come early, the catch-up and a sweeper with no grace run: nothing
/// is closed, early or at all, and the first new order's stamp is reported
/// within a minute, with the UTC offset that fits, in `/readyz`, the metric
/// and `doctor`; a stamp already in the future at start is reported at once.
async fn guessed_wrong(
    backend: Backend,
    mode: DelayMode,
    session: &str,
    shop_now: &str,
    fitting: &str,
) {
    let mut schema = precise_schema(backend);
    for (id, ago) in [(1, 2), (2, 20)] {
        let ago = match backend {
            Backend::Postgres => format!("INTERVAL '{ago} minutes'"),
            _ => format!("INTERVAL {ago} MINUTE"),
        };
        schema.push(format!(
            "INSERT INTO oms_order (id, member_id, order_sn, total_amount, status, note, create_time) \
             VALUES ({id}, 1, 'backlog-{id}', 10.00, 0, 'cron backlog', {shop_now} - {ago})"
        ));
    }
    let spawn = Spawn::new(backend, mode)
        .setup(&schema.iter().map(String::as_str).collect::<Vec<_>>())
        .env("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "true")
        .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
        .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
        .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s");
    let app =
        spawn_app(mall_mapping(spawn, false).env("ORDER_TIMEOUT__WINDOWS__PAYMENT", "10m")).await;
    let (_, at_start) = readyz(&app).await;
    let east = fitting.starts_with('+');
    let state = &at_start["time_zone"]["kinds"]["payment"]["state"];
    // West of the guess the stamps look old: no proof yet, held. East of
    // it they lie in the future, which a stamp written once cannot.
    assert_eq!(
        state,
        if east { "off" } else { "unconfirmed" },
        "{at_start}"
    );
    assert!(
        at_start["paused"]
            .as_array()
            .unwrap()
            .contains(&"payment".into()),
        "{at_start}"
    );

    let shop = Shop::open_session(&app, backend, session).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    let publisher = app.publisher().await;
    for n in [1, 2] {
        publisher.timeout(&mall.key(n), "payment", 300).await;
    }
    let placed = std::time::Instant::now();
    mall.checkout(3).await;
    publisher.timeout(&mall.key(3), "payment", 300).await;
    let report = wait_until(Duration::from_secs(60), "the mismatch reported", || async {
        let (_, body) = readyz(&app).await;
        let kind = &body["time_zone"]["kinds"]["payment"];
        (kind["state"] == "off" && body["status"] == "unready").then(|| kind["detail"].to_string())
    })
    .await;
    eprintln!(
        "mismatch reported {:?} after the first new order: {report}",
        placed.elapsed()
    );
    assert!(report.contains(&format!("fits UTC{fitting}")), "{report}");
    assert_eq!(
        app.metric(
            "order_timeout_time_zone_check",
            &["kind=\"payment\"", "state=\"off\""]
        )
        .await,
        1.0
    );
    // Time for the timers, the catch-up and several sweeper rounds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in 1..=3 {
        assert_eq!(
            mall.status(n).await,
            "0",
            "order {n} closed in a zone guessed wrong"
        );
    }
    let audit = shop
        .one(
            &format!("SELECT {} FROM order_timeout_audit", shop.text("COUNT(*)")),
            vec![],
        )
        .await;
    assert_eq!(audit, "0");
    // doctor gives the same evidence; the zone that fits, set, passes.
    let (ok, report) = doctor(&app, &[]);
    assert!(
        !ok && report.contains("FAIL  time zone: time zone mismatch: a new payment order's stamp")
            && report.contains(&format!("fits UTC{fitting}")),
        "{report}"
    );
    let (_, report) = doctor(&app, &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", fitting)]);
    assert!(!report.contains("FAIL  time zone"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessed_zone_west_of_the_shop_mariadb_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, |b, m| {
        guessed_wrong(
            b,
            m,
            "SET time_zone = '-05:00'",
            "CONVERT_TZ(UTC_TIMESTAMP(3), '+00:00', '-05:00')",
            "-05:00",
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessed_zone_east_of_the_shop_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, |b, m| {
        guessed_wrong(
            b,
            m,
            "SET TIME ZONE 'Asia/Shanghai'",
            "CAST(CURRENT_TIMESTAMP AT TIME ZONE 'Asia/Shanghai' AS TIMESTAMP(3))",
            "+08:00",
        )
    })
    .await;
}

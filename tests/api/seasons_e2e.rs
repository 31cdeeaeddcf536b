//! End to end across a spring jump (issue 40): a shop in Europe/Berlin places
//! orders in the seconds before 02:00 CET becomes 03:00 CEST, each with a 10 s
//! payment window, so that every deadline lies after the jump (03:00:01 to
//! 03:00:07 CEST). Wall clock less the window (the naive predicate) would
//! close them all at the jump, 1 to 7 s early; the service must close each
//! when 10 s have really passed.
//!
//! Only the database's clock is moved: a throwaway PostgreSQL cluster of the
//! machine's version, started under libfaketime a few seconds before the jump
//! ([`FakedCluster`], stopped and deleted however the test ends, short of a
//! SIGKILL of the test process); the service
//! runs in the test process on the true time, as it must never ask its host
//! clock what is due. The shop writes `create_time` (`timestamp without time
//! zone`) with `LOCALTIMESTAMP` in its own Berlin session; `mapping.time_zone`
//! is set, so the guessed-zone check (`zone_check`) is not what is tested.
//! The timeouts go out through the Python example (pika), 5 s shorter than
//! the window, so every message comes early and the database decides; the
//! catch-up and the deadline wake are on as in production.
//!
//! Judged by a trigger of the test's, which stamps each close with the faked
//! `clock_timestamp()` as the row changes: never before `create_time` (read
//! as a Berlin instant) plus the window, never more than 1 s after it. Both
//! delay modes on PostgreSQL: ttl and plugin (skipped, saying so, without it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::{NaiveDate, NaiveDateTime};

use crate::examples::{Example, missing, python};
use crate::helpers::*;
use crate::mapped::{Mall, Shop, mall_mapping, mall_schema};

/// libfaketime's single-threaded build: each PostgreSQL process has one thread.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

const ZONE: &str = "Europe/Berlin";
/// The database's clock when its cluster starts: 01:59:43 CET, 17 s before
/// the jump. The first order is placed at 01:59:51 (its deadline just past
/// the jump), which leaves the service a few seconds to start (1.5 to 6 s
/// seen here); one that starts later (up to some 13 s) bunches the orders
/// up, still before the jump. (Each second here is a second of the test's
/// run: the clock starts no earlier than the start needs.)
const FAKE_START: &str = "2027-03-28 00:59:43";
/// The payment window, and how much earlier than it each message is due.
/// The orders' spread (6 s) must fit in the window before the jump; the
/// messages, due 5 s early, come from 4 s before the jump to 2 s after it.
const WINDOW_MS: i64 = 10_000;
const EARLY_MS: i64 = 5_000;
/// How late a close may come after the deadline.
const LATE_MS: i64 = 1_000;
/// Orders placed, this far apart by the database's clock; one is paid.
const ORDERS: i64 = 5;
const SPACING_MS: i64 = 1_500;
const PAID: i64 = 3;

/// 02:00 CET = 03:00 CEST, 01:00 UTC, in ms since the epoch.
fn jump_ms() -> i64 {
    NaiveDate::from_ymd_opt(2027, 3, 28)
        .and_then(|d| d.and_hms_opt(1, 0, 0))
        .expect("a date")
        .and_utc()
        .timestamp_millis()
}

/// [`FAKE_START`] in ms since the epoch.
fn fake_start_ms() -> i64 {
    NaiveDateTime::parse_from_str(FAKE_START, "%Y-%m-%d %H:%M:%S")
        .expect("a time")
        .and_utc()
        .timestamp_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_jump_postgres_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, spring_jump).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_jump_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, spring_jump).await
}

async fn spring_jump(backend: Backend, mode: DelayMode) {
    if python().is_none() {
        missing("python with pika");
        return;
    }
    let started = std::time::Instant::now();
    let cluster = tokio::task::spawn_blocking(|| FakedCluster::start(FAKE_START))
        .await
        .expect("the cluster starts");
    let url = cluster.url();
    // The shop's tables to the millisecond, and the test's witness.
    let schema: Vec<String> = mall_schema(backend)
        .into_iter()
        .map(|s| s.replace("TIMESTAMP(0)", "TIMESTAMP(3)"))
        .chain(OBSERVE_CLOSES.map(String::from))
        .collect();
    for sql in &schema {
        admin(&url, sql).await;
    }
    let spawn = mall_mapping(Spawn::new(backend, mode), false)
        // The harness's own fresh database goes unused (and is dropped).
        .env("ORDER_TIMEOUT__DATABASE__URL", url.clone())
        .env("ORDER_TIMEOUT__MAPPING__TIME_ZONE", ZONE)
        .env("ORDER_TIMEOUT__WINDOWS__PAYMENT", format!("{WINDOW_MS}ms"))
        .env("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true");
    let app = spawn_app(spawn).await;
    let shop = Shop::open_session(&app, backend, &format!("SET TIME ZONE '{ZONE}'")).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };

    // The faked clock is what PostgreSQL reports, and it runs.
    let jump = jump_ms();
    let first = db_ms(&shop).await;
    assert!(
        (fake_start_ms()..jump).contains(&first),
        "the database's clock reads {} ms before the jump; the cluster started at {FAKE_START} UTC",
        jump - first
    );
    eprintln!(
        "spring jump ({mode:?}): the service ready {:.1} s after the database's clock started",
        (first - fake_start_ms()) as f64 / 1000.0
    );
    wait_until(
        Duration::from_secs(2),
        "the faked clock advances",
        || async { (db_ms(&shop).await > first + 100).then_some(()) },
    )
    .await;

    // Orders from the moment every deadline lies after the jump, each placed
    // before it; each timeout published right after its commit.
    let from = jump - WINDOW_MS + 1_000;
    for n in 1..=ORDERS {
        let at = from + (n - 1) * SPACING_MS;
        wait_until(Duration::from_secs(30), "the database's clock", || async {
            (db_ms(&shop).await >= at).then_some(())
        })
        .await;
        mall.checkout(n).await;
        publish(&app, n).await;
        if n == PAID {
            assert!(mall.pay(n).await, "the shop's payment of order {n}");
        }
    }
    let placed = shop
        .one(
            "SELECT CAST(COUNT(*) AS TEXT) FROM oms_order \
             WHERE create_time < TIMESTAMP '2027-03-28 02:00:00'",
            vec![],
        )
        .await;
    assert_eq!(
        placed,
        ORDERS.to_string(),
        "every order placed before the jump (the service started too slowly?)"
    );

    for n in (1..=ORDERS).filter(|n| *n != PAID) {
        mall.wait_status(n, "4", Duration::from_secs(30)).await;
    }
    // Past the paid order's deadline by more than a close may be late.
    let paid_deadline = WINDOW_MS
        + shop
            .one(
                &format!(
                    "SELECT CAST(CAST(FLOOR(EXTRACT(EPOCH FROM create_time AT TIME ZONE '{ZONE}') \
                     * 1000) AS BIGINT) AS TEXT) FROM oms_order WHERE id = {PAID}"
                ),
                vec![],
            )
            .await
            .parse::<i64>()
            .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the paid order's deadline",
        || async { (db_ms(&shop).await > paid_deadline + LATE_MS).then_some(()) },
    )
    .await;
    assert_eq!(mall.status(PAID).await, "1", "the paid order is left alone");

    // The witness's stamps against each order's own window; the service's
    // own account (its audit row) beside them.
    let rows = shop
        .rows(
            &format!(
                "SELECT CAST(o.id AS TEXT), CAST(c.status AS TEXT), CAST(o.create_time AS TEXT), \
                 CAST(c.at AT TIME ZONE '{ZONE}' AS TEXT), {}, {}, {}, \
                 CONCAT('by ', a.cause, ', ', a.late_ms, ' ms late by its own stamps') \
                 FROM oms_order o JOIN observed_close c ON c.order_id = o.id \
                 LEFT JOIN order_timeout_audit a \
                 ON a.order_id = CAST(o.id AS TEXT) AND a.to_status = '4' ORDER BY o.id",
                millis(&format!("(o.create_time AT TIME ZONE '{ZONE}')"), "c.at"),
                millis(
                    "TIMESTAMPTZ '2027-03-28 01:00:00+00'",
                    &format!("(o.create_time AT TIME ZONE '{ZONE}') + INTERVAL '{WINDOW_MS} milliseconds'")
                ),
                // modify_time is kept to the millisecond, rounded: the close
                // is rounded alike before the two are compared.
                millis(
                    &format!("(o.modify_time AT TIME ZONE '{ZONE}')"),
                    "CAST(c.at AS TIMESTAMPTZ(3))"
                ),
            ),
            vec![],
        )
        .await;
    assert_eq!(rows.len() as i64, ORDERS, "one change each: {rows:?}");
    for row in &rows {
        let f: Vec<&str> = row.split('|').collect();
        let (id, status, created, closed, audit) = (f[0], f[1], f[2], f[3], f[7]);
        if id == PAID.to_string() {
            assert_eq!(status, "1", "{row}");
            continue;
        }
        assert_eq!(status, "4", "{row}");
        let [after_create, deadline_after_jump, after_stamp] = [f[4], f[5], f[6]].map(|v| {
            v.parse::<i64>()
                .unwrap_or_else(|e| panic!("{v}: {e}: {rows:?}"))
        });
        // So the naive predicate, wall clock less the window, would have
        // closed it at the jump, before its deadline.
        assert!(
            deadline_after_jump > 0,
            "order {id}'s deadline is {} ms before the jump: {rows:?}",
            -deadline_after_jump
        );
        assert!(
            after_create >= WINDOW_MS,
            "order {id} (placed {created}) closed at {closed}: {} ms early: {rows:?}",
            WINDOW_MS - after_create
        );
        assert!(
            after_create <= WINDOW_MS + LATE_MS,
            "order {id} (placed {created}) closed at {closed}: {} ms late: {rows:?}",
            after_create - WINDOW_MS
        );
        // `modify_time` is the shop's wall clock at the close: summer time.
        assert!(
            (0..LATE_MS).contains(&after_stamp),
            "order {id}'s modify_time is {after_stamp} ms before its close: {rows:?}"
        );
        eprintln!(
            "spring jump ({mode:?}): order {id} placed {created} CET, deadline {deadline_after_jump} ms \
             after the jump, closed {closed} CEST, {} ms after its deadline ({audit})",
            after_create - WINDOW_MS
        );
    }
    // Every message came before its deadline: the database said not yet.
    let early = app
        .metric(
            "order_timeout_timeouts_handled_total",
            &["kind=\"payment\"", "outcome=\"not_yet_due\""],
        )
        .await;
    assert!(
        early >= (ORDERS - 1) as f64,
        "{early} timeouts found not yet due"
    );
    let stock = mall.stock().await;
    assert!(stock.values().all(|(_, lock)| *lock == 0), "{stock:?}");
    assert!(app.drain_parked().await.is_empty(), "nothing parked");
    eprintln!(
        "spring jump ({mode:?}): {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    drop(app);
    drop(cluster);
}

/// The Python example publishes order `n`'s timeout, due [`EARLY_MS`]
/// before its deadline.
async fn publish(app: &TestApp, n: i64) {
    let mut command = Example::Python
        .command(&app.vhost)
        .expect("checked before the first order");
    command.args(["--exchange", app.names.entry(), "--order-id"]);
    command.arg(n.to_string());
    command.args(["--delay-ms", &(WINDOW_MS - EARLY_MS).to_string()]);
    // Off the runtime's threads, which the service shares.
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the example runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test's own record of each order leaving status 0, by the database's
/// clock at the moment the row changed.
const OBSERVE_CLOSES: [&str; 3] = [
    "CREATE TABLE observed_close (order_id BIGINT PRIMARY KEY, \
     status SMALLINT NOT NULL, at TIMESTAMPTZ NOT NULL)",
    "CREATE FUNCTION observe_close() RETURNS trigger AS $$ BEGIN \
     INSERT INTO observed_close VALUES (NEW.id, NEW.status, clock_timestamp()); \
     RETURN NEW; END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER observe_close AFTER UPDATE OF status ON oms_order FOR EACH ROW \
     WHEN (OLD.status = 0 AND NEW.status <> 0) EXECUTE FUNCTION observe_close()",
];

/// Whole milliseconds from instant `a` to instant `b`, as text.
fn millis(a: &str, b: &str) -> String {
    format!("CAST(FLOOR(EXTRACT(EPOCH FROM ({b} - {a})) * 1000) AS TEXT)")
}

/// The database's clock, in ms since the epoch.
async fn db_ms(shop: &Shop) -> i64 {
    shop.one(
        "SELECT CAST(CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT) AS TEXT)",
        vec![],
    )
    .await
    .parse()
    .unwrap()
}

/// A PostgreSQL cluster of the machine's version in a temporary directory,
/// its clock started at a given UTC time by libfaketime (monotonic time left
/// alone); trust on 127.0.0.1, on a free port, `timezone` Berlin as a Berlin
/// shop's DBA would set it. Stopped and deleted when dropped.
struct FakedCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl FakedCluster {
    /// Blocking: `initdb` and `pg_ctl start`, a second or two.
    fn start(fake_utc: &str) -> Self {
        assert!(
            Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: `make tools` installs Debian's faketime"
        );
        let bin = postgres_bin();
        let dir =
            std::env::temp_dir().join(format!("ot-faked-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).expect("a temporary directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        // From here on the guard removes whatever was made.
        let cluster = Self { dir, bin, port };
        if as_root() {
            ok(Command::new("chown").arg("postgres:").arg(&cluster.dir));
        }
        let data = cluster.dir.join("data");
        ok(cluster
            .as_postgres("initdb", &[])
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]));
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c timezone={ZONE} \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            cluster.dir.display()
        );
        let faked = [
            ("LD_PRELOAD", LIBFAKETIME.to_string()),
            ("FAKETIME", format!("@{fake_utc}")),
            // libfaketime reads that time in the process's zone.
            ("TZ", "UTC".to_string()),
            // The server's timeouts and waits keep true time.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ];
        ok(cluster
            .as_postgres("pg_ctl", &faked)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("log"))
            .args(["-w", "-t", "30", "-o", &options, "start"]));
        cluster
    }

    /// The URL of its `postgres` database.
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A program of PostgreSQL's with these environment variables (given to
    /// it alone, not to `runuser`), run as the `postgres` user when the test
    /// runs as root (the server refuses to run as root).
    fn as_postgres(&self, program: &str, env: &[(&str, String)]) -> Command {
        let program = self.bin.join(program);
        if as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "env"])
                .args(env.iter().map(|(k, v)| format!("{k}={v}")))
                .arg(program);
            c
        } else {
            let mut c = Command::new(program);
            c.envs(env.iter().map(|(k, v)| (k, v)));
            c
        }
    }
}

impl Drop for FakedCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        if data.join("postmaster.pid").exists() {
            let _ = self
                .as_postgres("pg_ctl", &[])
                .arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `bin` of the newest PostgreSQL under /usr/lib/postgresql.
fn postgres_bin() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    std::fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .map(|v| root.join(v.to_string()).join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .unwrap_or_else(|| {
            panic!(
                "no PostgreSQL under {}: `make databases` installs it",
                root.display()
            )
        })
}

fn as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Runs a command that must succeed.
fn ok(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

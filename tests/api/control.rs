//! Pause and resume while running: a paused consumer leaves its deadlines in
//! the broker (and the sweeper leaves its kind alone), then catches up when
//! resumed, every order once and none early; the router, the relay and the
//! sweeper each stop and start again; `ctl` drives it all over the admin API.

use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::Value;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// One number from the app's database.
pub async fn count(app: &TestApp, sql: &str) -> i64 {
    let db = &app.ctx.db;
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .expect("a row");
    row.try_get_by_index::<i64>(0).unwrap()
}

/// `order-timeout ctl ARGS` against the app, with its admin token; stdout,
/// stderr and whether it exited 0.
pub fn ctl(app: &TestApp, args: &[&str]) -> (String, String, bool) {
    let out = Command::new(BIN)
        .arg("ctl")
        .args(["--url", &app.base])
        .args(args)
        .env("ORDER_TIMEOUT_CTL_TOKEN", app.token.as_deref().unwrap())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// `ctl ARGS`, which must succeed; its stdout.
fn ctl_ok(app: &TestApp, args: &[&str]) -> String {
    let (out, err, ok) = ctl(app, args);
    assert!(ok, "ctl {args:?} failed: {out}{err}");
    out
}

/// `/readyz`: its status code and body.
pub(crate) async fn readyz(app: &TestApp) -> (u16, Value) {
    let resp = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// Places `n` orders of one unit of `sku` with `window`, 16 at a time.
async fn place(app: &TestApp, sku: &str, n: usize, window: &str) -> Vec<String> {
    futures_util::stream::iter(0..n)
        .map(|_| async move { app.order(&[(sku, 1)], window).await })
        .buffer_unordered(16)
        .collect()
        .await
}

/// How many orders have each status.
async fn statuses(app: &TestApp, status: &str) -> i64 {
    count(
        app,
        &format!("SELECT COUNT(*) FROM orders WHERE status = '{status}'"),
    )
    .await
}

/// Every order cancelled exactly once (one `cancelled` audit row each), at
/// or after its deadline, its stock back: checked on the whole table.
async fn all_cancelled_once_none_early(app: &TestApp, n: i64, sku: &str, stock: i64) {
    assert_eq!(statuses(app, "cancelled").await, n);
    let early = count(
        app,
        "SELECT COUNT(*) FROM orders WHERE cancelled_at_ms < pay_deadline_ms",
    )
    .await;
    assert_eq!(early, 0, "no order cancelled before its deadline");
    let cancels = count(
        app,
        "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled'",
    )
    .await;
    let orders_cancelled = count(
        app,
        "SELECT COUNT(DISTINCT order_id) FROM order_events WHERE event = 'cancelled'",
    )
    .await;
    assert_eq!((cancels, orders_cancelled), (n, n), "each cancelled once");
    assert_eq!(app.stock(sku).await["available"], stock, "stock back");
}

/// The scenario: payment consumption paused, 500 deadlines pass
/// (the sweeper runs meanwhile, every 300 ms with 1 s of grace, and must
/// leave them alone), then resumed: every order cancelled once, none early,
/// each one's lateness reported.
async fn pause_payment_while_500_deadlines_pass(backend: Backend, mode: DelayMode) {
    const N: usize = 500;
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "300ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "1s"),
    )
    .await;
    app.put_stock("P", 10_000).await;
    let out = ctl_ok(&app, &["pause", "payment"]);
    assert_eq!(out.trim(), "payment: paused");
    assert_eq!(
        ctl_ok(&app, &["pause", "payment"]).trim(),
        "payment: paused already"
    );

    let placed = Instant::now();
    let ids = place(&app, "P", N, "2s").await;
    assert_eq!(ids.len(), N);
    let placing = placed.elapsed();

    // Paused, and saying so: the metric, /readyz (still ready) and `ctl status`.
    assert_eq!(
        app.metric("order_timeout_paused", &["role=\"payment\""])
            .await,
        1.0
    );
    assert_eq!(
        app.metric("order_timeout_paused", &["role=\"receipt\""])
            .await,
        0.0
    );
    let (status, ready) = readyz(&app).await;
    assert_eq!(
        status, 200,
        "a pause is deliberate, not unreadiness: {ready}"
    );
    assert_eq!(ready["paused"], serde_json::json!(["payment"]));
    let shown = ctl_ok(&app, &["status"]);
    let line = shown.lines().find(|l| l.starts_with("payment")).unwrap();
    assert!(line.contains("paused since"), "{shown}");
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("receipt") && l.contains("running")),
        "{shown}"
    );

    // Every deadline passes, then the sweeper's grace and a few of its rounds.
    tokio::time::sleep(Duration::from_secs(2) + Duration::from_secs(3)).await;
    let work = app.names.work(order_timeout::domain::TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(20),
        "every due timeout waiting in the payment queue",
        || async { (app.queue_depth(&work).await as usize == N).then_some(()) },
    )
    .await;
    assert_eq!(
        statuses(&app, "pending_payment").await,
        N as i64,
        "nothing closed while paused: not the consumer, not the sweeper"
    );
    let paused_for = placed.elapsed();

    let resumed = Instant::now();
    assert_eq!(
        ctl_ok(&app, &["resume", "payment"]).trim(),
        "payment: running"
    );
    wait_until(
        Duration::from_secs(60),
        "every order cancelled after the resume",
        || async { (statuses(&app, "cancelled").await == N as i64).then_some(()) },
    )
    .await;
    let caught_up = resumed.elapsed();
    all_cancelled_once_none_early(&app, N as i64, "P", 10_000).await;
    // The catch-up may have applied most of them from the first deliveries:
    // the rest of the queue then drains as not applicable.
    wait_until(
        Duration::from_secs(30),
        "the payment queue drained",
        || async { (app.queue_depth(&work).await == 0).then_some(()) },
    )
    .await;

    // Lateness reported for every one, and as long as the pause made it: the
    // last order placed was due 2 s after placing ended, and waited at least
    // until the resume.
    let lateness = "kind=\"payment\"";
    assert_eq!(
        app.metric("order_timeout_lateness_seconds_count", &[lateness])
            .await,
        N as f64
    );
    let mean = app
        .metric("order_timeout_lateness_seconds_sum", &[lateness])
        .await
        / N as f64;
    let least = (paused_for.as_secs_f64() - placing.as_secs_f64() - 2.0).max(0.0);
    assert!(
        mean >= least,
        "mean lateness {mean:.2} s, the pause made at least {least:.2} s"
    );
    assert_eq!(
        app.metric("order_timeout_paused", &["role=\"payment\""])
            .await,
        0.0
    );
    let _ = writeln_stderr(&format!(
        "pause payment ({backend:?}, {}): {N} orders placed in {placing:?}, paused {paused_for:?}, all cancelled {caught_up:?} after the resume, mean lateness {mean:.2} s",
        mode.as_str()
    ));
}

fn writeln_stderr(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(std::io::stderr(), "{text}")
}

each_mode!(pause_payment_while_500_deadlines_pass);

/// The relay, then the router: each one paused holds the timeouts where it
/// stands (outbox rows in the database; a publisher's messages in the ingest
/// queue); resumed, they flow on and the orders are cancelled, once, late,
/// not early.
async fn relay_and_router_pause_where_they_stand(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("R", 100).await;

    // The relay: the checkout's timeouts stay in the outbox.
    ctl_ok(&app, &["pause", "relay"]);
    let ids = place(&app, "R", 5, "1s").await;
    wait_until(
        Duration::from_secs(10),
        "five outbox rows waiting for the paused relay",
        || async { (app.metric("order_timeout_outbox_backlog", &[]).await == 5.0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(statuses(&app, "pending_payment").await, 5);
    ctl_ok(&app, &["resume", "relay"]);
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(15))
            .await;
    }
    all_cancelled_once_none_early(&app, 5, "R", 100).await;

    // The router: what a shop's checkout publishes waits in ingest. The
    // relay is paused again so that only those messages can act.
    ctl_ok(&app, &["pause", "relay"]);
    ctl_ok(&app, &["pause", "router"]);
    let ids = place(&app, "R", 5, "1s").await;
    let publisher = app.publisher().await;
    for id in &ids {
        publisher.timeout(id, "payment", 1000).await;
    }
    let ingest = app.names.ingest();
    wait_until(
        Duration::from_secs(10),
        "five timeouts waiting in ingest for the paused router",
        || async { (app.queue_depth(&ingest).await == 5).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(statuses(&app, "pending_payment").await, 5);
    ctl_ok(&app, &["resume", "router"]);
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(15))
            .await;
    }
    assert_eq!(app.queue_depth(&ingest).await, 0);
    // Their own timeouts, published on resume, find them done.
    ctl_ok(&app, &["resume", "relay"]);
    wait_until(Duration::from_secs(10), "the outbox published", || async {
        (app.metric("order_timeout_outbox_backlog", &[]).await == 0.0).then_some(())
    })
    .await;
    all_cancelled_once_none_early(&app, 10, "R", 100).await;
    for role in ["relay", "router"] {
        let label = format!("role=\"{role}\"");
        assert_eq!(app.metric("order_timeout_paused", &[&label]).await, 0.0);
    }
}
each_mode!(relay_and_router_pause_where_they_stand);

/// The sweeper, alone in closing orders (no relay publishes their timers):
/// paused, it closes none; resumed, it closes them all.
async fn the_sweeper_pauses_and_resumes(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s"),
    )
    .await;
    app.put_stock("S", 10).await;
    ctl_ok(&app, &["pause", "sweeper"]);
    let ids = place(&app, "S", 3, "500ms").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(statuses(&app, "pending_payment").await, 3);
    ctl_ok(&app, &["resume", "sweeper"]);
    for id in &ids {
        let order = app
            .wait_status(id, "cancelled", Duration::from_secs(10))
            .await;
        let audit = app.order_with_audit(id).await;
        let cause = audit["audit"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event"] == "cancelled")
            .map(|e| e["cause"].clone());
        assert_eq!(cause, Some("sweeper".into()), "{order}");
    }
    all_cancelled_once_none_early(&app, 3, "S", 10).await;
    // The relay does not run here: it cannot be paused.
    let (_, err, ok) = ctl(&app, &["pause", "relay"]);
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("relay.enabled = false"),
        "{err}"
    );
}
each_mode!(the_sweeper_pauses_and_resumes);

/// While payment timeouts are paused, an unpaid order past its deadline
/// still takes its payment (a payment provider was down: buyers pay once it
/// is back); the timeout that comes on resume finds it paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_after_the_deadline_is_taken_while_payment_is_paused() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("L", 5).await;
    ctl_ok(&app, &["pause", "payment"]);
    let id = app.order(&[("L", 1)], "500ms").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, paid) = app.post(&id, "pay").await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["status"], "paid");
    assert!(ms(&paid, "paid_at") > ms(&paid, "pay_deadline"));
    ctl_ok(&app, &["resume", "payment"]);
    wait_until(
        Duration::from_secs(10),
        "the payment timeout handled as not applicable",
        || async {
            let handled = app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\"", "outcome=\"not_applicable\""],
                )
                .await;
            (handled == 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(app.get_order(&id).await["status"], "paid");
    assert_eq!(app.stock("L").await["sold"], 1);
    // Resumed: the deadline holds again.
    let late = app.order(&[("L", 1)], "300ms").await;
    app.wait_status(&late, "cancelled", Duration::from_secs(5))
        .await;
}

/// The admin API's refusals: an unknown role, a checkout token, no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_needs_an_admin_token_and_a_real_role() {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
    )
    .await;
    let (_, err, ok) = ctl(&app, &["pause", "cashier"]);
    assert!(!ok);
    assert!(
        err.contains("400")
            && err.contains("payment, fulfillment, receipt, router, relay, sweeper"),
        "{err}"
    );
    for (token, status) in [(Some(checkout.as_str()), 403), (None, 401)] {
        let resp = api_client(token)
            .post(format!("{}/admin/pause/payment", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status);
    }
    assert!(
        !app.ctx
            .pauses
            .kind_paused(order_timeout::domain::TimeoutKind::Payment)
    );
    let out = Command::new(BIN)
        .args(["ctl", "--url", &app.base, "--token", &checkout, "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"));
    // No instance there: exit 1, saying where it looked.
    let out = Command::new(BIN)
        .args([
            "ctl",
            "--url",
            "http://127.0.0.1:9",
            "--token",
            &checkout,
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no answer from http://127.0.0.1:9"));
}

/// The database's clock in epoch milliseconds: now, and as an SQL expression
/// that reads it when a statement runs (not when its transaction began).
fn db_clock_ms(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        _ => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

/// Records, by the database's own clock, when each cancellation's audit row
/// was written (`cancel_clock`): independent of the stamps the service
/// computes before its transaction, so a transaction that runs after a pause
/// answered cannot hide behind an earlier stamp.
///
/// The same trigger paces the database: each cancellation costs it about a
/// millisecond more (a sleep on PostgreSQL, a 62,500-row count on SQLite,
/// which has no sleep), so a burst of thousands lasts seconds in any build
/// and a pause sent once the first ones committed lands inside it, not after
/// a release build's catch-ups finished the lot in a fifth of a second.
async fn clock_cancellations(app: &TestApp, backend: Backend) {
    let clock = db_clock_ms(backend);
    let statements = match backend {
        Backend::Sqlite => vec![
            "CREATE TABLE pace (n INTEGER)".to_string(),
            "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 250) \
             INSERT INTO pace SELECT n FROM s"
                .to_string(),
            format!(
                "CREATE TRIGGER cancel_clock AFTER INSERT ON order_events \
                 WHEN NEW.event = 'cancelled' \
                 BEGIN INSERT INTO cancel_clock SELECT NEW.order_id, {clock} \
                 WHERE (SELECT COUNT(*) FROM pace a, pace b) > 0; END"
            ),
        ],
        _ => vec![
            format!(
                "CREATE FUNCTION cancel_clock() RETURNS trigger AS $$ BEGIN \
                 PERFORM pg_sleep(0.001); \
                 INSERT INTO cancel_clock VALUES (NEW.order_id, {clock}); RETURN NEW; \
                 END $$ LANGUAGE plpgsql"
            ),
            "CREATE TRIGGER cancel_clock AFTER INSERT ON order_events FOR EACH ROW \
             WHEN (NEW.event = 'cancelled') EXECUTE FUNCTION cancel_clock()"
                .to_string(),
        ],
    };
    let db = &app.ctx.db;
    db.execute_unprepared("CREATE TABLE cancel_clock (order_id BIGINT, at_ms BIGINT)")
        .await
        .unwrap();
    for sql in statements {
        db.execute_unprepared(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Pauses `role` through the API; once it answered 200, the host's clock
/// and the database's, in epoch milliseconds.
async fn pause_now(app: &TestApp, backend: Backend, role: &str) -> (i64, i64) {
    let resp = app
        .http
        .post(format!("{}/admin/pause/{role}", app.base))
        .send()
        .await
        .unwrap();
    let host = chrono::Utc::now().timestamp_millis();
    assert_eq!(resp.status().as_u16(), 200, "pause {role}");
    let db = count(app, &format!("SELECT {}", db_clock_ms(backend))).await;
    (host, db)
}

async fn resume_now(app: &TestApp, role: &str) {
    let resp = app
        .http
        .post(format!("{}/admin/resume/{role}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "resume {role}");
}

/// What a pause that answered at `(host, db)` (see [`pause_now`]) left: the
/// orders cancelled before it and those still pending. Neither may be zero,
/// or the pause came outside the burst and shows nothing. Then, while it
/// lasts, nothing changes: no cancellation, no audit row written after the
/// answer by the database's clock, no stamp after it by the service's.
async fn nothing_changes_after(app: &TestApp, (host, db): (i64, i64), what: &str) -> (i64, i64) {
    let cancelled = statuses(app, "cancelled").await;
    let pending = statuses(app, "pending_payment").await;
    assert!(
        cancelled > 0 && pending > 0,
        "{what}: the pause came mid-burst ({cancelled} cancelled, {pending} pending)"
    );
    // Longer than a catch-up round of four pages or a sweep of many takes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let written_after = count(
        app,
        &format!("SELECT COUNT(*) FROM cancel_clock WHERE at_ms > {db}"),
    )
    .await;
    let stamped_after = count(
        app,
        &format!(
            "SELECT (SELECT COUNT(*) FROM orders WHERE cancelled_at_ms > {host}) \
             + (SELECT COUNT(*) FROM order_events WHERE event = 'cancelled' AND at_ms > {host})"
        ),
    )
    .await;
    let changed = statuses(app, "cancelled").await - cancelled;
    assert_eq!(
        (changed, written_after, stamped_after),
        (0, 0, 0),
        "{what}: orders cancelled, audit rows written (database's clock) and stamps after the pause answered"
    );
    (cancelled, pending)
}

/// Issue 25: a pause is a barrier. A burst of 3,000 due payment timeouts
/// is being applied (deliveries and catch-ups, pages of 500) when `pause
/// payment` answers: from that moment no order is cancelled until resumed.
/// Then every order is cancelled once, none early, the stock back.
async fn pause_payment_mid_burst_stops_every_change(backend: Backend, mode: DelayMode) {
    const N: usize = 3_000;
    let app = spawn_app(Spawn::new(backend, mode)).await;
    clock_cancellations(&app, backend).await;
    app.put_stock("B", N as i64).await;
    // The burst is gathered in the paused queue, then let go at once.
    ctl_ok(&app, &["pause", "payment"]);
    let placed = Instant::now();
    let ids = place(&app, "B", N, "1s").await;
    assert_eq!(ids.len(), N);
    let placing = placed.elapsed();
    let work = app.names.work(order_timeout::domain::TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(60),
        "every due timeout waiting in the paused payment queue",
        || async { (app.queue_depth(&work).await as usize == N).then_some(()) },
    )
    .await;
    resume_now(&app, "payment").await;
    wait_until(
        Duration::from_secs(30),
        "the first cancellations of the burst",
        || async { (statuses(&app, "cancelled").await > 0).then_some(()) },
    )
    .await;
    let answered = pause_now(&app, backend, "payment").await;
    let (before, pending) = nothing_changes_after(&app, answered, "pause payment").await;

    let resumed = Instant::now();
    resume_now(&app, "payment").await;
    wait_until(
        Duration::from_secs(60),
        "every order cancelled after the resume",
        || async { (statuses(&app, "cancelled").await == N as i64).then_some(()) },
    )
    .await;
    let rest = resumed.elapsed();
    all_cancelled_once_none_early(&app, N as i64, "B", N as i64).await;
    let _ = writeln_stderr(&format!(
        "pause payment mid-burst ({backend:?}, {}): {N} placed in {placing:?}; {before} cancelled before the pause, {pending} pending when it answered, 0 changed after it; the rest cancelled {rest:?} after the resume",
        mode.as_str()
    ));
}
each_mode!(pause_payment_mid_burst_stops_every_change);

/// The same barrier for the sweeper, alone in closing orders (no relay
/// publishes their timers) and sweeping pages of 50: `pause sweeper`
/// mid-sweep stops it before its next page; resumed, `pause payment`
/// mid-sweep stops its work on payment orders the same way. Resumed, every
/// order is cancelled once, none early.
async fn pause_mid_sweep_stops_every_change(backend: Backend, mode: DelayMode) {
    const N: usize = 2_000;
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "200ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
            .env("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "50"),
    )
    .await;
    clock_cancellations(&app, backend).await;
    app.put_stock("W", N as i64).await;
    ctl_ok(&app, &["pause", "sweeper"]);
    let ids = place(&app, "W", N, "300ms").await;
    assert_eq!(ids.len(), N);
    // Every deadline passed (the last was 300 ms after placing ended).
    tokio::time::sleep(Duration::from_millis(500)).await;

    resume_now(&app, "sweeper").await;
    wait_until(
        Duration::from_secs(10),
        "the sweep's first pages",
        || async { (statuses(&app, "cancelled").await > 0).then_some(()) },
    )
    .await;
    let answered = pause_now(&app, backend, "sweeper").await;
    let (swept, pending) = nothing_changes_after(&app, answered, "pause sweeper").await;

    resume_now(&app, "sweeper").await;
    wait_until(
        Duration::from_secs(10),
        "the sweep going on after the resume",
        || async { (statuses(&app, "cancelled").await > swept).then_some(()) },
    )
    .await;
    let answered = pause_now(&app, backend, "payment").await;
    let (by_payment, left) = nothing_changes_after(&app, answered, "pause payment").await;

    resume_now(&app, "payment").await;
    wait_until(
        Duration::from_secs(30),
        "every order swept after the resume",
        || async { (statuses(&app, "cancelled").await == N as i64).then_some(()) },
    )
    .await;
    all_cancelled_once_none_early(&app, N as i64, "W", N as i64).await;
    let _ = writeln_stderr(&format!(
        "pause mid-sweep ({backend:?}, {}): {N} orders; pause sweeper after {swept} swept ({pending} pending), pause payment after {by_payment} ({left} pending), 0 changed after either",
        mode.as_str()
    ));
}
each_mode!(pause_mid_sweep_stops_every_change);

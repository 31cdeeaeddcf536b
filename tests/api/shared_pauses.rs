//! Pauses shared by every instance: kept in `order_timeout_pauses`, so a
//! restarted instance and one started later start paused (no timeout of the
//! kind applied until resumed), and a running instance follows a pause made
//! on another within `control.poll_interval`. A pause of one instance
//! (`?scope=instance`, `ctl pause --instance`) reaches no other and is gone
//! after a restart. A table that cannot be read keeps the last known pauses.

use std::time::{Duration, Instant};

use order_timeout::domain::TimeoutKind;
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};
use serde_json::{Value, json};

use crate::control::{count, ctl};
use crate::helpers::*;

/// How often the instances of these tests read the shared pauses.
const POLL: Duration = Duration::from_millis(500);

/// How soon a running instance must follow a change made on another: one
/// poll interval, and as much again for the reading and a busy machine.
const FOLLOWED_WITHIN: Duration = Duration::from_millis(1_000);

fn spawn(backend: Backend, mode: DelayMode) -> Spawn {
    Spawn::new(backend, mode).env("ORDER_TIMEOUT__CONTROL__POLL_INTERVAL", "500ms")
}

/// `POST /admin/{action}/{role}{query}` with this body; status and answer.
async fn admin(app: &TestApp, action: &str, role_query: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = app
        .http
        .post(format!("{}/admin/{action}/{role_query}", app.base));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// `/admin/status`'s entry for `role`.
async fn role_status(app: &TestApp, role: &str) -> Value {
    let status = app.get_json("/admin/status").await;
    status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == role)
        .cloned()
        .unwrap()
}

/// The shared pause rows, `role|paused_by|instance|reason`, sorted.
async fn rows(app: &TestApp) -> Vec<String> {
    let db = &app.ctx.db;
    let found = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT role, paused_by, instance, reason FROM order_timeout_pauses ORDER BY role",
        ))
        .await
        .unwrap();
    found
        .iter()
        .map(|row| {
            let text = |i| row.try_get_by_index::<Option<String>>(i).unwrap();
            format!(
                "{}|{}|{}|{}",
                text(0).unwrap_or_default(),
                text(1).unwrap_or_default(),
                text(2).unwrap_or_default(),
                text(3).unwrap_or_default()
            )
        })
        .collect()
}

fn writeln_stderr(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(std::io::stderr(), "{text}")
}

fn payment_paused(app: &TestApp) -> bool {
    app.ctx.pauses.kind_paused(TimeoutKind::Payment)
}

/// Places one order of `sku` with `window`, and waits until the relay has
/// published its timeout (the outbox is empty).
async fn place_published(app: &TestApp, sku: &str, window: &str) -> String {
    let id = app.order(&[(sku, 1)], window).await;
    wait_until(Duration::from_secs(15), "the timeout published", || async {
        (count(app, "SELECT COUNT(*) FROM outbox").await == 0).then_some(())
    })
    .await;
    id
}

/// Waits until the order's due timeout waits in the paused payment queue
/// of `app`'s vhost, and a little longer: nothing may have closed it.
async fn due_and_left_alone(app: &TestApp, id: &str, what: &str) {
    let work = app.names.work(TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(20),
        "the due timeout waiting in the payment queue",
        || async { (app.queue_depth(&work).await >= 1).then_some(()) },
    )
    .await;
    // Longer than a poll and a consumer round: a consumer that ran would
    // have taken the message and closed the order meanwhile.
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(
        app.get_order(id).await["status"],
        "pending_payment",
        "{what}: no timeout applied while payment is paused"
    );
}

/// The scenario: payment paused through the API, the instance
/// restarted; it starts paused, an order due meanwhile stays pending, an
/// instance started later is paused too; resumed on that one, the order is
/// cancelled and the restarted instance follows the resume.
async fn a_shared_pause_survives_a_restart_and_reaches_new_instances(
    backend: Backend,
    mode: DelayMode,
) {
    let mut first = spawn_app(spawn(backend, mode)).await;
    first.put_stock("S", 10).await;
    let (status, paused) = admin(
        &first,
        "pause",
        "payment",
        Some(json!({"reason": "payment provider outage"})),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(
        paused,
        json!({"role": "payment", "scope": "shared", "paused": true, "changed": true})
    );
    // Pausing again keeps the first pauser and its reason.
    let (_, again) = admin(&first, "pause", "payment", Some(json!({"reason": "other"}))).await;
    assert_eq!(again["changed"], false, "{again}");
    let first_instance = first.ctx.settings.amqp.instance.clone();
    let token = first.token.clone().unwrap();
    let by = {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(token.as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("token sha256:{}", &hex[..12])
    };
    assert_eq!(
        rows(&first).await,
        vec![format!(
            "payment|{by}|{first_instance}|payment provider outage"
        )]
    );
    let id = place_published(&first, "S", "1s").await;

    // Restarted: paused before any consumer runs, and saying by whom.
    first.stop().await;
    let restarted = first
        .spawn_variant(&[(
            "ORDER_TIMEOUT__AMQP__INSTANCE",
            format!("restarted-{}", first.vhost),
        )])
        .await;
    assert!(payment_paused(&restarted), "restarted paused");
    assert_eq!(
        restarted
            .metric("order_timeout_paused", &["role=\"payment\""])
            .await,
        1.0
    );
    let shown = role_status(&restarted, "payment").await;
    assert_eq!(shown["paused"], true, "{shown}");
    let pauses = shown["pauses"].as_array().unwrap();
    assert_eq!(pauses.len(), 1, "{shown}");
    assert_eq!(pauses[0]["scope"], "shared");
    assert_eq!(pauses[0]["by"], by.as_str());
    assert_eq!(pauses[0]["instance"], first_instance.as_str());
    assert_eq!(pauses[0]["reason"], "payment provider outage");
    assert_eq!(shown["since"], pauses[0]["since"]);
    let ready = restarted.get_json("/readyz").await;
    assert_eq!(ready["paused"], json!(["payment"]), "{ready}");
    assert_eq!(ready["pauses"][0]["role"], "payment", "{ready}");
    assert_eq!(ready["pauses"][0]["scope"], "shared", "{ready}");
    assert_eq!(ready["pauses"][0]["by"], by.as_str(), "{ready}");
    due_and_left_alone(&restarted, &id, "after the restart").await;

    // An instance started later: paused too.
    let later = restarted.spawn_peer("later").await;
    assert!(payment_paused(&later), "a new instance starts paused");
    let (out, err, ok) = ctl(&later, &["status"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with("payment")).unwrap();
    assert!(
        line.contains("paused since")
            && line.contains(&format!(
                "shared, by {by} on {first_instance}: payment provider outage"
            )),
        "{out}"
    );
    due_and_left_alone(&later, &id, "with a second instance").await;
    assert_eq!(
        count(
            &later,
            "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'"
        )
        .await,
        0
    );

    // Resumed on the later one: the order is cancelled, and the restarted
    // instance follows the resume.
    let (out, err, ok) = ctl(&later, &["resume", "payment"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "payment: running");
    later
        .wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    wait_until(
        FOLLOWED_WITHIN,
        "the restarted instance follows the resume",
        || async { (!payment_paused(&restarted)).then_some(()) },
    )
    .await;
    assert_eq!(
        restarted
            .metric("order_timeout_paused", &["role=\"payment\""])
            .await,
        0.0
    );
    assert!(rows(&later).await.is_empty());
    let order = later.get_order(&id).await;
    assert!(
        order["cancelled_at"].as_str().unwrap() >= order["pay_deadline"].as_str().unwrap(),
        "not early: {order}"
    );
}
each_mode!(a_shared_pause_survives_a_restart_and_reaches_new_instances);

/// Two instances running: a pause on A reaches B within the poll interval,
/// the barrier included (B's consumer leaves the due order alone), and so
/// does the resume. A pause of A alone does not reach B, which goes on
/// applying the timeouts, and is gone once A restarts.
async fn a_running_instance_follows_and_an_instance_pause_stays_home(
    backend: Backend,
    mode: DelayMode,
) {
    let mut a = spawn_app(spawn(backend, mode)).await;
    let b = a.spawn_peer("b").await;
    a.put_stock("F", 10).await;

    let asked = Instant::now();
    let (status, paused) = admin(&a, "pause", "payment", None).await;
    assert_eq!((status, paused["changed"].clone()), (200, json!(true)));
    wait_until(FOLLOWED_WITHIN, "B follows A's pause", || async {
        payment_paused(&b).then_some(())
    })
    .await;
    let _ = writeln_stderr(&format!(
        "shared pause ({backend:?}, {}): followed by B {:?} after A was asked (poll interval {POLL:?})",
        mode.as_str(),
        asked.elapsed()
    ));
    let id = place_published(&a, "F", "1s").await;
    due_and_left_alone(&a, &id, "paused on A, followed by B").await;

    let (status, resumed) = admin(&a, "resume", "payment", None).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(
        resumed,
        json!({"role": "payment", "scope": "shared", "paused": false, "changed": true})
    );
    wait_until(FOLLOWED_WITHIN, "B follows A's resume", || async {
        (!payment_paused(&b)).then_some(())
    })
    .await;
    a.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;

    // A alone: B is not paused, and closes what comes due.
    let (out, err, ok) = ctl(
        &a,
        &["pause", "payment", "--instance", "--reason", "draining A"],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "payment: paused on this instance only");
    assert!(payment_paused(&a));
    assert!(
        rows(&a).await.is_empty(),
        "nothing written for every instance"
    );
    let shown = role_status(&a, "payment").await;
    assert_eq!(shown["pauses"][0]["scope"], "instance", "{shown}");
    assert_eq!(shown["pauses"][0]["reason"], "draining A", "{shown}");
    let id = place_published(&a, "F", "500ms").await;
    b.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    assert!(!payment_paused(&b), "an instance pause does not reach B");
    assert!(payment_paused(&a), "still paused on A");

    // Both scopes on A: resuming the shared one leaves it paused.
    admin(&a, "pause", "payment", None).await;
    let (_, resumed) = admin(&a, "resume", "payment", None).await;
    assert_eq!(
        resumed,
        json!({"role": "payment", "scope": "shared", "paused": true, "changed": true})
    );
    wait_until(FOLLOWED_WITHIN, "B follows the shared resume", || async {
        (!payment_paused(&b)).then_some(())
    })
    .await;

    // Restarted, A's own pause is gone.
    a.stop().await;
    let restarted = a
        .spawn_variant(&[("ORDER_TIMEOUT__AMQP__INSTANCE", format!("a2-{}", a.vhost))])
        .await;
    assert!(
        !payment_paused(&restarted),
        "an instance pause ends with its process"
    );
    let id = place_published(&restarted, "F", "500ms").await;
    restarted
        .wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
}
each_mode!(a_running_instance_follows_and_an_instance_pause_stays_home);

/// The shared pauses cannot be read (their table is renamed away): the
/// pause in effect stays and the failed readings are counted; a shared
/// resume answers 503 and lifts nothing, while a pause of this instance
/// works without the table. Once it is back, the resume goes through.
/// Refusals: an unknown scope, a reason too long. On SQLite and MariaDB
/// (PostgreSQL runs the scenarios above): one `INSERT` decides on each.
async fn an_unreadable_table_keeps_the_last_known_pauses(backend: Backend) {
    let app = spawn_app(spawn(backend, DelayMode::Ttl)).await;
    let (status, _) = admin(&app, "pause", "relay", None).await;
    assert_eq!(status, 200);
    let (_, again) = admin(&app, "pause", "relay", None).await;
    assert_eq!(
        again["changed"], false,
        "the key refuses a second row: {again}"
    );
    app.ctx
        .db
        .execute_unprepared("ALTER TABLE order_timeout_pauses RENAME TO order_timeout_pauses_away")
        .await
        .unwrap();
    wait_until(POLL * 10, "failed readings counted", || async {
        (app.metric("order_timeout_pause_reads_failed_total", &[])
            .await
            >= 2.0)
            .then_some(())
    })
    .await;
    assert!(
        role_status(&app, "relay").await["paused"] == true,
        "the pause stays"
    );
    let (status, refused) = admin(&app, "resume", "relay", None).await;
    assert_eq!(status, 503, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("?scope=instance"),
        "{refused}"
    );
    let (status, _) = admin(&app, "pause", "sweeper?scope=instance", None).await;
    assert_eq!(status, 409, "the sweeper does not run here");
    let (status, local) = admin(&app, "pause", "router?scope=instance", None).await;
    assert_eq!(status, 200, "{local}");
    assert!(
        role_status(&app, "relay").await["paused"] == true,
        "still paused"
    );

    app.ctx
        .db
        .execute_unprepared("ALTER TABLE order_timeout_pauses_away RENAME TO order_timeout_pauses")
        .await
        .unwrap();
    let (status, resumed) = admin(&app, "resume", "relay", None).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["paused"], false, "{resumed}");
    let (status, bad) = admin(&app, "pause", "relay?scope=cluster", None).await;
    assert_eq!(status, 400, "{bad}");
    let (status, long) = admin(
        &app,
        "pause",
        "relay",
        Some(json!({"reason": "x".repeat(501)})),
    )
    .await;
    assert_eq!(status, 422, "{long}");
    assert!(rows(&app).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_table_keeps_the_last_known_pauses_sqlite() {
    an_unreadable_table_keeps_the_last_known_pauses(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_table_keeps_the_last_known_pauses_mariadb() {
    an_unreadable_table_keeps_the_last_known_pauses(Backend::MariaDb).await
}

/// Issue 42: the follower of the shared pauses holds nothing the API needs
/// while it reads them. Its pool (`database.background_connections = 1`)
/// hangs: the test holds an order's row, and the timeout's transaction waits
/// on it with the pool's one connection, so the follower's next reading
/// cannot even start. A shared pause and resume of the router (which waits
/// for no transaction of its own) still answer within a second, written
/// through the API's pool; the reading that hung is dropped, not applied
/// after them. Let go, the order is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_reading_does_not_hold_up_pause_and_resume() {
    let app = spawn_app(
        spawn(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__DATABASE__BACKGROUND_CONNECTIONS", "1"),
    )
    .await;
    app.put_stock("HANG", 1).await;
    let id = app.order(&[("HANG", 1)], "1s").await;
    // The test's own connections: the service's background pool is the one
    // that hangs.
    let side = sea_orm::Database::connect(app.env["ORDER_TIMEOUT__DATABASE__URL"].as_str())
        .await
        .unwrap();
    let holder = side.begin().await.unwrap();
    holder
        .execute_unprepared(&format!("SELECT id FROM orders WHERE id = {id} FOR UPDATE"))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(20),
        "the timeout's transaction waiting on the held row",
        || async {
            let row = side
                .query_one_raw(Statement::from_string(
                    side.get_database_backend(),
                    "SELECT COUNT(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ))
                .await
                .unwrap()
                .unwrap();
            (row.try_get_by_index::<i64>(0).unwrap() > 0).then_some(())
        },
    )
    .await;
    // The follower's next reading waits for the pool's one connection.
    tokio::time::sleep(POLL * 2).await;
    for action in ["pause", "resume"] {
        let asked = Instant::now();
        let (status, answer) = admin(&app, action, "router", None).await;
        let took = asked.elapsed();
        assert_eq!(status, 200, "{action}: {answer}");
        assert!(
            took < Duration::from_secs(1),
            "{action} answered after {took:?} while the follower's reading hung"
        );
    }
    assert!(role_status(&app, "router").await["paused"] == false);
    holder.rollback().await.unwrap();
    side.close().await.ok();
    app.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    assert!(rows(&app).await.is_empty(), "resumed: no row");
    assert!(role_status(&app, "router").await["paused"] == false);
}

//! The broker and the database go away and come back: broker connections
//! killed mid-flow, the broker refusing a vhost at checkout, the database
//! refusing every connection, a commit whose answer is lost. Consumers pause
//! instead of spinning, nothing is lost, nothing is applied twice, and the
//! counters say what the database holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use order_timeout::db::entities::outbox;
use sea_orm::{EntityTrait, PaginatorTrait};

use crate::hardening::outbox_rows;
use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connections_killed_mid_flow() {
    let app = spawn_app(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    app.put_stock("A", 1000).await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(
            app.order(&[("A", 1)], &format!("{}ms", 1000 + (i % 30) * 100))
                .await,
        );
    }
    for _ in 0..2 {
        // The scenario: connections die while deadlines (1 to 4 s) are passing.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        close_each_service_connection(&app.vhost).await;
    }
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(30))
            .await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0})
    );
    assert!(
        app.metric("order_timeout_broker_disconnects_total", &[])
            .await
            >= 6.0
    );
    app.wait_ready(Duration::from_secs(20), "ready again after reconnecting")
        .await;
}

/// The relay's connection killed while several of its rounds are out (small
/// rounds, eight of them in flight, a backlog of many rounds): every row of
/// every round out is given back, so none is lost and the outbox empties, and
/// each timer is in the delay stage at least once (one confirmed before the
/// kill may be there twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_with_rounds_in_flight() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__RELAY__BATCH_SIZE", "20")
            .env("ORDER_TIMEOUT__RELAY__ROUNDS_IN_FLIGHT", "8"),
    )
    .await;
    let n = 10_000;
    // Due in a day: none falls due meanwhile, so the stage only fills.
    outbox_rows(&app.ctx.db, n, "payment", Duration::from_secs(86_400)).await;
    wait_until(Duration::from_secs(30), "the relay under way", || async {
        (outbox_left(&app).await < n as u64).then_some(())
    })
    .await;
    // The relay's connection is listed once its first statistics are in.
    wait_until(
        Duration::from_secs(30),
        "the relay's connection killed",
        || async {
            let closed = close_connections_named(&app.vhost, true).await;
            closed
                .iter()
                .any(|name| name.ends_with(" relay"))
                .then_some(())
        },
    )
    .await;
    let left = outbox_left(&app).await;
    assert!(
        left > 0,
        "the relay was done before its connection was killed"
    );
    wait_until(Duration::from_secs(90), "the outbox empty", || async {
        (outbox_left(&app).await == 0).then_some(())
    })
    .await;
    let staged = app.stage_timers(DelayMode::Ttl).await;
    assert!(staged >= n as u64, "{staged} timers in the stage, {n} rows");
    assert!(
        app.metric(
            "order_timeout_broker_disconnects_total",
            &["role=\"relay\""]
        )
        .await
            >= 1.0
    );
}

/// Rows left in the timeout outbox.
async fn outbox_left(app: &TestApp) -> u64 {
    outbox::Entity::find().count(&app.ctx.db).await.unwrap()
}

fn database_name(app: &TestApp) -> String {
    let url = app.ctx.settings.database.url.expose().to_string();
    url.rsplit('/').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_pauses_consumers_and_resumes() {
    let app = spawn_app(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    app.put_stock("A", 100).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(app.order(&[("A", 1)], "2s").await);
    }
    // The outbox is published before the database goes away.
    wait_until(Duration::from_secs(10), "outbox drained", || async {
        (app.metric("order_timeout_outbox_published_total", &[])
            .await
            >= 20.0)
            .then_some(())
    })
    .await;
    let name = database_name(&app);
    admin(
        POSTGRES_ADMIN,
        &format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"),
    )
    .await;
    admin(
        POSTGRES_ADMIN,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ),
    )
    .await;
    let outage = Instant::now();

    // The deadlines pass during the outage: consumers pause, nothing is acked.
    wait_until(Duration::from_secs(15), "a consumer pauses", || async {
        (app.metric("order_timeout_consumer_pauses_total", &["role=\"payment\""])
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert_database_down_is_told_not_shown(&app, &name).await;
    // A request the database fails: 503 with a sentence, the cause counted
    // (and logged), never shown.
    let resp = app
        .http
        .get(format!("{}/orders/{}", app.base, ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["error"], "the database is unavailable; try again",
        "{body}"
    );
    assert_eq!(
        app.metric(
            "order_timeout_http_requests_refused_total",
            &["reason=\"database\""]
        )
        .await,
        1.0
    );
    // The scenario: the outage lasts 4 s, long enough to count the pauses in it.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(outage.elapsed())).await;
    let pauses = app
        .metric("order_timeout_consumer_pauses_total", &["role=\"payment\""])
        .await;
    assert!(
        pauses < 30.0,
        "backoff, not a hot loop: {pauses} pauses in 4 s"
    );
    assert_eq!(
        app.metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"applied\""]
        )
        .await,
        0.0
    );

    admin(
        POSTGRES_ADMIN,
        &format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"),
    )
    .await;
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(app.stock("A").await["available"], 100);
    app.wait_ready(Duration::from_secs(10), "ready again").await;
}

/// `/readyz` answers 503 with the database down; anonymous callers learn that
/// it is down, not the driver's text about it.
async fn assert_database_down_is_told_not_shown(app: &TestApp, name: &str) {
    let resp = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["database"]["ok"], false, "{body}");
    assert_eq!(
        body["database"]["error"], "the database did not answer; the service log says why",
        "{body}"
    );
    assert!(!body.to_string().contains(name), "{body}");
}

/// Takes the broker away from one vhost: new connections are refused (no
/// permission) and the open ones are closed, as an operator or an outage would.
async fn broker_down(vhost: &str) {
    broker_api()
        .revoke(vhost)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    close_connections(vhost, false).await;
}

/// Gives the vhost back to the service: it reconnects on its own.
pub async fn broker_up(vhost: &str) {
    broker_api()
        .grant(vhost)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Takes the broker away from the app's vhost and waits until `/readyz`
/// says so for every role: none of the service's connections is left.
pub async fn broker_away(app: &TestApp) {
    broker_down(&app.vhost).await;
    // Generous: on a loaded machine (CI, eight tests at once) the management
    // API once took more than 20 s to list a connection that had just opened.
    wait_until(
        Duration::from_secs(60),
        "readyz reports every broker role down",
        || async {
            // The management API lists a connection only once its first
            // statistics are in: close again whatever has appeared since.
            close_connections(&app.vhost, false).await;
            let resp = app
                .http
                .get(format!("{}/readyz", app.base))
                .send()
                .await
                .ok()?;
            let status = resp.status();
            let body: Value = resp.json().await.ok()?;
            let roles = body["broker"]["connections"].as_object()?;
            let all_down = !roles.is_empty() && roles.values().all(|up| up == false);
            (status == 503 && all_down).then_some(())
        },
    )
    .await;
}

async fn checkout_with_broker_down(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 5).await;
    broker_away(&app).await;

    // Checkout still works; the timeout waits in the outbox.
    let id = app.order(&[("A", 2)], "2s").await;
    // The scenario: the order's deadline passes while the broker is away.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        app.get_order(&id).await["status"],
        "pending_payment",
        "nothing can fire without the broker"
    );
    assert!(app.metric("order_timeout_outbox_backlog", &[]).await >= 1.0);

    broker_up(&app.vhost).await;
    let order = app
        .wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    assert!(ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"));
    assert_eq!(app.stock("A").await["available"], 5);
    // The relay counts a row published when the broker's confirm is handled,
    // which can come after the timer was delivered and applied.
    wait_until(
        Duration::from_secs(10),
        "the outbox row counted as published once",
        || async {
            let published = app
                .metric("order_timeout_outbox_published_total", &[])
                .await;
            (published == 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        app.metric("order_timeout_outbox_published_total", &[])
            .await,
        1.0,
        "published once, not again"
    );
    assert!(
        app.metric("order_timeout_broker_disconnects_total", &[])
            .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_checkout_sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, checkout_with_broker_down).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_checkout_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        checkout_with_broker_down,
    )
    .await
}

/// `amqp.url` with several addresses (the nodes of a cluster), the first of
/// them down: every role connects to the next one, `/readyz` says which node
/// each connection is on, `doctor` reports the address that is down and where
/// the running instance's connections are, and timeouts work as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_is_down_is_skipped_for_the_next() {
    let vhost = Vhost::create().await;
    let dead = order_timeout_harness::free_port().unwrap();
    let live = BROKER.get();
    let live_node = live.rsplit('@').next().unwrap().to_string();
    let url = format!(
        "amqp://guest:guest@127.0.0.1:{dead}/{v}, {live}/{v}",
        v = vhost.name()
    );
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__AMQP__URL", url)
            .vhost(vhost),
    )
    .await;
    let ready = app.get_json("/readyz").await;
    for role in ["relay", "router", "consumer"] {
        assert_eq!(ready["broker"]["nodes"][role], live_node, "{ready}");
    }
    assert_eq!(ready["broker"]["connections"]["router"], true, "{ready}");

    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    assert_eq!(app.stock("A").await["available"], 1);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
        .arg("doctor")
        .envs(app.env.clone())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "one live node is enough:\n{stdout}");
    assert!(
        stdout.contains(&format!(
            "WARN  reachable: amqp://guest:***@127.0.0.1:{dead}/"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("order-timeout test-{} router on ", app.vhost)),
        "{stdout}"
    );
    assert!(!stdout.contains("guest:guest"), "{stdout}");
}

/// A TCP proxy to PostgreSQL that, once, passes on the COMMIT of a
/// transaction that applied a timeout (its statements hold `update`, the
/// transition, and `audit`, its audit row: `UPDATE "orders"` and `INSERT
/// INTO "order_events"` for the service's own orders) and then cuts that
/// connection without passing on the answer: the server commits, the service
/// never hears so. (The service reaches it with `statement-cache-capacity=0`,
/// so that every statement's text crosses it.) Returns the proxy's port and
/// how many commits it cut.
pub async fn commit_cutter(update: &'static [u8], audit: &'static [u8]) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cuts = Arc::new(AtomicUsize::new(0));
    let counted = cuts.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(pass_and_cut(client, counted.clone(), update, audit));
        }
    });
    (port, cuts)
}

async fn pass_and_cut(
    client: tokio::net::TcpStream,
    cuts: Arc<AtomicUsize>,
    update: &'static [u8],
    audit: &'static [u8],
) {
    let Ok(server) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let silenced = Arc::new(AtomicBool::new(false));
    let silent = silenced.clone();
    let answers = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if silent.load(Ordering::SeqCst) || to_client.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let has = |chunk: &[u8], what: &[u8]| chunk.windows(what.len()).any(|w| w == what);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut updated, mut recorded) = (false, false);
    loop {
        let n = match from_client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        updated |= has(chunk, update);
        recorded |= has(chunk, audit);
        let commit = has(chunk, b"COMMIT");
        if commit && updated && recorded && cuts.fetch_add(1, Ordering::SeqCst) == 0 {
            silenced.store(true, Ordering::SeqCst);
            let _ = to_server.write_all(chunk).await;
            // The scenario: the server commits; the answer never arrives.
            tokio::time::sleep(Duration::from_millis(300)).await;
            break;
        }
        if commit {
            (updated, recorded) = (false, false);
        }
        if to_server.write_all(chunk).await.is_err() {
            break;
        }
    }
    answers.abort();
}

/// A timeout's transaction commits and the answer is lost (the connection
/// cut right after the COMMIT): the consumer's retry finds the order no longer
/// applicable, and counts it as applied all the same, from the audit row the
/// lost commit wrote. The order is cancelled once, its stock released once,
/// and the metrics say what the database holds.
async fn a_lost_commit_answer_still_counts_applied(backend: Backend, mode: DelayMode) {
    let (port, cuts) = commit_cutter(b"UPDATE \"orders\"", b"INSERT INTO \"order_events\"").await;
    let app = spawn_app(Spawn::new(backend, mode).database_port(port)).await;
    app.put_stock("A", 3).await;
    let id = app.order(&[("A", 2)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    assert_cancelled_once(&app, std::slice::from_ref(&id)).await;
    assert!(cuts.load(Ordering::SeqCst) >= 1, "no commit was cut");
    assert_counted_applied_once(&app).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 3, "reserved": 0, "sold": 0})
    );
}

/// The one timeout of the test counted `applied`, never `not_applicable`.
pub async fn assert_counted_applied_once(app: &TestApp) {
    let applied = "outcome=\"applied\"";
    wait_until(Duration::from_secs(10), "the timeout counted", || async {
        (app.metric("order_timeout_timeouts_handled_total", &[applied])
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(
        (
            app.metric("order_timeout_timeouts_handled_total", &[applied])
                .await,
            app.metric(
                "order_timeout_timeouts_handled_total",
                &["outcome=\"not_applicable\""]
            )
            .await
        ),
        (1.0, 0.0),
        "{}",
        app.metrics().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_still_counts_applied_ttl() {
    run(
        Backend::Postgres,
        DelayMode::Ttl,
        a_lost_commit_answer_still_counts_applied,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_still_counts_applied_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        a_lost_commit_answer_still_counts_applied,
    )
    .await
}

/// The same for the sweeper: its transaction commits and the answer is lost;
/// the order is no longer overdue for the next sweep, and is counted as
/// caught all the same, from the audit row the lost commit wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_still_counts_the_sweepers_catch() {
    let (port, cuts) = commit_cutter(b"UPDATE \"orders\"", b"INSERT INTO \"order_events\"").await;
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .database_port(port)
            // No timer is published: the sweeper alone closes the order.
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "300ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "500ms"),
    )
    .await;
    app.put_stock("A", 3).await;
    let id = app.order(&[("A", 2)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    assert_cancelled_once(&app, std::slice::from_ref(&id)).await;
    assert!(cuts.load(Ordering::SeqCst) >= 1, "no commit was cut");
    let catches = "order_timeout_sweeper_catches_total";
    wait_until(
        Duration::from_secs(10),
        "the sweeper's catch counted",
        || async { (app.metric(catches, &[]).await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(
        app.metric(catches, &[]).await,
        1.0,
        "{}",
        app.metrics().await
    );
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 3, "reserved": 0, "sold": 0})
    );
}

/// A consumer waiting on the database when its connection is closed (here the
/// order's row, locked by another session) reconnects within seconds, not
/// once the database answers; the order is cancelled when the row is free.
/// The wait on a lock stands for any await that a failed connection does not
/// end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_on_the_database_reconnects_when_its_connection_closes_ttl() {
    consumer_waiting_on_the_database_reconnects(DelayMode::Ttl).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_on_the_database_reconnects_when_its_connection_closes_plugin() {
    consumer_waiting_on_the_database_reconnects(DelayMode::Plugin).await
}

async fn consumer_waiting_on_the_database_reconnects(mode: DelayMode) {
    use sea_orm::{ConnectionTrait, Database, TransactionTrait};

    let app = spawn_app(Spawn::new(Backend::Postgres, mode)).await;
    app.put_stock("A", 10).await;
    let id = app.order(&[("A", 1)], "1s").await;
    let holder = Database::connect(app.ctx.settings.database.url.expose())
        .await
        .unwrap();
    let txn = holder.begin().await.unwrap();
    txn.execute_unprepared(&format!("SELECT 1 FROM orders WHERE id = {id} FOR UPDATE"))
        .await
        .unwrap();
    // Due: the consumer (its delivery or its catch-up) waits on the row.
    let name = database_name(&app);
    wait_until(
        Duration::from_secs(20),
        "the consumer waits on the locked row",
        || async {
            let waiting = holder
                .query_one_raw(sea_orm::Statement::from_string(
                    holder.get_database_backend(),
                    format!(
                        "SELECT count(*) AS n FROM pg_stat_activity \
                         WHERE datname = '{name}' AND wait_event_type = 'Lock'"
                    ),
                ))
                .await
                .unwrap()
                .and_then(|r| r.try_get::<i64>("", "n").ok())
                .unwrap_or(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    let consumer_lost = || async {
        app.metric(
            "order_timeout_broker_disconnects_total",
            &["role=\"consumer\""],
        )
        .await
    };
    assert_eq!(consumer_lost().await, 0.0);
    close_each_service_connection(&app.vhost).await;
    let closed = Instant::now();
    wait_until(
        Duration::from_secs(20),
        "the consumer reconnects while the row is still locked",
        || async {
            let connected = app
                .metric("order_timeout_broker_connected", &["role=\"consumer\""])
                .await;
            (consumer_lost().await >= 1.0 && connected == 1.0).then_some(())
        },
    )
    .await;
    eprintln!(
        "{mode:?}: the consumer reconnected {:?} after its connection was closed",
        closed.elapsed()
    );
    let order = app.get_order(&id).await;
    assert_eq!(
        order["status"], "pending_payment",
        "the row is still locked: {order}"
    );
    txn.rollback().await.unwrap();
    app.wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    assert_cancelled_once(&app, std::slice::from_ref(&id)).await;
    holder.close().await.ok();
}

//! Reliability (issue 4), the fast versions: broker connections killed, the
//! database taken away, SIGTERM and SIGKILL of a real `serve` process, two
//! instances sharing the work, and hostile input on the AMQP side.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// Every order's audit trail has exactly one `cancelled` event, not early.
async fn assert_cancelled_once(app: &TestApp, ids: &[String]) {
    for id in ids {
        cancelled_once(&app.order_with_audit(id).await);
    }
}

/// One order document (with its audit trail): cancelled exactly once, not early.
fn cancelled_once(order: &Value) {
    let cancels = order["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "cancelled")
        .count();
    assert_eq!(cancels, 1, "{order}");
    assert!(
        ms(order, "cancelled_at") >= ms(order, "pay_deadline"),
        "early: {order}"
    );
}

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
    let admin = Database::connect(POSTGRES_ADMIN).await.unwrap();
    admin
        .execute_unprepared(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .await
        .unwrap();
    let outage = Instant::now();

    // The deadlines pass during the outage: consumers pause, nothing is acked.
    wait_until(Duration::from_secs(15), "a consumer pauses", || async {
        (app.metric("order_timeout_consumer_pauses_total", &["role=\"payment\""])
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    let resp = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["database"]["ok"], false, "{body}");
    // Anonymous callers learn that it is down, not the driver's text about it.
    assert_eq!(
        body["database"]["error"], "the database did not answer; the service log says why",
        "{body}"
    );
    assert!(!body.to_string().contains(&name), "{body}");
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

    admin
        .execute_unprepared(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    admin.close().await.ok();
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(app.stock("A").await["available"], 100);
    app.wait_ready(Duration::from_secs(10), "ready again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_work_without_double_effects() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "500ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s"),
    )
    .await;
    let peer = app.spawn_peer("second").await;
    app.put_stock("A", 1000).await;
    let mut ids = Vec::new();
    for i in 0..200 {
        // Orders come in through both instances.
        let via = if i % 2 == 0 { &app } else { &peer };
        ids.push(
            via.order(&[("A", 2)], &format!("{}ms", 1500 + (i % 20) * 50))
                .await,
        );
    }
    // Management statistics lag a few seconds behind the broker.
    let work = app.names.work(order_timeout::domain::TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(15),
        "both instances consume the work queue",
        || async {
            let queue = api_get(&format!("/queues/{}/{work}", app.vhost)).await;
            (queue["consumers"] == 2).then_some(())
        },
    )
    .await;
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0})
    );
    // Message path and sweepers together applied each order once.
    let applied = app
        .metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"applied\""],
        )
        .await
        + peer
            .metric(
                "order_timeout_timeouts_handled_total",
                &["outcome=\"applied\""],
            )
            .await;
    assert_eq!(applied, 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_amqp_input_is_parked_and_consumption_goes_on_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, hostile_amqp_input).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_amqp_input_is_parked_and_consumption_goes_on_plugin() {
    run(Backend::Sqlite, DelayMode::Plugin, hostile_amqp_input).await
}

/// Garbage at the entry is parked by the router before any delay (nothing of
/// it waits in the delay stage); garbage put straight into a work queue is
/// parked by the consumer.
async fn hostile_amqp_input(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    let json_props = |headers: FieldTable| {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_headers(headers)
    };
    let entry = app.names.entry().to_string();
    let body = br#"{"order_id":"5","kind":"payment"}"#;
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    app.publish_with(&entry, "payment", json_props(delay(1000)), &random)
        .await;
    app.publish_with(
        &entry,
        "payment",
        json_props(delay(1000)),
        &vec![b'a'; 1 << 20],
    )
    .await;
    app.publish_with(
        &entry,
        "payment",
        BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_headers(delay(1000)),
        body,
    )
    .await;
    let mut wrong_types = Vec::new();
    for value in [
        AMQPValue::LongString("1000".into()),
        AMQPValue::Double(1000.0),
        AMQPValue::Boolean(true),
        AMQPValue::FieldTable(FieldTable::default()),
    ] {
        let mut headers = FieldTable::default();
        headers.insert("x-delay".into(), value);
        wrong_types.push(headers);
    }
    for headers in wrong_types {
        app.publish_with(&entry, "payment", json_props(headers), body)
            .await;
    }
    // Straight into a work queue, bypassing the router: the consumer checks too.
    let work = app.names.work(order_timeout::domain::TimeoutKind::Payment);
    app.publish_with(
        "",
        &work,
        json_props(FieldTable::default()),
        b"\x00\x01garbage",
    )
    .await;
    app.publish_with(
        "",
        &work,
        BasicProperties::default(),
        br#"{"order_id": 12}"#,
    )
    .await;

    let parked = app.names.parked();
    wait_until(Duration::from_secs(10), "all parked", || async {
        (app.queue_depth(&parked).await >= 9).then_some(())
    })
    .await;
    let mut reasons: Vec<String> = app
        .drain_parked()
        .await
        .into_iter()
        .map(|(r, _, _)| r)
        .collect();
    reasons.sort();
    let mut expected = vec![
        "body_too_large",
        "invalid_body",
        "invalid_body",
        "invalid_body",
        "invalid_delay",
        "invalid_delay",
        "invalid_delay",
        "invalid_delay",
        "wrong_content_type",
    ];
    expected.sort();
    assert_eq!(reasons, expected);
    assert_eq!(
        app.stage_timers(mode).await,
        0,
        "nothing reached the delay stage"
    );
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(6))
        .await;
}

/// The service as a separate `serve` process, for signals.
struct Process {
    child: Child,
    base: String,
}

impl Process {
    async fn start(env: &HashMap<String, String>, name: &str) -> Process {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(BIN)
            .arg("serve")
            .envs(env)
            .env("ORDER_TIMEOUT__HTTP__BIND", format!("127.0.0.1:{port}"))
            .env("ORDER_TIMEOUT__AMQP__INSTANCE", name)
            .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let process = Process {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        wait_until(Duration::from_secs(60), "child service ready", || async {
            let resp = http
                .get(format!("{}/readyz", process.base))
                .send()
                .await
                .ok()?;
            resp.status().is_success().then_some(())
        })
        .await;
        process
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its success and how long it took.
    async fn wait(&mut self, within: Duration) -> (bool, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), start.elapsed());
            }
            assert!(
                start.elapsed() < within,
                "the service did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn place(http: &reqwest::Client, base: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let resp = http
            .post(format!("{base}/orders"))
            .json(&json!({"items": [{"sku": "A", "quantity": 1}], "payment_window": format!("{}ms", 800 + (i % 20) * 100)}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let order: Value = resp.json().await.unwrap();
        ids.push(order["id"].as_str().unwrap().to_string());
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_sigkill_loses_nothing() {
    // The in-process app only prepares the vhost, the database and the stock.
    let mut app = spawn_app(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    app.put_stock("A", 1000).await;
    app.stop().await;
    // The children run with the app's settings, its admin token included.
    let http = app.http.clone();

    // SIGTERM while timeouts are firing: a clean, bounded exit.
    let mut first = Process::start(&app.env, "first").await;
    let mut ids = place(&http, &first.base, 100).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    first.signal("-TERM");
    let (clean, took) = first.wait(Duration::from_secs(30)).await;
    assert!(clean, "SIGTERM ends with success");
    assert!(took < Duration::from_secs(21), "shutdown took {took:?}");

    // SIGKILL in the middle of the next batch: the broker and the outbox keep everything.
    let mut second = Process::start(&app.env, "second").await;
    ids.extend(place(&http, &second.base, 100).await);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    second.signal("-KILL");
    second.wait(Duration::from_secs(10)).await;

    let third = Process::start(&app.env, "third").await;
    let view = |id: String| {
        let http = http.clone();
        let base = third.base.clone();
        async move {
            let order: Value = http
                .get(format!("{base}/orders/{id}?include=audit"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (order["status"] == "cancelled").then_some(order)
        }
    };
    for id in &ids {
        let order = wait_until(
            Duration::from_secs(30),
            &format!("order {id} cancelled"),
            || view(id.clone()),
        )
        .await;
        cancelled_once(&order);
    }
    let stock: Value = http
        .get(format!("{}/inventory/A", third.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stock,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_carry_a_full_timeout_cycle() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__AMQP__QUEUE_TYPE", "quorum"),
    )
    .await;
    let queue = |name: String| {
        let vhost = app.vhost.clone();
        async move { api_get(&format!("/queues/{vhost}/{name}")).await }
    };
    for l in [0, 5, 22] {
        let q = queue(app.names.level(l)).await;
        assert_eq!(q["type"], "quorum", "{q}");
        let args = &q["arguments"];
        assert_eq!(args["x-queue-type"], "quorum", "{q}");
        assert_eq!(args["x-dead-letter-strategy"], "at-least-once", "{q}");
        assert_eq!(args["x-overflow"], "reject-publish", "{q}");
        // Lazy mode is a classic-queue argument; quorum queues keep it off disk anyway.
        assert!(args.get("x-queue-mode").is_none(), "{q}");
        assert_eq!(args["x-message-ttl"], (1i64 << l) * 1000, "{q}");
        assert_eq!(args["x-dead-letter-exchange"], app.names.out(l), "{q}");
    }
    for name in [
        app.names.work(order_timeout::domain::TimeoutKind::Payment),
        app.names.ingest(),
        app.names.parked(),
    ] {
        assert_eq!(queue(name).await["type"], "quorum");
    }
    // 3 s: a stay in level 1 (2 s), then level 0 (1 s), both quorum.
    app.put_stock("A", 5).await;
    let id = app.order(&[("A", 5)], "3s").await;
    app.cancelled_on_time(&id, Duration::from_secs(10)).await;
    assert_eq!(app.stock("A").await["available"], 5);
}

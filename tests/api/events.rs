//! Domain events: every transition that commits is published once (after
//! de-duplication by `message_id`) to `<prefix>.events` with the routing key
//! `order.<event>`, with the body of the wire contract v1 for events; a
//! refused action or a rolled-back transaction publishes nothing; events wait
//! in their table while the broker is away; the consumer examples in Python
//! and Node print each event once.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use order_timeout::amqp::wire;
use order_timeout::db::entities::order_timeout_events;
use order_timeout::db::events::{DomainEvent, append};
use order_timeout::domain::Millis;
use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait};
use serde_json::{Value, json};

use crate::examples::{missing, node_modules, python, runs};
use crate::hardening::{one_batch, one_order_refused};
use crate::helpers::*;
use crate::outages::{broker_away, broker_up};

/// One event message as a consumer receives it.
#[derive(Debug, Clone)]
struct Received {
    message_id: String,
    routing_key: String,
    body: Value,
}

impl Received {
    /// `(order id, event)`, from the body.
    fn key(&self) -> (String, String) {
        let text = |f: &str| self.body[f].as_str().unwrap_or_default().to_string();
        (text("order_id"), text("event"))
    }
}

/// A durable queue of the test's own, bound to the events exchange with
/// `order.#` as a consumer's would be; it outlives the connections a broker
/// outage closes.
struct EventQueue {
    name: String,
    /// Everything taken so far, duplicates included.
    taken: Vec<Received>,
}

impl EventQueue {
    async fn bind(app: &TestApp) -> Self {
        let name = format!("test.events.{}", uuid::Uuid::new_v4().simple());
        let conn = app.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(name.as_str().into(), durable, FieldTable::default())
            .await
            .unwrap();
        channel
            .queue_bind(
                name.as_str().into(),
                app.names.events().as_str().into(),
                "order.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("the service declared the events exchange");
        conn.close(200, "done".into()).await.ok();
        Self {
            name,
            taken: Vec::new(),
        }
    }

    /// Takes (and acks) every message waiting, checking what the contract
    /// promises of each: routing key, properties, headers, body version.
    async fn take(&mut self, app: &TestApp) {
        let conn = app.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        while let Some(msg) = channel
            .basic_get(self.name.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            let d = &msg.delivery;
            let body: Value = serde_json::from_slice(&d.data).expect("a JSON body");
            let p = &d.properties;
            let received = Received {
                message_id: p.message_id().as_ref().expect("a message id").to_string(),
                routing_key: d.routing_key.to_string(),
                body,
            };
            assert_properties(&received, p);
            self.taken.push(received);
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        }
        conn.close(200, "done".into()).await.ok();
    }

    /// Takes until every `(order, event)` of `expected` has come, and the
    /// event outbox is empty (so everything it held has been published, and
    /// a publish is confirmed only once the queue has the message); then
    /// once more. Returns each message id's message, checking every duplicate
    /// is the same message.
    async fn until(
        &mut self,
        app: &TestApp,
        expected: &BTreeSet<(String, String)>,
        within: Duration,
    ) -> BTreeMap<String, Received> {
        let start = std::time::Instant::now();
        loop {
            self.take(app).await;
            let seen: BTreeSet<_> = self.taken.iter().map(Received::key).collect();
            if seen.is_superset(expected) && event_rows(&app.ctx.db).await == 0 {
                break;
            }
            let missing: Vec<_> = expected.difference(&seen).collect();
            assert!(
                start.elapsed() < within,
                "timed out after {within:?}; not yet told: {missing:?}"
            );
            // Polling the queue, as wait_until does.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.take(app).await;
        let mut unique: BTreeMap<String, Received> = BTreeMap::new();
        for r in &self.taken {
            if let Some(first) = unique.get(&r.message_id) {
                // At least once: a re-publish is the same message.
                assert_eq!(first.body, r.body, "{}", r.message_id);
            } else {
                unique.insert(r.message_id.clone(), r.clone());
            }
        }
        unique
    }
}

/// What every event message carries, whatever the event.
fn assert_properties(r: &Received, p: &BasicProperties) {
    let (order_id, event) = r.key();
    assert_eq!(r.routing_key, format!("order.{event}"), "{:?}", r.body);
    assert_eq!(
        p.content_type().as_ref().map(|c| c.as_str()),
        Some("application/json")
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(r.body["version"], 1, "{:?}", r.body);
    let headers = p.headers().as_ref();
    assert_eq!(wire::header_text(headers, "event"), Some(event));
    assert_eq!(wire::header_text(headers, "order_id"), Some(order_id));
    let at = r.body["at"].as_str().expect("at");
    assert!(chrono::DateTime::parse_from_rfc3339(at).is_ok(), "{at}");
    assert!(at.ends_with('Z'), "UTC: {at}");
}

/// Rows in the event outbox (published rows are deleted).
async fn event_rows(db: &DatabaseConnection) -> u64 {
    order_timeout_events::Entity::find()
        .count(db)
        .await
        .unwrap()
}

/// Each `(order, event)` came under exactly one message id, and nothing else
/// came: a transition is told once, a refusal or a rollback never.
fn assert_once_each(
    unique: &BTreeMap<String, Received>,
    expected: &BTreeSet<(String, String)>,
) -> BTreeMap<(String, String), Value> {
    let mut by_key: BTreeMap<(String, String), Vec<&Received>> = BTreeMap::new();
    for r in unique.values() {
        by_key.entry(r.key()).or_default().push(r);
    }
    for (key, copies) in &by_key {
        assert_eq!(
            copies.len(),
            1,
            "{key:?} told under several ids: {copies:?}"
        );
    }
    let told: BTreeSet<_> = by_key.keys().cloned().collect();
    assert_eq!(&told, expected, "what was told, against what committed");
    by_key
        .into_iter()
        .map(|(k, v)| (k, v[0].body.clone()))
        .collect()
}

/// Every `(order, event)` of these orders' lives.
fn expect(lives: &[(&str, &[&str])]) -> BTreeSet<(String, String)> {
    lives
        .iter()
        .flat_map(|(order, events)| events.iter().map(|e| (order.to_string(), e.to_string())))
        .collect()
}

/// `(cause, from, to)` of an event's body.
fn transition(body: &Value) -> (String, Value, String) {
    (
        body["cause"].as_str().unwrap_or_default().to_string(),
        body["from"].clone(),
        body["to"].as_str().unwrap_or_default().to_string(),
    )
}

/// Every kind of transition of the owned mode, each told once with its cause,
/// statuses and (for a cancel) what it released; refusals told never.
async fn every_transition_is_told_once(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__WINDOWS__FULFILLMENT", "4s")
            .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", "4s"),
    )
    .await;
    let mut queue = EventQueue::bind(&app).await;
    app.put_stock("A", 100).await;
    app.put_stock("B", 100).await;

    let lapsed = app.order(&[("B", 1), ("A", 2)], "2s").await;
    let bought = app.order(&[("A", 1)], "1h").await;
    for action in ["pay", "ship", "confirm"] {
        assert_eq!(app.post(&bought, action).await.0, 200, "{action}");
    }
    let dropped = app.order(&[("B", 3)], "1h").await;
    assert_eq!(app.post(&dropped, "cancel").await.0, 200);
    let unshipped = app.order(&[("A", 1)], "1h").await;
    assert_eq!(app.post(&unshipped, "pay").await.0, 200);
    let unconfirmed = app.order(&[("A", 1)], "1h").await;
    for action in ["pay", "ship"] {
        assert_eq!(app.post(&unconfirmed, action).await.0, 200, "{action}");
    }
    let late = app.order(&[("A", 1)], "1s").await;
    app.wait_status(&late, "cancelled", Duration::from_secs(20))
        .await;
    // The first payment after the timeout is a late payment; its retry is not.
    for _ in 0..2 {
        assert_eq!(app.post(&late, "pay").await.0, 409);
    }
    // Refused by the state diagram or by stock: nothing to tell.
    assert_eq!(app.post(&dropped, "confirm").await.0, 409);
    assert_eq!(app.post(&bought, "cancel").await.0, 409);
    assert_eq!(app.post(&lapsed, "ship").await.0, 409);
    assert_eq!(app.checkout(&[("A", 1000)], "1h").await.0, 409);
    app.wait_status(&unconfirmed, "completed", Duration::from_secs(20))
        .await;
    wait_until(Duration::from_secs(20), "the fulfillment flag", || async {
        let order = app.get_order(&unshipped).await;
        order["fulfillment_overdue_at"].is_string().then_some(())
    })
    .await;
    app.wait_status(&lapsed, "cancelled", Duration::from_secs(20))
        .await;

    let (l, b, d) = (lapsed.as_str(), bought.as_str(), dropped.as_str());
    let (u, c, t) = (unshipped.as_str(), unconfirmed.as_str(), late.as_str());
    let expected = expect(&[
        (l, &["created", "cancelled"]),
        (b, &["created", "paid", "shipped", "completed"]),
        (d, &["created", "cancelled"]),
        (u, &["created", "paid", "fulfillment_overdue"]),
        (c, &["created", "paid", "shipped", "completed"]),
        (t, &["created", "cancelled", "late_payment"]),
    ]);
    let unique = queue.until(&app, &expected, Duration::from_secs(30)).await;
    let told = assert_once_each(&unique, &expected);
    let body = |o: &str, e: &str| told[&(o.to_string(), e.to_string())].clone();
    let pending = json!("pending_payment");
    let cases = [
        (l, "created", ("buyer", Value::Null, "pending_payment")),
        (l, "cancelled", ("timeout", pending.clone(), "cancelled")),
        (b, "paid", ("buyer", pending.clone(), "paid")),
        (b, "shipped", ("shop", json!("paid"), "shipped")),
        (b, "completed", ("buyer", json!("shipped"), "completed")),
        (d, "cancelled", ("buyer", pending.clone(), "cancelled")),
        (u, "fulfillment_overdue", ("timeout", json!("paid"), "paid")),
        (c, "completed", ("timeout", json!("shipped"), "completed")),
        (
            t,
            "late_payment",
            ("buyer", json!("cancelled"), "cancelled"),
        ),
    ];
    for (order, event, (cause, from, to)) in cases {
        let expected = (cause.to_string(), from, to.to_string());
        assert_eq!(transition(&body(order, event)), expected, "{order} {event}");
    }
    assert_eq!(
        body(l, "cancelled")["released"],
        json!([{"sku": "A", "quantity": 2}, {"sku": "B", "quantity": 1}])
    );
    assert_eq!(
        body(d, "cancelled")["released"],
        json!([{"sku": "B", "quantity": 3}])
    );
    assert_eq!(
        body(t, "cancelled")["released"],
        json!([{"sku": "A", "quantity": 1}])
    );
    for (key, b) in &told {
        assert_eq!(b.get("released").is_some(), key.1 == "cancelled", "{b}");
    }
    // The time an event tells is the time its transition committed.
    let order = app.get_order(&lapsed).await;
    assert_eq!(body(l, "cancelled")["at"], order["cancelled_at"]);
    assert_eq!(
        app.metric(
            "order_timeout_events_published_total",
            &["event=\"cancelled\""]
        )
        .await,
        3.0
    );
}

each_mode!(every_transition_is_told_once, MariaDb);

/// A trigger that refuses to record one order's cancellation in the audit
/// trail. A transition appends its events before its audit rows, so the
/// transactions this refuses have already written event rows: they roll back
/// with everything else.
async fn refuse_recording_the_cancel_of(db: &DatabaseConnection, backend: Backend, id: &str) {
    let condition = format!("NEW.order_id = {id} AND NEW.event = 'cancelled'");
    let on = "BEFORE INSERT ON order_events";
    let message = "test: this cancel is refused";
    refusing_trigger(db, backend, "refuse_cancel", on, &condition, message).await;
}

/// A batch of timeouts the database rolls back (one order in it is refused)
/// tells nothing: the orders cancelled afterwards, in smaller batches, are
/// each told once, and the refused one never.
async fn a_rolled_back_transition_tells_nothing(backend: Backend, mode: DelayMode) {
    let app = spawn_app(one_batch(Spawn::new(backend, mode))).await;
    let db = app.ctx.db.clone();
    let mut queue = EventQueue::bind(&app).await;
    let (refused, rest) = one_order_refused(&app, 4, |id| async move {
        refuse_recording_the_cancel_of(&db, backend, &id).await
    })
    .await;
    assert_eq!(app.get_order(&refused).await["status"], "pending_payment");
    let mut lives: Vec<(&str, &[&str])> = vec![(refused.as_str(), &["created"])];
    lives.extend(
        rest.iter()
            .map(|id| (id.as_str(), &["created", "cancelled"][..])),
    );
    let expected = expect(&lives);
    let unique = queue.until(&app, &expected, Duration::from_secs(30)).await;
    assert_once_each(&unique, &expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transition_tells_nothing_sqlite_ttl() {
    run(
        Backend::Sqlite,
        DelayMode::Ttl,
        a_rolled_back_transition_tells_nothing,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transition_tells_nothing_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        a_rolled_back_transition_tells_nothing,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transition_tells_nothing_mariadb_ttl() {
    run(
        Backend::MariaDb,
        DelayMode::Ttl,
        a_rolled_back_transition_tells_nothing,
    )
    .await
}

/// With the broker away, transitions still commit (the API's, and the
/// sweeper's cancel of an order whose timer cannot fire): their events wait
/// in the table, and all go out, once each, when the broker is back.
async fn events_wait_for_the_broker(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "500ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "1s"),
    )
    .await;
    let mut queue = EventQueue::bind(&app).await;
    app.put_stock("A", 10).await;
    broker_away(&app).await;

    let swept = app.order(&[("A", 2)], "1s").await;
    let bought = app.order(&[("A", 1)], "1h").await;
    for action in ["pay", "ship", "confirm"] {
        assert_eq!(app.post(&bought, action).await.0, 200, "{action}");
    }
    let dropped = app.order(&[("A", 1)], "1h").await;
    assert_eq!(app.post(&dropped, "cancel").await.0, 200);
    app.wait_status(&swept, "cancelled", Duration::from_secs(20))
        .await;
    // Eight events committed, none published: all wait in the table.
    assert_eq!(event_rows(&app.ctx.db).await, 8);
    wait_until(Duration::from_secs(5), "the backlog gauge", || async {
        (app.metric("order_timeout_events_backlog", &[]).await == 8.0).then_some(())
    })
    .await;
    assert_eq!(
        app.metric("order_timeout_events_published_total", &[])
            .await,
        0.0
    );

    broker_up(&app.vhost).await;
    let expected = expect(&[
        (swept.as_str(), &["created", "cancelled"]),
        (
            bought.as_str(),
            &["created", "paid", "shipped", "completed"],
        ),
        (dropped.as_str(), &["created", "cancelled"]),
    ]);
    let unique = queue.until(&app, &expected, Duration::from_secs(60)).await;
    let told = assert_once_each(&unique, &expected);
    let cancel = &told[&(swept.clone(), "cancelled".to_string())];
    assert_eq!(cancel["cause"], "sweeper");
    assert_eq!(cancel["released"], json!([{"sku": "A", "quantity": 2}]));
    wait_until(
        Duration::from_secs(5),
        "the backlog gauge at rest",
        || async { (app.metric("order_timeout_events_backlog", &[]).await == 0.0).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_wait_for_the_broker_sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, events_wait_for_the_broker).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_wait_for_the_broker_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        events_wait_for_the_broker,
    )
    .await
}

/// A backlog of events does not hold timeouts back: the relay takes a round
/// of timeouts before each round of events, so a checkout's timeout goes out
/// while thousands of events still wait, and its order is cancelled on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_events_does_not_hold_timeouts_back() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl).env("ORDER_TIMEOUT__RELAY__BATCH_SIZE", "20"),
    )
    .await;
    app.put_stock("A", 1).await;
    let backlog: Vec<DomainEvent> = (0..5000)
        .map(|i| DomainEvent {
            order_id: format!("backlog-{i}"),
            event: "paid".into(),
            cause: "buyer".into(),
            from: Some("pending_payment".into()),
            to: "paid".into(),
            at: Millis::now(),
            released: None,
        })
        .collect();
    append(&app.ctx.db, &backlog).await.unwrap();
    let id = app.order(&[("A", 1)], "2s").await;
    let published_meanwhile = wait_until(
        Duration::from_secs(10),
        "the order's timeout published",
        || async {
            let timeouts = app
                .metric("order_timeout_outbox_published_total", &[])
                .await;
            let events = app
                .metric("order_timeout_events_published_total", &[])
                .await;
            (timeouts >= 1.0).then_some(events)
        },
    )
    .await;
    assert!(
        published_meanwhile < 4000.0,
        "the timeout waited for {published_meanwhile} events"
    );
    app.cancelled_on_time(&id, Duration::from_secs(10)).await;
    wait_until(Duration::from_secs(60), "the backlog published", || async {
        (event_rows(&app.ctx.db).await == 0).then_some(())
    })
    .await;
    assert_eq!(
        app.metric("order_timeout_events_published_total", &["event=\"paid\""])
            .await,
        5000.0
    );
}

/// Runs a consumer example against the real service: it declares its queue
/// (named, so the test can see it bound and, at the end, empty: every
/// message acked), and must print five distinct events, one JSON line each,
/// while six messages come: a test message published twice with one
/// message id, and four events of real transitions.
async fn consumer_example_prints_each_event_once<F>(backend: Backend, mode: DelayMode, start: F)
where
    F: FnOnce(&TestApp, &str) -> Command,
{
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 10).await;
    let queue = format!("example.{}", uuid::Uuid::new_v4().simple());
    let child = start(&app, &queue)
        .args(["--count", "5", "--timeout", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output());
    let bindings = format!(
        "/exchanges/{}/{}/bindings/source",
        url_encode(&app.vhost),
        url_encode(&app.names.events())
    );
    wait_until(
        Duration::from_secs(30),
        "the example's queue bound",
        || async {
            let bound = api_get(&bindings).await;
            let bound = bound.as_array().is_some_and(|b| {
                b.iter()
                    .any(|b| b["destination"] == queue.as_str() && b["routing_key"] == "order.#")
            });
            bound.then_some(())
        },
    )
    .await;

    let test_event = json!({"version": 1, "event": "test", "order_id": "0"}).to_string();
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id("the-same-id".into());
    for _ in 0..2 {
        app.publish_with(
            &app.names.events(),
            "order.test",
            properties.clone(),
            test_event.as_bytes(),
        )
        .await;
    }
    let paid = app.order(&[("A", 1)], "1h").await;
    assert_eq!(app.post(&paid, "pay").await.0, 200);
    let dropped = app.order(&[("A", 1)], "1h").await;
    assert_eq!(app.post(&dropped, "cancel").await.0, 200);

    let out = output.await.unwrap().expect("the example ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let mut told: Vec<(String, String)> = printed
        .iter()
        .map(|b| {
            let text = |f: &str| b[f].as_str().unwrap_or_default().to_string();
            (text("order_id"), text("event"))
        })
        .collect();
    told.sort();
    let mut expected = vec![
        ("0".to_string(), "test".to_string()),
        (paid.clone(), "created".to_string()),
        (paid.clone(), "paid".to_string()),
        (dropped.clone(), "created".to_string()),
        (dropped.clone(), "cancelled".to_string()),
    ];
    expected.sort();
    assert_eq!(told, expected, "{stdout}");
    assert_eq!(app.queue_depth(&queue).await, 0, "every message acked");
}

async fn python_consumer(backend: Backend, mode: DelayMode) {
    let Some(python) = python() else {
        return missing("python with pika");
    };
    consumer_example_prints_each_event_once(backend, mode, |app, queue| {
        let mut cmd = Command::new(&python);
        cmd.arg(repo_path("rabbitmq/examples/python/consume_events.py"))
            .args(["--url", &app.amqp_url, "--exchange", &app.names.events()])
            .args(["--queue", queue]);
        cmd
    })
    .await
}

async fn node_consumer(backend: Backend, mode: DelayMode) {
    let Some(modules) = node_modules().filter(|_| runs("node")) else {
        return missing("node with amqplib");
    };
    consumer_example_prints_each_event_once(backend, mode, |app, queue| {
        let mut cmd = Command::new("node");
        cmd.arg(repo_path("rabbitmq/examples/node/consume_events.js"))
            .args(["--url", &app.amqp_url, "--exchange", &app.names.events()])
            .args(["--queue", queue])
            .env("NODE_PATH", &modules);
        cmd
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_consumer_example_sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, python_consumer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_consumer_example_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, node_consumer).await
}

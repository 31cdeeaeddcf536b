//! Traces across the broker (`tracing.*`): a `serve` child exports to an
//! OTLP/HTTP receiver run here, which decodes each `ExportTraceServiceRequest`
//! as a collector would. The parent chain is checked span by span: from a
//! shop's own `traceparent` through the router and the consumer's apply to
//! the relay's publish of the cancelled event; from a checkout to the same
//! cancel; a malformed `traceparent` starts a new trace and changes nothing
//! else; with tracing off nothing is sent and no trace header is written.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use order_timeout::amqp::topology::Names;
use order_timeout::amqp::wire;
use order_timeout_harness::{Process, Serve};
use prost::Message as _;
use serde_json::json;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The shop's own trace, as its publisher would send it.
const SHOP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SHOP_SPAN: &str = "00f067aa0ba902b7";
/// A storefront's trace around its checkout call.
const STORE_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const STORE_SPAN: &str = "b7ad6b7169203331";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, traced_across_the_broker).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        traced_across_the_broker,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ttl_off() {
    run(Backend::Sqlite, DelayMode::Ttl, off_sends_nothing).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_plugin_off() {
    run(Backend::Postgres, DelayMode::Plugin, off_sends_nothing).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_tracestate_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        a_long_tracestate_is_cut_to_fit,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_tracestate_mariadb_ttl() {
    run(
        Backend::MariaDb,
        DelayMode::Ttl,
        a_long_tracestate_is_cut_to_fit,
    )
    .await
}

/// One span as received, with what the checks need.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP receiver on 127.0.0.1: every span it was sent, and how many
/// export requests came.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
    requests: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start() -> (Self, SocketAddr) {
        let receiver = Self::default();
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, addr)
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits for the span `name` with these attributes.
    async fn wait_span(&self, name: &str, attributes: &[(&str, &str)]) -> Got {
        wait_until(
            Duration::from_secs(40),
            &format!("span {name} with {attributes:?}"),
            || async {
                self.spans().into_iter().find(|s| {
                    s.name == name
                        && attributes
                            .iter()
                            .all(|(k, v)| s.attributes.get(*k).map(String::as_str) == Some(*v))
                })
            },
        )
        .await
    }

    /// Waits for the `consumer.apply` span that applied the order's timeout
    /// (a delivery that came early has a span of its own, `held`).
    async fn applied(&self, id: &str) -> Got {
        let attributes = [("order.id", id), ("timeout.outcome", "applied")];
        self.wait_span("consumer.apply", &attributes).await
    }

    /// Waits for the `relay.publish` span of the order's `cancelled` event.
    async fn cancel_published(&self, id: &str) -> Got {
        let attributes = [("order.id", id), ("message.name", "cancelled")];
        self.wait_span("relay.publish", &attributes).await
    }
}

/// The receiver's handler: decodes the protobuf body as a collector does.
async fn receive(State(receiver): State<Receiver>, body: Bytes) -> Vec<u8> {
    receiver.requests.fetch_add(1, Ordering::SeqCst);
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut got = receiver.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                got.push(read(&service, span));
            }
        }
    }
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

fn read(service: &str, span: Span) -> Got {
    Got {
        service: service.to_string(),
        name: span.name,
        trace: hex(&span.trace_id),
        id: hex(&span.span_id),
        parent: hex(&span.parent_span_id),
        attributes: span
            .attributes
            .into_iter()
            .map(|kv| {
                (
                    kv.key,
                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                )
            })
            .collect(),
    }
}

fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `serve` child on `fresh`'s settings with these changes, ready.
async fn serve(fresh: &Fresh, env: &[(&str, String)]) -> (Process, Api) {
    let serve = Serve::new(BIN)
        .envs(fresh.env.clone())
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .instance(format!("traced-{}", fresh.vhost))
        .log(std::env::temp_dir().join(format!("{}.log", fresh.vhost)));
    let mut child = serve.start().expect("serve starts");
    child
        .wait_ready(&fresh.http, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let api = fresh.api(&child);
    (child, api)
}

/// A queue of the test's bound to every domain event.
async fn event_queue(fresh: &Fresh) -> (Connection, Channel, String) {
    let conn = Connection::connect(&fresh.amqp_url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let queue = format!("test-events-{}", fresh.vhost);
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            Names::new("order.timeouts").events().as_str().into(),
            "order.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (conn, channel, queue)
}

/// The next message of `queue`, acked: its body, and its `traceparent` and
/// `tracestate` headers (`None` when it has none); `None` when none waits.
async fn next_event(
    channel: &Channel,
    queue: &str,
) -> Option<(serde_json::Value, Option<String>, Option<String>)> {
    let msg = channel
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .unwrap()?;
    msg.delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
    let body = serde_json::from_slice(&msg.delivery.data).unwrap();
    let headers = msg.delivery.properties.headers().as_ref();
    Some((
        body,
        wire::header_text(headers, "traceparent"),
        wire::header_text(headers, "tracestate"),
    ))
}

/// The `traceparent` header of the event `event` of order `id`, waiting for
/// the message; `None` when it has none. Messages after it stay queued.
async fn event_traceparent(
    channel: &Channel,
    queue: &str,
    id: &str,
    event: &str,
) -> Option<String> {
    wait_until(
        Duration::from_secs(30),
        &format!("order.{event} of {id}"),
        || async {
            while let Some((body, parent, _)) = next_event(channel, queue).await {
                if body["order_id"] == id && body["event"] == event {
                    return Some(parent);
                }
            }
            None
        },
    )
    .await
}

/// The `traceparent` and `tracestate` headers of the `cancelled` event of
/// each of `ids`, waiting for the messages (in whatever order they come).
async fn cancel_traces(
    channel: &Channel,
    queue: &str,
    ids: &[&str],
) -> HashMap<String, (String, String)> {
    let found = Mutex::new(HashMap::new());
    wait_until(Duration::from_secs(30), "the cancelled events", || {
        let found = &found;
        async move {
            while let Some((body, parent, state)) = next_event(channel, queue).await {
                if body["event"] == "cancelled" {
                    let id = body["order_id"].as_str().unwrap_or_default().to_string();
                    found
                        .lock()
                        .unwrap()
                        .insert(id, (parent.unwrap_or_default(), state.unwrap_or_default()));
                }
            }
            let found = found.lock().unwrap();
            ids.iter().all(|id| found.contains_key(*id)).then_some(())
        }
    })
    .await;
    found.into_inner().unwrap()
}

/// Publishes a payment timeout for `id` on the entry exchange, as a shop's
/// publisher does, with `traceparent` when given.
async fn shop_publishes(fresh: &Fresh, id: &str, delay_ms: i64, traceparent: Option<&str>) {
    let conn = Connection::connect(&fresh.amqp_url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = delay(delay_ms);
    if let Some(traceparent) = traceparent {
        headers.insert(
            "traceparent".into(),
            AMQPValue::LongString(traceparent.into()),
        );
        headers.insert("tracestate".into(), AMQPValue::LongString("shop=7".into()));
    }
    let body = json!({ "order_id": id, "kind": "payment" }).to_string();
    order_timeout::amqp::publish_confirmed(
        &channel,
        "order.timeouts",
        "payment",
        body.as_bytes(),
        contract_properties(headers),
    )
    .await
    .expect("published and confirmed");
    conn.close(200, "done".into()).await.ok();
}

async fn admin_post(api: &Api, path: &str) {
    let resp = api
        .http
        .post(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
}

/// Both chains, in one service: a shop's timeout with its own
/// `traceparent` (and one with a malformed one), then a checkout whose own
/// timeout cancels it.
async fn traced_across_the_broker(backend: Backend, mode: DelayMode) {
    let (receiver, addr) = Receiver::start().await;
    let fresh = fresh(Spawn::new(backend, mode)).await;
    let service = format!("ot-traced-{}", mode.as_str());
    let (mut child, api) = serve(
        &fresh,
        &[
            (
                "ORDER_TIMEOUT__TRACING__OTLP_ENDPOINT",
                format!("http://{addr}"),
            ),
            ("ORDER_TIMEOUT__TRACING__SERVICE_NAME", service.clone()),
            // Batches go out each second, not each five.
            ("OTEL_BSP_SCHEDULE_DELAY", "1000".to_string()),
            // Each order applied by its own message, not by a catch-up
            // round after another's (a catch-up reads the database, not a
            // message: its transitions start no trace, see operations.md).
            ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false".to_string()),
        ],
    )
    .await;
    let (_events_conn, events, queue) = event_queue(&fresh).await;
    api.put_stock("TRACE-A", 100).await;

    // The shop's timeouts: the service's own for these orders are taken
    // out of the outbox while the relay is paused, so that the shop's
    // messages are the ones that cancel them.
    admin_post(&api, "/admin/pause/relay").await;
    let shop_order = api.order(&[("TRACE-A", 1)], "3s").await;
    let bad_order = api.order(&[("TRACE-A", 1)], "3s").await;
    let db = sea_orm::Database::connect(fresh.database_url())
        .await
        .unwrap();
    sea_orm::ConnectionTrait::execute_unprepared(
        &db,
        &format!("DELETE FROM outbox WHERE order_id IN ({shop_order}, {bad_order})"),
    )
    .await
    .unwrap();
    db.close().await.ok();
    admin_post(&api, "/admin/resume/relay").await;
    let shop_parent = format!("00-{SHOP_TRACE}-{SHOP_SPAN}-01");
    shop_publishes(&fresh, &shop_order, 3000, Some(&shop_parent)).await;
    shop_publishes(&fresh, &bad_order, 3000, Some("00-not-a-trace-01")).await;
    for id in [&shop_order, &bad_order] {
        api.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }

    // shop → router.validate → consumer.apply → relay.publish (cancelled).
    let apply = receiver.applied(&shop_order).await;
    assert_eq!(apply.service, service);
    assert_eq!(apply.trace, SHOP_TRACE, "{apply:?}");
    assert_eq!(apply.attributes["timeout.kind"], "payment");
    assert_eq!(apply.attributes["timeout.cause"], "timeout");
    assert_eq!(apply.attributes["timeout.outcome"], "applied");
    let late: i64 = apply.attributes["timeout.lateness_ms"].parse().unwrap();
    assert!((0..10_000).contains(&late), "lateness {late} ms");
    let spans = receiver.spans();
    let router = spans
        .iter()
        .find(|s| s.id == apply.parent)
        .unwrap_or_else(|| panic!("the apply's parent among {spans:#?}"));
    assert_eq!(router.name, "router.validate");
    assert_eq!(router.trace, SHOP_TRACE);
    assert_eq!(
        router.parent, SHOP_SPAN,
        "the shop's span is the router's parent"
    );
    assert_eq!(router.attributes["timeout.kind"], "payment");
    let cancelled = receiver.cancel_published(&shop_order).await;
    assert_eq!(cancelled.trace, SHOP_TRACE);
    assert_eq!(
        cancelled.parent, apply.id,
        "the apply span is the event publish's parent"
    );
    // The event carries the publish span's context on.
    let header = event_traceparent(&events, &queue, &shop_order, "cancelled").await;
    assert_eq!(
        header.as_deref(),
        Some(format!("00-{SHOP_TRACE}-{}-01", cancelled.id).as_str())
    );

    // A malformed traceparent: the order is cancelled all the same, in a
    // trace of its own, and nothing was parked.
    let bad = receiver.applied(&bad_order).await;
    let bad_router = receiver
        .spans()
        .into_iter()
        .find(|s| s.id == bad.parent)
        .expect("the malformed message's router span");
    assert_eq!(
        bad_router.parent, "",
        "a malformed traceparent is no parent"
    );
    assert_ne!(bad_router.trace, SHOP_TRACE);
    let handled = "order_timeout_timeouts_handled_total";
    let applied = api.metric(handled, &["outcome=\"applied\""]).await;
    assert_eq!(applied, 2.0, "both shop timeouts applied");
    assert_eq!(api.metric(handled, &["outcome=\"parked\""]).await, 0.0);
    let parked = api.metric("order_timeout_parked_messages_total", &[]).await;
    assert_eq!(parked, 0.0, "nothing parked");

    // A checkout, called inside a storefront's trace, reaches its cancel:
    // checkout → relay.publish (outbox, straight into the delay stage) →
    // consumer.apply → relay.publish (cancelled).
    let resp = api
        .http
        .post(format!("{}/orders", api.base))
        .header("traceparent", format!("00-{STORE_TRACE}-{STORE_SPAN}-01"))
        .json(&json!({ "items": [{ "sku": "TRACE-A", "quantity": 1 }], "payment_window": "2s" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let order: serde_json::Value = resp.json().await.unwrap();
    let id = order["id"].as_str().unwrap().to_string();
    api.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    let checkout = receiver.wait_span("checkout", &[("order.id", &id)]).await;
    assert_eq!(checkout.trace, STORE_TRACE);
    assert_eq!(
        checkout.parent, STORE_SPAN,
        "the storefront's span is the checkout's parent"
    );
    assert_eq!(checkout.attributes["http.response.status_code"], "201");
    let apply = receiver.applied(&id).await;
    assert_eq!(
        apply.trace, STORE_TRACE,
        "the checkout's trace reaches the cancel"
    );
    assert_eq!(apply.attributes["timeout.kind"], "payment");
    let spans = receiver.spans();
    let published = spans
        .iter()
        .find(|s| s.id == apply.parent)
        .unwrap_or_else(|| panic!("the apply's parent among {spans:#?}"));
    assert_eq!(published.name, "relay.publish");
    assert_eq!(published.attributes["outbox"], "outbox");
    assert_eq!(published.attributes["message.name"], "payment");
    assert_eq!(
        published.parent, checkout.id,
        "the checkout is the timeout publish's parent"
    );
    // The created event, told in the checkout's transaction, is in its trace too.
    let created = receiver
        .wait_span(
            "relay.publish",
            &[("order.id", &id), ("message.name", "created")],
        )
        .await;
    assert_eq!(created.parent, checkout.id);
    let cancelled = receiver.cancel_published(&id).await;
    assert_eq!(cancelled.parent, apply.id);
    assert_eq!(cancelled.trace, STORE_TRACE);

    child.stop();
}

/// Tracing off: the exporter's own environment variables point at a
/// receiver, yet nothing is sent, and no message gets a trace header that
/// its publisher did not give it.
async fn off_sends_nothing(backend: Backend, mode: DelayMode) {
    let (receiver, addr) = Receiver::start().await;
    let fresh = fresh(Spawn::new(backend, mode)).await;
    let (mut child, api) = serve(
        &fresh,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("http://{addr}/v1/traces"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
        ],
    )
    .await;
    let (_events_conn, events, queue) = event_queue(&fresh).await;
    api.put_stock("TRACE-B", 10).await;
    let resp = api
        .http
        .post(format!("{}/orders", api.base))
        .header("traceparent", format!("00-{STORE_TRACE}-{STORE_SPAN}-01"))
        .json(&json!({ "items": [{ "sku": "TRACE-B", "quantity": 1 }], "payment_window": "1s" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let id = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    assert_eq!(
        event_traceparent(&events, &queue, &id, "created").await,
        None
    );
    assert_eq!(
        event_traceparent(&events, &queue, &id, "cancelled").await,
        None
    );
    // Past several batch intervals, and through the SIGTERM drain.
    tokio::time::sleep(Duration::from_secs(2)).await;
    child.stop();
    assert_eq!(
        receiver.requests.load(Ordering::SeqCst),
        0,
        "export requests with tracing off"
    );
}

/// Issue 42: a W3C `tracestate` of 30 members, 1,339 characters, longer than the 1,024 the stored context's column holds.
/// Published with pika by the Python example, its timeout still cancels the
/// order (on PostgreSQL, and MariaDB in strict mode, where a longer value is
/// refused rather than cut); a checkout carrying it answers 201. What is kept
/// is the `traceparent` and the leading members that fit, each whole.
async fn a_long_tracestate_is_cut_to_fit(backend: Backend, mode: DelayMode) {
    let Some(python) = crate::examples::python() else {
        return crate::examples::missing("python with pika");
    };
    let (_receiver, addr) = Receiver::start().await;
    let fresh = fresh(Spawn::new(backend, mode)).await;
    let (mut child, api) = serve(
        &fresh,
        &[
            (
                "ORDER_TIMEOUT__TRACING__OTLP_ENDPOINT",
                format!("http://{addr}"),
            ),
            ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false".to_string()),
        ],
    )
    .await;
    // W3C allows printable ASCII only in a member's value.
    let members: Vec<String> = (0..30)
        .map(|i| format!("vendor{i:02}={}", "s".repeat(if i < 20 { 35 } else { 34 })))
        .collect();
    let state = members.join(",");
    assert_eq!(state.chars().count(), 1_339);
    let (_events_conn, events, queue) = event_queue(&fresh).await;
    api.put_stock("TRACE-L", 10).await;
    admin_post(&api, "/admin/pause/relay").await;
    let shop_order = api.order(&[("TRACE-L", 1)], "3s").await;
    let db = sea_orm::Database::connect(fresh.database_url())
        .await
        .unwrap();
    sea_orm::ConnectionTrait::execute_unprepared(
        &db,
        &format!("DELETE FROM outbox WHERE order_id = {shop_order}"),
    )
    .await
    .unwrap();
    admin_post(&api, "/admin/resume/relay").await;
    let out = std::process::Command::new(&python)
        .arg(repo_path("rabbitmq/examples/python/publish_timeout.py"))
        .args(["--url", &fresh.amqp_url, "--order-id", &shop_order])
        .args(["--delay-ms", "2000"])
        .args(["--traceparent", &format!("00-{SHOP_TRACE}-{SHOP_SPAN}-01")])
        .args(["--tracestate", &state])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    api.wait_status(&shop_order, "cancelled", Duration::from_secs(20))
        .await;
    let parked = api.metric("order_timeout_parked_messages_total", &[]).await;
    assert_eq!(parked, 0.0, "nothing parked");

    let resp = api
        .http
        .post(format!("{}/orders", api.base))
        .header("traceparent", format!("00-{STORE_TRACE}-{STORE_SPAN}-01"))
        .header("tracestate", &state)
        .json(&json!({ "items": [{ "sku": "TRACE-L", "quantity": 1 }], "payment_window": "1s" }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        201,
        "a checkout carrying the long tracestate"
    );
    let id = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;

    // The cancelled events carry on what was kept with them: in the
    // shop's trace and in the storefront's, the leading members, each whole.
    let traces = cancel_traces(&events, &queue, &[&shop_order, &id]).await;
    for (id, trace) in [(&shop_order, SHOP_TRACE), (&id, STORE_TRACE)] {
        let (parent, kept) = &traces[id.as_str()];
        assert!(parent.starts_with(&format!("00-{trace}-")), "{parent}");
        let kept: Vec<&str> = kept.split(',').collect();
        assert!(kept.len() >= 20, "{} members kept", kept.len());
        assert_eq!(
            kept,
            members[..kept.len()]
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
        assert!(parent.len() + 1 + kept.join(",").len() <= 1024);
    }
    db.close().await.ok();
    child.stop();
}

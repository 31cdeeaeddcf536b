//! One order's whole story (`GET /admin/orders/{id}`, `ctl order`): an owned
//! order cancelled by its timeout, a paid one waiting for its fulfillment
//! timeout with a timeout of it parked, a mapped order on PostgreSQL; the
//! parked queue read without losing or reordering anything; 400, 404 and the
//! admin scope.

use std::time::Duration;

use lapin::types::FieldTable;
use serde_json::{Value, json};

use crate::control::ctl;
use crate::helpers::*;
use crate::mapped::{Mall, Shop, mall_mapping, mall_schema};

each_mode!(owned_orders_tell_their_story);
each_mode!(a_parked_queue_that_cannot_be_read_is_said_so);

/// A shop's table on PostgreSQL in both delay modes, and on MariaDB.
mod mapped_story {
    use crate::helpers::{Backend, DelayMode, run};
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ttl() {
        run(Backend::Postgres, DelayMode::Ttl, super::mapped_story).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_plugin() {
        run(Backend::Postgres, DelayMode::Plugin, super::mapped_story).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_ttl() {
        run(Backend::MariaDb, DelayMode::Ttl, super::mapped_story).await
    }
}

/// The story of `id`, which must be a 200.
async fn story(app: &TestApp, id: &str) -> Value {
    let response = app
        .http
        .get(format!("{}/admin/orders/{id}", app.base))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// The story of `id` once every event of it is published (the relay runs
/// after the commit).
async fn published_story(app: &TestApp, id: &str) -> Value {
    let what = format!("every event of order {id} published");
    wait_until(Duration::from_secs(15), &what, || async {
        let body = story(app, id).await;
        let events = body["events"].as_array().cloned().unwrap_or_default();
        (!events.is_empty() && events.iter().all(|e| e["state"] == "published")).then_some(body)
    })
    .await
}

/// Milliseconds of an RFC 3339 time.
fn at(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}")))
        .unwrap()
        .timestamp_millis()
}

async fn owned_orders_tell_their_story(backend: Backend, mode: DelayMode) {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(backend, mode).env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
    )
    .await;
    let instance = app.ctx.settings.amqp.instance.clone();
    let parked_queue = app.names.parked();
    app.put_stock("A", 10).await;
    let cancelled = app.order(&[("A", 2)], "1s").await;
    let paid = app.order(&[("A", 1)], "60s").await;
    let (status, body) = app.post(&paid, "pay").await;
    assert_eq!(status, 200, "{body}");
    // A timeout of the paid order that the router parks (an x-delay out of
    // range), and one of another order after it: the story must leave both
    // in the parked queue, in this order.
    let bad = json!({"order_id": paid, "kind": "fulfillment"}).to_string();
    app.publish_raw("fulfillment", delay(-5), bad.as_bytes())
        .await;
    let other = json!({"order_id": "777777", "kind": "payment"}).to_string();
    app.publish_raw("payment", FieldTable::default(), other.as_bytes())
        .await;
    wait_until(Duration::from_secs(10), "two messages parked", || async {
        (app.queue_depth(&parked_queue).await == 2).then_some(())
    })
    .await;
    app.cancelled_on_time(&cancelled, Duration::from_secs(10))
        .await;

    // Cancelled by its timeout: the transition says by what, how late and
    // where; its event was published; nothing waits; nothing parked.
    let body = published_story(&app, &cancelled).await;
    assert_eq!(body["id"], cancelled.as_str(), "{body}");
    assert_eq!(body["source"], "owned", "{body}");
    assert_eq!(body["status"], "cancelled", "{body}");
    assert!(body.get("status_raw").is_none(), "{body}");
    let now = at(&body["now"]);
    let deadlines = body["deadlines"].as_array().unwrap();
    assert_eq!(deadlines.len(), 1, "only payment applies: {body}");
    assert_eq!(deadlines[0]["kind"], "payment");
    assert_eq!(deadlines[0]["passed"], true);
    assert!(at(&deadlines[0]["at"]) <= now, "{body}");
    let transitions = body["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), 2, "{body}");
    assert_eq!(transitions[0]["event"], "created");
    assert_eq!(transitions[0]["cause"], "buyer");
    assert_eq!(transitions[0]["from"], Value::Null);
    assert_eq!(transitions[0]["late_ms"], Value::Null);
    let cancel = &transitions[1];
    assert_eq!(cancel["event"], "cancelled", "{body}");
    assert_eq!(cancel["from"], "pending_payment");
    assert_eq!(cancel["to"], "cancelled");
    assert_eq!(cancel["cause"], "timeout", "{body}");
    assert_eq!(cancel["kind"], "payment");
    assert_eq!(cancel["instance"], instance.as_str(), "{body}");
    let late = cancel["late_ms"].as_i64().expect("late_ms recorded");
    // Never early, and the lateness is the audit's time minus the deadline.
    assert!(late >= 0, "{body}");
    assert_eq!(late, at(&cancel["at"]) - at(&deadlines[0]["at"]), "{body}");
    let events = event_states(&body);
    assert_eq!(
        events,
        [
            ("order.created", "published"),
            ("order.cancelled", "published")
        ]
    );
    assert_eq!(body["waiting"], json!([]), "{body}");
    assert_eq!(body["parked_checked"], true, "{body}");
    assert_eq!(body["parked"], json!([]), "{body}");
    assert_eq!(body["parked_complete"], true, "{body}");
    assert_eq!(body["parked_read"], 2, "{body}");

    // Paid: waiting for its fulfillment timeout, by the database; its
    // parked timeout shown with the router's reason.
    let body = story(&app, &paid).await;
    assert_eq!(body["status"], "paid", "{body}");
    let kinds: Vec<&str> = body["deadlines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["payment", "fulfillment"], "{body}");
    assert!(
        body["deadlines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["passed"] == false),
        "{body}"
    );
    let waiting = body["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{body}");
    assert_eq!(waiting[0]["kind"], "fulfillment");
    let due_in = waiting[0]["due_in_ms"].as_i64().unwrap();
    // The default fulfillment window is 7 days.
    assert!(
        (6 * 86_400_000..=7 * 86_400_000).contains(&due_in),
        "{body}"
    );
    assert_eq!(due_in, at(&waiting[0]["due_at"]) - at(&body["now"]));
    let events: Vec<&str> = body["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["created", "paid"], "{body}");
    let parked = body["parked"].as_array().unwrap();
    assert_eq!(parked.len(), 1, "{body}");
    assert_eq!(parked[0]["kind"], "fulfillment");
    assert_eq!(parked[0]["reason"], "invalid_delay", "{body}");
    assert_eq!(parked[0]["queue"], parked_queue.as_str());
    assert!(parked[0]["at"].is_string(), "{body}");

    // Reading the parked queue took nothing and moved nothing.
    let drained = app.drain_parked().await;
    let bodies: Vec<String> = drained
        .iter()
        .map(|(_, _, body)| String::from_utf8_lossy(body).into_owned())
        .collect();
    assert_eq!(bodies, [bad.clone(), other.clone()]);
    assert_eq!(drained[0].0, "invalid_delay");
    assert_eq!(drained[1].0, "missing_delay");

    // An id the service's orders cannot have; one no order has.
    let get = |id: &str, token: Option<&str>| {
        let client = api_client(token);
        let url = format!("{}/admin/orders/{id}", app.base);
        async move {
            let response = client.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let admin = app.token.as_deref();
    let (status, body) = get("abc", admin).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("owns the orders"),
        "{body}"
    );
    let (status, body) = get("999999", admin).await;
    assert_eq!(
        (status, body),
        (404, json!({"error": "order '999999' not found"}))
    );
    // The admin scope: a checkout token is refused, no token too.
    let (status, body) = get(&paid, Some(&checkout)).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = get(&paid, None).await;
    assert_eq!(status, 401, "{body}");

    // `ctl order`: a line per transition, for people; --json as it is.
    let (out, err, ok) = ctl(&app, &["order", &cancelled]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with(&format!("order {cancelled} (owned)  cancelled\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "pending_payment -> cancelled  by timeout (payment), {late} ms after the deadline, on {instance}"
        )),
        "{out}"
    );
    assert!(out.contains("order.cancelled"), "{out}");
    assert!(out.contains("waiting: no timeout ahead"), "{out}");
    let (out, err, ok) = ctl(&app, &["--json", "order", &paid]);
    assert!(ok, "{out}{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["status"], "paid");
    // The parked queue was drained above.
    assert_eq!(json["parked"], json!([]));
    let (out, err, ok) = ctl(&app, &["order", "999999"]);
    assert!(!ok, "{out}");
    assert!(err.contains("404 order '999999' not found"), "{err}");

    // While the relay is paused, a buyer's cancel and its events wait in the
    // event outbox: pending, each matched to its own transition.
    let (out, err, ok) = ctl(&app, &["pause", "relay"]);
    assert!(ok, "{out}{err}");
    let buyer = app.order(&[("A", 1)], "60s").await;
    let (status, body) = app.post(&buyer, "cancel").await;
    assert_eq!(status, 200, "{body}");
    let body = story(&app, &buyer).await;
    let events = event_states(&body);
    assert_eq!(
        events,
        [("order.created", "pending"), ("order.cancelled", "pending")],
        "{body}"
    );
    assert_eq!(body["transitions"][1]["cause"], "buyer", "{body}");
    assert_eq!(body["transitions"][1]["late_ms"], Value::Null, "{body}");
    assert_eq!(body["waiting"], json!([]), "{body}");
    let (out, err, ok) = ctl(&app, &["resume", "relay"]);
    assert!(ok, "{out}{err}");
    published_story(&app, &buyer).await;
}

async fn mapped_story(backend: Backend, mode: DelayMode) {
    let spawn = Spawn::new(backend, mode).setup(&mall_schema(backend));
    let app = spawn_app(mall_mapping(spawn, false)).await;
    let instance = app.ctx.settings.amqp.instance.clone();
    let shop = Shop::open(&app, backend).await;
    let mall = Mall {
        shop: &shop,
        text_ids: false,
    };
    // Order 1 is cancelled by its timeout; order 2 waits for its own.
    mall.checkout(1).await;
    app.publish_timeout("1", "payment", 3_000).await;
    mall.wait_status(1, "4", Duration::from_secs(20)).await;
    mall.checkout(2).await;

    let body = story(&app, "2").await;
    assert_eq!(body["source"], "mapped", "{body}");
    assert_eq!(body["status"], "pending_payment", "{body}");
    assert_eq!(body["status_raw"], "0", "{body}");
    let waiting = body["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{body}");
    assert_eq!(waiting[0]["kind"], "payment");
    // The mall's window is 3 s, its columns whole seconds.
    let due_in = waiting[0]["due_in_ms"].as_i64().unwrap();
    assert!((0..=4_000).contains(&due_in), "{body}");
    assert_eq!(body["transitions"], json!([]), "{body}");

    let body = published_story(&app, "1").await;
    assert_eq!(body["status"], "cancelled", "{body}");
    assert_eq!(body["status_raw"], "4", "{body}");
    let deadlines = body["deadlines"].as_array().unwrap();
    // Receipt is reckoned from `delivery_time`, null for an unshipped order.
    assert_eq!(deadlines.len(), 1, "{body}");
    assert_eq!(deadlines[0]["kind"], "payment");
    assert_eq!(deadlines[0]["passed"], true);
    let transitions = body["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), 1, "{body}");
    let cancel = &transitions[0];
    assert_eq!(
        (&cancel["event"], &cancel["from"], &cancel["to"]),
        (&json!("cancelled"), &json!("0"), &json!("4")),
        "{body}"
    );
    assert_eq!(cancel["cause"], "timeout");
    assert_eq!(cancel["kind"], "payment");
    assert_eq!(cancel["instance"], instance.as_str());
    assert!(cancel["late_ms"].as_i64().expect("late_ms") >= 0, "{body}");
    assert_eq!(body["events"][0]["event"], "order.cancelled", "{body}");
    assert_eq!(body["waiting"], json!([]));
    assert_eq!(body["parked_checked"], true, "{body}");

    // The id column is an integer.
    let response = app
        .http
        .get(format!("{}/admin/orders/abc", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let response = app
        .http
        .get(format!("{}/admin/orders/424242", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
}

/// With the management API off, or a parked queue of the quorum type (which
/// a read would change), the story is told without the parked queue, saying
/// why.
async fn a_parked_queue_that_cannot_be_read_is_said_so(backend: Backend, mode: DelayMode) {
    for (key, value, why) in [
        (
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            "off",
            "amqp.management_url = off",
        ),
        (
            "ORDER_TIMEOUT__AMQP__QUEUE_TYPE",
            "quorum",
            "is a quorum queue",
        ),
    ] {
        let app = spawn_app(Spawn::new(backend, mode).env(key, value)).await;
        app.put_stock("A", 1).await;
        let id = app.order(&[("A", 1)], "60s").await;
        let body = story(&app, &id).await;
        assert_eq!(body["parked_checked"], false, "{body}");
        assert!(
            body["parked_error"].as_str().unwrap().contains(why),
            "{key}: {body}"
        );
        assert_eq!(body["parked_complete"], false, "{body}");
        // The rest is told all the same.
        assert_eq!(body["status"], "pending_payment", "{body}");
        assert_eq!(body["waiting"][0]["kind"], "payment", "{body}");
        let (out, err, ok) = ctl(&app, &["order", &id]);
        assert!(ok, "{out}{err}");
        assert!(out.contains("parked: not checked ("), "{out}");
    }
}

/// Each domain event of a story with its state: `(event, state)`, in order.
fn event_states(body: &Value) -> Vec<(&str, &str)> {
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["event"].as_str().unwrap(), e["state"].as_str().unwrap()))
        .collect()
}

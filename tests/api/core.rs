//! The core promises of issue 2, each run once in every delay mode (TTL on
//! SQLite, plugin on PostgreSQL or MariaDB, native on PostgreSQL).

use std::time::Duration;

use lapin::types::FieldTable;
use serde_json::json;

use crate::helpers::*;

each_mode!(unpaid_is_cancelled_paid_stays, MariaDb);
each_mode!(duplicates_change_nothing);
each_mode!(early_message_never_cancels_early);
each_mode!(reverse_order_delays);
each_mode!(bad_messages_are_parked);

async fn unpaid_is_cancelled_paid_stays(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 10).await;
    app.put_stock("B", 5).await;
    let unpaid = app.order(&[("A", 2), ("B", 1)], "2s").await;
    let paid = app.order(&[("A", 3)], "2s").await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 5, "reserved": 5, "sold": 0})
    );

    let (status, body) = app.post(&paid, "pay").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "paid");

    app.cancelled_on_time(&unpaid, Duration::from_secs(8)).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 7, "reserved": 0, "sold": 3})
    );
    assert_eq!(
        app.stock("B").await,
        json!({"sku": "B", "available": 5, "reserved": 0, "sold": 0})
    );

    // The paid order's timeout fires too, and changes nothing.
    wait_until(
        Duration::from_secs(5),
        "the paid order's timeout handled",
        || async {
            (app.metric(
                "order_timeout_timeouts_handled_total",
                &["kind=\"payment\"", "outcome=\"not_applicable\""],
            )
            .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    let still = app.get_order(&paid).await;
    assert_eq!(still["status"], "paid");
    assert_eq!(app.stock("A").await["sold"], 3);

    // Paying the cancelled order is refused, naming the status, and recorded
    // as a late payment (a refund is due) once, however often it is retried.
    for _ in 0..3 {
        let (status, body) = app.post(&unpaid, "pay").await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["status"], "cancelled");
    }
    let order = app.order_with_audit(&unpaid).await;
    let late: Vec<&serde_json::Value> = order["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "late_payment")
        .collect();
    assert_eq!(late.len(), 1, "{order}");
    assert!(
        late[0]["detail"].as_str().unwrap().contains("refund"),
        "{order}"
    );
    assert!(order["late_payment_at"].is_string(), "{order}");
    assert_eq!(
        app.metric("order_timeout_late_payments_total", &[]).await,
        1.0
    );
    assert_eq!(
        app.metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"applied\""]
        )
        .await,
        1.0
    );
}

async fn duplicates_change_nothing(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 10).await;
    let id = app.order(&[("A", 4)], "2s").await;
    // Two more copies of the same timeout: three deliveries in all.
    app.publish_timeout(&id, "payment", 2000).await;
    app.publish_timeout(&id, "payment", 2000).await;
    let handled = || async {
        app.metric(
            "order_timeout_timeouts_handled_total",
            &["kind=\"payment\"", "outcome=\"applied\""],
        )
        .await
            + app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\"", "outcome=\"not_applicable\""],
                )
                .await
    };
    wait_until(
        Duration::from_secs(10),
        "three deliveries handled",
        || async { (handled().await >= 3.0).then_some(()) },
    )
    .await;
    let order = app.get_order(&id).await;
    assert_eq!(order["status"], "cancelled");
    assert_eq!(order["version"], 1, "one transition only: {order}");
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 10, "reserved": 0, "sold": 0})
    );
    assert_eq!(
        app.metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"applied\""]
        )
        .await,
        1.0
    );

    // And once more, long after: still nothing.
    app.publish_timeout(&id, "payment", 1).await;
    wait_until(
        Duration::from_secs(10),
        "fourth delivery handled",
        || async { (handled().await >= 4.0).then_some(()) },
    )
    .await;
    assert_eq!(app.get_order(&id).await["version"], 1);
    assert_eq!(app.stock("A").await["available"], 10);
}

async fn early_message_never_cancels_early(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 3).await;
    let id = app.order(&[("A", 1)], "4s").await;
    // A timeout that claims the order is due in 300 ms: wrong, the database says 4 s.
    app.publish_timeout(&id, "payment", 300).await;
    wait_until(Duration::from_secs(5), "the early message seen", || async {
        (app.metric(
            "order_timeout_timeouts_handled_total",
            &["outcome=\"not_yet_due\""],
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(app.get_order(&id).await["status"], "pending_payment");
    app.cancelled_on_time(&id, Duration::from_secs(10)).await;
    assert_eq!(app.stock("A").await["available"], 3);
}

async fn reverse_order_delays(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 10).await;
    // Long enough to sit in a TTL level ahead of the short one (8 s and
    // 2 s levels) and still be pending when the short one is cancelled.
    let long = app.order(&[("A", 1)], "10s").await;
    let short = app.order(&[("A", 1)], "1s").await;
    app.cancelled_on_time(&short, Duration::from_secs(5)).await;
    assert_eq!(app.get_order(&long).await["status"], "pending_payment");
    app.cancelled_on_time(&long, Duration::from_secs(20)).await;
    assert_eq!(app.stock("A").await["available"], 10);
}

/// Everything that breaks the contract is parked with its reason when it is
/// published, before any delay, in both modes: the bad messages carry a
/// 60 s `x-delay` where they carry a valid one, yet they are parked within
/// seconds, and nothing of theirs waits in the delay stage (the plugin never
/// sees them). An unknown order is parked by the consumer, once due.
async fn bad_messages_are_parked(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    let body = json!({"order_id": "123", "kind": "payment"}).to_string();
    let header = |value: lapin::types::AMQPValue| {
        let mut t = FieldTable::default();
        t.insert("x-delay".into(), value);
        t
    };
    app.publish_raw("payment", delay(60_000), b"{not json")
        .await;
    app.publish_raw("refund", delay(60_000), br#"{"order_id":"123"}"#)
        .await;
    app.publish_raw("payment", FieldTable::default(), body.as_bytes())
        .await;
    app.publish_raw("payment", delay(0), body.as_bytes()).await;
    app.publish_raw("payment", delay(-5), body.as_bytes()).await;
    app.publish_raw("payment", delay(4_294_967_296), body.as_bytes())
        .await;
    app.publish_raw(
        "payment",
        header(lapin::types::AMQPValue::LongString("60000".into())),
        body.as_bytes(),
    )
    .await;
    app.publish_raw(
        "payment",
        header(lapin::types::AMQPValue::Double(60000.5)),
        body.as_bytes(),
    )
    .await;
    app.publish_timeout("999999", "payment", 100).await;
    let mut expected: Vec<String> = [
        "invalid_body",
        "unknown_kind",
        "missing_delay",
        "invalid_delay",
        "invalid_delay",
        "invalid_delay",
        "invalid_delay",
        "invalid_delay",
        "unknown_order",
    ]
    .map(String::from)
    .to_vec();
    let parked = app.names.parked();
    wait_until(
        Duration::from_secs(10),
        "every bad message parked",
        || async { (app.queue_depth(&parked).await as usize >= expected.len()).then_some(()) },
    )
    .await;
    let mut got: Vec<String> = app
        .drain_parked()
        .await
        .into_iter()
        .map(|(reason, detail, _)| {
            assert!(!detail.is_empty(), "a parked message says why");
            reason
        })
        .collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    // Nothing of theirs waits in the delay stage.
    assert_eq!(app.stage_timers(mode).await, 0);

    // The service keeps consuming.
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(6))
        .await;
}

/// HTTP input that is wrong gets a clear 4xx and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("A", 2).await;
    app.put_stock("B", 1).await;
    let post = |body: &'static str| {
        let req = app
            .http
            .post(format!("{}/orders", app.base))
            .header("content-type", "application/json")
            .body(body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap();
            assert!(
                body["error"].as_str().is_some_and(|e| !e.is_empty()),
                "error message: {body}"
            );
            status
        }
    };
    assert_eq!(post("{").await, 400);
    assert_eq!(post(r#"{"items": []}"#).await, 422);
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": 0}]}"#).await,
        422
    );
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": -1}]}"#).await,
        422
    );
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": 99999999999}]}"#).await,
        422
    );
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": 1}], "payment_window": "soon"}"#).await,
        422
    );
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": 1}], "payment_window": "60d"}"#).await,
        422
    );
    assert_eq!(
        post(r#"{"items": [{"sku": "NOPE", "quantity": 1}]}"#).await,
        422
    );
    // Short on the second line: nothing reserved on the first either.
    assert_eq!(
        post(r#"{"items": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 2}]}"#).await,
        409
    );
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 2, "reserved": 0, "sold": 0})
    );
    assert_eq!(
        app.stock("B").await,
        json!({"sku": "B", "available": 1, "reserved": 0, "sold": 0})
    );

    let (status, body) = app.post("424242", "pay").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = app.post("not-a-number", "pay").await;
    assert_eq!(status, 404);
    let resp = app
        .http
        .get(format!("{}/orders/1", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = app
        .http
        .delete(format!("{}/orders", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let resp = app
        .http
        .put(format!("{}/inventory/A", app.base))
        .json(&json!({"available": -3}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let big = format!(
        r#"{{"items": [{{"sku": "{}", "quantity": 1}}]}}"#,
        "x".repeat(100_000)
    );
    let resp = app
        .http
        .post(format!("{}/orders", app.base))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        app.metric("order_timeout_orders_created_total", &[]).await,
        0.0
    );
}

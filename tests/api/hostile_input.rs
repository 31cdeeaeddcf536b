//! Hostile input on the AMQP side: garbage bodies, huge bodies, wrong content
//! types and `x-delay` headers of every wrong type are parked with their
//! reason, by the router before any delay or by the consumer, and consumption
//! goes on.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_amqp_input_is_parked_and_consumption_goes_on_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, hostile_amqp_input).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_amqp_input_is_parked_and_consumption_goes_on_plugin() {
    run(Backend::Sqlite, DelayMode::Plugin, hostile_amqp_input).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_amqp_input_is_parked_and_consumption_goes_on_native() {
    run(Backend::Postgres, DelayMode::Native, hostile_amqp_input).await
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

//! How `x-delay` travels. First the publishers: each example of
//! `rabbitmq/examples/` publishes to an exchange of the test's own, and the
//! AMQP type of its `x-delay` is read off the wire with the rest of the
//! contract (rabbitmq/README.md has the table). Then the router: a valid delay
//! in every AMQP integer type is accepted and cancels its order on time; a
//! delay of another type or out of range is parked with a detail naming the
//! problem. (`hostile_input` parks wrong types among other garbage and shows
//! consumption goes on; this module is about what the detail says.)

use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPType, AMQPValue, DecimalValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use order_timeout::amqp::wire::{self, MAX_DELAY_MS};
use serde_json::Value;

use crate::examples::Example;
use crate::helpers::*;

/// The AMQP type of `x-delay` each example sends for a small and for the
/// largest delay (lapin reads `l` and `L` alike as LongLongInt).
fn sends(example: Example) -> [AMQPType; 2] {
    match example {
        // pika: a Python int as a signed 32-bit `I` when it fits, else `l`.
        Example::Python => [AMQPType::LongInt, AMQPType::LongLongInt],
        // amqplib: the smallest signed type that holds the number (`b`, `s`,
        // `I`, then `l`).
        Example::Node => [AMQPType::ShortInt, AMQPType::LongLongInt],
        // The management API: a JSON integer as a signed 64-bit `l`.
        Example::Curl => [AMQPType::LongLongInt, AMQPType::LongLongInt],
        // Pinned to `l` by the example (an int64, a Long, T_INT_LONGLONG).
        Example::Go | Example::Java | Example::Php => {
            [AMQPType::LongLongInt, AMQPType::LongLongInt]
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publisher_sends_an_integer_x_delay() {
    let vhost = Vhost::create().await;
    let conn = Connection::connect(
        &format!("{BROKER}/{}", vhost.name()),
        ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let (exchange, queue) = ("shop.timeouts", "seen");
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_declare(
            queue.into(),
            // Exclusive: RabbitMQ 4.3 refuses a transient queue that is not.
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let mut message_ids = Vec::new();
    for example in Example::ALL {
        let cases = [(2000, "payment"), (MAX_DELAY_MS, "receipt")];
        for ((delay_ms, kind), expected) in cases.into_iter().zip(sends(example)) {
            let Some(mut command) = example.command(vhost.name()) else {
                break;
            };
            // Leading zeros: an id that a JSON number would not keep.
            let order_id = format!("00{delay_ms}");
            let before = chrono::Utc::now().timestamp_millis();
            let out = command
                .args(["--exchange", exchange, "--order-id", &order_id])
                .args(["--kind", kind, "--delay-ms", &delay_ms.to_string()])
                .output()
                .expect("the example runs");
            let after = chrono::Utc::now().timestamp_millis();
            assert!(
                out.status.success(),
                "{example:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            // Everything the example published: it exits once confirmed, so
            // all of it is in the queue by now.
            let mut published = Vec::new();
            while let Some(message) = channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
            {
                published.push(message.delivery);
            }
            let (delivery, retries) = published
                .split_first()
                .unwrap_or_else(|| panic!("{example:?} published nothing"));
            let props = &delivery.properties;
            let what = format!("{example:?} with --delay-ms {delay_ms}: {props:?}");
            let headers = props.headers().as_ref();
            let x_delay = headers
                .and_then(|h| h.inner().get(wire::X_DELAY))
                .unwrap_or_else(|| panic!("no x-delay: {what}"));
            assert_eq!(x_delay.get_type(), expected, "{what}");
            let sent = wire::publish_delay(headers).unwrap_or_else(|e| panic!("{e:?}: {what}"));
            assert_eq!(
                wire::header_int(headers, wire::X_DELAY),
                Some(Ok(sent as i64)),
                "{what}"
            );
            // The Go example works out x-delay from the deadline when it
            // publishes, a few milliseconds after it read --delay-ms: as much
            // or a little less, never more.
            let expected_delay = match example {
                Example::Go => delay_ms.saturating_sub(1000)..=delay_ms,
                _ => delay_ms..=delay_ms,
            };
            assert!(expected_delay.contains(&sent), "x-delay {sent}: {what}");
            assert_eq!(delivery.routing_key.as_str(), kind, "{what}");
            assert_eq!(*props.delivery_mode(), Some(2), "persistent: {what}");
            assert_eq!(
                props.content_type().as_ref().map(|c| c.as_str()),
                Some("application/json"),
                "{what}"
            );
            assert!(props.timestamp().is_some(), "{what}");
            let id = props
                .message_id()
                .as_ref()
                .map(|m| m.to_string())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| panic!("no message_id: {what}"));
            // A publisher that gets no confirm in time publishes again (the Go
            // example after 5 s, as a loaded broker may take): the same
            // message, whose x-delay is the time left then.
            for retry in retries {
                assert!(
                    example == Example::Go,
                    "{example:?} published twice: {:?}",
                    retry.properties
                );
                let again = wire::publish_delay(retry.properties.headers().as_ref())
                    .unwrap_or_else(|e| panic!("{e:?}: {:?}", retry.properties));
                assert_eq!(
                    retry.properties.message_id().as_ref().map(|m| m.as_str()),
                    Some(id.as_str()),
                    "a retry keeps the message_id: {what}"
                );
                assert_eq!(retry.data, delivery.data, "a retry keeps the body: {what}");
                assert!(
                    again <= sent,
                    "a retry's x-delay {again} is the time left: {what}"
                );
                eprintln!("{example:?} published again (x-delay {again}) after no confirm came");
            }
            message_ids.push(id);
            let body: Value = serde_json::from_slice(&delivery.data).unwrap();
            assert_eq!(body["order_id"], Value::String(order_id), "{what}");
            assert_eq!(body["kind"], kind, "{what}");
            let due = chrono::DateTime::parse_from_rfc3339(body["due_at"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("due_at {}: {e}", body["due_at"]))
                .timestamp_millis();
            // The curl script writes whole seconds, rounding both its clock and
            // the deadline down: up to two seconds early. The others, milliseconds.
            let (low, high) = (before + delay_ms as i64 - 2000, after + delay_ms as i64);
            assert!(
                (low..=high).contains(&due),
                "due_at {} is not {delay_ms} ms after publishing: {what}",
                body["due_at"]
            );
        }
    }
    let count = message_ids.len();
    message_ids.sort();
    message_ids.dedup();
    assert_eq!(message_ids.len(), count, "every message_id is new");
    conn.close(200, "done".into()).await.ok();
}

/// A valid delay in each AMQP integer type the router reads, with the largest
/// value the type holds up to 2000 ms.
fn every_integer_type() -> [AMQPValue; 8] {
    [
        AMQPValue::ShortShortInt(127),
        AMQPValue::ShortShortUInt(255),
        AMQPValue::ShortInt(2000),
        AMQPValue::ShortUInt(2000),
        AMQPValue::LongInt(2000),
        AMQPValue::LongUInt(2000),
        AMQPValue::LongLongInt(2000),
        AMQPValue::Timestamp(2000),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_integer_type_of_x_delay_is_accepted_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, accepts_every_integer_type).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_integer_type_of_x_delay_is_accepted_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        accepts_every_integer_type,
    )
    .await
}

/// One order per integer type, each with a 2 s window and one message whose
/// `x-delay` has that type: every order is cancelled on time by its message,
/// nothing is parked. (127 and 255 ms come early; the deadline decides.)
async fn accepts_every_integer_type(backend: Backend, mode: DelayMode) {
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    let values = every_integer_type();
    app.put_stock("A", values.len() as i64).await;
    let mut orders = Vec::new();
    for value in values {
        let id = app.order(&[("A", 1)], "2s").await;
        let mut headers = FieldTable::default();
        headers.insert(wire::X_DELAY.into(), value.clone());
        let body = serde_json::json!({ "order_id": id, "kind": "payment" }).to_string();
        app.publish_raw("payment", headers, body.as_bytes()).await;
        orders.push((id, value));
    }
    for (id, value) in &orders {
        let order = app
            .wait_status(id, "cancelled", Duration::from_secs(8))
            .await;
        assert_on_time(&order, "cancelled_at", "pay_deadline");
        let trail = app.order_with_audit(id).await;
        let last = trail["audit"].as_array().and_then(|a| a.last()).cloned();
        assert_eq!(
            last.as_ref()
                .map(|e| (e["event"].as_str(), e["cause"].as_str())),
            Some((Some("cancelled"), Some("timeout"))),
            "{value:?}: {trail}"
        );
    }
    assert_eq!(app.stock("A").await["available"], orders.len() as i64);
    assert!(app.drain_parked().await.is_empty(), "nothing parked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_integer_type_of_x_delay_is_accepted_native() {
    run(
        Backend::Postgres,
        DelayMode::Native,
        accepts_every_integer_type,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_delay_of_another_type_or_out_of_range_is_parked_saying_why_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, parks_what_is_no_delay).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_delay_of_another_type_or_out_of_range_is_parked_saying_why_plugin() {
    run(Backend::Sqlite, DelayMode::Plugin, parks_what_is_no_delay).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_delay_of_another_type_or_out_of_range_is_parked_saying_why_native() {
    run(Backend::Postgres, DelayMode::Native, parks_what_is_no_delay).await
}

/// Each message is parked by the router before any delay (nothing reaches
/// the delay stage, where the plugin would deliver it at once), with
/// `invalid_delay` and a detail that names what was wrong.
async fn parks_what_is_no_delay(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    let cases = [
        (AMQPValue::LongString("2000".into()), "the string '2000'"),
        (AMQPValue::Float(2000.0), "the float 2000"),
        (AMQPValue::Double(2000.5), "the float 2000.5"),
        (
            AMQPValue::DecimalValue(DecimalValue {
                scale: 1,
                value: 20000,
            }),
            "the decimal 2000.0",
        ),
        (AMQPValue::Boolean(true), "the boolean true"),
        (AMQPValue::Void, "no value"),
        (
            AMQPValue::LongLongInt(MAX_DELAY_MS as i64 + 1),
            "x-delay is 4294967296, the most is 4294967295",
        ),
        (
            AMQPValue::Timestamp(u64::MAX),
            "x-delay is 18446744073709551615",
        ),
        (AMQPValue::LongInt(0), "x-delay is 0, it must be above 0"),
        (
            AMQPValue::ShortShortInt(-1),
            "x-delay is -1, it must be above 0",
        ),
    ];
    for (i, (value, _)) in cases.iter().enumerate() {
        let mut headers = FieldTable::default();
        headers.insert(wire::X_DELAY.into(), value.clone());
        let body = format!(r#"{{"order_id":"{}","kind":"payment"}}"#, i + 1);
        app.publish_raw("payment", headers, body.as_bytes()).await;
    }
    let parked = app.names.parked();
    wait_until(Duration::from_secs(10), "all parked", || async {
        (app.queue_depth(&parked).await as usize >= cases.len()).then_some(())
    })
    .await;
    let mut seen = app.drain_parked().await;
    seen.sort_by_key(|(_, _, body)| {
        serde_json::from_slice::<Value>(body).unwrap()["order_id"]
            .as_str()
            .unwrap()
            .parse::<usize>()
            .unwrap()
    });
    assert_eq!(seen.len(), cases.len());
    for ((reason, detail, _), (value, names)) in seen.iter().zip(&cases) {
        assert_eq!(reason, "invalid_delay", "{value:?}: {detail}");
        assert!(
            detail.contains(names),
            "{value:?}: '{detail}' should say '{names}'"
        );
    }
    assert_eq!(
        app.stage_timers(mode).await,
        0,
        "nothing reached the delay stage"
    );
}

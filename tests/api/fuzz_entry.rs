//! Generated input at the entry exchange, against a real `serve` process:
//! thousands of messages with random headers of every AMQP type (`x-delay`
//! among them: negative, huge, strings, tables), random properties, bodies
//! from empty to a few MiB, invalid UTF-8, deeply nested JSON, and valid
//! timers mixed in. Each is scheduled (waits in the delay stage) or parked
//! with a reason; none is lost; the process stays small; and the messages
//! parked before the flood are still there after it.
//!
//! The generator is seeded and prints its seed: `FUZZ_SEED=<seed>` replays a
//! failure.

use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString};
use order_timeout::amqp::{publish_confirmed, wire};
use order_timeout::domain::TimeoutKind;
use order_timeout_harness::Serve;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");
/// Generated messages, besides the known-bad ones published first.
const MESSAGES: usize = 2000;
/// Resident memory the `serve` process may reach (VmHWM).
const MAX_RSS_KB: u64 = 150 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generated_entry_message_is_scheduled_or_parked() {
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("fuzz_entry seed {seed} (FUZZ_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    // The in-process app only prepares the database and vhost; a real `serve`
    // process does the work, so that its memory is its own.
    let mut app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.stop().await;
    let serve = Serve::new(BIN)
        .envs(app.env.clone())
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
        .instance(format!("fuzz-{}", app.vhost));
    let (child, _api) = start_ready(&app, serve).await;

    let parked = app.names.parked();
    for n in 0..3 {
        app.publish_raw("payment", delay(1000), format!("known-bad-{n}").as_bytes())
            .await;
    }
    wait_until(Duration::from_secs(10), "the known-bad parked", || async {
        (app.queue_depth(&parked).await == 3).then_some(())
    })
    .await;

    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let entry = app.names.entry().to_string();
    let mut valid = 0;
    let mut waiting = 0u64;
    let mut bytes = 0;
    for i in 0..MESSAGES {
        let message = generate(&mut rng, i);
        valid += usize::from(message.valid);
        waiting += u64::from(message.waits);
        bytes += message.body.len();
        publish_confirmed(
            &channel,
            &entry,
            &message.routing_key,
            &message.body,
            message.properties,
        )
        .await
        .unwrap_or_else(|e| panic!("message {i} (seed {seed}) refused by the broker: {e}"));
    }
    conn.close(200, "done".into()).await.ok();
    eprintln!(
        "published {MESSAGES} messages ({valid} valid timers, {} KiB) in {:?}",
        bytes / 1024,
        started.elapsed()
    );

    // Nothing lost: every message waits in the delay stage or in `parked`
    // (a valid timer on a short delay comes due and is parked by the consumer:
    // no order has its id), once ingest and the work queues are empty and
    // only the long timers wait.
    let ingest = app.names.ingest();
    let work: Vec<String> = TimeoutKind::ALL
        .iter()
        .map(|k| app.names.work(*k))
        .collect();
    let (scheduled, parked_count) = wait_until(
        Duration::from_secs(40),
        "every message scheduled or parked",
        || async {
            let mut queues = vec![ingest.clone(), parked.clone()];
            queues.extend(work.iter().cloned());
            let depths = app.queue_depths(&queues).await;
            let moving: u32 = depths[2..].iter().sum::<u32>() + depths[0];
            let scheduled = app.stage_timers(DelayMode::Ttl).await;
            let total = scheduled + u64::from(depths[1]);
            let settled = moving == 0 && scheduled == waiting;
            (settled && total == MESSAGES as u64 + 3).then_some((scheduled, depths[1]))
        },
    )
    .await;
    eprintln!("{scheduled} scheduled, {parked_count} parked");

    // Every parked message says why; the ones parked first are still there.
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    let mut known = Vec::new();
    let mut drained = 0;
    while let Some(msg) = channel
        .basic_get(parked.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        drained += 1;
        let headers = msg.delivery.properties.headers().as_ref();
        let reason = wire::header_text(headers, wire::X_PARKED_REASON).unwrap_or_default();
        let by = wire::header_text(headers, wire::X_PARKED_BY).unwrap_or_default();
        assert!(
            !reason.is_empty() && (by == "router" || by == "consumer"),
            "parked with a reason by us (seed {seed}): {reason:?} by {by:?}"
        );
        if msg.delivery.data.starts_with(b"known-bad-") {
            known.push(String::from_utf8_lossy(&msg.delivery.data).into_owned());
        }
    }
    conn.close(200, "done".into()).await.ok();
    assert_eq!(drained, parked_count);
    assert_eq!(known, ["known-bad-0", "known-bad-1", "known-bad-2"]);

    let (hwm, rss) = memory_kb(child.pid());
    eprintln!(
        "serve: VmHWM {hwm} kB, VmRSS {rss} kB; fuzz test took {:?}",
        started.elapsed()
    );
    assert!(hwm < MAX_RSS_KB, "serve peaked at {hwm} kB (seed {seed})");
    drop(child);
}

/// One generated message, and whether it is a valid timer that waits long
/// (an hour or more) in the delay stage; a valid one on a short delay (5 s at
/// most) comes due during the test and is parked by the consumer (no order
/// has its id).
struct Generated {
    routing_key: String,
    properties: BasicProperties,
    body: Vec<u8>,
    valid: bool,
    waits: bool,
}

fn generate(rng: &mut StdRng, i: usize) -> Generated {
    let kinds = ["payment", "fulfillment", "receipt"];
    let kind = kinds[rng.random_range(0..3)];
    let mut headers = FieldTable::default();
    // A few random headers of random types, some with names of ours.
    for _ in 0..rng.random_range(0..4) {
        let names = [
            "x-parked-reason",
            "x-original-size",
            "x-order-timeout-redelays",
            "x-death",
            "trace",
            "x-",
        ];
        let name = if rng.random_bool(0.5) {
            names[rng.random_range(0..names.len())].to_string()
        } else {
            format!("h{}", rng.random_range(0..1000))
        };
        headers.insert(name.into(), any_value(rng, 0));
    }
    let mut properties = BasicProperties::default();
    if rng.random_bool(0.3) {
        properties = properties.with_message_id(format!("m-{i}").into());
    }
    if rng.random_bool(0.3) {
        properties = properties.with_timestamp(rng.random());
    }
    if rng.random_bool(0.2) {
        properties = properties.with_priority(rng.random());
    }
    if rng.random_bool(0.2) {
        properties = properties.with_delivery_mode(rng.random_range(1..=2));
    }
    if rng.random_bool(0.1) {
        // Long enough never to expire in ingest before the router reads it.
        properties = properties.with_expiration("600000".into());
    }
    if rng.random_bool(0.1) {
        properties = properties.with_correlation_id(random_text(rng, 64).into());
    }
    let roll = rng.random_range(0..100);
    if roll < 40 {
        // A valid timer: an integer delay of a width that holds it.
        let (value, delay_ms) = valid_delay(rng);
        headers.insert(wire::X_DELAY.into(), value);
        let content_type = [
            None,
            Some("application/json"),
            Some("application/json; charset=utf-8"),
        ][rng.random_range(0..3)];
        if let Some(ct) = content_type {
            properties = properties.with_content_type(ct.into());
        }
        let mut body = serde_json::json!({
            "order_id": rng.random_range(1..1_000_000_000u64).to_string(),
            "kind": kind,
        });
        if rng.random_bool(0.2) {
            // Unknown fields, up to 60 KiB: forwarded without them.
            let size = rng.random_range(0..60 * 1024);
            body["padding"] = serde_json::Value::String("p".repeat(size));
            body["extra"] = serde_json::json!({"a": [1, 2, {"b": null}]});
        }
        if rng.random_bool(0.2) {
            body["due_at"] = "2030-01-01T00:00:00Z".into();
        }
        return Generated {
            routing_key: kind.to_string(),
            properties: properties.with_headers(headers),
            body: body.to_string().into_bytes(),
            valid: true,
            waits: delay_ms >= 3_600_000,
        };
    }
    // Everything else breaks at least one rule of the contract.
    if rng.random_bool(0.8) {
        headers.insert(wire::X_DELAY.into(), any_value(rng, 0));
    }
    if rng.random_bool(0.5) {
        let types = [
            "application/json",
            "text/plain",
            "",
            "application/xml",
            "\u{0}",
        ];
        properties = properties.with_content_type(types[rng.random_range(0..types.len())].into());
    }
    let routing_key = match rng.random_range(0..10) {
        0 => random_text(rng, 255),
        1 => String::new(),
        _ => kind.to_string(),
    };
    let body = match roll {
        // Large: a handful only (1 to 4 MiB), to keep the volume reasonable.
        _ if i % 400 == 7 => vec![b'{'; rng.random_range(1 << 20..4 << 20)],
        40..=54 => {
            let len = rng.random_range(0..4096);
            invalid_utf8(rng, len)
        }
        55..=64 => nested(rng),
        65..=74 => random_json(rng),
        75..=79 => Vec::new(),
        80..=84 => vec![b' '; rng.random_range(60 * 1024..80 * 1024)],
        _ => serde_json::json!({"order_id": rng.random::<u32>().to_string(), "kind": "refund"})
            .to_string()
            .into_bytes(),
    };
    // Valid by chance (a random integer x-delay on a good body): broken on
    // purpose, so that only the timers above wait, for an exact count.
    let by_chance =
        wire::publish_delay(Some(&headers)).is_ok() && decodes(&routing_key, &properties, &body);
    Generated {
        routing_key: if by_chance {
            "refund".into()
        } else {
            routing_key
        },
        properties: properties.with_headers(headers),
        body,
        valid: false,
        waits: false,
    }
}

/// Whether the body and routing key pass the contract's body rules.
fn decodes(routing_key: &str, properties: &BasicProperties, body: &[u8]) -> bool {
    let ct = properties.content_type().as_ref().map(|c| c.as_str());
    wire::decode(routing_key, ct, body).is_ok()
}

/// A valid `x-delay`: an integer type, 1 ms up to 2^32-1 ms as the type
/// allows; short (5 s at most) or long (an hour or more), never in between,
/// so that the short ones have all come due when the long ones are counted.
fn valid_delay(rng: &mut StdRng) -> (AMQPValue, u64) {
    match rng.random_range(0..6) {
        0 => {
            let d = rng.random_range(1..=i8::MAX);
            (AMQPValue::ShortShortInt(d), d as u64)
        }
        1 => {
            let d = rng.random_range(1..=5000u16);
            (AMQPValue::ShortUInt(d), u64::from(d))
        }
        2 => {
            let d = rng.random_range(3_600_000..=i32::MAX);
            (AMQPValue::LongInt(d), d as u64)
        }
        3 => {
            let d = rng.random_range(3_600_000..=u32::MAX);
            (AMQPValue::LongUInt(d), u64::from(d))
        }
        _ => {
            let d = rng.random_range(3_600_000..=i64::from(u32::MAX));
            (AMQPValue::LongLongInt(d), d as u64)
        }
    }
}

/// A value of any AMQP field type, with edge values; tables and arrays nest.
fn any_value(rng: &mut StdRng, depth: u32) -> AMQPValue {
    let extreme = rng.random_bool(0.3);
    match rng.random_range(0..17) {
        0 => AMQPValue::Boolean(rng.random()),
        1 => AMQPValue::ShortShortInt(if extreme { i8::MIN } else { rng.random() }),
        2 => AMQPValue::ShortShortUInt(rng.random()),
        3 => AMQPValue::ShortInt(if extreme { i16::MIN } else { rng.random() }),
        4 => AMQPValue::ShortUInt(rng.random()),
        5 => AMQPValue::LongInt(if extreme { i32::MIN } else { rng.random() }),
        6 => AMQPValue::LongUInt(if extreme { 0 } else { rng.random() }),
        7 => AMQPValue::LongLongInt(if extreme { i64::MAX } else { rng.random() }),
        8 => AMQPValue::Float(rng.random::<f32>() * 1e10),
        // Not NaN: RabbitMQ 3.10 closes the publisher's connection with
        // INTERNAL_ERROR on a NaN in a header (Erlang has no NaN); it never
        // reaches us.
        9 => AMQPValue::Double(if extreme {
            f64::MAX
        } else {
            rng.random::<f64>() * 1e12
        }),
        10 => AMQPValue::DecimalValue(DecimalValue {
            scale: rng.random(),
            value: rng.random(),
        }),
        11 => {
            let text = match rng.random_range(0..3) {
                0 => rng
                    .random_range(-5_000_000_000i64..5_000_000_000)
                    .to_string(),
                1 => "1e3".to_string(),
                _ => random_text(rng, 40),
            };
            AMQPValue::LongString(LongString::from(text.into_bytes()))
        }
        12 if depth < 3 => {
            let mut array = FieldArray::default();
            for _ in 0..rng.random_range(0..4) {
                array.push(any_value(rng, depth + 1));
            }
            AMQPValue::FieldArray(array)
        }
        13 => AMQPValue::Timestamp(rng.random()),
        14 if depth < 3 => {
            let mut table = FieldTable::default();
            table.insert("x-delay".into(), any_value(rng, depth + 1));
            AMQPValue::FieldTable(table)
        }
        15 => AMQPValue::ByteArray(ByteArray::from(invalid_utf8(rng, 16))),
        _ => AMQPValue::Void,
    }
}

fn random_text(rng: &mut StdRng, max: usize) -> String {
    let len = rng.random_range(0..=max);
    (0..len)
        .map(|_| char::from(rng.random_range(0x20u8..0x7f)))
        .collect()
}

fn invalid_utf8(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    // A lone continuation byte: never valid UTF-8.
    bytes.push(0x80);
    bytes
}

/// JSON nested deeper than any parser's default limit, or just deep.
fn nested(rng: &mut StdRng) -> Vec<u8> {
    let depth = rng.random_range(10..20_000);
    let open = if rng.random_bool(0.5) {
        "["
    } else {
        "{\"order_id\":"
    };
    let close = if open == "[" { "]" } else { "}" };
    let mut body = open.repeat(depth);
    body.push_str("\"1\"");
    body.push_str(&close.repeat(depth));
    body.into_bytes()
}

/// A JSON value of the wrong shape for the contract.
fn random_json(rng: &mut StdRng) -> Vec<u8> {
    let id = rng.random_range(1..1000);
    let bodies = [
        serde_json::json!({"order_id": id, "kind": "payment"}),
        serde_json::json!({"order_id": null}),
        serde_json::json!({"order_id": [id.to_string()]}),
        serde_json::json!({"order_id": id.to_string(), "kind": "payment", "due_at": "yesterday"}),
        serde_json::json!([id]),
        serde_json::json!("payment"),
        serde_json::json!({"order_id": "", "kind": "payment"}),
    ];
    bodies[rng.random_range(0..bodies.len())]
        .to_string()
        .into_bytes()
}

/// VmHWM and VmRSS of a process, in kB.
fn memory_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

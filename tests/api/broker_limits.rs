//! Limits on what the broker side may cost: a node that accepts TCP and never
//! speaks AMQP costs one `amqp.connect_timeout`, not a hung role; a padded
//! timer is forwarded with its canonical body; an oversized body is parked
//! truncated, and a flood of them leaves earlier parked messages in place.

use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;
use order_timeout::amqp::wire;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::helpers::*;

/// A TCP listener that accepts every connection and never says a word: a node
/// that is up for the kernel and dead for AMQP. It holds what it accepted, so
/// each client waits for a protocol header that never comes.
async fn silent_node() -> (u16, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (port, task)
}

/// The silent node first in `amqp.url`, the real broker second: every role
/// reaches the broker after at most one connect timeout each, the service is
/// ready well within the bound, and a timeout goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_first_in_amqp_url_costs_one_connect_timeout() {
    let (port, node) = silent_node().await;
    let vhost = Vhost::create().await;
    let silent = format!("amqp://guest:guest@127.0.0.1:{port}/{}", vhost.name());
    let real = format!("{BROKER}/{}", vhost.name());
    let started = Instant::now();
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .vhost(vhost)
            .env("ORDER_TIMEOUT__AMQP__URL", format!("{silent},{real}"))
            .env("ORDER_TIMEOUT__AMQP__CONNECT_TIMEOUT", "2s"),
    )
    .await;
    let took = started.elapsed();
    eprintln!("ready after {took:?} with a silent node first");
    // Without the connect timeout a role stays on the silent node for ever
    // and the service never gets ready (spawn_app gives up at 120 s). With it,
    // each role loses at most 2 s there; the rest is the topology's
    // declaration, which a broker loaded by the whole suite has taken 15 s
    // and more to answer, so the bound leaves room for that and none for a hang.
    assert!(took < Duration::from_secs(60), "ready only after {took:?}");
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(10))
        .await;
    node.abort();
}

/// A silent node alone: `doctor` ends, and says which address timed out
/// (without the password) instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_silent_node_that_timed_out() {
    let (port, node) = silent_node().await;
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let url = format!("amqp://guest:hush-{port}@127.0.0.1:{port}/%2f");
    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
        .arg("doctor")
        .envs(app.env.clone())
        .env("ORDER_TIMEOUT__AMQP__URL", &url)
        .env("ORDER_TIMEOUT__AMQP__CONNECT_TIMEOUT", "1s")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        wait_until(Duration::from_secs(40), "doctor ends", || {
            std::future::ready(child.try_wait().unwrap())
        }),
    )
    .await;
    if ended.is_err() {
        let _ = child.kill();
        panic!("doctor still runs after 30 s on a silent node");
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("doctor took {:?}", started.elapsed());
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("127.0.0.1:{port}")) && stdout.contains("timed out"),
        "doctor names the address that timed out: {stdout}"
    );
    assert!(!stdout.contains(&format!("hush-{port}")), "{stdout}");
    node.abort();
}

/// A valid timer padded with 60 KiB of unknown fields waits in the delay stage
/// with the canonical body, not the publisher's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_padded_timer_waits_with_its_canonical_body() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let padding = "p".repeat(60 * 1024);
    let body = json!({"order_id": "4711", "kind": "payment", "padding": padding, "more": [1, 2]});
    let body = body.to_string();
    assert!(body.len() > 60 * 1024);
    // An hour: it stays in a level queue, where it can be looked at.
    app.publish_raw("payment", delay(3_600_000), body.as_bytes())
        .await;
    app.wait_stage_timers(DelayMode::Ttl, 1, Duration::from_secs(10))
        .await;
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    let mut found = None;
    for level in 0..order_timeout::amqp::topology::LEVELS {
        let queue = app.names.level(level);
        // Not acked: closing the connection puts it back.
        if let Some(msg) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            found = Some(msg.delivery.data.clone());
        }
    }
    conn.close(200, "done".into()).await.ok();
    let waiting = found.expect("the timer waits in a level queue");
    assert!(waiting.len() < 200, "{} bytes wait", waiting.len());
    assert_eq!(
        serde_json::from_slice::<Value>(&waiting).unwrap(),
        json!({"order_id": "4711", "kind": "payment"}),
        "forwarded as wire::encode writes it"
    );
}

/// An oversized body is parked cut to its first KiB, with its size and reason;
/// a flood of them (more bytes than the parked queue's bound, lowered here by
/// a policy on the test's vhost) leaves the earlier parked messages in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_parked_cut_and_keep_earlier_parked_messages() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let parked = app.names.parked();
    let rule = json!({
        "pattern": format!("^{}$", regex_escape(&parked)),
        "apply-to": "queues",
        "definition": {"max-length-bytes": 4 * 1024 * 1024},
    });
    broker_api()
        .put(
            &format!("/policies/{}/parked-small", url_encode(&app.vhost)),
            Some(&rule),
        )
        .await
        .unwrap();
    for n in 0..3 {
        let body = format!("known-bad-{n}");
        app.publish_raw("payment", delay(1000), body.as_bytes())
            .await;
    }
    wait_until(Duration::from_secs(10), "the known-bad parked", || async {
        (app.queue_depth(&parked).await == 3).then_some(())
    })
    .await;
    // 16 MiB in all: whole, they would push everything before them out.
    let big = vec![b'{'; 512 * 1024];
    let publisher = app.amqp().await;
    let channel = publisher.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    for _ in 0..32 {
        order_timeout::amqp::publish_confirmed(
            &channel,
            app.names.entry(),
            "payment",
            &big,
            contract_properties(delay(1000)),
        )
        .await
        .unwrap();
    }
    publisher.close(200, "done".into()).await.ok();
    wait_until(Duration::from_secs(20), "every message parked", || async {
        (app.queue_depth(&parked).await >= 35).then_some(())
    })
    .await;
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    let mut known = Vec::new();
    let mut cut = 0;
    while let Some(msg) = channel
        .basic_get(parked.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let headers = msg.delivery.properties.headers().as_ref();
        let reason = wire::header_text(headers, wire::X_PARKED_REASON).unwrap_or_default();
        if msg.delivery.data.starts_with(b"known-bad-") {
            assert_eq!(reason, "invalid_body");
            known.push(String::from_utf8_lossy(&msg.delivery.data).into_owned());
            continue;
        }
        assert_eq!(reason, "body_too_large");
        assert_eq!(msg.delivery.data.len(), wire::PARKED_KEEP_BYTES);
        assert_eq!(
            wire::header_int(headers, wire::X_ORIGINAL_SIZE),
            Some(Ok(512 * 1024))
        );
        cut += 1;
    }
    conn.close(200, "done".into()).await.ok();
    assert_eq!(known, ["known-bad-0", "known-bad-1", "known-bad-2"]);
    assert_eq!(cut, 32);
    assert_eq!(app.stage_timers(DelayMode::Ttl).await, 0);
}

/// A queue name as a regular expression matching only itself.
fn regex_escape(name: &str) -> String {
    name.chars()
        .flat_map(|c| {
            let escape = !c.is_ascii_alphanumeric() && c != '_' && c != '-';
            escape.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

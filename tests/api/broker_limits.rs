//! Limits on what the broker side may cost: a node that accepts TCP and never
//! speaks AMQP costs one `amqp.connect_timeout`, not a hung role; a padded
//! timer is forwarded with its canonical body; an oversized body is parked
//! truncated, and a flood of them leaves earlier parked messages in place.

use std::time::{Duration, Instant};

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
    assert!(took < Duration::from_secs(15), "ready only after {took:?}");
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

//! Publishers in other languages (Python with pika, Node with amqplib, curl
//! on the management API), following the README's contract, work the same as
//! our own relay. `make test` installs their client libraries.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use crate::helpers::*;

/// The Python interpreter with pika: `ORDER_TIMEOUT_TEST_PYTHON`, else the
/// project's `.venv` that `make test` creates.
pub fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ORDER_TIMEOUT_TEST_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    venv.exists().then_some(venv)
}

/// Skips (saying why) when run outside `make test` without the client library;
/// under `make test` (ORDER_TIMEOUT_REQUIRE_EXAMPLES=1) a missing one fails.
pub fn missing(what: &str) {
    if std::env::var("ORDER_TIMEOUT_REQUIRE_EXAMPLES").is_ok() {
        panic!("{what} is required under make test");
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} not installed (run `make test`, which installs it)"
    );
}

async fn publishes_a_working_timeout(backend: Backend, mode: DelayMode) {
    let Some(python) = python() else {
        return missing("python with pika");
    };
    example_cancels_an_order(backend, mode, |app, id| {
        Command::new(&python)
            .arg(repo_path("rabbitmq/examples/python/publish_timeout.py"))
            .args([
                "--url",
                &app.amqp_url,
                "--exchange",
                app.names.entry(),
                "--order-id",
                id,
                "--delay-ms",
                "2000",
            ])
            .output()
            .expect("python runs")
    })
    .await
}

/// Runs a publisher example for a fresh order with a 2 s window, relay off so
/// the example's message is the only timeout; the order is cancelled within a
/// second of its deadline and its stock is back.
async fn example_cancels_an_order<F>(backend: Backend, mode: DelayMode, publish: F)
where
    F: FnOnce(&TestApp, &str) -> Output,
{
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    app.put_stock("A", 2).await;
    let id = app.order(&[("A", 2)], "2s").await;
    let out = publish(&app, &id);
    // The example's message is due 2 s after it was published, which is after
    // the order's deadline by however long the interpreter took to start.
    let published_by = chrono::Utc::now().timestamp_millis();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let order = app
        .wait_status(&id, "cancelled", Duration::from_secs(8))
        .await;
    let cancelled = ms(&order, "cancelled_at");
    assert!(
        cancelled >= ms(&order, "pay_deadline"),
        "never early: {order}"
    );
    let due = ms(&order, "pay_deadline").max(published_by + 2000);
    assert!(
        cancelled - due < 1000,
        "cancelled {} ms after the message was due",
        cancelled - due
    );
    assert_eq!(app.stock("A").await["available"], 2);
    assert_eq!(
        app.metric("order_timeout_outbox_published_total", &[])
            .await,
        0.0
    );
    assert!(app.drain_parked().await.is_empty(), "nothing parked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pika_sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, publishes_a_working_timeout).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pika_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        publishes_a_working_timeout,
    )
    .await
}

/// amqplib's folder: `ORDER_TIMEOUT_TEST_NODE_MODULES`, else the example's own
/// `node_modules` that `make examples-deps` installs.
pub fn node_modules() -> Option<PathBuf> {
    let dir = std::env::var("ORDER_TIMEOUT_TEST_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_path("rabbitmq/examples/node/node_modules"));
    dir.join("amqplib").exists().then_some(dir)
}

pub fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

async fn node_publishes_a_working_timeout(backend: Backend, mode: DelayMode) {
    let Some(modules) = node_modules().filter(|_| runs("node")) else {
        return missing("node with amqplib");
    };
    example_cancels_an_order(backend, mode, |app, id| {
        Command::new("node")
            .arg(repo_path("rabbitmq/examples/node/publish_timeout.js"))
            .args(["--url", &app.amqp_url, "--exchange", app.names.entry()])
            .args(["--order-id", id, "--delay-ms", "2000"])
            .env("NODE_PATH", modules)
            .output()
            .expect("node runs")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_amqplib_sqlite_ttl() {
    run(
        Backend::Sqlite,
        DelayMode::Ttl,
        node_publishes_a_working_timeout,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_amqplib_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        node_publishes_a_working_timeout,
    )
    .await
}

/// The management HTTP API publisher, in both modes (the entry exchange is a
/// fanout in both, so the script's `routed` check holds with the plugin too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_management_api_mariadb_ttl() {
    run(
        Backend::MariaDb,
        DelayMode::Ttl,
        curl_publishes_a_working_timeout,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_management_api_sqlite_plugin() {
    run(
        Backend::Sqlite,
        DelayMode::Plugin,
        curl_publishes_a_working_timeout,
    )
    .await
}

async fn curl_publishes_a_working_timeout(backend: Backend, mode: DelayMode) {
    if !(runs("curl") && runs("jq") && runs("bash")) {
        return missing("curl, jq and bash");
    }
    example_cancels_an_order(backend, mode, |app, id| {
        Command::new("bash")
            .arg(repo_path("rabbitmq/examples/curl/publish_timeout.sh"))
            .args(["--url", &management_base(true)])
            .args(["--vhost", &app.vhost, "--exchange", app.names.entry()])
            .args(["--order-id", id, "--delay-ms", "2000"])
            .output()
            .expect("bash runs")
    })
    .await
}

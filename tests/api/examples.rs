//! The publisher examples of `rabbitmq/examples/` (Python with pika, Node with
//! amqplib, curl on the management API, Go with amqp091-go, Java with the
//! official client, PHP with php-amqplib), each following the wire contract
//! (docs/wire-contract.md), cancel an order on time against the real service in every delay
//! mode, as our own relay would. `make test` installs their toolchains and
//! client libraries (pika and amqplib from their registries, the rest from
//! Debian); outside it, a test whose toolchain is missing says so and skips.
//! `encodings` checks what each one puts on the wire. The Go example is also
//! the long-running publisher a shop would copy: it is shown publishing
//! through a connection the broker closed under it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;

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
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} not installed (run `make test`, which installs it)"
    );
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
    succeeds(program, &["--version"])
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Where Debian's packages put the Go, Java and PHP client libraries.
const GO_AMQP091: &str = "/usr/share/gocode/src/github.com/rabbitmq/amqp091-go";
const JAVA_CLASSPATH: &str = "/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar";
const PHP_AMQPLIB: &str = "/usr/share/php/PhpAmqpLib/autoload.php";

/// The Go example, built once per test run under `target/` (`go run` would
/// compile it again for every test, seconds each on a busy machine), and held
/// to what a Go shop's CI asks of its code: `gofmt` has nothing to say, and
/// `go vet` and its unit tests pass. Its `go.mod` names the upstream module as a shop's would;
/// the build is given a copy with a `replace` pointing at Debian's source
/// (`-modfile`), so nothing is fetched (`GOPROXY=off`) and the example's own
/// files stay as they are.
fn go_example() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !(succeeds("go", &["version"]) && Path::new(GO_AMQP091).exists()) {
                return None;
            }
            let source = repo_path("rabbitmq/examples/go");
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("examples-go");
            std::fs::create_dir_all(&dir).expect("target/tmp is writable");
            let go_mod = std::fs::read_to_string(source.join("go.mod")).expect("go.mod");
            let modfile = dir.join("debian.mod");
            std::fs::write(
                &modfile,
                format!("{go_mod}\nreplace github.com/rabbitmq/amqp091-go => {GO_AMQP091}\n"),
            )
            .expect("target/tmp is writable");
            let binary = dir.join("publish_timeout");
            let go = |args: &[&str]| {
                let out = Command::new("go")
                    .args(args)
                    .arg(format!("-modfile={}", modfile.display()))
                    .arg(".")
                    .current_dir(&source)
                    .env("GOFLAGS", "")
                    .env("GOPROXY", "off")
                    .env("GOWORK", "off")
                    .env("GO111MODULE", "on")
                    .env("GOCACHE", dir.join("cache"))
                    .env("GOMODCACHE", dir.join("modcache"))
                    .output()
                    .expect("go runs");
                assert!(
                    out.status.success(),
                    "go {}: {}{}",
                    args[0],
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            go(&["build", "-o", &binary.to_string_lossy()]);
            go(&["vet"]);
            go(&["test"]);
            let gofmt = Command::new("gofmt")
                .arg("-l")
                .arg(&source)
                .output()
                .expect("gofmt runs");
            assert!(
                gofmt.status.success() && gofmt.stdout.is_empty(),
                "gofmt -l: {}{}",
                String::from_utf8_lossy(&gofmt.stdout),
                String::from_utf8_lossy(&gofmt.stderr)
            );
            Some(binary)
        })
        .clone()
}

/// A publisher example of `rabbitmq/examples/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    Python,
    Node,
    Curl,
    Go,
    Java,
    Php,
}

impl Example {
    pub const ALL: [Example; 6] = [
        Self::Python,
        Self::Node,
        Self::Curl,
        Self::Go,
        Self::Java,
        Self::Php,
    ];

    /// The example's command, connected to `vhost` of the test broker and
    /// ready for `--exchange`, `--order-id`, `--delay-ms` and `--kind`; `None`
    /// (after [`missing`]) when its toolchain or library is not installed.
    pub fn command(self, vhost: &str) -> Option<Command> {
        let amqp_url = format!("{BROKER}/{vhost}");
        let script = |path: &str| repo_path(&format!("rabbitmq/examples/{path}"));
        let (mut command, url) = match self {
            Self::Python => {
                let Some(python) = python() else {
                    missing("python with pika");
                    return None;
                };
                let mut c = Command::new(python);
                c.arg(script("python/publish_timeout.py"));
                (c, amqp_url)
            }
            Self::Node => {
                let Some(modules) = node_modules().filter(|_| runs("node")) else {
                    missing("node with amqplib");
                    return None;
                };
                let mut c = Command::new("node");
                c.arg(script("node/publish_timeout.js"))
                    .env("NODE_PATH", modules);
                (c, amqp_url)
            }
            Self::Curl => {
                if !(runs("curl") && runs("jq") && runs("bash")) {
                    missing("curl, jq and bash");
                    return None;
                }
                let mut c = Command::new("bash");
                c.arg(script("curl/publish_timeout.sh"))
                    .args(["--vhost", vhost]);
                (c, management_base(true))
            }
            Self::Go => {
                let Some(binary) = go_example() else {
                    missing("go with amqp091-go (golang-go golang-github-rabbitmq-amqp091-go-dev)");
                    return None;
                };
                (Command::new(binary), amqp_url)
            }
            Self::Java => {
                let jars = JAVA_CLASSPATH.split(':').all(|j| Path::new(j).exists());
                if !(jars && runs("java") && runs("javac")) {
                    missing(
                        "a JDK with the RabbitMQ Java client (default-jdk-headless librabbitmq-client-java)",
                    );
                    return None;
                }
                // Run as a single-file source program, as its header says.
                let mut c = Command::new("java");
                c.args(["-cp", JAVA_CLASSPATH])
                    .arg(script("java/PublishTimeout.java"));
                (c, amqp_url)
            }
            Self::Php => {
                if !(runs("php") && Path::new(PHP_AMQPLIB).exists()) {
                    missing("php with php-amqplib (php-cli php-amqplib)");
                    return None;
                }
                let mut c = Command::new("php");
                c.arg(script("php/publish_timeout.php"));
                (c, amqp_url)
            }
        };
        command.args(["--url", &url]);
        Some(command)
    }
}

/// Runs a publisher example for a fresh order with a payment window of
/// `window`, the example's delay the same; relay off so the example's message
/// is the only timeout. The order is cancelled by that message (cause
/// `timeout`) within a second of when it was due, never before its deadline,
/// and its stock is back.
async fn example_cancels_an_order(backend: Backend, mode: DelayMode, example: Example) {
    // A JVM compiling the source file takes a second or two, more on a busy
    // machine: a longer window keeps its message due at the deadline.
    let window = match example {
        Example::Java => Duration::from_secs(6),
        _ => Duration::from_secs(2),
    };
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    // Checked (and the Go example built) before the order's window starts.
    let Some(mut command) = example.command(&app.vhost) else {
        return;
    };
    app.put_stock("A", 2).await;
    let id = app
        .order(&[("A", 2)], &format!("{}s", window.as_secs()))
        .await;
    let delay_ms = window.as_millis() as i64;
    command.args(["--exchange", app.names.entry(), "--order-id", &id]);
    // The Go example takes the order's own deadline and works out the delay
    // when it publishes, as a shop's checkout would; the others take the
    // window as the delay.
    let deadline = app.get_order(&id).await["pay_deadline"].clone();
    match (example, deadline.as_str()) {
        (Example::Go, Some(deadline)) => command.args(["--due-at", deadline]),
        _ => command.args(["--delay-ms", &delay_ms.to_string()]),
    };
    let out: Output = command.output().expect("the example runs");
    // A message given a delay is due `delay_ms` after it was published, which
    // is after the order's deadline by however long the program took to start;
    // one given the deadline is due at the deadline.
    let published_by = chrono::Utc::now().timestamp_millis();
    assert!(
        out.status.success(),
        "{example:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let order = app
        .wait_status(&id, "cancelled", window + Duration::from_secs(6))
        .await;
    let cancelled = ms(&order, "cancelled_at");
    assert!(
        cancelled >= ms(&order, "pay_deadline"),
        "never early: {order}"
    );
    let due = match example {
        Example::Go => ms(&order, "pay_deadline"),
        _ => ms(&order, "pay_deadline").max(published_by + delay_ms),
    };
    assert!(
        cancelled - due < 1000,
        "{example:?}: cancelled {} ms after the message was due",
        cancelled - due
    );
    let trail = app.order_with_audit(&id).await;
    let last = trail["audit"].as_array().and_then(|a| a.last()).cloned();
    assert_eq!(
        last.as_ref()
            .map(|e| (e["event"].as_str(), e["cause"].as_str())),
        Some((Some("cancelled"), Some("timeout"))),
        "cancelled by the example's message: {trail}"
    );
    assert_eq!(app.stock("A").await["available"], 2);
    assert_eq!(
        app.metric("order_timeout_outbox_published_total", &[])
            .await,
        0.0
    );
    assert!(app.drain_parked().await.is_empty(), "nothing parked");
}

/// One test per example, backend and mode: each example in ttl and plugin
/// mode, two in native mode, the backends spread across them.
macro_rules! example_test {
    ($name:ident, $example:ident, $backend:ident, $mode:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run(Backend::$backend, DelayMode::$mode, |b, m| {
                example_cancels_an_order(b, m, Example::$example)
            })
            .await
        }
    };
}

example_test!(python_pika_sqlite_ttl, Python, Sqlite, Ttl);
example_test!(python_pika_postgres_plugin, Python, Postgres, Plugin);
example_test!(node_amqplib_sqlite_ttl, Node, Sqlite, Ttl);
example_test!(node_amqplib_postgres_plugin, Node, Postgres, Plugin);
// The management HTTP API publisher, in both modes (the entry exchange is a
// fanout in both, so the script's `routed` check holds with the plugin too).
example_test!(curl_management_api_mariadb_ttl, Curl, MariaDb, Ttl);
example_test!(curl_management_api_sqlite_plugin, Curl, Sqlite, Plugin);
example_test!(go_amqp091_sqlite_ttl, Go, Sqlite, Ttl);
example_test!(go_amqp091_postgres_plugin, Go, Postgres, Plugin);
example_test!(java_amqp_client_mariadb_ttl, Java, MariaDb, Ttl);
example_test!(java_amqp_client_sqlite_plugin, Java, Sqlite, Plugin);
example_test!(php_amqplib_postgres_ttl, Php, Postgres, Ttl);
example_test!(php_amqplib_mariadb_plugin, Php, MariaDb, Plugin);
// Native mode changes only the stage behind the entry exchange: two of the
// publishers show that the contract they follow holds there too.
example_test!(python_pika_postgres_native, Python, Postgres, Native);
example_test!(go_amqp091_postgres_native, Go, Postgres, Native);

/// The Go example as a shop runs it: one long-lived connection for many
/// timeouts, repaired when it drops. It reads timeouts from its standard
/// input; after a first batch is confirmed, the test closes its connection
/// through the management API (as an operator, a broker restart or a network
/// cut would) and writes a second batch at once, which it must publish on a
/// new connection. Every timeout is confirmed (a line each on its standard
/// output) and cancels its order on time; nothing is parked.
async fn go_publisher_survives_a_closed_connection(backend: Backend, mode: DelayMode) {
    const BATCH: usize = 4;
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    let Some(mut command) = Example::Go.command(&app.vhost) else {
        return;
    };
    let name = format!("shop checkout {}", app.vhost);
    let mut child = Running(
        command
            .args(["--exchange", app.names.entry(), "--stdin"])
            .args(["--connection-name", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts"),
    );
    let mut stdin = child.0.stdin.take().expect("piped");
    // Its output is read on threads: the pipes are blocking I/O.
    let (tx, mut printed) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.0.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = child.0.stderr.take().expect("piped");
    let logged = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());

    app.put_stock("A", 2 * BATCH as i64).await;
    let mut ids = Vec::new();
    for batch in 0..2 {
        let mut lines = String::new();
        let mut placed = Vec::new();
        for _ in 0..BATCH {
            let id = app.order(&[("A", 1)], "3s").await;
            let order = app.get_order(&id).await;
            let line = json!({"order_id": id, "kind": "payment", "due_at": order["pay_deadline"]});
            lines.push_str(&format!("{line}\n"));
            placed.push(id);
        }
        stdin
            .write_all(lines.as_bytes())
            .expect("the example reads");
        stdin.flush().expect("the example reads");
        let mut unconfirmed = placed.clone();
        wait_until(
            Duration::from_secs(20),
            &format!("batch {batch} confirmed"),
            || {
                while let Ok(line) = printed.try_recv() {
                    unconfirmed.retain(|id| !line.contains(&format!("for order {id},")));
                }
                std::future::ready(unconfirmed.is_empty().then_some(()))
            },
        )
        .await;
        ids.extend(placed);
        if batch == 0 {
            // The management API lists a connection once its first statistics
            // are in: polled until there is one to close.
            wait_until(
                Duration::from_secs(30),
                "the example's connection closed",
                || async {
                    let closed = broker_api()
                        .close_connections(&app.vhost, Some(&name))
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    (!closed.is_empty()).then_some(())
                },
            )
            .await;
        }
    }
    drop(stdin);
    let status = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .unwrap()
        .expect("the example ran");
    let logged = logged.join().unwrap_or_default();
    assert!(status.success(), "{status}: {logged}");
    assert!(
        logged.contains("connection closed") && logged.contains("reconnected to the broker"),
        "the example saw its connection closed and reconnected: {logged}"
    );
    for id in &ids {
        app.cancelled_on_time(id, Duration::from_secs(20)).await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(app.stock("A").await["available"], 2 * BATCH as i64);
    assert!(app.drain_parked().await.is_empty(), "nothing parked");
}

/// A child process killed if a test ends before it does.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_amqp091_reconnects_postgres_ttl() {
    run(
        Backend::Postgres,
        DelayMode::Ttl,
        go_publisher_survives_a_closed_connection,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_amqp091_reconnects_sqlite_plugin() {
    run(
        Backend::Sqlite,
        DelayMode::Plugin,
        go_publisher_survives_a_closed_connection,
    )
    .await
}

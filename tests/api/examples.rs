//! The publisher examples of `rabbitmq/examples/` (Python with pika, Node with
//! amqplib, curl on the management API, Go with amqp091-go, Java with the
//! official client, PHP with php-amqplib), each following the wire contract
//! (docs/wire-contract.md), cancel an order on time against the real service in every delay
//! mode, as our own relay would. `make test` installs their toolchains and
//! client libraries (pika and amqplib from their registries, the rest from
//! Debian); outside it, a test whose toolchain is missing says so and skips.
//! `encodings` checks what each one puts on the wire.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
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
const GOPATH: &str = "/usr/share/gocode";
const JAVA_CLASSPATH: &str = "/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar";
const PHP_AMQPLIB: &str = "/usr/share/php/PhpAmqpLib/autoload.php";

/// The Go example, built once per test run under `target/` (`go run` would
/// compile it again for every test, seconds each on a busy machine).
fn go_example() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let library = Path::new(GOPATH).join("src/github.com/rabbitmq/amqp091-go");
            if !(succeeds("go", &["version"]) && library.exists()) {
                return None;
            }
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("examples-go");
            let binary = dir.join("publish_timeout");
            let out = Command::new("go")
                .arg("build")
                .arg("-o")
                .arg(&binary)
                .arg(repo_path("rabbitmq/examples/go/publish_timeout.go"))
                .env("GO111MODULE", "off")
                .env("GOPATH", GOPATH)
                .env("GOCACHE", dir.join("cache"))
                .output()
                .expect("go runs");
            assert!(
                out.status.success(),
                "go build: {}",
                String::from_utf8_lossy(&out.stderr)
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
    let out: Output = command
        .args(["--exchange", app.names.entry(), "--order-id", &id])
        .args(["--delay-ms", &delay_ms.to_string()])
        .output()
        .expect("the example runs");
    // The example's message is due `delay_ms` after it was published, which
    // is after the order's deadline by however long the program took to start.
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
    let due = ms(&order, "pay_deadline").max(published_by + delay_ms);
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

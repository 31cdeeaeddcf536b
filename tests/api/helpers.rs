//! The test harness: `spawn_app` starts the real service in-process on port 0,
//! against a fresh database (SQLite file, PostgreSQL or MariaDB database) and a
//! fresh RabbitMQ vhost, both removed when the `TestApp` drops, so tests run in
//! parallel and leave nothing behind. Nothing here mocks the broker or SQL.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use order_timeout::amqp::topology::{Mode, Names};
use order_timeout::amqp::wire;
use order_timeout::app::Application;
use order_timeout::context::Context;
use order_timeout::settings::{Settings, SettingsSource};
use order_timeout_harness::{Process, Serve};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use order_timeout_harness::{Management, url_encode};

/// The broker's management API and AMQP address (without a vhost). The
/// machine's own broker unless `ORDER_TIMEOUT_TEST_MANAGEMENT` /
/// `ORDER_TIMEOUT_TEST_BROKER` say otherwise: CI runs the core scenarios a
/// second time against RabbitMQ 4 that way.
pub static MANAGEMENT: Endpoint = Endpoint {
    var: "ORDER_TIMEOUT_TEST_MANAGEMENT",
    default: "http://127.0.0.1:15672/api",
};
/// See [`MANAGEMENT`].
pub static BROKER: Endpoint = Endpoint {
    var: "ORDER_TIMEOUT_TEST_BROKER",
    default: "amqp://guest:guest@127.0.0.1:5672",
};

/// An address a test run can be pointed elsewhere with an environment variable.
pub struct Endpoint {
    var: &'static str,
    default: &'static str,
}

impl Endpoint {
    pub fn get(&self) -> String {
        std::env::var(self.var).unwrap_or_else(|_| self.default.to_string())
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.get())
    }
}

/// The management API's base URL with credentials, as the curl example and
/// the service's `amqp.management_url` take it.
pub fn management_base(with_credentials: bool) -> String {
    let api = MANAGEMENT.get();
    let base = api.trim_end_matches("/api");
    if with_credentials {
        base.replacen("://", "://guest:guest@", 1)
    } else {
        base.to_string()
    }
}
pub const POSTGRES_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const MARIADB_ADMIN: &str = "mysql://root@127.0.0.1:3306/mysql";

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MariaDb,
}

/// Which delay mode a test runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayMode {
    Ttl,
    Plugin,
    /// Timers held by a quorum queue until their due time (RabbitMQ 4.3 and later).
    Native,
}

impl DelayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ttl => "ttl",
            Self::Plugin => "plugin",
            Self::Native => "native",
        }
    }

    /// The service's own name for this mode, for the topology it declares.
    pub fn service(self) -> Mode {
        match self {
            Self::Ttl => Mode::Ttl,
            Self::Plugin => Mode::Plugin,
            Self::Native => Mode::Native,
        }
    }

    /// The mode the service names the same way (`Mode::as_str`).
    pub fn named(name: &str) -> Self {
        [Self::Ttl, Self::Plugin, Self::Native]
            .into_iter()
            .find(|m| m.as_str() == name)
            .unwrap_or_else(|| panic!("no delay mode named {name:?}"))
    }
}

/// The service's HTTP API at one address: the in-process app's, or a `serve`
/// child's. Every call goes through `http`, with its token.
#[derive(Clone)]
pub struct Api {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// A client that sends the caller's token on every request.
    pub http: reqwest::Client,
}

/// A running service with its own database and vhost; its [`Api`] methods
/// (`app.order(…)`, `app.base`) are reached through `Deref`.
pub struct TestApp {
    /// The service's HTTP API, with [`TestApp::token`].
    pub api: Api,
    /// The first admin token the app was started with (a fresh one by
    /// default), so that every test goes through authentication; `None` when
    /// a test configured none.
    pub token: Option<String>,
    pub ctx: Arc<Context>,
    pub names: Names,
    pub vhost: String,
    pub amqp_url: String,
    /// The settings environment this app was started with (peers reuse it).
    pub env: HashMap<String, String>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    cleanup: Option<Cleanup>,
}

/// What to remove when a test ends, whatever way it ends: when its `TestApp`
/// drops, or when the service never got that far (a start-up that panics).
struct Cleanup {
    vhost: String,
    database: Option<DatabaseGuard>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let vhost = std::mem::take(&mut self.vhost);
        let database = self.database.take();
        // Drop cannot await; a helper thread with its own runtime does the
        // removal, and we wait for it so nothing outlives the test.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                delete_vhost(&vhost).await;
                if let Some(database) = database {
                    drop_database(database).await;
                }
            });
        })
        .join();
    }
}

enum DatabaseGuard {
    SqliteFile(std::path::PathBuf),
    Server { backend: Backend, name: String },
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
        .chars()
        .take(prefix.len() + 16)
        .collect()
}

/// GET on the management API, as JSON.
pub async fn api_get(path: &str) -> Value {
    api_get_opt(path)
        .await
        .unwrap_or_else(|| panic!("GET {path}: 404 Not Found"))
}

/// GET on the management API, as JSON; `None` on 404.
pub async fn api_get_opt(path: &str) -> Option<Value> {
    broker_api()
        .get_opt(path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The broker's version, as its management API reports it (`3.10.8`, `4.0.5`).
pub async fn broker_version() -> String {
    broker_api()
        .broker_version()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `rabbitmqctl ARGS` against the broker under test: the command is
/// `ORDER_TIMEOUT_TEST_RABBITMQCTL` (a shell command prefix), or `rabbitmqctl`.
pub fn rabbitmqctl(args: &str) {
    let ctl = std::env::var("ORDER_TIMEOUT_TEST_RABBITMQCTL")
        .unwrap_or_else(|_| "rabbitmqctl".to_string());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{ctl} {args}"))
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "{ctl} {args}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Closes the vhost's connections through the management API, as an operator
/// would; `only_service` keeps to those named `order-timeout …`. Returns how
/// many it closed. A connection is listed once its first statistics are in.
pub async fn close_connections(vhost: &str, only_service: bool) -> usize {
    close_connections_named(vhost, only_service).await.len()
}

/// Closes the vhost's open connections and returns the client-given names of
/// those the broker closed.
pub async fn close_connections_named(vhost: &str, only_service: bool) -> Vec<String> {
    broker_api()
        .close_connections(vhost, only_service.then_some("order-timeout "))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Closes one connection of each of the service's broker roles (relay,
/// router, consumer). The management API lists a connection only once its
/// first statistics are in, and a role that was just closed reconnects after a
/// backoff, so the roles are closed as they appear, not all in one sweep.
pub async fn close_each_service_connection(vhost: &str) {
    const ROLES: [&str; 3] = ["relay", "router", "consumer"];
    let within = Duration::from_secs(45);
    let start = Instant::now();
    let mut closed = std::collections::HashSet::new();
    loop {
        for name in close_connections_named(vhost, true).await {
            if let Some(role) = name.rsplit(' ').next() {
                closed.insert(role.to_string());
            }
        }
        if ROLES.iter().all(|r| closed.contains(*r)) {
            return;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} closing each role's connection; closed {closed:?}"
        );
        // Polling: the next sweep catches the roles that have reconnected.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The management API of the broker under test, as guest.
pub fn broker_api() -> Management {
    Management::new(&MANAGEMENT.get(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{MANAGEMENT}: {e}"))
}

/// Creates a vhost and gives `guest` all rights in it.
pub async fn create_vhost(name: &str) {
    broker_api().create_vhost(name).await.unwrap_or_else(|e| {
        panic!("management API reachable at {MANAGEMENT} (make test enables the plugin): {e}")
    });
}

/// Deletes a vhost, if it is there.
pub async fn delete_vhost(name: &str) {
    let _ = broker_api().delete_vhost(name).await;
}

/// A fresh vhost that is deleted when dropped, unless handed to `spawn_app`
/// (`Spawn::vhost`), whose `TestApp` then deletes it: prepared before the service
/// starts (definitions imported, say), it is removed whatever way the test ends.
pub struct Vhost {
    name: Option<String>,
}

impl Vhost {
    pub async fn create() -> Self {
        let name = unique("ot-test-");
        create_vhost(&name).await;
        Self { name: Some(name) }
    }

    pub fn name(&self) -> &str {
        self.name.as_deref().expect("vhost not yet handed over")
    }

    /// Hands the deletion over to the caller.
    fn release(mut self) -> String {
        self.name.take().expect("vhost not yet handed over")
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            // Drop cannot await: a helper thread with its own runtime deletes it.
            let _ = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(delete_vhost(&name));
            })
            .join();
        }
    }
}

/// Whether the broker offers the delayed-message exchange type (asked once).
pub async fn plugin_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    if let Some(v) = AVAILABLE.get() {
        return *v;
    }
    let found = broker_api()
        .plugin_available()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    *AVAILABLE.get_or_init(|| found)
}

/// The first RabbitMQ release whose quorum queues hold a returned message
/// until the `x-opt-delivery-time` it carries: what native mode needs.
pub const NATIVE_SINCE: (u32, u32) = (4, 3);

/// Whether a RabbitMQ version (`3.10.8`, `4.3.6`) is [`NATIVE_SINCE`] or later.
pub fn version_has_native(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= NATIVE_SINCE,
        _ => false,
    }
}

#[test]
fn native_mode_needs_rabbitmq_4_3() {
    for (version, native) in [
        ("3.10.8", false),
        ("3.13.7", false),
        ("4.0.5", false),
        ("4.2.9", false),
        ("4.3.0", true),
        ("4.3.6", true),
        ("4.4.0-beta.1", true),
        ("5.0", true),
        ("", false),
    ] {
        assert_eq!(version_has_native(version), native, "{version}");
    }
}

/// The quorum queue where native mode's timers wait: `<prefix>.wait`.
pub fn native_wait_queue(names: &Names) -> String {
    format!("{}.wait", names.entry())
}

/// How late the management API may count a queue's messages: the broker
/// sends queue statistics every `collect_statistics_interval` (5 s by
/// default), and a quorum queue's leader a little later still on a busy
/// machine (7 s seen). Native mode's timers are counted only there.
pub const STATISTICS_LAG: Duration = Duration::from_secs(12);

/// Whether the broker under test can run native mode: RabbitMQ 4.3 or later,
/// by the `rabbitmq_version` its management API reports (asked once).
pub async fn native_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    if let Some(v) = AVAILABLE.get() {
        return *v;
    }
    let found = version_has_native(&broker_version().await);
    *AVAILABLE.get_or_init(|| found)
}

/// The server's admin URL and the URL of a database on it, for server backends.
fn server(backend: Backend) -> Option<(&'static str, &'static str)> {
    match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some((POSTGRES_ADMIN, "postgres://postgres@127.0.0.1:5432")),
        Backend::MariaDb => Some((MARIADB_ADMIN, "mysql://root@127.0.0.1:3306")),
    }
}

/// Runs one statement on a database server as its administrator.
pub async fn admin(url: &str, sql: &str) {
    let admin = Database::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url} reachable: {e}"));
    admin
        .execute_unprepared(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    admin.close().await.ok();
}

async fn create_database(backend: Backend) -> (String, DatabaseGuard) {
    match server(backend) {
        None => {
            let path = std::env::temp_dir().join(format!("{}.db", unique("ot-test-")));
            (
                format!("sqlite://{}?mode=rwc", path.display()),
                DatabaseGuard::SqliteFile(path),
            )
        }
        Some((admin_url, base)) => {
            let name = unique("ot_test_");
            admin(admin_url, &format!("CREATE DATABASE {name}")).await;
            (
                format!("{base}/{name}"),
                DatabaseGuard::Server { backend, name },
            )
        }
    }
}

async fn drop_database(guard: DatabaseGuard) {
    match guard {
        DatabaseGuard::SqliteFile(path) => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
        DatabaseGuard::Server { backend, name } => {
            // FORCE: the service's pool may still hold connections when a test fails.
            let force = if backend == Backend::Postgres {
                " WITH (FORCE)"
            } else {
                ""
            };
            if let Some((admin_url, _)) = server(backend) {
                admin(admin_url, &format!("DROP DATABASE IF EXISTS {name}{force}")).await;
            }
        }
    }
}

/// Options of a test app; `env` adds or overrides settings like the real environment would.
pub struct Spawn {
    pub backend: Backend,
    pub mode: DelayMode,
    pub env: Vec<(&'static str, String)>,
    /// A vhost prepared by the test; a fresh empty one when `None`.
    pub vhost: Option<Vhost>,
    /// Statements run on the test's new database before the service starts
    /// (a shop's own tables, for the mapped mode).
    pub setup: Vec<String>,
    /// The service reaches its database server through this local port (a
    /// proxy of the test's) instead of the server's own.
    pub database_port: Option<u16>,
}

impl Spawn {
    pub fn new(backend: Backend, mode: DelayMode) -> Self {
        Self {
            backend,
            mode,
            env: Vec::new(),
            vhost: None,
            setup: Vec::new(),
            database_port: None,
        }
    }
    /// The service reaches its database through a proxy on this local port,
    /// with no statement cache (every statement's text crosses the proxy).
    pub fn database_port(mut self, port: u16) -> Self {
        self.database_port = Some(port);
        self
    }
    /// Runs these statements on the new database before the service starts.
    pub fn setup(mut self, statements: &[&str]) -> Self {
        self.setup.extend(statements.iter().map(|s| s.to_string()));
        self
    }
    /// Runs the service in this vhost (deleted with the app, like a fresh one).
    pub fn vhost(mut self, vhost: Vhost) -> Self {
        self.vhost = Some(vhost);
        self
    }
    pub fn env(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.env.push((key, value.into()));
        self
    }
}

fn init_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if let Ok(level) = std::env::var("TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(level)
                .with_test_writer()
                .try_init();
        }
    });
}

pub async fn spawn_app(opts: Spawn) -> TestApp {
    let fresh = fresh(opts).await;
    start(fresh.env, fresh.vhost, fresh.amqp_url, Some(fresh.cleanup)).await
}

/// A fresh vhost and an empty database (removed when it drops), and the
/// settings a service would run on there, with nothing started: for tests
/// that start `serve` children themselves on a database nobody migrated.
pub struct Fresh {
    /// The settings environment, as [`spawn_app`] would start the service with.
    pub env: HashMap<String, String>,
    pub vhost: String,
    pub amqp_url: String,
    /// A client of the service's API with the admin token of `env`.
    pub http: reqwest::Client,
    cleanup: Cleanup,
}

impl Fresh {
    /// The `database.url` of `env`.
    pub fn database_url(&self) -> &str {
        &self.env["ORDER_TIMEOUT__DATABASE__URL"]
    }

    /// The API of a `serve` child started on these settings.
    pub fn api(&self, child: &Process) -> Api {
        Api::new(self.http.clone(), child.base())
    }
}

/// A fresh vhost and database with their settings, nothing started ([`Fresh`]).
pub async fn fresh(opts: Spawn) -> Fresh {
    init_logs();
    let vhost_guard = match opts.vhost {
        Some(v) => v,
        None => Vhost::create().await,
    };
    let vhost = vhost_guard.name().to_string();
    let (db_url, guard) = create_database(opts.backend).await;
    let cleanup = Cleanup {
        vhost: vhost_guard.release(),
        database: Some(guard),
    };
    for statement in &opts.setup {
        admin(&db_url, statement).await;
    }
    let amqp_url = format!("{BROKER}/{vhost}");
    let db_url = match (opts.database_port, server(opts.backend)) {
        (Some(port), Some((_, base))) => {
            let (scheme, rest) = base.split_once("@").unwrap();
            let host = rest.rsplit_once(':').unwrap().0;
            // Every statement's text on the wire (no prepared statements
            // reused by name), for a proxy that reads them.
            db_url.replacen(base, &format!("{scheme}@{host}:{port}"), 1)
                + "?statement-cache-capacity=0"
        }
        _ => db_url,
    };
    let mut env: HashMap<String, String> = [
        ("ORDER_TIMEOUT__DATABASE__URL", db_url),
        ("ORDER_TIMEOUT__AMQP__URL", amqp_url.clone()),
        (
            "ORDER_TIMEOUT__AMQP__DELAY_MODE",
            opts.mode.as_str().to_string(),
        ),
        ("ORDER_TIMEOUT__AMQP__INSTANCE", format!("test-{vhost}")),
        ("ORDER_TIMEOUT__HTTP__BIND", "127.0.0.1:0".to_string()),
        // Every test calls the API authenticated, as production does.
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", new_token("admin")),
        ("ORDER_TIMEOUT__SWEEPER__ENABLED", "false".to_string()),
        // Like the sweeper: tests of the message path see it alone, and the
        // tests of the deadline wake (`catch_up::`) turn it on.
        (
            "ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE",
            "false".to_string(),
        ),
        ("ORDER_TIMEOUT__DATABASE__MAX_CONNECTIONS", "5".to_string()),
        // The API of the broker under test, not the default derived from its host.
        (
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            management_base(false),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in opts.env {
        env.insert(k.to_string(), v);
    }
    let token = env
        .get("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS")
        .and_then(|tokens| tokens.split(',').map(str::trim).find(|t| !t.is_empty()));
    let http = api_client(token);
    Fresh {
        env,
        vhost,
        amqp_url,
        http,
        cleanup,
    }
}

/// A fresh random bearer token, `<what>-` and 32 hex digits.
pub fn new_token(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::new_v4().simple())
}

/// A client for the service's API that sends this bearer token, if any, on
/// every request, and `Content-Type: application/json`, which the API asks of
/// every state-changing request, body or not (a test of that rule builds a
/// client of its own).
pub fn api_client(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    if let Some(token) = token {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .expect("a token is a header value");
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .default_headers(headers)
        .build()
        .unwrap()
}

/// Starts an application on the given settings and waits until it is ready.
async fn start(
    env: HashMap<String, String>,
    vhost: String,
    amqp_url: String,
    cleanup: Option<Cleanup>,
) -> TestApp {
    // A reload reads the same layers again: this map, and the file that
    // `ORDER_TIMEOUT_CONFIG` in it names, if any.
    let source = SettingsSource {
        file: None,
        env: Some(env.clone()),
    };
    let settings = Settings::load(&source).expect("test settings");
    let names = Names::new(&settings.amqp.prefix);
    let app = Application::build_reloading(settings.clone(), source, settings)
        .await
        .expect("application builds");
    let base = format!("http://{}", app.local_addr());
    let ctx = app.context();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(shutdown.clone()));
    let token = env
        .get("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS")
        .and_then(|tokens| tokens.split(',').map(str::trim).find(|t| !t.is_empty()))
        .map(str::to_string);
    let test = TestApp {
        api: Api {
            base,
            http: api_client(token.as_deref()),
        },
        token,
        ctx,
        names,
        vhost,
        amqp_url,
        env,
        shutdown,
        task: Some(task),
        cleanup,
    };
    // Ready means: database answers and every broker role is connected with its topology declared.
    // Generous: with dozens of tests starting at once, the broker declares
    // thousands of queues and bindings before every app is ready.
    // A mapped table's zone found wrong at start (`time_zone`) leaves the
    // service unready on purpose: started is enough then.
    wait_until(Duration::from_secs(120), "service ready", || test.started()).await;
    test
}

impl std::ops::Deref for TestApp {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl std::ops::DerefMut for TestApp {
    fn deref_mut(&mut self) -> &mut Api {
        &mut self.api
    }
}

impl Api {
    /// The API at `base`, called with this client.
    pub fn new(http: reqwest::Client, base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            http,
        }
    }

    pub async fn put_stock(&self, sku: &str, available: i64) -> Value {
        let resp = self
            .http
            .put(format!("{}/inventory/{sku}", self.base))
            .json(&json!({ "available": available }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "put stock");
        resp.json().await.unwrap()
    }

    /// GET on the service's API, as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn stock(&self, sku: &str) -> Value {
        self.get_json(&format!("/inventory/{sku}")).await
    }

    /// Places an order and returns (status code, body).
    pub async fn checkout(&self, items: &[(&str, i64)], window: &str) -> (u16, Value) {
        let items: Vec<Value> = items
            .iter()
            .map(|(sku, q)| json!({"sku": sku, "quantity": q}))
            .collect();
        let resp = self
            .http
            .post(format!("{}/orders", self.base))
            .json(&json!({ "items": items, "payment_window": window }))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    /// Places an order that must succeed; returns its id.
    pub async fn order(&self, items: &[(&str, i64)], window: &str) -> String {
        let (status, body) = self.checkout(items, window).await;
        assert_eq!(status, 201, "checkout: {body}");
        body["id"].as_str().expect("id is a string").to_string()
    }

    pub async fn get_order(&self, id: &str) -> Value {
        self.get_json(&format!("/orders/{id}")).await
    }

    pub async fn post(&self, id: &str, action: &str) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/orders/{id}/{action}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Sum of a metric's samples whose label text contains every fragment.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| labels.iter().all(|frag| l.contains(frag)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the order is cancelled and checks it was cancelled on time
    /// (not before its deadline, not later than the on-time bound); returns it.
    pub async fn cancelled_on_time(&self, id: &str, within: Duration) -> Value {
        let order = self.wait_status(id, "cancelled", within).await;
        assert_on_time(&order, "cancelled_at", "pay_deadline");
        order
    }

    /// Waits until the order has this status; returns the order.
    pub async fn wait_status(&self, id: &str, status: &str, within: Duration) -> Value {
        wait_until(within, &format!("order {id} becomes {status}"), || async {
            let order = self.get_order(id).await;
            (order["status"] == status).then_some(order)
        })
        .await
    }

    /// The order with its audit trail.
    pub async fn order_with_audit(&self, id: &str) -> Value {
        self.get_json(&format!("/orders/{id}?include=audit")).await
    }

    /// Whether `/readyz` answers 200 now.
    pub async fn ready(&self) -> Option<()> {
        let resp = self
            .http
            .get(format!("{}/readyz", self.base))
            .send()
            .await
            .ok()?;
        resp.status().is_success().then_some(())
    }

    /// Whether `/readyz` says the database and the broker are ready (the
    /// rest, a zone found wrong, may leave it unready).
    pub async fn started(&self) -> Option<()> {
        let body: Value = self
            .http
            .get(format!("{}/readyz", self.base))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (body["database"]["ok"] == true && body["broker"]["ok"] == true).then_some(())
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self, within: Duration, what: &str) {
        wait_until(within, what, || self.ready()).await
    }
}

impl TestApp {
    pub async fn amqp(&self) -> Connection {
        Connection::connect(
            &self.amqp_url,
            ConnectionProperties::default().with_connection_name("test publisher".into()),
        )
        .await
        .expect("test connection")
    }

    /// Publishes with any properties to any exchange, with confirms.
    pub async fn publish_with(
        &self,
        exchange: &str,
        routing_key: &str,
        props: BasicProperties,
        body: &[u8],
    ) {
        let conn = self.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        order_timeout::amqp::publish_confirmed(&channel, exchange, routing_key, body, props)
            .await
            .expect("published and confirmed (acked)");
        conn.close(200, "done".into()).await.ok();
    }

    /// Publishes raw, with confirms, to the entry exchange.
    pub async fn publish_raw(&self, routing_key: &str, headers: FieldTable, body: &[u8]) {
        let entry = self.names.entry().to_string();
        self.publish_with(&entry, routing_key, contract_properties(headers), body)
            .await
    }

    /// A second instance of the service on the same broker vhost and database,
    /// as a second `serve` process would be. The first app owns the cleanup.
    pub async fn spawn_peer(&self, name: &str) -> TestApp {
        let instance = format!("{name}-{}", self.vhost);
        self.spawn_variant(&[("ORDER_TIMEOUT__AMQP__INSTANCE", instance)])
            .await
    }

    /// Another instance on the same vhost and database with some settings
    /// changed. The first app owns the cleanup.
    pub async fn spawn_variant(&self, changes: &[(&str, String)]) -> TestApp {
        let mut env = self.env.clone();
        // Migrations already ran; another instance must not need them.
        env.insert(
            "ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START".into(),
            "false".into(),
        );
        for (k, v) in changes {
            env.insert(k.to_string(), v.clone());
        }
        let amqp_url = env["ORDER_TIMEOUT__AMQP__URL"].clone();
        start(env, self.vhost.clone(), amqp_url, None).await
    }

    /// Stops the service and waits for it to drain.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    }

    /// A publisher that keeps its connection, for tests that publish a lot.
    pub async fn publisher(&self) -> Publisher {
        let conn = self.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Publisher {
            _conn: conn,
            channel,
            exchange: self.names.entry().to_string(),
        }
    }

    /// Publishes a contract-conforming timeout for an order.
    pub async fn publish_timeout(&self, order_id: &str, kind: &str, delay_ms: i64) {
        let body = json!({ "order_id": order_id, "kind": kind }).to_string();
        self.publish_raw(kind, delay(delay_ms), body.as_bytes())
            .await;
    }

    /// Takes every message from the parked queue: (reason, detail, body).
    pub async fn drain_parked(&self) -> Vec<(String, String, Vec<u8>)> {
        let conn = self.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(msg) = channel
            .basic_get(
                self.names.parked().as_str().into(),
                BasicGetOptions::default(),
            )
            .await
            .unwrap()
        {
            let headers = msg.delivery.properties.headers().as_ref();
            out.push((
                wire::header_text(headers, wire::X_PARKED_REASON).unwrap_or_default(),
                wire::header_text(headers, wire::X_PARKED_DETAIL).unwrap_or_default(),
                msg.delivery.data.clone(),
            ));
            msg.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
        }
        conn.close(200, "done".into()).await.ok();
        out
    }

    /// Messages ready in each of these queues, on one connection.
    ///
    /// A loaded broker may answer a queue's declare with "NOT_FOUND … due to
    /// timeout" (the queue's process was too busy to answer in time), which
    /// closes the channel: that queue is asked again on a new channel, a few
    /// times, before the test fails.
    pub async fn queue_depths(&self, queues: &[String]) -> Vec<u32> {
        const ATTEMPTS: u32 = 5;
        let conn = self.amqp().await;
        let mut channel = conn.create_channel().await.unwrap();
        let mut depths = Vec::with_capacity(queues.len());
        for queue in queues {
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let mut attempt = 1;
            let q = loop {
                match channel
                    .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                    .await
                {
                    Ok(q) => break q,
                    Err(e) if attempt < ATTEMPTS && e.to_string().contains("due to timeout") => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        channel = conn.create_channel().await.unwrap();
                    }
                    Err(e) => panic!("declare {queue} passively: {e}"),
                }
            };
            depths.push(q.message_count());
        }
        conn.close(200, "done".into()).await.ok();
        depths
    }

    /// Timers waiting in one delay stage: the messages in the level queues
    /// (ttl, counted over AMQP), what the plugin reports for `<prefix>.delay`
    /// (plugin; no queue holds them), or the messages of the quorum queue
    /// `<prefix>.wait`, deferred or not (native, from the management API,
    /// which counts them a few seconds late). 0 where the stage does not
    /// exist in the vhost.
    pub async fn stage_timers(&self, stage: DelayMode) -> u64 {
        match stage {
            DelayMode::Ttl => {
                let levels: Vec<String> = (0..order_timeout::amqp::topology::LEVELS)
                    .map(|l| self.names.level(l))
                    .collect();
                let declared = api_get_opt(&format!(
                    "/queues/{}/{}",
                    url_encode(&self.vhost),
                    url_encode(&levels[0])
                ))
                .await
                .is_some();
                if !declared {
                    return 0;
                }
                self.queue_depths(&levels)
                    .await
                    .into_iter()
                    .map(u64::from)
                    .sum()
            }
            DelayMode::Plugin => api_get_opt(&format!(
                "/exchanges/{}/{}",
                url_encode(&self.vhost),
                url_encode(&self.names.delay())
            ))
            .await
            .map(|x| {
                x["messages_delayed"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("the plugin reports messages_delayed: {x}"))
            })
            .unwrap_or(0),
            // Seen on RabbitMQ 4.3.6: a deferred timer counts in the queue's
            // `messages` and in `messages_delayed` (not in `messages_ready`,
            // nor in the message count of a passive declare over AMQP), so
            // `messages` alone is every timer, deferred, ready or delivered.
            DelayMode::Native => api_get_opt(&format!(
                "/queues/{}/{}",
                url_encode(&self.vhost),
                url_encode(&native_wait_queue(&self.names))
            ))
            .await
            // A queue the statistics have not reached yet has no count: none.
            .and_then(|q| q["messages"].as_u64())
            .unwrap_or(0),
        }
    }

    /// Waits until a delay stage holds exactly `n` timers; for the native
    /// stage, [`STATISTICS_LAG`] longer.
    pub async fn wait_stage_timers(&self, stage: DelayMode, n: u64, within: Duration) {
        let within = match stage {
            DelayMode::Native => within + STATISTICS_LAG,
            DelayMode::Ttl | DelayMode::Plugin => within,
        };
        wait_until(
            within,
            &format!("{n} timers waiting in the {} stage", stage.as_str()),
            || async { (self.stage_timers(stage).await == n).then_some(()) },
        )
        .await
    }

    /// Messages in one of our queues, as the broker counts them.
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let conn = self.amqp().await;
        let channel = conn.create_channel().await.unwrap();
        let q = channel
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        conn.close(200, "done".into()).await.ok();
        q.message_count()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        // Removes the vhost and the database (see `Cleanup`'s drop).
        drop(self.cleanup.take());
    }
}

/// A header table with `x-delay`.
pub fn delay(ms: i64) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(wire::X_DELAY.into(), AMQPValue::LongLongInt(ms));
    t
}

/// Polls `check` every 25 ms until it yields a value; panics naming `what` on timeout.
pub async fn wait_until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        // Polling, inside the one wait loop.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Parses an RFC 3339 field of an order into epoch milliseconds.
pub fn ms(order: &Value, field: &str) -> i64 {
    let text = order[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing in {order}"));
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

/// Set (by `.ci/run`) where the plugin must be present: a plugin-mode test that
/// finds none fails instead of skipping.
pub const REQUIRE_PLUGIN: &str = "ORDER_TIMEOUT_REQUIRE_PLUGIN";

/// Set (by `.ci/run`, for its RabbitMQ 4.3 run) where native mode must run: a
/// native-mode test on an older broker fails instead of skipping.
pub const REQUIRE_NATIVE: &str = "ORDER_TIMEOUT_REQUIRE_NATIVE";

/// Runs a scenario on a backend and mode; plugin mode is skipped, loudly, when
/// the broker does not offer the exchange type (and fails under
/// [`REQUIRE_PLUGIN`]), native mode when the broker is older than RabbitMQ 4.3
/// (and fails under [`REQUIRE_NATIVE`]).
pub async fn run<F, Fut>(backend: Backend, mode: DelayMode, scenario: F)
where
    F: FnOnce(Backend, DelayMode) -> Fut,
    Fut: Future<Output = ()>,
{
    if mode == DelayMode::Native && !native_available().await {
        let version = broker_version().await;
        assert!(
            std::env::var_os(REQUIRE_NATIVE).is_none(),
            "{REQUIRE_NATIVE} is set but the broker at {MANAGEMENT} is RabbitMQ {version} (native mode needs RabbitMQ {}.{} or later)",
            NATIVE_SINCE.0,
            NATIVE_SINCE.1
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED ({backend:?}, native mode): RabbitMQ {version} at {MANAGEMENT} has no quorum-queue delivery times (native mode needs RabbitMQ {}.{} or later)",
            NATIVE_SINCE.0,
            NATIVE_SINCE.1
        );
        return;
    }
    if mode == DelayMode::Plugin && !plugin_available().await {
        // CI installs the plugin: there a plugin-mode test that finds none fails.
        assert!(
            std::env::var_os(REQUIRE_PLUGIN).is_none(),
            "{REQUIRE_PLUGIN} is set but the broker at {MANAGEMENT} offers no x-delayed-message exchange type"
        );
        // Written to the process's stderr directly, so the test harness's capture
        // does not hide it: a skipped test must say so.
        // On RabbitMQ 4.3 and later the plugin cannot be enabled at all.
        let why = if native_available().await {
            format!(
                "RabbitMQ {} at {MANAGEMENT} cannot run the delayed-message plugin (Mnesia removed in 4.3; the plugin is archived upstream)",
                broker_version().await
            )
        } else {
            "the broker offers no x-delayed-message exchange type (rabbitmq_delayed_message_exchange is not enabled)".to_string()
        };
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED ({backend:?}, plugin mode): {why}"
        );
        return;
    }
    scenario(backend, mode).await;
}

/// A confirm-mode channel on its own connection.
pub struct Publisher {
    _conn: Connection,
    channel: lapin::Channel,
    exchange: String,
}

impl Publisher {
    /// Publishes a contract-conforming timeout and waits for the broker's ack.
    pub async fn timeout(&self, order_id: &str, kind: &str, delay_ms: i64) {
        let body = json!({ "order_id": order_id, "kind": kind }).to_string();
        let props = contract_properties(delay(delay_ms));
        order_timeout::amqp::publish_confirmed(
            &self.channel,
            &self.exchange,
            kind,
            body.as_bytes(),
            props,
        )
        .await
        .expect("published and confirmed (acked)");
    }
}

/// Properties as the wire contract wants them, with these headers.
pub fn contract_properties(headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_message_id(uuid::Uuid::new_v4().to_string().into())
        .with_headers(headers)
}

/// The transition recorded in `done` came at or after `deadline`, by less than a second.
pub fn assert_on_time(order: &Value, done: &str, deadline: &str) {
    assert_on_time_within(order, done, deadline, 1000);
}

/// The transition recorded in `done` came at or after `deadline`, by less
/// than `limit_ms`.
pub fn assert_on_time_within(order: &Value, done: &str, deadline: &str, limit_ms: i64) {
    let lateness = ms(order, done) - ms(order, deadline);
    assert!(
        (0..limit_ms).contains(&lateness),
        "{done} is {lateness} ms after {deadline} (limit {limit_ms} ms): {order}"
    );
}

/// Empties one queue through the management API.
pub async fn purge_queue(vhost: &str, queue: &str) {
    broker_api()
        .purge_queue(vhost, queue)
        .await
        .unwrap_or_else(|e| panic!("purge {queue}: {e}"));
}

/// Every order's audit trail has exactly one `cancelled` event, not early.
pub async fn assert_cancelled_once(api: &Api, ids: &[String]) {
    for id in ids {
        cancelled_once(&api.order_with_audit(id).await);
    }
}

/// One order document (with its audit trail): cancelled exactly once, not early.
pub fn cancelled_once(order: &Value) {
    let cancels = order["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "cancelled")
        .count();
    assert_eq!(cancels, 1, "{order}");
    assert!(
        ms(order, "cancelled_at") >= ms(order, "pay_deadline"),
        "early: {order}"
    );
}

/// A trigger `name` that makes the database refuse a statement `on` a table
/// (`BEFORE UPDATE ON orders`, …) for the rows where `condition` holds
/// (written with `OLD`/`NEW`, the same on every backend), with `message`: as
/// a constraint or a broken row would.
pub async fn refusing_trigger(
    db: &sea_orm::DatabaseConnection,
    backend: Backend,
    name: &str,
    on: &str,
    condition: &str,
    message: &str,
) {
    let statements = match backend {
        Backend::Sqlite => vec![format!(
            "CREATE TRIGGER {name} {on} WHEN {condition} \
             BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )],
        Backend::Postgres => vec![
            format!(
                "CREATE FUNCTION {name}() RETURNS trigger AS $$ \
                 BEGIN RAISE EXCEPTION '{message}'; END $$ LANGUAGE plpgsql"
            ),
            format!(
                "CREATE TRIGGER {name} {on} FOR EACH ROW \
                 WHEN ({condition}) EXECUTE FUNCTION {name}()"
            ),
        ],
        Backend::MariaDb => vec![format!(
            "CREATE TRIGGER {name} {on} FOR EACH ROW BEGIN \
             IF {condition} THEN SIGNAL SQLSTATE '45000' \
             SET MESSAGE_TEXT = '{message}'; END IF; END"
        )],
    };
    for sql in statements {
        db.execute_unprepared(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Starts a `serve` child beside `app` and waits until it is ready (a
/// minute at most); returns it with its API, called with `app`'s token.
pub async fn start_ready(app: &TestApp, serve: Serve) -> (Process, Api) {
    let mut child = serve.start().expect("serve starts");
    child
        .wait_ready(&app.http, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let api = Api::new(app.http.clone(), child.base());
    (child, api)
}

/// Runs `doctor` with the app's settings and these changes: whether it
/// passed, and what it printed.
pub fn doctor(app: &TestApp, changes: &[(&str, &str)]) -> (bool, String) {
    let mut env = app.env.clone();
    for (k, v) in changes {
        env.insert(k.to_string(), v.to_string());
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
        .arg("doctor")
        .envs(env)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A file of this repository (the README, the shipped examples and definitions).
pub fn repo_path(path: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A JSON file of this repository.
pub fn read_repo_json(path: &str) -> Value {
    let text = std::fs::read_to_string(repo_path(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

//! `make chaos`: minutes of orders with windows of a few seconds, some paid,
//! while the broker's connections are killed, the broker application is
//! stopped and started, the database refuses connections, and `serve`
//! processes are SIGKILLed and restarted. Then the ledger: every unpaid order
//! cancelled, no paid order cancelled, nothing cancelled early, stock conserved
//! per SKU, the parked queue holding only what was meant to be parked. The
//! figures are printed and written to `docs/RELIABILITY.md`.
//!
//! It stops and starts the broker application: run it alone, never beside
//! `make test`. `#[ignore]` keeps it out of `cargo test`.
//!
//! The test reads as its steps: [`setup`], [`load`], [`faults`], [`settle`],
//! [`ledger`], [`report`], then the verdict.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use order_timeout_harness::{Management, Process, Serve};
use serde_json::Value;
use tokio::sync::Mutex;

mod ledger;

use ledger::{
    Placed, SKUS, admin, checkout, ends, env_or, migrate, outbox_rows, put_stock, settle,
    stock_check, write_section,
};

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");
const MANAGEMENT: &str = "http://127.0.0.1:15672/api";
/// The two instances' names, by index.
const NAMES: [&str; 2] = ["chaos-a", "chaos-b"];

/// The local broker's management API, as guest.
fn broker_api() -> Management {
    Management::new(MANAGEMENT, Duration::from_secs(10)).expect("management API URL")
}

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl")
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {args:?}");
}

/// What the run stands on: its vhost, its database, the instances' settings
/// and ports.
struct World {
    vhost: String,
    db_name: String,
    env: HashMap<String, String>,
    ports: Vec<u16>,
    /// The service's API, for every call the test makes.
    client: reqwest::Client,
}

impl World {
    /// The API of instance `i`.
    fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Starts instance `i` (the runner kills it when dropped).
    fn start(&self, i: usize) -> Process {
        Serve::new(BIN)
            .envs(self.env.clone())
            .port(self.ports[i])
            .instance(NAMES[i])
            .start()
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The two `serve` instances; a slot is empty while its instance is killed.
type Instances = Arc<Mutex<Vec<Option<Process>>>>;

#[derive(Default)]
struct Counters {
    checkouts_refused: AtomicUsize,
    pays_uncertain: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long and stops the broker application: run with `make chaos`"]
async fn chaos_ledger() {
    let duration = Duration::from_secs(env_or("CHAOS_SECONDS", 120));
    let rate = env_or("CHAOS_ORDERS_PER_SECOND", 40);
    let started_at = chrono::Utc::now();

    let world = Arc::new(setup().await);
    let instances: Instances =
        Arc::new(Mutex::new(vec![Some(world.start(0)), Some(world.start(1))]));
    wait_ready(&instances, 0).await;
    wait_ready(&instances, 1).await;
    put_stock(&world.client, &world.base(0)).await;
    println!(
        "chaos: {duration:?} of {rate} orders/s on vhost {}, database {}",
        world.vhost, world.db_name
    );

    let counters = Arc::new(Counters::default());
    let deadline = Instant::now() + duration;
    let generator = tokio::spawn(load(world.clone(), counters.clone(), rate, deadline));
    let faults = faults(&world, &instances, duration, deadline).await;
    let placed = generator.await.unwrap();
    println!("chaos: {} orders placed; settling", placed.len());

    wait_ready(&instances, 0).await;
    // Longest window 8 s, sweeper grace 10 s, interval 5 s.
    let orders = settle(
        &world.client,
        &world.base(0),
        &placed,
        Duration::from_secs(90),
    )
    .await;
    let ledger = ledger(&world, &placed, &orders, &counters).await;
    report(&ledger, &faults, started_at, duration, rate).await;
    teardown(&world, &instances).await;
    ledger.assert_balances(duration, rate);
}

/// A vhost and a database of our own, migrated once.
async fn setup() -> World {
    let vhost = format!(
        "ot-chaos-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let db_name = format!(
        "ot_chaos_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    broker_api().create_vhost(&vhost).await.unwrap();
    admin(&format!("CREATE DATABASE {db_name}")).await;
    let env: HashMap<String, String> = [
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            format!("postgres://postgres@127.0.0.1:5432/{db_name}"),
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            format!("amqp://guest:guest@127.0.0.1:5672/{vhost}"),
        ),
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "ttl".into()),
        ("ORDER_TIMEOUT__SWEEPER__INTERVAL", "5s".into()),
        ("ORDER_TIMEOUT__SWEEPER__GRACE", "10s".into()),
        ("ORDER_TIMEOUT__LOG__LEVEL", "warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    migrate(BIN, &env);
    let ports = (0..2)
        .map(|_| order_timeout_harness::free_port().unwrap())
        .collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    World {
        vhost,
        db_name,
        env,
        ports,
        client,
    }
}

/// Waits until instance `i` answers `/readyz`.
async fn wait_ready(instances: &Instances, i: usize) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut all = instances.lock().await;
    let process = all[i].as_mut().expect("the instance runs");
    process
        .wait_ready(&client, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Orders at `rate` a second until `deadline`, through both instances in
/// turn: windows of 2 to 8 s, about a third paid inside their window.
async fn load(
    world: Arc<World>,
    counters: Arc<Counters>,
    rate: u64,
    deadline: Instant,
) -> Vec<Placed> {
    let placed = Arc::new(Mutex::new(Vec::<Placed>::new()));
    let mut n: u64 = 0;
    let mut tasks = Vec::new();
    while Instant::now() < deadline {
        n += 1;
        let base = world.base((n % 2) as usize);
        let items: Vec<(String, i64)> = vec![
            (SKUS[(n % 5) as usize].to_string(), 1 + (n % 3) as i64),
            (SKUS[((n + 2) % 5) as usize].to_string(), 1),
        ];
        let window_ms = 2000 + (n * 7919 % 6000);
        let pay = n.is_multiple_of(3);
        let (placed, counters, client) = (placed.clone(), counters.clone(), world.client.clone());
        tasks.push(tokio::spawn(async move {
            let Some(id) = checkout(&client, &base, &items, window_ms).await else {
                counters.checkouts_refused.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut paid = false;
            if pay {
                // The scenario: paid a third of the way into its window.
                tokio::time::sleep(Duration::from_millis(window_ms / 3)).await;
                match client
                    .post(format!("{base}/orders/{id}/pay"))
                    // The API asks every POST to say JSON, body or not.
                    .header("content-type", "application/json")
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => paid = true,
                    Ok(r) if r.status() == 409 => {}
                    // 503 or no answer: it may or may not have committed; the
                    // ledger then accepts either end, with stock to match.
                    _ => {
                        counters.pays_uncertain.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            placed.lock().await.push(Placed { id, items, paid });
        }));
        // The scenario: the order rate.
        tokio::time::sleep(Duration::from_micros(1_000_000 / rate)).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    placed.lock().await.clone()
}

/// Faults, one after another, for as long as orders come in; returns what
/// was done, and when.
async fn faults(
    world: &World,
    instances: &Instances,
    duration: Duration,
    deadline: Instant,
) -> Vec<String> {
    let mut faults: Vec<String> = Vec::new();
    let mut round = 0;
    while Instant::now() + Duration::from_secs(12) < deadline {
        // The scenario: six seconds of orders between faults.
        tokio::time::sleep(Duration::from_secs(6)).await;
        round += 1;
        let at = format!(
            "{:>5.1}s",
            (duration - deadline.saturating_duration_since(Instant::now())).as_secs_f64()
        );
        let what = match round % 4 {
            1 => close_connections(&world.vhost).await,
            2 => stop_broker().await,
            3 => cut_database(&world.db_name).await,
            _ => kill_instance(world, instances, round / 4 % 2).await,
        };
        faults.push(format!("{at} {what}"));
        println!("chaos: {}", faults.last().unwrap());
    }
    faults
}

async fn close_connections(vhost: &str) -> String {
    let n = broker_api()
        .close_connections(vhost, None)
        .await
        .unwrap_or_default()
        .len();
    format!("closed {n} broker connections (management API)")
}

async fn stop_broker() -> String {
    rabbitmqctl(&["stop_app"]);
    // The scenario: the broker is away for 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    "stopped the broker application for 5 s (rabbitmqctl stop_app / start_app)".to_string()
}

async fn cut_database(db_name: &str) -> String {
    admin(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS false")).await;
    admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db_name}'"
    ))
    .await;
    // The scenario: the database is away for 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    admin(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS true")).await;
    "refused and cut every database connection for 5 s".to_string()
}

async fn kill_instance(world: &World, instances: &Instances, victim: usize) -> String {
    let mut all = instances.lock().await;
    if let Some(mut process) = all[victim].take() {
        process.kill();
    }
    // The scenario: the instance is away for 2 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    all[victim] = Some(world.start(victim));
    format!("SIGKILLed serve instance {victim} and restarted it 2 s later")
}

/// Every figure of the run, and what the verdict reads.
struct Ledger {
    placed: usize,
    lost: usize,
    early: usize,
    paid_then_cancelled: usize,
    double_release: usize,
    stock_ok: bool,
    stock_lines: Vec<String>,
    parked_count: i64,
    published: Vec<u64>,
    outbox_left: i64,
    set_aside: i64,
    figures: Vec<(&'static str, String)>,
}

impl Ledger {
    fn assert_balances(&self, duration: Duration, rate: u64) {
        assert_eq!(
            (
                self.lost,
                self.early,
                self.paid_then_cancelled,
                self.double_release
            ),
            (0, 0, 0, 0),
            "the ledger does not balance"
        );
        assert!(self.stock_ok, "stock not conserved");
        assert_eq!(self.parked_count, 0, "unexpected parked messages");
        assert_eq!(
            (self.outbox_left, self.set_aside),
            (0, 0),
            "outbox not drained"
        );
        assert!(
            self.published.iter().all(|n| *n > 0),
            "both relays publish: {:?}",
            self.published
        );
        assert!(
            self.placed as u64 > duration.as_secs() * rate / 2,
            "too few orders placed"
        );
    }
}

/// Timeouts each instance's relay published since its last start (both run
/// their relay: each publishes the rows it claimed).
async fn published_by_each(world: &World) -> Vec<u64> {
    let mut published = Vec::new();
    for i in 0..world.ports.len() {
        let text = world
            .client
            .get(format!("{}/metrics", world.base(i)))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let n: f64 = text
            .lines()
            .filter(|l| l.starts_with("order_timeout_outbox_published_total "))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        published.push(n as u64);
    }
    published
}

/// The ledger: the orders' ends, the stock, the parked queue, the relays and
/// the outbox.
async fn ledger(
    world: &World,
    placed: &[Placed],
    orders: &HashMap<String, Value>,
    counters: &Counters,
) -> Ledger {
    let ends = ends(placed, orders);
    let (stock_ok, stock_lines) =
        stock_check(&world.client, &world.base(0), &ends.sold_expected).await;
    let parked_count = broker_api()
        .get_opt(&format!("/queues/{}/order.timeouts.parked", world.vhost))
        .await
        .ok()
        .flatten()
        .and_then(|q| q["messages"].as_i64())
        .unwrap_or(-1);
    let published = published_by_each(world).await;
    let (outbox_left, set_aside) = outbox_rows(&world.db_name).await;
    let figures = vec![
        ("orders placed", placed.len().to_string()),
        (
            "checkouts refused during faults (503 or no answer)",
            counters
                .checkouts_refused
                .load(Ordering::Relaxed)
                .to_string(),
        ),
        (
            "payments with no certain answer",
            counters.pays_uncertain.load(Ordering::Relaxed).to_string(),
        ),
        ("cancelled", ends.cancelled.to_string()),
        ("paid (and still paid)", ends.paid.to_string()),
        ("lost (unpaid, not cancelled)", ends.lost.to_string()),
        ("cancelled before the deadline", ends.early.to_string()),
        (
            "paid with a 200, then cancelled",
            ends.paid_then_cancelled.to_string(),
        ),
        (
            "double releases (two cancels in an audit trail)",
            ends.double_release.to_string(),
        ),
        ("stock conserved for every SKU", stock_ok.to_string()),
        (
            "parked messages (none were meant to be)",
            parked_count.to_string(),
        ),
        (
            "timeouts published by each instance's relay since its last start",
            format!("{} and {}", published[0], published[1]),
        ),
        ("outbox rows left unpublished", outbox_left.to_string()),
        ("outbox rows set aside", set_aside.to_string()),
    ];
    Ledger {
        placed: placed.len(),
        lost: ends.lost,
        early: ends.early,
        paid_then_cancelled: ends.paid_then_cancelled,
        double_release: ends.double_release,
        stock_ok,
        stock_lines,
        parked_count,
        published,
        outbox_left,
        set_aside,
        figures,
    }
}

/// Prints the figures and writes its section of `docs/RELIABILITY.md`.
async fn report(
    ledger: &Ledger,
    faults: &[String],
    started_at: chrono::DateTime<chrono::Utc>,
    duration: Duration,
    rate: u64,
) {
    for (k, v) in &ledger.figures {
        println!("chaos: {k:<52} {v}");
    }
    let rabbit = broker_api()
        .broker_version()
        .await
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "?".to_string());
    let report = format!(
        "## The chaos ledger\n\n\
         Produced by `make chaos` (`cargo test --release --test chaos -- --ignored --nocapture`), \
         {started}, on the 2-core machine with RabbitMQ {rabbit}, PostgreSQL and two `serve` \
         instances, both running their relay (claiming disjoint outbox rows), TTL mode, \
         sweeper interval 5 s and grace 10 s. {secs} s of orders at about \
         {rate}/s, windows of 2 to 8 s, every third order paid a third of the way into its window.\n\n\
         ### Faults injected\n\n{faults}\n\n### Ledger\n\n| figure | value |\n|---|---|\n{rows}\n\n\
         ### Stock per SKU\n\n| sku | available | reserved | sold | total | conserved and matching paid orders |\n\
         |---|---|---|---|---|---|\n{stock}\n\n\
         A payment without a certain answer (the request failed during a fault) may or may not \
         have committed; the ledger accepts either end for those orders, and the stock check \
         then counts what the database says was paid.\n",
        started = started_at.format("%Y-%m-%d %H:%M UTC"),
        secs = duration.as_secs(),
        faults = faults
            .iter()
            .map(|f| format!("- {f}"))
            .collect::<Vec<_>>()
            .join("\n"),
        rows = ledger
            .figures
            .iter()
            .map(|(k, v)| format!("| {k} | {v} |"))
            .collect::<Vec<_>>()
            .join("\n"),
        stock = ledger.stock_lines.join("\n"),
    );
    write_section("chaos", &report);
}

/// Stops the instances and removes the vhost and the database.
async fn teardown(world: &World, instances: &Instances) {
    drop(instances.lock().await.drain(..).collect::<Vec<_>>());
    let _ = broker_api().delete_vhost(&world.vhost).await;
    admin(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        world.db_name
    ))
    .await;
}

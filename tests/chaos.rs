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

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};
use tokio::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");
const MANAGEMENT: &str = "http://127.0.0.1:15672/api";
const POSTGRES_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const SKUS: [&str; 5] = ["C1", "C2", "C3", "C4", "C5"];
const STOCK: i64 = 1_000_000;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mgmt() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn admin(sql: &str) {
    let db = Database::connect(POSTGRES_ADMIN).await.expect("PostgreSQL");
    db.execute_unprepared(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    db.close().await.ok();
}

/// One `serve` process.
struct Service {
    child: Child,
}

impl Service {
    fn start(env: &HashMap<String, String>, name: &str, port: u16) -> Service {
        let child = Command::new(BIN)
            .arg("serve")
            .envs(env)
            .env("ORDER_TIMEOUT__HTTP__BIND", format!("127.0.0.1:{port}"))
            .env("ORDER_TIMEOUT__AMQP__INSTANCE", name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        Service { child }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone)]
struct Placed {
    id: String,
    items: Vec<(String, i64)>,
    paid: bool,
}

#[derive(Default)]
struct Counters {
    checkouts_refused: AtomicUsize,
    pays_uncertain: AtomicUsize,
}

async fn kill_connections(vhost: &str) -> usize {
    let Ok(resp) = mgmt()
        .get(format!("{MANAGEMENT}/vhosts/{vhost}/connections"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
    else {
        return 0;
    };
    let connections: Vec<Value> = resp.json().await.unwrap_or_default();
    let mut n = 0;
    for c in connections {
        let name: String = c["name"]
            .as_str()
            .unwrap_or_default()
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        if mgmt()
            .delete(format!("{MANAGEMENT}/connections/{name}"))
            .basic_auth("guest", Some("guest"))
            .send()
            .await
            .is_ok()
        {
            n += 1;
        }
    }
    n
}

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl")
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long and stops the broker application: run with `make chaos`"]
async fn chaos_ledger() {
    let duration = Duration::from_secs(env_or("CHAOS_SECONDS", 120));
    let rate = env_or("CHAOS_ORDERS_PER_SECOND", 40);
    let started_at = chrono::Utc::now();

    // A vhost and a database of our own.
    let vhost = format!(
        "ot-chaos-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let db_name = format!(
        "ot_chaos_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let http = mgmt();
    http.put(format!("{MANAGEMENT}/vhosts/{vhost}"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap();
    http.put(format!("{MANAGEMENT}/permissions/{vhost}/guest"))
        .basic_auth("guest", Some("guest"))
        .json(&json!({"configure": ".*", "write": ".*", "read": ".*"}))
        .send()
        .await
        .unwrap();
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

    // Migrate once, then two instances.
    let status = Command::new(BIN)
        .args(["migrate", "up"])
        .envs(&env)
        .status()
        .unwrap();
    assert!(status.success(), "migrate");
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let services = Arc::new(Mutex::new(vec![
        Some(Service::start(&env, "chaos-a", ports[0])),
        Some(Service::start(&env, "chaos-b", ports[1])),
    ]));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ready = |base: String| {
        let client = client.clone();
        async move {
            for _ in 0..600 {
                if client
                    .get(format!("{base}/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{base} never ready");
        }
    };
    for p in &ports {
        ready(format!("http://127.0.0.1:{p}")).await;
    }
    for sku in SKUS {
        let resp = client
            .put(format!("http://127.0.0.1:{}/inventory/{sku}", ports[0]))
            .json(&json!({"available": STOCK}))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }
    println!("chaos: {duration:?} of {rate} orders/s on vhost {vhost}, database {db_name}");

    // Orders: windows of 2 to 8 s, about a third paid inside their window.
    let placed = Arc::new(Mutex::new(Vec::<Placed>::new()));
    let counters = Arc::new(Counters::default());
    let deadline = Instant::now() + duration;
    let generator = {
        let (placed, counters, client, ports) = (
            placed.clone(),
            counters.clone(),
            client.clone(),
            ports.clone(),
        );
        tokio::spawn(async move {
            let mut n: u64 = 0;
            let mut tasks = Vec::new();
            while Instant::now() < deadline {
                n += 1;
                let base = format!("http://127.0.0.1:{}", ports[(n % 2) as usize]);
                let items: Vec<(String, i64)> = vec![
                    (SKUS[(n % 5) as usize].to_string(), 1 + (n % 3) as i64),
                    (SKUS[((n + 2) % 5) as usize].to_string(), 1),
                ];
                let window_ms = 2000 + (n * 7919 % 6000);
                let pay = n.is_multiple_of(3);
                let (placed, counters, client) = (placed.clone(), counters.clone(), client.clone());
                tasks.push(tokio::spawn(async move {
                    let body = json!({
                        "items": items.iter().map(|(s, q)| json!({"sku": s, "quantity": q})).collect::<Vec<_>>(),
                        "payment_window": format!("{window_ms}ms"),
                    });
                    let Ok(resp) = client.post(format!("{base}/orders")).json(&body).send().await else {
                        counters.checkouts_refused.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    if resp.status() != 201 {
                        counters.checkouts_refused.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let order: Value = resp.json().await.unwrap();
                    let id = order["id"].as_str().unwrap().to_string();
                    let mut paid = false;
                    if pay {
                        tokio::time::sleep(Duration::from_millis(window_ms / 3)).await;
                        match client.post(format!("{base}/orders/{id}/pay")).send().await {
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
                tokio::time::sleep(Duration::from_micros(1_000_000 / rate)).await;
            }
            for t in tasks {
                let _ = t.await;
            }
        })
    };

    // Faults, one after another, for as long as orders come in.
    let mut faults: Vec<String> = Vec::new();
    let mut round = 0;
    while Instant::now() + Duration::from_secs(12) < deadline {
        tokio::time::sleep(Duration::from_secs(6)).await;
        round += 1;
        let at = format!(
            "{:>5.1}s",
            (duration - deadline.saturating_duration_since(Instant::now())).as_secs_f64()
        );
        match round % 4 {
            1 => {
                let n = kill_connections(&vhost).await;
                faults.push(format!(
                    "{at} closed {n} broker connections (management API)"
                ));
            }
            2 => {
                rabbitmqctl(&["stop_app"]);
                tokio::time::sleep(Duration::from_secs(5)).await;
                rabbitmqctl(&["start_app"]);
                rabbitmqctl(&["await_startup"]);
                faults.push(format!(
                    "{at} stopped the broker application for 5 s (rabbitmqctl stop_app / start_app)"
                ));
            }
            3 => {
                admin(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS false")).await;
                admin(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db_name}'"
                ))
                .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
                admin(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS true")).await;
                faults.push(format!(
                    "{at} refused and cut every database connection for 5 s"
                ));
            }
            _ => {
                let victim = round / 4 % 2;
                let mut all = services.lock().await;
                if let Some(mut s) = all[victim].take() {
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                all[victim] = Some(Service::start(
                    &env,
                    if victim == 0 { "chaos-a" } else { "chaos-b" },
                    ports[victim],
                ));
                faults.push(format!(
                    "{at} SIGKILLed serve instance {victim} and restarted it 2 s later"
                ));
            }
        }
        println!("chaos: {}", faults.last().unwrap());
    }
    generator.await.unwrap();
    let placed = placed.lock().await.clone();
    println!("chaos: {} orders placed; settling", placed.len());

    // Settle: longest window 8 s, sweeper grace 10 s, interval 5 s.
    let base = format!("http://127.0.0.1:{}", ports[0]);
    ready(base.clone()).await;
    let settle_until = Instant::now() + Duration::from_secs(90);
    let mut orders: HashMap<String, Value> = HashMap::new();
    loop {
        let mut pending = 0;
        for p in &placed {
            if orders
                .get(&p.id)
                .is_some_and(|o| o["status"] != "pending_payment")
            {
                continue;
            }
            let Ok(resp) = client
                .get(format!("{base}/orders/{}?include=audit", p.id))
                .send()
                .await
            else {
                continue;
            };
            let order: Value = resp.json().await.unwrap_or(Value::Null);
            if order["status"] == "pending_payment" || order.is_null() {
                pending += 1;
            }
            orders.insert(p.id.clone(), order);
        }
        if pending == 0 || Instant::now() > settle_until {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // The ledger.
    let (mut lost, mut early, mut paid_then_cancelled, mut double_release, mut cancelled, mut paid) =
        (0, 0, 0, 0, 0, 0);
    let mut sold_expected: HashMap<String, i64> = HashMap::new();
    for p in &placed {
        let o = &orders[&p.id];
        let status = o["status"].as_str().unwrap_or("missing");
        let cancels = o["audit"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["event"] == "cancelled").count())
            .unwrap_or(0);
        if cancels > 1 {
            double_release += 1;
        }
        match status {
            "cancelled" => {
                cancelled += 1;
                if p.paid {
                    paid_then_cancelled += 1;
                }
                let at = chrono::DateTime::parse_from_rfc3339(o["cancelled_at"].as_str().unwrap())
                    .unwrap();
                let due = chrono::DateTime::parse_from_rfc3339(o["pay_deadline"].as_str().unwrap())
                    .unwrap();
                if at < due {
                    early += 1;
                }
            }
            "paid" => {
                paid += 1;
                for (sku, q) in &p.items {
                    *sold_expected.entry(sku.clone()).or_default() += q;
                }
            }
            _ => lost += 1,
        }
    }
    let mut stock_ok = true;
    let mut stock_lines = Vec::new();
    for sku in SKUS {
        let s: Value = client
            .get(format!("{base}/inventory/{sku}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let (a, r, so) = (
            s["available"].as_i64().unwrap(),
            s["reserved"].as_i64().unwrap(),
            s["sold"].as_i64().unwrap(),
        );
        let ok =
            a + r + so == STOCK && r == 0 && so == sold_expected.get(sku).copied().unwrap_or(0);
        stock_ok &= ok;
        stock_lines.push(format!(
            "| {sku} | {a} | {r} | {so} | {} | {} |",
            a + r + so,
            if ok { "yes" } else { "**NO**" }
        ));
    }
    let parked: Value = mgmt()
        .get(format!("{MANAGEMENT}/queues/{vhost}/order.timeouts.parked"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let parked_count = parked["messages"].as_i64().unwrap_or(-1);
    // Both instances run their relay: each publishes the rows it claimed.
    let mut published = Vec::new();
    for port in &ports {
        let text = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
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
    let (outbox_left, set_aside) = {
        let db = Database::connect(format!("postgres://postgres@127.0.0.1:5432/{db_name}"))
            .await
            .unwrap();
        let count = |sql: &'static str| {
            let db = db.clone();
            async move {
                let row = db
                    .query_one_raw(sea_orm::Statement::from_string(
                        sea_orm::DbBackend::Postgres,
                        sql,
                    ))
                    .await
                    .unwrap()
                    .unwrap();
                row.try_get_by_index::<i64>(0).unwrap()
            }
        };
        let left = count("SELECT COUNT(*) FROM outbox WHERE set_aside_at_ms IS NULL").await;
        let aside = count("SELECT COUNT(*) FROM outbox WHERE set_aside_at_ms IS NOT NULL").await;
        db.close().await.ok();
        (left, aside)
    };
    let figures = [
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
        ("cancelled", cancelled.to_string()),
        ("paid (and still paid)", paid.to_string()),
        ("lost (unpaid, not cancelled)", lost.to_string()),
        ("cancelled before the deadline", early.to_string()),
        (
            "paid with a 200, then cancelled",
            paid_then_cancelled.to_string(),
        ),
        (
            "double releases (two cancels in an audit trail)",
            double_release.to_string(),
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
    for (k, v) in &figures {
        println!("chaos: {k:<52} {v}");
    }

    let report = format!(
        "# Reliability: the chaos ledger\n\n\
         Produced by `make chaos` (`cargo test --release --test chaos -- --ignored --nocapture`), \
         {started}, on the 2-core machine with RabbitMQ {rabbit}, PostgreSQL and two `serve` \
         instances, both running their relay (claiming disjoint outbox rows), TTL mode, \
         sweeper interval 5 s and grace 10 s. {secs} s of orders at about \
         {rate}/s, windows of 2 to 8 s, every third order paid a third of the way into its window.\n\n\
         ## Faults injected\n\n{faults}\n\n## Ledger\n\n| figure | value |\n|---|---|\n{rows}\n\n\
         ## Stock per SKU\n\n| sku | available | reserved | sold | total | conserved and matching paid orders |\n\
         |---|---|---|---|---|---|\n{stock}\n\n\
         A payment without a certain answer (the request failed during a fault) may or may not \
         have committed; the ledger accepts either end for those orders, and the stock check \
         then counts what the database says was paid.\n",
        started = started_at.format("%Y-%m-%d %H:%M UTC"),
        rabbit = rabbit_version().await,
        secs = duration.as_secs(),
        faults = faults
            .iter()
            .map(|f| format!("- {f}"))
            .collect::<Vec<_>>()
            .join("\n"),
        rows = figures
            .iter()
            .map(|(k, v)| format!("| {k} | {v} |"))
            .collect::<Vec<_>>()
            .join("\n"),
        stock = stock_lines.join("\n"),
    );
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/docs/RELIABILITY.md"),
        report,
    )
    .unwrap();

    drop(services.lock().await.drain(..).collect::<Vec<_>>());
    let _ = mgmt()
        .delete(format!("{MANAGEMENT}/vhosts/{vhost}"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await;
    admin(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")).await;

    assert_eq!(
        (lost, early, paid_then_cancelled, double_release),
        (0, 0, 0, 0),
        "the ledger does not balance"
    );
    assert!(stock_ok, "stock not conserved");
    assert_eq!(parked_count, 0, "unexpected parked messages");
    assert_eq!((outbox_left, set_aside), (0, 0), "outbox not drained");
    assert!(
        published.iter().all(|n| *n > 0),
        "both relays publish: {published:?}"
    );
    assert!(
        placed.len() as u64 > duration.as_secs() * rate / 2,
        "too few orders placed"
    );
}

async fn rabbit_version() -> String {
    let overview: Value = match mgmt()
        .get(format!("{MANAGEMENT}/overview"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    overview["rabbitmq_version"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

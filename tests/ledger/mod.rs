//! What the long fault runs (`make chaos`, `make test-cluster`) share: placing
//! orders through the API, waiting until none is pending, and the ledger that
//! reads their ends against what the run did to them (lost, early, paid then
//! cancelled, released twice, stock conserved, outbox drained), and the
//! section of `docs/RELIABILITY.md` each run writes.

#![allow(dead_code)] // each run uses what it needs of this

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};

pub const POSTGRES_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const SKUS: [&str; 5] = ["C1", "C2", "C3", "C4", "C5"];
pub const STOCK: i64 = 1_000_000;

pub fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs one statement on the PostgreSQL server as its admin.
pub async fn admin(sql: &str) {
    let db = Database::connect(POSTGRES_ADMIN).await.expect("PostgreSQL");
    db.execute_unprepared(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    db.close().await.ok();
}

/// An order the run placed, and whether its payment was answered 200.
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: String,
    pub items: Vec<(String, i64)>,
    pub paid: bool,
}

/// GET a JSON document.
pub async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Migrates a database with the service's own `migrate up`, in `env`.
pub fn migrate(bin: &str, env: &HashMap<String, String>) {
    let status = std::process::Command::new(bin)
        .args(["migrate", "up"])
        .envs(env)
        .status()
        .unwrap();
    assert!(status.success(), "migrate");
}

/// Puts every SKU's stock on sale.
pub async fn put_stock(client: &reqwest::Client, base: &str) {
    for sku in SKUS {
        let resp = client
            .put(format!("{base}/inventory/{sku}"))
            .json(&json!({"available": STOCK}))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }
}

/// Places one order; `None` when the service refused it or did not answer.
pub async fn checkout(
    client: &reqwest::Client,
    base: &str,
    items: &[(String, i64)],
    window_ms: u64,
) -> Option<String> {
    let body = json!({
        "items": items.iter().map(|(s, q)| json!({"sku": s, "quantity": q})).collect::<Vec<_>>(),
        "payment_window": format!("{window_ms}ms"),
    });
    let resp = client
        .post(format!("{base}/orders"))
        .json(&body)
        .send()
        .await
        .ok()?;
    if resp.status() != 201 {
        return None;
    }
    let order: Value = resp.json().await.unwrap();
    Some(order["id"].as_str().unwrap().to_string())
}

/// Reads every order (with its audit trail) until none is pending, or
/// `patience` has passed.
pub async fn settle(
    client: &reqwest::Client,
    base: &str,
    placed: &[Placed],
    patience: Duration,
) -> HashMap<String, Value> {
    let settle_until = Instant::now() + patience;
    let mut orders: HashMap<String, Value> = HashMap::new();
    loop {
        let mut pending = 0;
        for p in placed {
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
        // Polling: a round every second until nothing is pending (a round
        // reads only the orders still pending).
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    orders
}

/// Tallies of the orders' ends against what the run did to them.
#[derive(Default)]
pub struct Ends {
    pub lost: usize,
    pub early: usize,
    pub paid_then_cancelled: usize,
    pub double_release: usize,
    pub cancelled: usize,
    /// Cancelled by the sweeper (their timer never came in time).
    pub by_sweeper: usize,
    /// The deadlines of those.
    pub swept: Vec<chrono::DateTime<chrono::FixedOffset>>,
    pub paid: usize,
    pub sold_expected: HashMap<String, i64>,
    /// Per cancelled order: its deadline and how late it was cancelled.
    pub lateness: Vec<(chrono::DateTime<chrono::FixedOffset>, Duration)>,
}

fn at(o: &Value, field: &str) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(o[field].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{field} of {o}: {e}"))
}

pub fn ends(placed: &[Placed], orders: &HashMap<String, Value>) -> Ends {
    let mut ends = Ends::default();
    for p in placed {
        let o = &orders[&p.id];
        let status = o["status"].as_str().unwrap_or("missing");
        let cancels: Vec<&Value> = o["audit"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["event"] == "cancelled").collect())
            .unwrap_or_default();
        if cancels.len() > 1 {
            ends.double_release += 1;
        }
        match status {
            "cancelled" => {
                ends.cancelled += 1;
                if p.paid {
                    ends.paid_then_cancelled += 1;
                }
                let (done, due) = (at(o, "cancelled_at"), at(o, "pay_deadline"));
                if cancels.iter().any(|e| e["cause"] == "sweeper") {
                    ends.by_sweeper += 1;
                    ends.swept.push(due);
                }
                if done < due {
                    ends.early += 1;
                } else {
                    let late = (done - due).to_std().unwrap_or_default();
                    ends.lateness.push((due, late));
                }
            }
            "paid" => {
                ends.paid += 1;
                for (sku, q) in &p.items {
                    *ends.sold_expected.entry(sku.clone()).or_default() += q;
                }
            }
            _ => ends.lost += 1,
        }
    }
    ends
}

/// p50 / p99 / max of some latenesses, as text (`-` for none).
pub fn percentiles(mut late: Vec<Duration>) -> String {
    if late.is_empty() {
        return "- (none)".to_string();
    }
    late.sort();
    let pick = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {} ms / p99 {} ms / max {} ms ({} orders)",
        pick(0.5).as_millis(),
        pick(0.99).as_millis(),
        late[late.len() - 1].as_millis(),
        late.len()
    )
}

/// Per SKU: available + reserved + sold is what was stocked, nothing is
/// reserved, and sold matches the paid orders. Returns the verdict and a
/// table row per SKU.
pub async fn stock_check(
    client: &reqwest::Client,
    base: &str,
    sold_expected: &HashMap<String, i64>,
) -> (bool, Vec<String>) {
    let mut stock_ok = true;
    let mut stock_lines = Vec::new();
    for sku in SKUS {
        let s = get_json(client, &format!("{base}/inventory/{sku}")).await;
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
    (stock_ok, stock_lines)
}

/// Outbox rows left unpublished, and rows set aside.
pub async fn outbox_rows(db_name: &str) -> (i64, i64) {
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
}

/// Replaces this run's section of `docs/RELIABILITY.md` (between
/// `<!-- begin NAME -->` and `<!-- end NAME -->`, added at the end when
/// missing); the other runs' sections stay as they were.
pub fn write_section(name: &str, text: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/RELIABILITY.md");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = (
        format!("<!-- begin {name} -->"),
        format!("<!-- end {name} -->"),
    );
    let section = format!("{begin}\n{}\n{end}", text.trim_end());
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{section}{}", &old[..b], &old[e + end.len()..])
        }
        _ if old.trim().is_empty() => format!("{section}\n"),
        _ => format!("{}\n\n{section}\n", old.trim_end()),
    };
    std::fs::write(path, new).unwrap();
}

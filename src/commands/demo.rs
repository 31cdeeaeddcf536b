//! `order-timeout demo`: the service, live, in under a minute. It starts the real
//! service in-process on a temporary SQLite file and a throwaway prefix on the
//! configured broker, stocks a few SKUs, places orders with short windows
//! through the HTTP API, pays some, and shows the others being cancelled at
//! their deadlines and their stock coming back. Colour and a progress line on a
//! terminal; plain lines when piped (or with `NO_COLOR`). Everything it made is
//! removed at the end.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::amqp::{self, topology};
use crate::app::Application;
use crate::domain::Millis;
use crate::http_client::{Answer, JsonClient, Method};
use crate::settings::{Secret, Settings};

const STOCK: [(&str, i64); 3] = [("TSHIRT", 10), ("MUG", 6), ("POSTER", 4)];
/// One demo order: its items, its payment window, and when (ms) it is paid, if at all.
type DemoOrder = (&'static [(&'static str, i64)], &'static str, Option<u64>);

const ORDERS: [DemoOrder; 6] = [
    (&[("TSHIRT", 2)], "4s", None),
    (&[("MUG", 1), ("POSTER", 1)], "6s", Some(1500)),
    (&[("TSHIRT", 1)], "8s", None),
    (&[("POSTER", 2)], "5s", Some(2500)),
    (&[("MUG", 3)], "7s", None),
    (&[("TSHIRT", 3), ("MUG", 1)], "9s", None),
];

struct Style {
    colour: bool,
    live: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
    fn line(&self, text: &str) {
        let mut out = std::io::stdout();
        if self.live {
            // Clear the progress line first.
            let _ = write!(out, "\r\x1b[2K");
        }
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
    fn progress(&self, text: &str) {
        if self.live {
            let mut out = std::io::stdout();
            let _ = write!(out, "\r\x1b[2K{}", self.paint("2", text));
            let _ = out.flush();
        }
    }
}

fn clock() -> String {
    chrono::Utc::now().format("%H:%M:%S%.3f").to_string()
}

/// Runs the demo; exits non-zero if anything did not happen as it should.
pub async fn run(mut settings: Settings) -> anyhow::Result<ExitCode> {
    let terminal = std::io::stdout().is_terminal();
    let style = Style {
        colour: terminal && std::env::var_os("NO_COLOR").is_none(),
        live: terminal,
    };
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let db_path = std::env::temp_dir().join(format!("order-timeout-demo-{tag}.db"));
    settings.database.url = Secret::new(format!("sqlite://{}?mode=rwc", db_path.display()));
    settings.database.migrate_on_start = true;
    settings.amqp.prefix = format!("order-timeout-demo.{tag}");
    settings.http.bind = "127.0.0.1:0".parse()?;
    // Its own API, called the way production calls it: with a bearer token of
    // its own, random for this run (and the only one its service accepts).
    let token = uuid::Uuid::new_v4().simple().to_string();
    settings.http.admin_tokens = vec![Secret::opaque(token.clone())];
    settings.http.checkout_tokens = Vec::new();
    settings.sweeper.enabled = true;
    settings.sweeper.interval = Duration::from_secs(1);
    settings.sweeper.grace = Duration::from_secs(3);
    let amqp_settings = settings.amqp.clone();

    style.line(&style.paint("1", "order-timeout demo"));
    style.line(&format!(
        "  broker {}, exchange {}, database {}",
        settings.amqp.url.redacted(),
        settings.amqp.prefix,
        db_path.display()
    ));
    let app = Application::build(settings).await?;
    let base = format!("http://{}", app.local_addr());
    let ctx = app.context();
    let shutdown = CancellationToken::new();
    let service = tokio::spawn(app.run(shutdown.clone()));
    let outcome = drive(&style, &base, &token).await;
    let mode = ctx.resolved_mode();

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(25), service).await;
    // Leave nothing behind: the demo's exchanges and queues, and its database.
    if let Ok(conn) = amqp::connect(&amqp_settings, "demo-cleanup").await {
        if let Ok(channel) = conn.create_channel().await {
            let _ =
                topology::delete_all(&channel, &topology::Names::new(&amqp_settings.prefix)).await;
        }
        let _ = conn.close(200, "demo done".into()).await;
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db_path.display()));
    }
    match outcome {
        Ok(()) => {
            let mode = mode.map(|m| m.as_str()).unwrap_or("?");
            style.line(&format!(
                "  (delay mode: {mode}; everything the demo made has been removed)"
            ));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            style.line(&style.paint("31", &format!("demo failed: {e:#}")));
            Ok(ExitCode::FAILURE)
        }
    }
}

/// How long the demo waits for `/readyz`: a busy broker declaring the
/// topology for the first time can take a while.
const READY_WITHIN: Duration = Duration::from_secs(90);

/// What `/readyz` said was not ready, in words.
fn unready(answer: Option<&Value>) -> String {
    let Some(answer) = answer else {
        return "the HTTP API did not answer".into();
    };
    let mut missing = Vec::new();
    if answer["database"]["ok"] != true {
        missing.push("the database".to_string());
    }
    if let Some(roles) = answer["broker"]["connections"].as_object() {
        let down: Vec<&str> = roles
            .iter()
            .filter(|(_, up)| **up != true)
            .map(|(role, _)| role.as_str())
            .collect();
        if !down.is_empty() {
            missing.push(format!("the broker connection of {}", down.join(", ")));
        }
    }
    if missing.is_empty() {
        "readiness flapped".into()
    } else {
        format!("not ready: {}", missing.join(" and "))
    }
}

async fn drive(style: &Style, base: &str, token: &str) -> anyhow::Result<()> {
    let http = client(token)?;
    wait_ready(style, &http, base).await?;
    stock(style, &http, base).await?;
    let orders = place(style, &http, base).await?;
    let ledger = watch(style, &http, base, &orders).await?;
    summary(style, &http, base, &orders, &ledger).await
}

/// The demo's HTTP client, sending the token it gave the service.
fn client(token: &str) -> anyhow::Result<JsonClient> {
    Ok(JsonClient::new(Duration::from_secs(10)).bearer(token)?)
}

/// The body of a successful answer; an error naming the request otherwise.
fn success(what: &str, answer: Answer) -> anyhow::Result<Value> {
    anyhow::ensure!(
        answer.status.is_success(),
        "{what} failed: HTTP {} {}",
        answer.status,
        answer.body
    );
    Ok(answer.body)
}

/// Waits for `/readyz`, saying what was not ready when it gives up.
async fn wait_ready(style: &Style, http: &JsonClient, base: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answer = match http.get(&format!("{base}/readyz")).await {
            Ok(answer) if answer.status.is_success() => break,
            Ok(answer) => Some(answer.body),
            Err(_) => None,
        };
        if started.elapsed() > READY_WITHIN {
            anyhow::bail!(
                "the service did not become ready within {} s: {} (is RabbitMQ running?)",
                READY_WITHIN.as_secs(),
                unready(answer.as_ref())
            );
        }
        style.progress("connecting to the broker and declaring the topology…");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    style.line(&format!("{}  service ready at {base}", clock()));
    Ok(())
}

async fn stock(style: &Style, http: &JsonClient, base: &str) -> anyhow::Result<()> {
    for (sku, available) in STOCK {
        let answer = http
            .put(
                &format!("{base}/inventory/{sku}"),
                &json!({ "available": available }),
            )
            .await?;
        success(&format!("stocking {sku}"), answer)?;
    }
    let stocked: Vec<String> = STOCK.iter().map(|(s, n)| format!("{s}={n}")).collect();
    style.line(&format!("{}  stocked {}", clock(), stocked.join(" ")));
    Ok(())
}

/// One order of the demo: its id, and when it is paid (ms after placing), if ever.
struct Placed {
    id: String,
    pay_after: Option<u64>,
}

async fn place(style: &Style, http: &JsonClient, base: &str) -> anyhow::Result<Vec<Placed>> {
    let mut orders = Vec::new();
    for (items, window, pay_after) in ORDERS {
        let body = json!({
            "items": items.iter().map(|(s, q)| json!({"sku": s, "quantity": q})).collect::<Vec<_>>(),
            "payment_window": window,
        });
        let order = success(
            "checkout",
            http.post(&format!("{base}/orders"), &body).await?,
        )?;
        let id = order["id"].as_str().unwrap_or_default().to_string();
        let what: Vec<String> = items.iter().map(|(s, q)| format!("{q}×{s}")).collect();
        let plan = if pay_after.is_some() {
            style.paint("32", "will be paid")
        } else {
            style.paint("33", "will not be paid")
        };
        style.line(&format!(
            "{}  order {id}: {}, pay within {window} ({plan})",
            clock(),
            what.join(" + ")
        ));
        orders.push(Placed { id, pay_after });
    }
    Ok(orders)
}

/// What happened to the orders: those paid, and how each cancelled one was
/// cancelled (the cause in its audit trail, and how late).
#[derive(Default)]
struct Ledger {
    paid: Vec<String>,
    cancels: Vec<(String, i64)>,
}

/// Pays the orders that are to be paid when their time comes, and reports each
/// cancellation as it happens, until no order is pending.
async fn watch(
    style: &Style,
    http: &JsonClient,
    base: &str,
    orders: &[Placed],
) -> anyhow::Result<Ledger> {
    let placed = Instant::now();
    let mut pending: Vec<&str> = orders.iter().map(|o| o.id.as_str()).collect();
    let mut ledger = Ledger::default();
    while !pending.is_empty() {
        anyhow::ensure!(
            placed.elapsed() < Duration::from_secs(40),
            "orders were not all settled within 40 s"
        );
        for order in orders {
            let due = order
                .pay_after
                .is_some_and(|after| placed.elapsed() >= Duration::from_millis(after));
            if due && !ledger.paid.contains(&order.id) {
                pay(style, http, base, &order.id).await?;
                ledger.paid.push(order.id.clone());
                pending.retain(|id| *id != order.id);
            }
        }
        let mut next_deadline = Vec::new();
        for id in pending.clone() {
            let order = get_json(http, &format!("{base}/orders/{id}?include=audit")).await?;
            if order["status"] == "cancelled" {
                ledger
                    .cancels
                    .push(cancelled(style, http, base, id, &order).await?);
                pending.retain(|p| *p != id);
            } else {
                let deadline =
                    Millis::parse_rfc3339(order["pay_deadline"].as_str().unwrap_or_default())
                        .map_err(anyhow::Error::msg)?;
                next_deadline.push(deadline.signed_since(Millis::now()).max(0));
            }
        }
        if let Some(next) = next_deadline.iter().min() {
            style.progress(&format!(
                "{} order(s) waiting for payment; next deadline in {:.1} s",
                next_deadline.len(),
                *next as f64 / 1000.0
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(ledger)
}

async fn pay(style: &Style, http: &JsonClient, base: &str, id: &str) -> anyhow::Result<()> {
    let answer = http
        .send(Method::POST, &format!("{base}/orders/{id}/pay"), None)
        .await?;
    success(&format!("paying order {id}"), answer)?;
    style.line(&format!(
        "{}  order {id} {}",
        clock(),
        style.paint("32", "paid: its stock is sold")
    ));
    Ok(())
}

/// Reports a cancelled order; returns who cancelled it and how late.
async fn cancelled(
    style: &Style,
    http: &JsonClient,
    base: &str,
    id: &str,
    order: &Value,
) -> anyhow::Result<(String, i64)> {
    let lateness = late_ms(order);
    let by = order["audit"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["event"] == "cancelled"))
        .and_then(|e| e["cause"].as_str())
        .unwrap_or("?")
        .to_string();
    let stock = back_on_sale(http, base, order).await?;
    style.line(&format!(
        "{}  order {id} {} by {by}, {lateness} ms after its deadline; back on sale: {stock}",
        clock(),
        style.paint("31", "cancelled"),
    ));
    Ok((by, lateness))
}

/// The summary: what happened, by which path, and the stock ledger; an error
/// if a timer did not cancel its order or the stock does not add up.
async fn summary(
    style: &Style,
    http: &JsonClient,
    base: &str,
    orders: &[Placed],
    ledger: &Ledger,
) -> anyhow::Result<()> {
    style.line(&style.paint("1", "summary"));
    style.line(&format!(
        "  {} orders: {} paid, {} cancelled",
        orders.len(),
        ledger.paid.len(),
        ledger.cancels.len()
    ));
    let by_timer: Vec<i64> = ledger
        .cancels
        .iter()
        .filter(|(by, _)| by == "timeout")
        .map(|(_, late)| *late)
        .collect();
    if let Some(worst) = by_timer.iter().max() {
        style.line(&format!(
            "  {} cancelled by their timer from the broker, at most {worst} ms after the deadline",
            by_timer.len()
        ));
    }
    let missed: Vec<&(String, i64)> = ledger
        .cancels
        .iter()
        .filter(|(by, _)| by != "timeout")
        .collect();
    if let Some(worst) = missed.iter().map(|(_, late)| *late).max() {
        style.line(&style.paint(
            "31",
            &format!(
                "  {} cancelled by the {} instead, up to {worst} ms late: their timers did not arrive (see the log)",
                missed.len(),
                missed[0].0
            ),
        ));
    }
    for (sku, stocked) in STOCK {
        let s = get_json(http, &format!("{base}/inventory/{sku}")).await?;
        let (a, r, so) = (
            s["available"].as_i64().unwrap_or(-1),
            s["reserved"].as_i64().unwrap_or(-1),
            s["sold"].as_i64().unwrap_or(-1),
        );
        anyhow::ensure!(
            a + r + so == stocked && r == 0,
            "stock of {sku} does not add up: {s}"
        );
        style.line(&format!(
            "  {sku:<7} available {a:>2}  reserved {r}  sold {so:>2}  (stocked {stocked})"
        ));
    }
    anyhow::ensure!(
        missed.is_empty(),
        "{} order(s) were not cancelled by their timer",
        missed.len()
    );
    Ok(())
}

fn late_ms(order: &Value) -> i64 {
    let at = |f: &str| {
        Millis::parse_rfc3339(order[f].as_str().unwrap_or_default())
            .map(|m| m.0)
            .unwrap_or(0)
    };
    at("cancelled_at") - at("pay_deadline")
}

/// GET on the service's API, as JSON.
async fn get_json(http: &JsonClient, url: &str) -> anyhow::Result<Value> {
    success(&format!("GET {url}"), http.get(url).await?)
}

async fn back_on_sale(http: &JsonClient, base: &str, order: &Value) -> anyhow::Result<String> {
    let mut parts = Vec::new();
    for item in order["items"].as_array().cloned().unwrap_or_default() {
        let sku = item["sku"].as_str().unwrap_or_default();
        let s = get_json(http, &format!("{base}/inventory/{sku}")).await?;
        parts.push(format!(
            "{}×{sku} ({} available)",
            item["quantity"], s["available"]
        ));
    }
    Ok(parts.join(", "))
}

//! The whole order lifecycle (issue 3): fulfillment and receipt deadlines, buyer
//! cancel, refused transitions, the audit trail, the sweeper, a payment/timeout
//! race, and a randomized interleaving checked against the conservation law.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use order_timeout::domain::OrderStatus;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::helpers::*;

/// Short windows for every stage.
fn short(backend: Backend, mode: DelayMode) -> Spawn {
    Spawn::new(backend, mode)
        .env("ORDER_TIMEOUT__WINDOWS__FULFILLMENT", "2s")
        .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", "2s")
}

/// The events of an order's audit trail.
async fn trail(app: &TestApp, id: &str) -> Vec<Value> {
    let order = app.order_with_audit(id).await;
    order["audit"]
        .as_array()
        .unwrap_or_else(|| panic!("audit missing: {order}"))
        .clone()
}

fn events(trail: &[Value]) -> Vec<String> {
    trail
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["event"].as_str().unwrap(),
                e["cause"].as_str().unwrap()
            )
        })
        .collect()
}

each_mode!(every_timeout_end_to_end, MariaDb);
each_mode!(buyer_actions_and_refusals);

async fn every_timeout_end_to_end(backend: Backend, mode: DelayMode) {
    let app = spawn_app(short(backend, mode)).await;
    app.put_stock("A", 10).await;
    // Payment: covered in core; here the fulfillment and receipt deadlines.
    let unshipped = app.order(&[("A", 1)], "10m").await;
    let shipped = app.order(&[("A", 1)], "10m").await;
    for id in [&unshipped, &shipped] {
        assert_eq!(app.post(id, "pay").await.0, 200);
    }
    let (status, body) = app.post(&shipped, "ship").await;
    assert_eq!(status, 200, "{body}");
    assert!(body["confirm_deadline"].is_string(), "{body}");

    // Fulfillment: the unshipped order is flagged (still paid), not cancelled.
    let flagged = wait_until(
        Duration::from_secs(20),
        "fulfillment overdue flag",
        || async {
            let order = app.get_order(&unshipped).await;
            order["fulfillment_overdue_at"].is_string().then_some(order)
        },
    )
    .await;
    assert_eq!(flagged["status"], "paid");
    assert_on_time(&flagged, "fulfillment_overdue_at", "ship_deadline");

    // Receipt: the shipped order the buyer never confirmed completes by itself.
    let done = app
        .wait_status(&shipped, "completed", Duration::from_secs(20))
        .await;
    assert_on_time(&done, "completed_at", "confirm_deadline");
    // It shipped inside its fulfillment window, so its fulfillment timeout did nothing.
    assert!(done.get("fulfillment_overdue_at").is_none(), "{done}");

    assert_eq!(
        events(&trail(&app, &unshipped).await),
        ["created/api", "paid/api", "fulfillment_overdue/timeout"]
    );
    assert_eq!(
        events(&trail(&app, &shipped).await),
        [
            "created/api",
            "paid/api",
            "shipped/api",
            "completed/timeout"
        ]
    );
    assert_timeout_ledger(&app).await;
    assert_eq!(app.stock("A").await["sold"], 2);
}

/// Final outcomes of the timeout messages of `every_timeout_end_to_end`, by
/// kind: (applied, not_applicable, parked).
async fn outcomes(app: &TestApp, kind: &str) -> (f64, f64, f64) {
    let count = |outcome: &'static str| {
        let labels = [format!("kind=\"{kind}\""), format!("outcome=\"{outcome}\"")];
        async move {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            app.metric("order_timeout_timeouts_handled_total", &labels)
                .await
        }
    };
    (
        count("applied").await,
        count("not_applicable").await,
        count("parked").await,
    )
}

/// The message ledger of `every_timeout_end_to_end`. Published: one
/// fulfillment timeout per paid order (2), one receipt timeout for the shipped
/// order (1), and payment timeouts of 10 minutes (none due in the test). Each
/// due message ends exactly once, applied or not applicable, none parked (an
/// early arrival, held or re-delayed, is counted `not_yet_due` first, then
/// ends like the rest). The shipped order's fulfillment timeout finds it
/// shipped. The other two are applied, once each as the audit trails show;
/// under heavy load a retried batch (its first commit's answer lost) counts
/// its order as not_applicable instead, which the ledger allows.
async fn assert_timeout_ledger(app: &TestApp) {
    for (kind, published) in [("fulfillment", 2.0), ("receipt", 1.0)] {
        wait_until(
            Duration::from_secs(20),
            &format!("every {kind} timeout handled"),
            || async {
                let (applied, not_applicable, _) = outcomes(app, kind).await;
                (applied + not_applicable >= published).then_some(())
            },
        )
        .await;
    }
    let fulfillment = outcomes(app, "fulfillment").await;
    assert!(
        [(1.0, 1.0, 0.0), (0.0, 2.0, 0.0)].contains(&fulfillment),
        "fulfillment (applied, not_applicable, parked): {fulfillment:?}"
    );
    let receipt = outcomes(app, "receipt").await;
    assert!(
        [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0)].contains(&receipt),
        "receipt (applied, not_applicable, parked): {receipt:?}"
    );
    let payment = outcomes(app, "payment").await;
    assert_eq!(payment, (0.0, 0.0, 0.0), "payment: none was due");
}

async fn buyer_actions_and_refusals(backend: Backend, mode: DelayMode) {
    let app = spawn_app(short(backend, mode)).await;
    app.put_stock("A", 10).await;

    // Buyer cancel releases the stock; the later payment timeout is a no-op.
    let cancelled = app.order(&[("A", 3)], "2s").await;
    let (status, body) = app.post(&cancelled, "cancel").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    assert_eq!(app.stock("A").await["available"], 10);
    wait_until(
        Duration::from_secs(20),
        "the cancelled order's timeout handled",
        || async {
            let n = app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\"", "outcome=\"not_applicable\""],
                )
                .await;
            (n >= 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(app.get_order(&cancelled).await["version"], 1);
    assert_eq!(
        events(&trail(&app, &cancelled).await),
        ["created/api", "cancelled/api"]
    );

    // A payment for an order the buyer cancelled: 409, and no late payment (no
    // timeout closed it; `core` shows the timeout's case).
    let (status, body) = app.post(&cancelled, "pay").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("cancelled")),
        "{body}"
    );
    assert_eq!(
        events(&trail(&app, &cancelled).await),
        ["created/api", "cancelled/api"]
    );
    assert!(
        app.get_order(&cancelled)
            .await
            .get("late_payment_at")
            .is_none()
    );
    assert_eq!(
        app.metric("order_timeout_late_payments_total", &[]).await,
        0.0
    );

    // Transitions the diagram forbids are refused, naming the status, changing nothing.
    let paid = app.order(&[("A", 1)], "10m").await;
    assert_eq!(app.post(&paid, "pay").await.0, 200);
    for (action, status) in [("cancel", "paid"), ("confirm", "paid"), ("pay", "paid")] {
        let (code, body) = app.post(&paid, action).await;
        assert_eq!(
            (code, body["status"].as_str()),
            (409, Some(status)),
            "{action}: {body}"
        );
        assert!(body["error"].as_str().unwrap().contains(status), "{body}");
    }
    let pending = app.order(&[("A", 1)], "10m").await;
    for action in ["ship", "confirm"] {
        let (code, body) = app.post(&pending, action).await;
        assert_eq!(
            (code, body["status"].as_str()),
            (409, Some("pending_payment")),
            "{action}: {body}"
        );
    }
    assert_eq!(app.post(&paid, "ship").await.0, 200);
    assert_eq!(app.post(&paid, "ship").await.0, 409);
    let (code, body) = app.post(&paid, "confirm").await;
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("completed")),
        "{body}"
    );
    for action in ["cancel", "confirm", "ship", "pay"] {
        assert_eq!(
            app.post(&paid, action).await.0,
            409,
            "{action} on a completed order"
        );
    }
    assert_eq!(app.post(&paid, "refund").await.0, 404);
    // A shipped-then-completed order is neither flagged nor completed twice by
    // its timeouts: once both have been handled (2 s windows), nothing changed.
    for kind in ["fulfillment", "receipt"] {
        wait_until(
            Duration::from_secs(15),
            &format!("the completed order's {kind} timeout handled"),
            || async {
                let n = app
                    .metric(
                        "order_timeout_timeouts_handled_total",
                        &[&format!("kind=\"{kind}\""), "outcome=\"not_applicable\""],
                    )
                    .await;
                (n >= 1.0).then_some(())
            },
        )
        .await;
    }
    let order = app.get_order(&paid).await;
    assert!(order.get("fulfillment_overdue_at").is_none(), "{order}");
    assert_eq!(order["version"], 3);
    assert_eq!(
        events(&trail(&app, &paid).await),
        ["created/api", "paid/api", "shipped/api", "completed/api"]
    );
    assert_eq!(app.get_order(&pending).await["status"], "pending_payment");
    assert_eq!(
        app.stock("A").await,
        serde_json::json!({"sku": "A", "available": 8, "reserved": 1, "sold": 1})
    );
}

/// Deletes every message in every queue of the vhost: the broker "lost" them.
async fn purge_all(vhost: &str) -> usize {
    let queues: Vec<Value> =
        serde_json::from_value(api_get(&format!("/queues/{vhost}")).await).unwrap();
    for q in &queues {
        purge_queue(vhost, q["name"].as_str().unwrap()).await;
    }
    queues.len()
}

/// The stage windows and the unpaid orders' payment window of
/// `sweeper_catches_what_the_broker_lost`: a timer published with a delay of
/// 8 to 10 s (whole seconds, rounded down) waits first in the 8 s TTL level.
const LOST_WINDOW: Duration = Duration::from_secs(10);
/// How long a timer of [`LOST_WINDOW`] stays in its first TTL level.
const LOST_FIRST_LEVEL: Duration = Duration::from_secs(8);
/// The sweeper's interval and grace there.
const LOST_SWEEP: Duration = Duration::from_millis(250);

async fn sweeper_catches_what_the_broker_lost(backend: Backend) {
    // Windows long enough that every timer still sits in its first TTL level
    // (8 s) when it is purged: not between levels, not held in a consumer's
    // memory.
    let window = format!("{}ms", LOST_WINDOW.as_millis());
    let sweep = format!("{}ms", LOST_SWEEP.as_millis());
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__WINDOWS__FULFILLMENT", window.clone())
            .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", window.clone())
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", sweep.clone())
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", sweep),
    )
    .await;
    app.put_stock("A", 100).await;
    let started = std::time::Instant::now();
    // Ten of each at once: the sooner every timer is in, the shorter the
    // windows can be.
    let (app_ref, window_ref) = (&app, &window);
    let placed = join_all((0..10).map(|_| async move {
        let (app, window) = (app_ref, window_ref);
        let u = app.order(&[("A", 1)], window).await;
        let p = app.order(&[("A", 2)], "10m").await;
        assert_eq!(app.post(&p, "pay").await.0, 200);
        let s = app.order(&[("A", 1)], "10m").await;
        assert_eq!(app.post(&s, "pay").await.0, 200);
        assert_eq!(app.post(&s, "ship").await.0, 200);
        (u, p, s)
    }))
    .await;
    let mut unpaid = Vec::new();
    let mut paid = Vec::new();
    let mut shipped = Vec::new();
    for (u, p, s) in placed {
        unpaid.push(u);
        paid.push(p);
        shipped.push(s);
    }
    // Every timer is waiting in a TTL level (not in the outbox, not in the
    // router's hands), then the broker loses them all.
    wait_until(
        Duration::from_secs(10),
        "all 40 timers in the levels",
        || async {
            let levels: Vec<String> = (0..order_timeout::amqp::topology::LEVELS)
                .map(|l| app.names.level(l))
                .collect();
            (app.queue_depths(&levels).await.iter().sum::<u32>() >= 40).then_some(())
        },
    )
    .await;
    assert!(purge_all(&app.vhost).await >= 28);
    assert!(
        started.elapsed() < LOST_FIRST_LEVEL - Duration::from_secs(1),
        "setup took {:?}: some timers may have left their first level before the purge",
        started.elapsed()
    );

    // interval + grace after each deadline (all ≤ the window from the purge),
    // with slack for the sweep.
    let within = LOST_WINDOW + LOST_SWEEP + LOST_SWEEP + Duration::from_secs(3);
    for id in &unpaid {
        app.wait_status(id, "cancelled", within).await;
    }
    for id in &shipped {
        app.wait_status(id, "completed", within).await;
    }
    for id in &paid {
        wait_until(within, "fulfillment flag by the sweeper", || async {
            app.get_order(id).await["fulfillment_overdue_at"]
                .is_string()
                .then_some(())
        })
        .await;
    }
    for kind in ["payment", "fulfillment", "receipt"] {
        let caught = app
            .metric(
                "order_timeout_sweeper_catches_total",
                &[&format!("kind=\"{kind}\"")],
            )
            .await;
        assert_eq!(caught, 10.0, "{kind} catches");
    }
    assert_eq!(
        events(&trail(&app, &unpaid[0]).await),
        ["created/api", "cancelled/sweeper"]
    );
    assert_eq!(app.stock("A").await["available"], 100 - 30);
    assert_eq!(app.stock("A").await["reserved"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_catches_what_the_broker_lost_sqlite() {
    sweeper_catches_what_the_broker_lost(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_catches_what_the_broker_lost_postgres() {
    sweeper_catches_what_the_broker_lost(Backend::Postgres).await
}

const SKUS: [&str; 4] = ["R1", "R2", "R3", "R4"];
const STOCK: i64 = 10_000;

/// For every SKU, available + reserved + sold equals what was stocked.
async fn assert_conserved(app: &TestApp) -> HashMap<String, Value> {
    let mut all = HashMap::new();
    for sku in SKUS {
        let s = app.stock(sku).await;
        let total = s["available"].as_i64().unwrap()
            + s["reserved"].as_i64().unwrap()
            + s["sold"].as_i64().unwrap();
        assert_eq!(total, STOCK, "conservation broken for {sku}: {s}");
        assert!(
            s["available"].as_i64().unwrap() >= 0 && s["reserved"].as_i64().unwrap() >= 0,
            "{s}"
        );
        all.insert(sku.to_string(), s);
    }
    all
}

/// Each audit trail is a legal walk through the state diagram ending where the order is.
fn assert_legal(order: &Value, trail: &[Value]) {
    let first = &trail[0];
    assert_eq!(
        (first["event"].as_str(), first["to"].as_str()),
        (Some("created"), Some("pending_payment")),
        "{order}"
    );
    let mut at = OrderStatus::PendingPayment;
    let mut flagged = false;
    for e in &trail[1..] {
        let from: OrderStatus = e["from"].as_str().unwrap().parse().unwrap();
        let to: OrderStatus = e["to"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            from, at,
            "event {e} does not start where the order was, in {trail:?}"
        );
        match e["event"].as_str().unwrap() {
            "fulfillment_overdue" => {
                assert!(
                    from == OrderStatus::Paid && to == from && !flagged,
                    "bad flag {e} in {trail:?}"
                );
                flagged = true;
            }
            "late_payment" => assert!(
                from == OrderStatus::Cancelled && to == from,
                "bad late payment {e}"
            ),
            _ => assert!(from.can_become(to), "illegal transition {e} in {trail:?}"),
        }
        at = to;
    }
    assert_eq!(
        order["status"].as_str(),
        Some(at.as_str()),
        "final status differs from the trail: {trail:?}"
    );
}

async fn payment_and_timeout_race(backend: Backend) {
    // 500 requests at once, each to be answered (not refused as a flood).
    let app = Arc::new(
        spawn_app(
            Spawn::new(backend, DelayMode::Ttl).env("ORDER_TIMEOUT__HTTP__MAX_IN_FLIGHT", "1000"),
        )
        .await,
    );
    for sku in SKUS {
        app.put_stock(sku, STOCK).await;
    }
    // 500 orders with the same deadline, far enough ahead for checkout on a
    // machine the rest of the suite keeps busy (toolchains of the publisher
    // examples starting beside it, say): half a second alone, so twelve
    // times that.
    let placing = std::time::Instant::now();
    let deadline = chrono::Utc::now().timestamp_millis() + 6_000;
    // Placed 50 at a time: the checkouts are not the race, and 500 at once
    // would only queue for the API's database pool on a busy machine.
    let ids: Vec<(String, Vec<(&str, i64)>)> = futures_util::stream::iter((0..500).map(|i| {
        let app = app.clone();
        async move {
            let items: Vec<(&str, i64)> =
                vec![(SKUS[i % 4], 1 + (i % 3) as i64), (SKUS[(i + 1) % 4], 1)];
            let window = format!("{}ms", deadline - chrono::Utc::now().timestamp_millis());
            (app.order(&items, &window).await, items)
        }
    }))
    .buffered(50)
    .collect()
    .await;
    // Fire every payment at the deadline, as the timeouts fire: the sleep is
    // the scenario, not a wait for a condition.
    let wait = deadline - chrono::Utc::now().timestamp_millis() - 30;
    let placed_in = placing.elapsed();
    assert!(
        wait > 0,
        "checkout of 500 orders took {placed_in:?}, longer than the window"
    );
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    let answers: Vec<(u16, Value)> = join_all(ids.iter().map(|(id, _)| {
        let app = app.clone();
        let id = id.clone();
        async move { app.post(&id, "pay").await }
    }))
    .await;

    let mut sold_expected: HashMap<&str, i64> = HashMap::new();
    let (mut paid, mut cancelled) = (0, 0);
    for ((id, items), (code, body)) in ids.iter().zip(&answers) {
        let order = app
            .wait_status(
                id,
                if *code == 200 { "paid" } else { "cancelled" },
                Duration::from_secs(20),
            )
            .await;
        match code {
            200 => {
                paid += 1;
                for (sku, q) in items {
                    *sold_expected.entry(sku).or_default() += q;
                }
            }
            409 => {
                cancelled += 1;
                assert_eq!(body["status"], "cancelled", "{body}");
            }
            other => panic!("pay answered {other}: {body}"),
        }
        let trail = trail(&app, id).await;
        assert_legal(&order, &trail);
        let terminal: Vec<_> = trail
            .iter()
            .filter(|e| e["event"] == "paid" || e["event"] == "cancelled")
            .collect();
        assert_eq!(
            terminal.len(),
            1,
            "paid or cancelled, never both: {trail:?}"
        );
    }
    assert_eq!(paid + cancelled, 500);
    eprintln!("race: {paid} paid, {cancelled} cancelled (checkout took {placed_in:?})");
    // Every timeout has come through (applied to the unpaid, a no-op for the paid).
    wait_until(
        Duration::from_secs(20),
        "all 500 timeouts handled",
        || async {
            let applied = app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\"", "outcome=\"applied\""],
                )
                .await;
            let noop = app
                .metric(
                    "order_timeout_timeouts_handled_total",
                    &["kind=\"payment\"", "outcome=\"not_applicable\""],
                )
                .await;
            (applied + noop >= 500.0).then_some(())
        },
    )
    .await;
    let stock = assert_conserved(&app).await;
    for sku in SKUS {
        assert_eq!(stock[sku]["reserved"], 0, "{sku}: {}", stock[sku]);
        assert_eq!(
            stock[sku]["sold"],
            sold_expected.get(sku).copied().unwrap_or(0),
            "{sku}"
        );
    }
    assert_eq!(
        app.metric("order_timeout_late_payments_total", &[]).await,
        cancelled as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_and_timeout_race_postgres() {
    payment_and_timeout_race(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_and_timeout_race_sqlite() {
    payment_and_timeout_race(Backend::Sqlite).await
}

/// Operations each of the six workers performs.
const OPS_PER_WORKER: usize = 80;

async fn randomized_interleaving(backend: Backend) {
    let seed: u64 = std::env::var("TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("randomized_interleaving({backend:?}): TEST_SEED={seed}");
    let app = Arc::new(
        spawn_app(
            short(backend, DelayMode::Ttl)
                .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
                .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "700ms")
                .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s"),
        )
        .await,
    );
    for sku in SKUS {
        app.put_stock(sku, STOCK).await;
    }
    let orders = Arc::new(tokio::sync::Mutex::new(Vec::<String>::new()));
    let workers = (0..6).map(|w| {
        let app = app.clone();
        let orders = orders.clone();
        async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(w));
            let publisher = app.publisher().await;
            for _ in 0..OPS_PER_WORKER {
                let known = orders.lock().await.clone();
                let pick =
                    |rng: &mut StdRng| known.get(rng.random_range(0..known.len().max(1))).cloned();
                match rng.random_range(0..10) {
                    0..=2 => {
                        let items = vec![(SKUS[rng.random_range(0..4)], rng.random_range(1..4))];
                        let window = format!("{}ms", rng.random_range(500..2500));
                        let (code, body) = app.checkout(&items, &window).await;
                        assert_eq!(code, 201, "{body}");
                        orders
                            .lock()
                            .await
                            .push(body["id"].as_str().unwrap().to_string());
                    }
                    n @ 3..=6 => {
                        if let Some(id) = pick(&mut rng) {
                            let action = ["pay", "ship", "confirm", "cancel"][n - 3];
                            let (code, body) = app.post(&id, action).await;
                            assert!(code == 200 || code == 409, "{action}: {code} {body}");
                        }
                    }
                    7 | 8 => {
                        if let Some(id) = pick(&mut rng) {
                            let kind =
                                ["payment", "fulfillment", "receipt"][rng.random_range(0..3)];
                            publisher
                                .timeout(&id, kind, rng.random_range(1..1500))
                                .await;
                        }
                    }
                    _ => {
                        order_timeout::sweeper::sweep(
                            &app.ctx,
                            order_timeout::domain::Millis::now(),
                        )
                        .await
                        .unwrap();
                    }
                }
            }
        }
    });
    join_all(workers).await;
    let ids = orders.lock().await.clone();
    assert!(
        ids.len() > 40,
        "only {} orders placed (seed {seed})",
        ids.len()
    );

    // Settle: every deadline passes (windows ≤ 2.5 s, stages 2 s) and is applied.
    let mut settled = Vec::new();
    for id in &ids {
        let order = wait_until(
            Duration::from_secs(20),
            &format!("order {id} settles"),
            || async {
                let o = app.get_order(id).await;
                let done = match o["status"].as_str().unwrap() {
                    "pending_payment" => false,
                    "paid" => o["fulfillment_overdue_at"].is_string(),
                    "shipped" => false,
                    _ => true,
                };
                done.then_some(o)
            },
        )
        .await;
        settled.push(order);
    }
    let mut sold: HashMap<String, i64> = HashMap::new();
    for order in &settled {
        let id = order["id"].as_str().unwrap();
        assert_legal(order, &trail(&app, id).await);
        if matches!(order["status"].as_str(), Some("paid" | "completed")) {
            for item in order["items"].as_array().unwrap() {
                *sold
                    .entry(item["sku"].as_str().unwrap().to_string())
                    .or_default() += item["quantity"].as_i64().unwrap();
            }
        }
    }
    let stock = assert_conserved(&app).await;
    for sku in SKUS {
        assert_eq!(stock[sku]["reserved"], 0, "{sku} (seed {seed})");
        assert_eq!(
            stock[sku]["sold"],
            sold.get(sku).copied().unwrap_or(0),
            "{sku} (seed {seed})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_interleaving_postgres() {
    randomized_interleaving(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_interleaving_sqlite() {
    randomized_interleaving(Backend::Sqlite).await
}

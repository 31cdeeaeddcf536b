//! The deadlines ahead: a burst of orders falling due ten minutes out shows
//! in its minute of `GET /admin/deadlines` and in `due_next{window="60m"}`,
//! not in the 1m and 5m windows; orders past their deadline count as
//! overdue until their timeouts are applied; bad input is a 400 naming the
//! parameter; a checkout token is refused. The service's own orders in every
//! delay mode, a shop's table on PostgreSQL and MariaDB.

use std::time::Duration;

use sea_orm::ConnectionTrait;
use serde_json::Value;

use crate::helpers::*;
use crate::mapped::{mall_mapping, mall_schema};

/// How many orders the burst has.
const BURST: u64 = 12;
/// How far ahead the burst falls due.
const AHEAD_MS: i64 = 10 * 60_000;

/// The start of the minute `ms` is in.
fn minute_of(ms: i64) -> i64 {
    ms - ms.rem_euclid(60_000)
}

fn millis(rfc3339: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .timestamp_millis()
}

/// `/admin/deadlines` for `query`, answered 200.
async fn deadlines(app: &TestApp, query: &str) -> Value {
    let resp = app
        .http
        .get(format!("{}/admin/deadlines{query}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{query}");
    resp.json().await.unwrap()
}

/// The one entry of `kind` in an answer.
fn kind<'a>(answer: &'a Value, kind: &str) -> &'a Value {
    let kinds = answer["kinds"].as_array().unwrap();
    kinds
        .iter()
        .find(|k| k["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {answer}"))
}

/// The database's clock as `/admin/deadlines` reads it.
async fn db_now(app: &TestApp) -> i64 {
    millis(deadlines(app, "?next=1m").await["now"].as_str().unwrap())
}

/// The burst, whose deadlines all lie in `[from, to]`: in the minutes of
/// that span only, `BURST` in all, and counted within an hour but not within
/// five minutes; `overdue` orders are overdue.
async fn assert_burst(app: &TestApp, from: i64, to: i64, overdue: u64) {
    let answer = deadlines(app, "?kind=payment&next=15m").await;
    assert_eq!(answer["next_ms"], 15 * 60_000);
    let kinds = answer["kinds"].as_array().unwrap();
    assert_eq!(kinds.len(), 1, "{answer}");
    let payment = kind(&answer, "payment");
    assert_eq!(payment["overdue"], overdue, "{answer}");
    assert_eq!(payment["total"], BURST, "{answer}");
    let minutes = payment["minutes"].as_array().unwrap();
    let mut sum = 0;
    let mut last = i64::MIN;
    for m in minutes {
        let start = millis(m["start"].as_str().unwrap());
        assert_eq!(start, minute_of(start), "on the minute: {m}");
        assert!(start > last, "ascending: {answer}");
        last = start;
        assert!(
            (minute_of(from)..=minute_of(to)).contains(&start),
            "the burst's minute, between {from} and {to}: {answer}"
        );
        let due = m["due"].as_u64().unwrap();
        assert!(due > 0, "only minutes with something due: {answer}");
        sum += due;
    }
    assert_eq!(sum, BURST, "{answer}");
    // Ten minutes out: nothing within five.
    let soon = deadlines(app, "?kind=payment&next=5m").await;
    assert_eq!(kind(&soon, "payment")["total"], 0, "{soon}");
    assert_eq!(kind(&soon, "payment")["minutes"], serde_json::json!([]));
    assert_eq!(kind(&soon, "payment")["overdue"], overdue, "{soon}");

    // The gauge: within the hour, not within one or five minutes.
    let gauge = |window: &'static str| async move {
        app.metric(
            "order_timeout_due_next",
            &["kind=\"payment\"", &format!("window=\"{window}\"")],
        )
        .await
    };
    wait_until(
        Duration::from_secs(10),
        "due_next 60m counts the burst",
        || async { (gauge("60m").await == BURST as f64).then_some(()) },
    )
    .await;
    assert_eq!(gauge("5m").await, 0.0);
    assert_eq!(gauge("1m").await, 0.0);
}

/// A POST of the admin API, answered 200.
async fn admin_post(app: &TestApp, path: &str) {
    let resp = app
        .http
        .post(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
}

/// Refusals: a wrong `kind` or `next` names itself; a checkout token gets 403.
async fn assert_refusals(app: &TestApp, checkout: &str) {
    for (query, names) in [
        ("?kind=refund", "`kind`"),
        ("?kind=", "`kind`"),
        ("?next=soon", "`next`"),
        ("?next=30s", "`next`"),
        ("?next=25h", "`next`"),
        ("?next=90s", "`next`"),
        ("?kind=payment&next=0m", "`next`"),
    ] {
        let resp = app
            .http
            .get(format!("{}/admin/deadlines{query}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{query}");
        let body: Value = resp.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(names), "{query}: {error}");
    }
    let resp = api_client(Some(checkout))
        .get(format!("{}/admin/deadlines", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let resp = api_client(None)
        .get(format!("{}/admin/deadlines", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}

/// The service's own orders: a burst of checkouts with a 10 minute window,
/// their timers in the delay stage; three with a 1 s window, overdue while
/// the payment consumer is paused, then cancelled once it is resumed.
async fn owned(backend: Backend, mode: DelayMode) {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone())
            .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms"),
    )
    .await;
    assert_refusals(&app, &checkout).await;
    app.put_stock("A", 100).await;
    admin_post(&app, "/admin/pause/payment?scope=instance").await;
    let mut short = Vec::new();
    for _ in 0..3 {
        short.push(app.order(&[("A", 1)], "1s").await);
    }
    let from = db_now(&app).await + AHEAD_MS;
    for _ in 0..BURST {
        app.order(&[("A", 1)], "10m").await;
    }
    let to = db_now(&app).await + AHEAD_MS;
    // The short ones past their deadline, still pending.
    wait_until(Duration::from_secs(10), "three overdue", || async {
        let answer = deadlines(&app, "?kind=payment").await;
        (kind(&answer, "payment")["overdue"] == 3).then_some(())
    })
    .await;
    assert_burst(&app, from, to, 3).await;
    // Every kind when none is named: the others have nothing ahead.
    let all = deadlines(&app, "").await;
    assert_eq!(all["next_ms"], 3_600_000);
    let names: Vec<&str> = all["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kind"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["payment", "fulfillment", "receipt"]);
    assert_eq!(kind(&all, "fulfillment")["total"], 0);
    assert_eq!(kind(&all, "payment")["total"], BURST);

    // Resumed, the consumer applies the short ones' timeouts: no longer overdue.
    admin_post(&app, "/admin/resume/payment?scope=instance").await;
    for id in &short {
        app.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }
    let answer = deadlines(&app, "?kind=payment&next=15m").await;
    assert_eq!(kind(&answer, "payment")["overdue"], 0, "{answer}");
    assert_eq!(kind(&answer, "payment")["total"], BURST, "{answer}");
}

each_mode!(owned, MariaDb);

/// A shop's table (the mall, 3 s payment window from `create_time`, whole
/// seconds): a burst of rows whose deadline is ten minutes ahead by the
/// database's clock, and three unpaid rows an hour old, overdue (nothing
/// sweeps them). Receipt is mapped, fulfillment is not: it has no entry.
async fn mapped(backend: Backend, mode: DelayMode) {
    let checkout = new_token("checkout");
    let app = spawn_app(mall_mapping(
        Spawn::new(backend, mode)
            .setup(&mall_schema(backend))
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone())
            .env("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "200ms"),
        false,
    ))
    .await;
    assert_refusals(&app, &checkout).await;
    // Deadline = create_time + 3 s window (+ 1 s for a column in whole
    // seconds): ten minutes ahead.
    let (past, ahead) = match backend {
        Backend::Postgres => (
            "LOCALTIMESTAMP - INTERVAL '1 hour'",
            "LOCALTIMESTAMP + INTERVAL '10 minutes' - INTERVAL '4 seconds'",
        ),
        _ => (
            "NOW() - INTERVAL 1 HOUR",
            "NOW() + INTERVAL 10 MINUTE - INTERVAL 4 SECOND",
        ),
    };
    let from = db_now(&app).await + AHEAD_MS;
    for n in 1..=(3 + BURST) {
        let created = if n <= 3 { past } else { ahead };
        app.ctx
            .db
            .execute_unprepared(&format!(
                "INSERT INTO oms_order (id, member_id, order_sn, status, create_time) \
                 VALUES ({n}, {n}, 'sn-{n}', 0, {created})"
            ))
            .await
            .unwrap();
    }
    // Whole seconds: rounded (PostgreSQL) or truncated (MariaDB) by up to a second.
    let to = db_now(&app).await + AHEAD_MS;
    assert_burst(&app, from - 1_000, to + 1_000, 3).await;
    let all = deadlines(&app, "?next=24h").await;
    let names: Vec<&str> = all["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kind"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["payment", "receipt"], "{all}");
    assert_eq!(kind(&all, "receipt")["total"], 0);
    // A kind the mapping leaves out: no entry, not an error.
    let none = deadlines(&app, "?kind=fulfillment").await;
    assert_eq!(none["kinds"], serde_json::json!([]));
    assert!(
        !app.metrics()
            .await
            .contains("order_timeout_due_next{kind=\"fulfillment\""),
        "a kind the mapping does not map has no series"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_postgres_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, mapped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_postgres_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, mapped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_mariadb_ttl() {
    run(Backend::MariaDb, DelayMode::Ttl, mapped).await;
}

//! The operator's page: `/ui`, its script and its style answer without a
//! token, with their types and the Content-Security-Policy that forbids
//! inline script; `/admin/overview`, which the page reads first, needs the
//! admin scope and answers the contract's fields with the real numbers:
//! orders waiting and overdue (by the database's clock), the roles as
//! `/admin/status` has them, and the parked queue by reason, read without
//! taking anything off it. (The page in a real browser: `make test-ui`.)

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

/// The page's policy, as the service sends it.
const POLICY: &str = order_timeout::http::ui::CONTENT_SECURITY_POLICY;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_open_under_its_policy() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let anonymous = api_client(None);
    for (path, content_type, marker) in [
        (
            "/ui",
            "text/html; charset=utf-8",
            "<title>order-timeout</title>",
        ),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "/admin/overview",
        ),
        ("/ui/style.css", "text/css; charset=utf-8", ".chart rect"),
    ] {
        let resp = anonymous
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "GET {path} without a token");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        assert_eq!(
            header("content-type").as_deref(),
            Some(content_type),
            "{path}"
        );
        assert_eq!(
            header("content-security-policy").as_deref(),
            Some(POLICY),
            "{path}"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"), "{path}");
        let body = resp.text().await.unwrap();
        assert!(body.contains(marker), "{path}: {body}");
    }
    // The policy allows this origin's script only, and no framing.
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(POLICY.contains(directive), "{POLICY}");
    }
    assert!(!POLICY.contains("unsafe-inline") && !POLICY.contains("unsafe-eval"));
    // What is not the page is not served as the page.
    let resp = anonymous
        .get(format!("{}/ui/other.js", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // Not in the API's document: it is not part of the JSON API.
    let doc = app.get_json("/openapi.json").await;
    assert!(doc["paths"].get("/ui").is_none());
}

/// On a loopback service without tokens the page and the overview need
/// none; a page under another name (DNS rebinding) is refused, the page
/// itself included, as every other route of a token-less service is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_less_service_serves_the_page_under_its_own_names_only() {
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl).env("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", ""),
    )
    .await;
    assert_eq!(app.token, None);
    let bare = reqwest::Client::new();
    for path in ["/ui", "/ui/app.js", "/admin/overview"] {
        let resp = bare
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "GET {path} without a token");
        let port = app.base.rsplit(':').next().unwrap();
        let resp = bare
            .get(format!("{}{path}", app.base))
            .header("host", format!("evil.example:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 421, "GET {path} under a rebound name");
    }
    // The page's own calls: a pause from its origin, with JSON, goes through.
    let resp = bare
        .post(format!("{}/admin/pause/receipt?scope=instance", app.base))
        .header("content-type", "application/json")
        .header("origin", &app.base)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let overview = app.get_json("/admin/overview").await;
    let receipt = overview["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "receipt")
        .unwrap();
    assert_eq!(receipt["paused"], true, "{overview}");
}

/// `/admin/overview`, read until `check` holds on it (the broker's and the
/// router's work take a moment), at a pace the management API is fine with.
async fn overview_until(app: &TestApp, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait_until(Duration::from_secs(30), what, || async {
        let overview = app.get_json("/admin/overview").await;
        if check(&overview) {
            Some(overview)
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            None
        }
    })
    .await
}

/// One kind's entry of an overview.
fn kind<'a>(overview: &'a Value, name: &str) -> &'a Value {
    overview["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == name)
        .unwrap_or_else(|| panic!("no kind {name}: {overview}"))
}

async fn overview_answers_the_contract(backend: Backend, mode: DelayMode) {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone())
            // Overdue as soon as the deadline passed.
            .env("ORDER_TIMEOUT__METRICS__OVERDUE_AFTER", "0s"),
    )
    .await;

    // The admin scope only.
    for (who, http, expected) in [
        ("no token", api_client(None), 401),
        ("a checkout token", api_client(Some(&checkout)), 403),
    ] {
        let resp = http
            .get(format!("{}/admin/overview", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), expected, "with {who}");
    }

    // Two orders waiting 10 minutes; one overdue, its payment consumer
    // paused (for every instance: the peer below too) so that it stays so.
    let resp = app
        .http
        .post(format!("{}/admin/pause/payment", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let paused: Value = resp.json().await.unwrap();
    assert_eq!(paused["paused"], true, "{paused}");
    app.put_stock("UI", 10).await;
    let waiting = [
        app.order(&[("UI", 1)], "10m").await,
        app.order(&[("UI", 1)], "10m").await,
    ];
    let overdue = app.order(&[("UI", 1)], "1s").await;

    // Two messages the router parks, each with its reason.
    app.publish_raw(
        "payment",
        lapin::types::FieldTable::default(),
        br#"{"order_id":"1","kind":"payment"}"#,
    )
    .await;
    app.publish_raw("payment", delay(60_000), b"not json").await;

    let overview = overview_until(&app, "one overdue order and two parked messages", |o| {
        o["kinds"].as_array().is_some_and(|kinds| {
            kinds
                .iter()
                .any(|k| k["kind"] == "payment" && k["overdue"] == 1)
        }) && o["parked"]["read"] == 2
    })
    .await;
    let payment = kind(&overview, "payment");
    assert_eq!(payment["waiting"], 3, "{overview}");
    assert_eq!(payment["overdue"], 1, "{overview}");
    for other in ["fulfillment", "receipt"] {
        assert_eq!(kind(&overview, other)["waiting"], 0, "{overview}");
    }
    assert_eq!(overview["overdue_after_ms"], 0);
    assert_eq!(overview["delay_mode"], mode.as_str());
    assert_eq!(overview["instance"], format!("test-{}", app.vhost));
    // The numbers are the database's, at its clock's reading.
    let now = overview["now"].as_str().unwrap();
    assert!(now.ends_with('Z') && now.len() >= 20, "{now}");
    let order = app.get_order(&overdue).await;
    assert!(
        ms(&order, "pay_deadline") <= ms(&overview, "now"),
        "{order} {overview}"
    );
    assert_eq!(
        app.get_order(&waiting[0]).await["status"],
        "pending_payment"
    );

    // The broker: its nodes as the management API names them.
    let broker = &overview["broker"];
    assert_eq!(broker["reachable"], true, "{broker}");
    assert_eq!(broker["connected"], true, "{broker}");
    let nodes = broker["nodes"].as_array().unwrap();
    let node = api_get("/overview").await["node"].clone();
    assert!(nodes.contains(&node), "{node} not in {broker}");

    // The roles as /admin/status has them, the paused consumer among them.
    let status = app.get_json("/admin/status").await;
    assert_eq!(overview["roles"], status["roles"]);
    let role = |name: &str| {
        overview["roles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["role"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no role {name}: {overview}"))
    };
    assert_eq!(role("payment")["paused"], true);
    assert_eq!(role("router")["paused"], false);

    // Parked: counted by reason, and still all there after being read.
    let parked = &overview["parked"];
    assert_eq!(parked["checked"], true, "{parked}");
    assert_eq!(parked["total"], 2, "{parked}");
    assert_eq!(parked["queue"], app.names.parked(), "{parked}");
    assert_eq!(
        parked["by_reason"],
        json!([
            {"reason": "invalid_body", "count": 1},
            {"reason": "missing_delay", "count": 1}
        ]),
        "{parked}"
    );
    for _ in 0..3 {
        let again = app.get_json("/admin/overview").await;
        assert_eq!(again["parked"]["by_reason"], parked["by_reason"]);
    }
    assert_eq!(app.queue_depth(&app.names.parked()).await, 2);
    let drained = app.drain_parked().await;
    let mut reasons: Vec<&str> = drained.iter().map(|(r, _, _)| r.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons, ["invalid_body", "missing_delay"]);
    overview_until(&app, "the parked queue empty", |o| {
        o["parked"]["total"] == 0 && o["parked"]["read"] == 0
    })
    .await;

    // Without the management API the database's numbers still come, and the
    // broker's part says why it is missing.
    let peer = app
        .spawn_variant(&[
            ("ORDER_TIMEOUT__AMQP__MANAGEMENT_URL", "off".to_string()),
            (
                "ORDER_TIMEOUT__AMQP__INSTANCE",
                format!("peer-{}", app.vhost),
            ),
        ])
        .await;
    let blind = peer.get_json("/admin/overview").await;
    assert_eq!(kind(&blind, "payment")["waiting"], 3, "{blind}");
    assert_eq!(blind["broker"]["reachable"], false, "{blind}");
    assert_eq!(blind["parked"]["checked"], false, "{blind}");
    for error in [&blind["broker"]["error"], &blind["parked"]["error"]] {
        assert!(
            error
                .as_str()
                .is_some_and(|e| e.contains("amqp.management_url")),
            "{blind}"
        );
    }
}
each_mode!(overview_answers_the_contract);

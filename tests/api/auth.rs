//! Authentication of the HTTP API against a real service: who may do what
//! with which token, that a refused request changes nothing, that the
//! operations endpoints are open unless protected, that a reachable bind
//! without tokens does not start, and that tokens are never shown.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use order_timeout::settings::{Settings, SettingsSource};
use order_timeout_harness::Serve;
use serde_json::{Value, json};

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// A service with a fresh admin token (the harness's) and a checkout token.
async fn app_with_checkout_token() -> (TestApp, String) {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
    )
    .await;
    (app, checkout)
}

/// Sends one request; returns the status, the `WWW-Authenticate` header and the body.
async fn call(
    http: &reqwest::Client,
    method: &str,
    url: String,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut req = http.request(method.parse().unwrap(), url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, challenge, body)
}

/// Every endpoint that needs a token, with a body where it takes one.
fn protected_calls(order: &str) -> Vec<(&'static str, String, Option<Value>)> {
    vec![
        (
            "PUT",
            "/inventory/A".into(),
            Some(json!({"available": 1000})),
        ),
        ("GET", "/inventory/A".into(), None),
        (
            "POST",
            "/orders".into(),
            Some(json!({"items": [{"sku": "A", "quantity": 1}]})),
        ),
        ("GET", format!("/orders/{order}"), None),
        ("GET", format!("/orders/{order}?include=audit"), None),
        ("POST", format!("/orders/{order}/pay"), None),
        ("POST", format!("/orders/{order}/ship"), None),
        ("POST", format!("/orders/{order}/confirm"), None),
        ("POST", format!("/orders/{order}/cancel"), None),
    ]
}

/// What a refused request may have changed: the stock, the order, and the
/// orders and actions counted.
async fn state(app: &TestApp, order: &str) -> Value {
    json!({
        "stock": app.stock("A").await,
        "order": app.get_order(order).await,
        "created": app.metric("order_timeout_orders_created_total", &[]).await,
        "actions": app.metric("order_timeout_order_actions_total", &[]).await,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_a_wrong_one_gets_401_and_changes_nothing() {
    let (app, _) = app_with_checkout_token().await;
    app.put_stock("A", 5).await;
    let order = app.order(&[("A", 2)], "10m").await;
    let before = state(&app, &order).await;

    let anonymous = api_client(None);
    let wrong = api_client(Some(&new_token("wrong")));
    // A prefix of the real token is no token either.
    let admin = app.token.clone().unwrap();
    let prefix = api_client(Some(&admin[..admin.len() - 1]));
    for (method, path, body) in protected_calls(&order) {
        let url = format!("{}{path}", app.base);
        let (status, challenge, answer) = call(&anonymous, method, url.clone(), body.clone()).await;
        assert_eq!(status, 401, "anonymous {method} {path}: {answer}");
        assert_eq!(challenge.as_deref(), Some("Bearer"), "{method} {path}");
        assert!(
            answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("bearer token")),
            "{method} {path}: {answer}"
        );
        for client in [&wrong, &prefix] {
            let (status, challenge, answer) = call(client, method, url.clone(), body.clone()).await;
            assert_eq!(status, 401, "wrong token {method} {path}: {answer}");
            assert_eq!(
                challenge.as_deref(),
                Some(r#"Bearer error="invalid_token""#),
                "{method} {path}"
            );
            assert!(answer["error"].is_string(), "{answer}");
        }
    }
    // Malformed headers: another scheme, no token, no scheme.
    for value in [
        format!("Basic {admin}"),
        "Bearer ".to_string(),
        "Bearer".to_string(),
        admin.clone(),
    ] {
        let resp = reqwest::Client::new()
            .put(format!("{}/inventory/A", app.base))
            .header("authorization", &value)
            .json(&json!({"available": 1000}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "Authorization: {value}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let body: Value = resp.json().await.unwrap();
        assert!(body["error"].is_string(), "{body}");
    }
    // A refused request reads no body: one that would not even parse gets 401, not 400.
    let resp = anonymous
        .post(format!("{}/orders", app.base))
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    assert_eq!(state(&app, &order).await, before, "nothing changed");
    assert_eq!(before["stock"]["available"], 3, "{before}");
    assert_eq!(before["order"]["status"], "pending_payment", "{before}");
    // Refusals are counted by reason.
    assert!(
        app.metric(
            "order_timeout_http_auth_refused_total",
            &["reason=\"missing_token\""]
        )
        .await
            >= 9.0
    );
    assert!(
        app.metric(
            "order_timeout_http_auth_refused_total",
            &["reason=\"invalid_token\""]
        )
        .await
            >= 18.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_tokens_buy_but_cannot_stock_or_ship() {
    let (app, checkout) = app_with_checkout_token().await;
    let buyer = api_client(Some(&checkout));
    app.put_stock("A", 5).await;

    // Inventory is the admin's: 403, and nothing changed.
    for (method, body) in [("PUT", Some(json!({"available": 1000}))), ("GET", None)] {
        let (status, challenge, answer) =
            call(&buyer, method, format!("{}/inventory/A", app.base), body).await;
        assert_eq!(status, 403, "{method} /inventory: {answer}");
        assert!(
            answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("admin")),
            "{answer}"
        );
        assert!(
            challenge.is_some_and(|c| c.contains("insufficient_scope")),
            "{method}"
        );
    }
    assert_eq!(app.stock("A").await["available"], 5);

    // Checkout, read, pay, confirm: the buyer's.
    let (status, _, order) = call(
        &buyer,
        "POST",
        format!("{}/orders", app.base),
        Some(json!({"items": [{"sku": "A", "quantity": 2}], "payment_window": "10m"})),
    )
    .await;
    assert_eq!(status, 201, "{order}");
    let id = order["id"].as_str().unwrap().to_string();
    let url = |tail: &str| format!("{}/orders/{id}{tail}", app.base);
    let (status, _, read) = call(&buyer, "GET", url("?include=audit"), None).await;
    assert_eq!((status, &read["status"]), (200, &json!("pending_payment")));
    let (status, _, paid) = call(&buyer, "POST", url("/pay"), None).await;
    assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");

    // Shipping is the merchant's: 403, the order stays paid.
    let (status, _, answer) = call(&buyer, "POST", url("/ship"), None).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(app.get_order(&id).await["status"], "paid");
    let (status, _) = app.post(&id, "ship").await;
    assert_eq!(status, 200);
    let (status, _, done) = call(&buyer, "POST", url("/confirm"), None).await;
    assert_eq!((status, &done["status"]), (200, &json!("completed")));

    // Cancel, too.
    let other = app.order(&[("A", 1)], "10m").await;
    let (status, _, cancelled) = call(
        &buyer,
        "POST",
        format!("{}/orders/{other}/cancel", app.base),
        None,
    )
    .await;
    assert_eq!((status, &cancelled["status"]), (200, &json!("cancelled")));
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 3, "reserved": 0, "sold": 2})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tokens_do_everything_and_rotated_pairs_both_work() {
    let (old_admin, new_admin) = (new_token("old-admin"), new_token("new-admin"));
    let (old_buyer, new_buyer) = (new_token("old-buyer"), new_token("new-buyer"));
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env(
                "ORDER_TIMEOUT__HTTP__ADMIN_TOKENS",
                format!("{old_admin}, {new_admin}"),
            )
            .env(
                "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
                format!("{old_buyer},{new_buyer}"),
            ),
    )
    .await;
    for admin in [&old_admin, &new_admin] {
        let http = api_client(Some(admin));
        let (status, _, stock) = call(
            &http,
            "PUT",
            format!("{}/inventory/A", app.base),
            Some(json!({"available": 10})),
        )
        .await;
        assert_eq!(status, 200, "{stock}");
        let (status, _, _) = call(&http, "GET", format!("{}/inventory/A", app.base), None).await;
        assert_eq!(status, 200);
        let (status, _, order) = call(
            &http,
            "POST",
            format!("{}/orders", app.base),
            Some(json!({"items": [{"sku": "A", "quantity": 1}]})),
        )
        .await;
        assert_eq!(status, 201, "{order}");
        let id = order["id"].as_str().unwrap();
        for (action, after) in [
            ("pay", "paid"),
            ("ship", "shipped"),
            ("confirm", "completed"),
        ] {
            let (status, _, order) = call(
                &http,
                "POST",
                format!("{}/orders/{id}/{action}", app.base),
                None,
            )
            .await;
            assert_eq!((status, &order["status"]), (200, &json!(after)), "{action}");
        }
        let cancel = app.order(&[("A", 1)], "10m").await;
        let (status, _, order) = call(
            &http,
            "POST",
            format!("{}/orders/{cancel}/cancel", app.base),
            None,
        )
        .await;
        assert_eq!((status, &order["status"]), (200, &json!("cancelled")));
        let (status, _, _) = call(&http, "GET", format!("{}/orders/{id}", app.base), None).await;
        assert_eq!(status, 200);
    }
    for buyer in [&old_buyer, &new_buyer] {
        let (status, _, order) = call(
            &api_client(Some(buyer)),
            "POST",
            format!("{}/orders", app.base),
            Some(json!({"items": [{"sku": "A", "quantity": 1}]})),
        )
        .await;
        assert_eq!(status, 201, "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_are_open_unless_protected() {
    let anonymous = api_client(None);
    let status = |path: &'static str, base: String, http: reqwest::Client| async move {
        http.get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let open = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(
            status(path, open.base.clone(), anonymous.clone()).await,
            200,
            "{path}"
        );
    }
    drop(open);

    let checkout = new_token("checkout");
    let protected = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__HTTP__PROTECT_OPERATIONS", "true")
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
    )
    .await;
    let base = protected.base.clone();
    for path in ["/readyz", "/metrics"] {
        let resp = anonymous.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        // A token of either scope reads them.
        for http in [api_client(Some(&checkout)), protected.http.clone()] {
            assert_eq!(status(path, base.clone(), http).await, 200, "{path}");
        }
    }
    // Liveness probes never need a token; nor does the API's description,
    // which then says that /readyz and /metrics need one.
    assert_eq!(
        status("/healthz", base.clone(), anonymous.clone()).await,
        200
    );
    let doc = Api::new(anonymous.clone(), base.clone())
        .get_json("/openapi.json")
        .await;
    for path in ["/readyz", "/metrics"] {
        assert_eq!(
            doc["paths"][path]["get"]["security"],
            json!([{"bearer": []}]),
            "{path}"
        );
    }
    assert!(doc["paths"]["/healthz"]["get"].get("security").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_window_over_the_maximum_gets_422_and_reserves_nothing() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("A", 5).await;
    // The default maximum is 7 days; 49 days (what the broker could hold) is refused.
    for window in ["8d", "49d"] {
        let (status, body) = app.checkout(&[("A", 2)], window).await;
        assert_eq!(status, 422, "{window}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("windows.max_payment") && error.contains("7days"),
            "{error}"
        );
    }
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 5, "reserved": 0, "sold": 0})
    );
    assert_eq!(
        app.metric("order_timeout_orders_created_total", &[]).await,
        0.0
    );
    app.order(&[("A", 2)], "7d").await;

    // A lower maximum, configured.
    let short = app
        .spawn_variant(&[("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "1h".into())])
        .await;
    let (status, body) = short.checkout(&[("A", 1)], "61m").await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("1h"), "{body}");
    assert_eq!(short.stock("A").await["reserved"], 2);
}

/// Settings as `serve` would load them from this environment.
fn load(env: &[(&str, &str)]) -> Result<Settings, String> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::load(&SettingsSource {
        file: None,
        env: Some(env),
    })
    .map_err(|e| e.to_string())
}

#[test]
fn a_reachable_bind_without_tokens_stops_start_up_naming_the_keys() {
    let keys = [
        "`http.bind`",
        "`http.admin_tokens`",
        "`http.checkout_tokens`",
        "`http.allow_anonymous",
    ];
    let out = Command::new(BIN)
        .arg("serve")
        .env("ORDER_TIMEOUT__HTTP__BIND", "0.0.0.0:0")
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for key in keys {
        assert!(stderr.contains(key), "{key}: {stderr}");
    }

    let err = load(&[("ORDER_TIMEOUT__HTTP__BIND", "0.0.0.0:0")]).unwrap_err();
    for key in keys {
        assert!(err.contains(key), "{key}: {err}");
    }
    let open = load(&[
        ("ORDER_TIMEOUT__HTTP__BIND", "0.0.0.0:0"),
        ("ORDER_TIMEOUT__HTTP__ALLOW_ANONYMOUS", "true"),
    ])
    .unwrap();
    assert!(!open.http.has_tokens());
    let token = new_token("admin");
    let guarded = load(&[
        ("ORDER_TIMEOUT__HTTP__BIND", "0.0.0.0:0"),
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", &token),
    ])
    .unwrap();
    assert_eq!(guarded.http.admin_tokens[0].expose(), token);

    // Wrong tokens stop start-up too, naming the key and not the token.
    for (var, value, key) in [
        (
            "ORDER_TIMEOUT__HTTP__ADMIN_TOKENS",
            "too-short",
            "http.admin_tokens",
        ),
        (
            "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
            "has whitespace 0123456789",
            "http.checkout_tokens",
        ),
    ] {
        let out = Command::new(BIN)
            .arg("serve")
            .env(var, value)
            .output()
            .expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("`{key}`")), "{stderr}");
        assert!(!stderr.contains(value), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reachable_bind_with_a_token_serves_authenticated() {
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl).env("ORDER_TIMEOUT__HTTP__BIND", "0.0.0.0:0"),
    )
    .await;
    app.put_stock("A", 1).await;
    let resp = api_client(None)
        .get(format!("{}/inventory/A", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_reach_doctor_output_or_logs() {
    let admin = new_token("admin");
    let checkout = new_token("checkout");
    let wrong = new_token("wrong");
    let db = std::env::temp_dir().join(format!("ot-auth-{}.db", uuid::Uuid::new_v4().simple()));
    let port = order_timeout_harness::free_port().unwrap();
    let log = std::env::temp_dir().join(format!("ot-auth-{}.log", uuid::Uuid::new_v4().simple()));
    let env = [
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", admin.clone()),
        ("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
        // No broker: the HTTP API serves all the same, and the test is quick.
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://guest:guest@127.0.0.1:1/%2f".to_string(),
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            format!("sqlite://{}?mode=rwc", db.display()),
        ),
        ("ORDER_TIMEOUT__HTTP__BIND", format!("127.0.0.1:{port}")),
        ("ORDER_TIMEOUT__LOG__FORMAT", "json".to_string()),
        ("ORDER_TIMEOUT__LOG__LEVEL", "trace,lapin=off".to_string()),
    ];

    let out = Command::new(BIN)
        .arg("doctor")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("binary runs");
    let doctor = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(doctor.contains("http.admin_tokens"), "{doctor}");
    assert!(doctor.contains("1 token (redacted)"), "{doctor}");
    for token in [&admin, &checkout] {
        assert!(!doctor.contains(token.as_str()), "{doctor}");
    }

    let mut child = Serve::new(BIN)
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .port(port)
        .log(&log)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let base = child.base().to_string();
    child
        .wait_live(&api_client(None), Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for (token, expected) in [(&admin, 200), (&checkout, 403), (&wrong, 401)] {
        let resp = api_client(Some(token))
            .put(format!("{base}/inventory/A"))
            .json(&json!({"available": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), expected);
    }
    child.kill();
    let logs = child.log_text();
    let _ = std::fs::remove_file(&db);
    let _ = std::fs::remove_file(&log);
    assert!(
        logs.contains("HTTP request refused by authentication"),
        "{logs}"
    );
    for token in [&admin, &checkout, &wrong] {
        assert!(!logs.contains(token.as_str()), "{token} in {logs}");
    }
}

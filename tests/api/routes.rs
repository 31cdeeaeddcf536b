//! The authorization matrix: every route the service documents (its OpenAPI
//! document is generated from the router, so it is the list of routes), called
//! with no token, a checkout token and an admin token, answers as the route's
//! scope says; and no other spelling of a route (percent-encoded, doubled or
//! trailing slashes, another case) lets a token reach a handler its scope may
//! not run. A new route fails here until [`scope_of`] says what it needs.

use serde_json::{Value, json};

use crate::helpers::*;

/// What a route needs, as this test expects it (not as the service says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    Checkout,
    Admin,
}

/// The scope a call needs, from its route template and its canonical path.
fn scope_of(method: &str, template: &str, path: &str) -> Needs {
    match template {
        "/healthz" | "/readyz" | "/metrics" => Needs::Nothing,
        "/inventory/{sku}" | "/orders/{id}/ship" => Needs::Admin,
        t if t.starts_with("/admin/") => Needs::Admin,
        "/orders" | "/orders/{id}" => Needs::Checkout,
        // Shipping is the merchant's however the router gets to it.
        "/orders/{id}/{action}" if path.ends_with("/ship") => Needs::Admin,
        "/orders/{id}/{action}" => Needs::Checkout,
        other => panic!(
            "{method} {other} is a route this test does not know: say in `scope_of` which scope it needs"
        ),
    }
}

/// One call: method, template, canonical path, body.
type Call = (String, String, String, Option<Value>);

/// Every documented operation as calls on `order` (each action of
/// `/orders/{id}/{action}`, shipping among them).
fn calls(doc: &Value, order: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    for (template, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let actions: &[&str] = if template.contains("{action}") {
                &["pay", "ship", "confirm", "cancel"]
            } else {
                &[""]
            };
            for action in actions {
                let path = template
                    .replace("{sku}", "A")
                    .replace("{id}", order)
                    .replace("{role}", "router")
                    .replace("{action}", action);
                assert!(
                    !path.contains('{'),
                    "{template}: a parameter this test cannot fill"
                );
                let body = match (method.as_str(), template.as_str()) {
                    ("PUT", "/inventory/{sku}") => Some(json!({"available": 5})),
                    ("POST", "/orders") => Some(json!({"items": [{"sku": "A", "quantity": 1}]})),
                    _ => None,
                };
                calls.push((method.clone(), template.clone(), path, body));
            }
        }
    }
    assert!(
        calls.len() >= 12,
        "the document lists too few routes: {calls:?}"
    );
    calls
}

/// Sends one call; returns the status and the body.
async fn send(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: &Option<Value>,
) -> (u16, Value) {
    let mut req = http.request(method.parse().unwrap(), format!("{base}{path}"));
    if let Some(body) = body {
        req = req.json(body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A service with an admin and a checkout token, stock of `A` and a paid
/// order; returns the app, the checkout token and the order.
async fn app_with_a_paid_order() -> (TestApp, String, String) {
    let checkout = new_token("checkout");
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", checkout.clone()),
    )
    .await;
    app.put_stock("A", 5).await;
    let order = app.order(&[("A", 1)], "10m").await;
    let (status, paid) = app.post(&order, "pay").await;
    assert_eq!(status, 200, "{paid}");
    (app, checkout, order)
}

/// What an admin handler would have changed: the stock, the order, the
/// pauses and the last reload.
async fn admin_state(app: &TestApp, order: &str) -> Value {
    let status = app.get_json("/admin/status").await;
    json!({
        "stock": app.stock("A").await,
        "order": app.get_order(order).await["status"],
        "roles": status["roles"],
        "reload": status["reload"]["last_at"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_token_as_its_scope_says() {
    let (app, checkout, order) = app_with_a_paid_order().await;
    let doc = app.get_json("/openapi.json").await;
    let tokens = [
        ("no token", api_client(None)),
        ("checkout token", api_client(Some(&checkout))),
        ("admin token", app.http.clone()),
    ];
    for (method, template, path, body) in calls(&doc, &order) {
        let needs = scope_of(&method, &template, &path);
        let op = &doc["paths"][template.as_str()][method.to_lowercase()];
        for (who, http) in &tokens {
            let (status, answer) = send(http, &app.base, &method, &path, &body).await;
            let expected = match (needs, *who) {
                (Needs::Checkout | Needs::Admin, "no token") => Some(401),
                (Needs::Admin, "checkout token") => Some(403),
                _ => None,
            };
            match expected {
                Some(expected) => {
                    assert_eq!(status, expected, "{method} {path} with {who}: {answer}");
                    assert!(answer["error"].is_string(), "{method} {path}: {answer}");
                }
                None => {
                    assert!(
                        ![401, 403].contains(&status),
                        "{method} {path} with {who} refused: {status} {answer}"
                    );
                    assert!(
                        op["responses"].get(status.to_string()).is_some(),
                        "{method} {path} with {who}: {status}, not in the document: {answer}"
                    );
                }
            }
        }
    }
}

/// Other spellings of `path` that a router or a decoder might take for it:
/// each named segment percent-encoded (one byte, every byte, either hex
/// case), in upper and title case; doubled, trailing and encoded slashes.
fn spellings(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut out = Vec::new();
    let join = |segments: &[String]| format!("/{}", segments.join("/"));
    for (i, segment) in segments.iter().enumerate() {
        // An order id spelled otherwise is the same order: not a route's name.
        if segment.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let (first, rest) = segment.split_at(1);
        let title = first.to_uppercase() + rest;
        for spelled in [
            format!("%{:02X}{rest}", first.as_bytes()[0]),
            format!("%{:02x}{rest}", first.as_bytes()[0]),
            segment.bytes().map(|b| format!("%{b:02X}")).collect(),
            segment.to_uppercase(),
            title,
        ] {
            let mut s: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
            s[i] = spelled;
            out.push(join(&s));
        }
    }
    out.push(format!("/{path}"));
    out.push(format!("{path}/"));
    for i in 1..segments.len() {
        for slash in ["//", "%2F", "%2f"] {
            let (left, right) = segments.split_at(i);
            out.push(format!("/{}{slash}{}", left.join("/"), right.join("/")));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_route_gets_past_its_scope() {
    let (app, checkout, order) = app_with_a_paid_order().await;
    let doc = app.get_json("/openapi.json").await;
    let before = admin_state(&app, &order).await;
    let buyer = api_client(Some(&checkout));
    let anonymous = api_client(None);
    let mut tried = 0;
    for (method, template, path, body) in calls(&doc, &order) {
        let needs = scope_of(&method, &template, &path);
        if needs == Needs::Nothing {
            continue;
        }
        for spelled in spellings(&path) {
            // Without a token, nothing that needs one is done, however spelled.
            let (status, answer) = send(&anonymous, &app.base, &method, &spelled, &body).await;
            assert!(
                [401, 404, 405].contains(&status),
                "{method} {spelled} without a token: {status} {answer}"
            );
            // A checkout token never reaches an admin handler.
            if needs == Needs::Admin {
                let (status, answer) = send(&buyer, &app.base, &method, &spelled, &body).await;
                assert!(
                    [403, 404, 405].contains(&status),
                    "{method} {spelled} with a checkout token: {status} {answer}"
                );
                assert!(answer["error"].is_string(), "{method} {spelled}: {answer}");
            }
            tried += 1;
        }
    }
    assert!(tried > 100, "only {tried} spellings tried");
    // Upper-case `/admin` and `/ADMIN/status` are no routes at all.
    for path in ["/Admin/status", "/ADMIN/status", "/admin/STATUS"] {
        let (status, answer) = send(&buyer, &app.base, "GET", path, &None).await;
        assert_eq!(status, 404, "{path}: {answer}");
    }
    assert_eq!(admin_state(&app, &order).await, before);
}

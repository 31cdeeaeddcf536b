//! The OpenAPI document served at `/openapi.json` is generated from the
//! handlers; this keeps it true: every documented operation is called, its
//! answer's status must be one the document lists for it, and a successful
//! body must carry every property its schema requires.

use serde_json::{Value, json};

use crate::helpers::*;

/// The schema a response refers to, resolved in the document's components.
fn response_schema<'a>(doc: &'a Value, op: &Value, status: u16) -> Option<&'a Value> {
    let reference =
        op["responses"][status.to_string()]["content"]["application/json"]["schema"]["$ref"]
            .as_str()?;
    let name = reference.rsplit('/').next()?;
    doc["components"]["schemas"].get(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_matches_what_the_api_does() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let doc = app.get_json("/openapi.json").await;
    assert_eq!(
        doc,
        serde_json::to_value(order_timeout::http::openapi()).unwrap()
    );
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );

    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    documented.sort();
    let expected: Vec<(String, String)> = [
        ("GET", "/admin/deadlines"),
        ("GET", "/admin/orders/{id}"),
        ("GET", "/admin/overview"),
        ("GET", "/admin/shadow"),
        ("GET", "/admin/status"),
        ("GET", "/healthz"),
        ("GET", "/inventory/{sku}"),
        ("GET", "/metrics"),
        ("GET", "/orders/{id}"),
        ("GET", "/readyz"),
        ("POST", "/admin/pause/{role}"),
        ("POST", "/admin/reload"),
        ("POST", "/admin/resume/{role}"),
        ("POST", "/orders"),
        ("POST", "/orders/{id}/ship"),
        ("POST", "/orders/{id}/{action}"),
        ("PUT", "/inventory/{sku}"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    assert_eq!(documented, expected);

    // Bearer tokens: the scheme, and a requirement on exactly the operations
    // that need a token (the operations endpoints are open by default).
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["type"], "http",
        "{}",
        doc["components"]
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (method, path) in &expected {
        let op = &doc["paths"][path.as_str()][method.to_lowercase()];
        let scope = match path.as_str() {
            "/inventory/{sku}" | "/orders/{id}/ship" => Some("admin"),
            p if p.starts_with("/admin/") => Some("admin"),
            "/orders" | "/orders/{id}" | "/orders/{id}/{action}" => Some("checkout"),
            _ => None,
        };
        match scope {
            Some(scope) => {
                assert_eq!(
                    op["security"],
                    json!([{"bearer": [scope]}]),
                    "{method} {path}"
                );
                assert!(op["responses"].get("401").is_some(), "{method} {path}");
            }
            None => {
                assert!(op.get("security").is_none(), "{method} {path}: {op}");
                assert!(op["responses"].get("401").is_none(), "{method} {path}");
            }
        }
        // 403 where a checkout token is refused: inventory, `ship`, `/admin`.
        let forbidden = matches!(path.as_str(), "/inventory/{sku}" | "/orders/{id}/ship")
            || path.starts_with("/admin/");
        assert_eq!(
            op["responses"].get("403").is_some(),
            forbidden,
            "{method} {path}"
        );
    }
    assert!(
        doc.get("security").is_none(),
        "no document-wide requirement"
    );

    // Calls that succeed and calls that fail, each checked against the document.
    app.put_stock("DOC", 5).await;
    let order = app.order(&[("DOC", 1)], "10m").await;
    let calls: Vec<(&str, &str, String, Option<Value>)> = vec![
        (
            "PUT",
            "/inventory/{sku}",
            "/inventory/DOC".into(),
            Some(json!({"available": 7})),
        ),
        (
            "PUT",
            "/inventory/{sku}",
            "/inventory/DOC".into(),
            Some(json!({"available": -1})),
        ),
        ("GET", "/inventory/{sku}", "/inventory/DOC".into(), None),
        ("GET", "/inventory/{sku}", "/inventory/NOPE".into(), None),
        // Owned orders: not in shadow mode (its 200 is shadow's own test's).
        ("GET", "/admin/shadow", "/admin/shadow".into(), None),
        (
            "POST",
            "/orders",
            "/orders".into(),
            Some(json!({"items": [{"sku": "DOC", "quantity": 1}]})),
        ),
        (
            "POST",
            "/orders",
            "/orders".into(),
            Some(json!({"items": [{"sku": "DOC", "quantity": 100}]})),
        ),
        (
            "POST",
            "/orders",
            "/orders".into(),
            Some(json!({"items": []})),
        ),
        (
            "GET",
            "/orders/{id}",
            format!("/orders/{order}?include=audit"),
            None,
        ),
        ("GET", "/orders/{id}", "/orders/999999".into(), None),
        (
            "POST",
            "/orders/{id}/{action}",
            format!("/orders/{order}/pay"),
            None,
        ),
        (
            "POST",
            "/orders/{id}/ship",
            format!("/orders/{order}/ship"),
            None,
        ),
        (
            "POST",
            "/orders/{id}/{action}",
            format!("/orders/{order}/cancel"),
            None,
        ),
        (
            "POST",
            "/orders/{id}/{action}",
            format!("/orders/{order}/refund"),
            None,
        ),
        ("GET", "/healthz", "/healthz".into(), None),
        ("GET", "/readyz", "/readyz".into(), None),
        ("GET", "/metrics", "/metrics".into(), None),
        ("GET", "/admin/status", "/admin/status".into(), None),
        ("GET", "/admin/overview", "/admin/overview".into(), None),
        (
            "GET",
            "/admin/orders/{id}",
            format!("/admin/orders/{order}"),
            None,
        ),
        (
            "GET",
            "/admin/orders/{id}",
            "/admin/orders/abc".into(),
            None,
        ),
        (
            "GET",
            "/admin/orders/{id}",
            "/admin/orders/999999".into(),
            None,
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/router".into(),
            None,
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/cashier".into(),
            None,
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/sweeper".into(),
            None,
        ),
        (
            "POST",
            "/admin/resume/{role}",
            "/admin/resume/router".into(),
            None,
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/relay?scope=instance".into(),
            Some(json!({"reason": "documented"})),
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/relay?scope=cluster".into(),
            None,
        ),
        (
            "POST",
            "/admin/pause/{role}",
            "/admin/pause/relay".into(),
            Some(json!({"reason": "x".repeat(501)})),
        ),
        (
            "POST",
            "/admin/resume/{role}",
            "/admin/resume/relay?scope=instance".into(),
            None,
        ),
        ("POST", "/admin/reload", "/admin/reload".into(), None),
        ("GET", "/admin/deadlines", "/admin/deadlines".into(), None),
        (
            "GET",
            "/admin/deadlines",
            "/admin/deadlines?kind=payment&next=10m".into(),
            None,
        ),
        (
            "GET",
            "/admin/deadlines",
            "/admin/deadlines?kind=refund".into(),
            None,
        ),
        (
            "GET",
            "/admin/deadlines",
            "/admin/deadlines?next=2d".into(),
            None,
        ),
    ];
    // Each call with the admin token, then without one (401 where the
    // document says a token is needed; the same answer elsewhere).
    let anonymous = api_client(None);
    let with_and_without = calls
        .iter()
        .map(|call| (&app.http, call))
        .chain(calls.iter().map(|call| (&anonymous, call)));
    for (http, (method, template, url, body)) in with_and_without {
        let op = &doc["paths"][*template][method.to_lowercase()];
        let mut req = http.request(method.parse().unwrap(), format!("{}{url}", app.base));
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        if std::ptr::eq(http, &anonymous) && op.get("security").is_some() {
            assert_eq!(status, 401, "{method} {url} without a token");
        }
        assert!(
            op["responses"].get(status.to_string()).is_some(),
            "{method} {url} answered {status}, which the document does not list: {}",
            op["responses"]
        );
        let text = resp.text().await.unwrap();
        if let Some(schema) = response_schema(&doc, op, status) {
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{method} {url}: not JSON ({e}): {text}"));
            for required in schema["required"].as_array().into_iter().flatten() {
                let key = required.as_str().unwrap();
                assert!(
                    value.get(key).is_some(),
                    "{method} {url} ({status}) lacks required `{key}`: {value}"
                );
            }
        }
    }
}

/// A pause's body is optional (no body, or a reason), and both admin
/// actions document their scope.
#[test]
fn a_pause_documents_its_scope_and_optional_reason() {
    let doc = serde_json::to_value(order_timeout::http::openapi()).unwrap();
    for action in ["pause", "resume"] {
        let op = &doc["paths"][format!("/admin/{action}/{{role}}")]["post"];
        let scope = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "scope")
            .unwrap_or_else(|| panic!("{action}: no scope parameter: {op}"));
        assert_eq!(scope["in"], "query", "{scope}");
        assert_ne!(scope["required"], true, "{scope}");
    }
    let body = &doc["paths"]["/admin/pause/{role}"]["post"]["requestBody"];
    assert_ne!(body["required"], true, "{body}");
    assert!(
        body["content"]["application/json"]["schema"].is_object(),
        "{body}"
    );
}

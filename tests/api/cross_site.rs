//! What a web page in the operator's browser may not make the API do: a
//! state-changing request that does not say JSON (415), one from a foreign
//! `Origin` (403), and, with no token configured, one under a name that is not
//! an address of this machine, as DNS rebinding gives (421). Each refusal
//! changes nothing; our own clients (`ctl`) still work.

use std::process::Command;

use reqwest::header::{CONTENT_TYPE, HOST, ORIGIN};
use serde_json::{Value, json};

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// A service with no token, as `make run` and a loopback default start it.
async fn token_less_app() -> TestApp {
    let app = spawn_app(
        Spawn::new(Backend::Sqlite, DelayMode::Ttl).env("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", ""),
    )
    .await;
    assert_eq!(app.token, None);
    app
}

/// A client that adds no header of its own, as a browser's form post.
fn bare_client() -> reqwest::Client {
    reqwest::Client::new()
}

/// What the refused requests would have changed.
async fn state(app: &TestApp, order: &str) -> Value {
    let status = app.get_json("/admin/status").await;
    json!({
        "order": app.get_order(order).await["status"],
        "roles": status["roles"],
        "reload": status["reload"]["last_at"],
    })
}

/// The state-changing routes a page could aim at, body-less.
fn targets(order: &str) -> Vec<String> {
    vec![
        "/admin/pause/payment".into(),
        "/admin/reload".into(),
        format!("/orders/{order}/cancel"),
    ]
}

async fn refused(resp: reqwest::Response, status: u16, says: &str, what: &str) {
    assert_eq!(resp.status(), status, "{what}");
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains(says)),
        "{what}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_less_api_refuses_what_a_web_page_could_send() {
    let app = token_less_app().await;
    app.put_stock("A", 5).await;
    let order = app.order(&[("A", 1)], "10m").await;
    let before = state(&app, &order).await;
    let port = app.base.rsplit(':').next().unwrap().to_string();
    let bare = bare_client();
    for path in targets(&order) {
        let url = format!("{}{path}", app.base);
        // A form post or a fetch without a preflight: no content type, or a
        // form's or plain text.
        let resp = bare.post(&url).send().await.unwrap();
        refused(resp, 415, "Content-Type: application/json", &path).await;
        for content_type in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let resp = bare
                .post(&url)
                .header(CONTENT_TYPE, content_type)
                .body("{}")
                .send()
                .await
                .unwrap();
            refused(resp, 415, "Content-Type", &format!("{path} {content_type}")).await;
        }
        // JSON, but from another site's page.
        for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
            let resp = bare
                .post(&url)
                .header(CONTENT_TYPE, "application/json")
                .header(ORIGIN, origin)
                .send()
                .await
                .unwrap();
            refused(resp, 403, "Origin", &format!("{path} from {origin}")).await;
        }
        // A rebound name: the page's own origin, our address.
        let host = format!("evil.example:{port}");
        let resp = bare
            .post(&url)
            .header(CONTENT_TYPE, "application/json")
            .header(HOST, &host)
            .header(ORIGIN, format!("http://{host}"))
            .send()
            .await
            .unwrap();
        refused(resp, 421, "Host", &format!("{path} as {host}")).await;
    }
    // Reading under a rebound name is refused too: the answers are the
    // page's to read.
    let resp = bare
        .get(format!("{}/orders/{order}", app.base))
        .header(HOST, format!("evil.example:{port}"))
        .send()
        .await
        .unwrap();
    refused(resp, 421, "Host", "GET under a rebound name").await;
    assert_eq!(state(&app, &order).await, before);

    // Our own names pass, with a same-origin Origin or none.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let resp = bare
            .get(format!("{}/admin/status", app.base))
            .header(HOST, &host)
            .header(ORIGIN, format!("http://{host}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{host}");
    }
    let resp = bare
        .post(format!("{}/orders/{order}/cancel", app.base))
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .header(ORIGIN, &app.base)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a same-origin JSON cancel");
    assert_eq!(app.get_order(&order).await["status"], "cancelled");

    // `ctl`, a body-less POST of ours, still works.
    let out = Command::new(BIN)
        .args(["ctl", "--url", &app.base, "pause", "payment"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl pause: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(paused(&app, "payment").await);
}

/// Whether `role` is paused, as `/admin/status` says.
async fn paused(app: &TestApp, role: &str) -> bool {
    let status = app.get_json("/admin/status").await;
    status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == role)
        .and_then(|r| r["paused"].as_bool())
        .unwrap_or_else(|| panic!("no role {role}: {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_the_host_is_free_and_the_rest_still_holds() {
    // Behind a proxy the Host is the proxy's name; a page cannot send the
    // token, so the name does not matter. JSON and the origin still do.
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    let admin = api_client(app.token.as_deref());
    let status = admin
        .get(format!("{}/admin/status", app.base))
        .header(HOST, "orders.example.com")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let token = app.token.clone().unwrap();
    let resp = bare_client()
        .post(format!("{}/admin/reload", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    refused(resp, 415, "Content-Type", "a body-less reload with a token").await;
    let resp = admin
        .post(format!("{}/admin/pause/payment", app.base))
        .header(ORIGIN, "https://evil.example")
        .send()
        .await
        .unwrap();
    refused(resp, 403, "Origin", "a foreign origin with a token").await;
    assert!(!paused(&app, "payment").await);
}

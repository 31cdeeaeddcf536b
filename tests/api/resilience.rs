//! The broker goes away and comes back: nothing is lost.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

/// Takes the broker away from one vhost: new connections are refused (no
/// permission) and the open ones are closed, as an operator or an outage would.
async fn broker_down(vhost: &str) {
    let http = management();
    http.delete(format!("{MANAGEMENT}/permissions/{vhost}/guest"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .unwrap();
    close_connections(vhost, false).await;
}

async fn broker_up(vhost: &str) {
    management()
        .put(format!("{MANAGEMENT}/permissions/{vhost}/guest"))
        .basic_auth("guest", Some("guest"))
        .json(&json!({"configure": ".*", "write": ".*", "read": ".*"}))
        .send()
        .await
        .unwrap();
}

async fn checkout_with_broker_down(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 5).await;
    broker_down(&app.vhost).await;
    wait_until(
        Duration::from_secs(20),
        "readyz reports the broker down",
        || async {
            // The management API lists a connection only once its first
            // statistics are in: close again whatever has appeared since.
            close_connections(&app.vhost, false).await;
            let resp = app
                .http
                .get(format!("{}/readyz", app.base))
                .send()
                .await
                .ok()?;
            let status = resp.status();
            let body: Value = resp.json().await.ok()?;
            (status == 503 && body["broker"]["ok"] == false).then_some(())
        },
    )
    .await;

    // Checkout still works; the timeout waits in the outbox.
    let id = app.order(&[("A", 2)], "2s").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        app.get_order(&id).await["status"],
        "pending_payment",
        "nothing can fire without the broker"
    );
    assert!(app.metric("order_timeout_outbox_backlog", &[]).await >= 1.0);

    broker_up(&app.vhost).await;
    let order = app
        .wait_status(&id, "cancelled", Duration::from_secs(30))
        .await;
    assert!(ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"));
    assert_eq!(app.stock("A").await["available"], 5);
    assert_eq!(
        app.metric("order_timeout_outbox_published_total", &[])
            .await,
        1.0
    );
    assert!(
        app.metric("order_timeout_broker_disconnects_total", &[])
            .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_checkout_sqlite_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, checkout_with_broker_down).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_checkout_postgres_plugin() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        checkout_with_broker_down,
    )
    .await
}

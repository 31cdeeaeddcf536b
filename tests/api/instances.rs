//! The service as instances: two sharing one vhost and database without
//! double effects, and a real `serve` process stopped by SIGTERM (a clean,
//! bounded drain) or SIGKILL (the broker and the outbox keep everything).

use std::time::Duration;

use order_timeout_harness::{Process, Serve, Signal};
use serde_json::json;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_work_without_double_effects() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true")
            .env("ORDER_TIMEOUT__SWEEPER__INTERVAL", "500ms")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s"),
    )
    .await;
    let peer = app.spawn_peer("second").await;
    app.put_stock("A", 1000).await;
    let mut ids = Vec::new();
    for i in 0..200 {
        // Orders come in through both instances.
        let via = if i % 2 == 0 { &app } else { &peer };
        ids.push(
            via.order(&[("A", 2)], &format!("{}ms", 1500 + (i % 20) * 50))
                .await,
        );
    }
    // Management statistics lag a few seconds behind the broker.
    let work = app.names.work(order_timeout::domain::TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(15),
        "both instances consume the work queue",
        || async {
            let queue = api_get(&format!("/queues/{}/{work}", app.vhost)).await;
            (queue["consumers"] == 2).then_some(())
        },
    )
    .await;
    for id in &ids {
        app.wait_status(id, "cancelled", Duration::from_secs(20))
            .await;
    }
    assert_cancelled_once(&app, &ids).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0})
    );
    // Message path and sweepers together applied each order once.
    let applied = applied(&app).await + applied(&peer).await;
    assert_eq!(applied, 200.0);
}

/// Timeouts this instance applied since it started.
async fn applied(api: &Api) -> f64 {
    api.metric(
        "order_timeout_timeouts_handled_total",
        &["outcome=\"applied\""],
    )
    .await
}

/// Starts a `serve` child on the app's settings (its admin token included),
/// and waits until it is ready.
async fn serve(app: &TestApp, name: &str) -> (Process, Api) {
    let serve = Serve::new(BIN)
        .envs(app.env.clone())
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
        .instance(name);
    start_ready(app, serve).await
}

/// Places `n` orders of one unit of A, windows of 0.8 to 2.7 s.
async fn place(api: &Api, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            api.order(&[("A", 1)], &format!("{}ms", 800 + (i % 20) * 100))
                .await,
        );
    }
    ids
}

/// Waits until the child has applied its first timeouts: they are firing now.
async fn wait_firing(api: &Api) {
    wait_until(Duration::from_secs(15), "timeouts firing", || async {
        (applied(api).await >= 1.0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_sigkill_loses_nothing() {
    // The in-process app only prepares the vhost, the database and the stock.
    let mut app = spawn_app(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    app.put_stock("A", 1000).await;
    app.stop().await;

    // SIGTERM while timeouts are firing: a clean, bounded exit.
    let (mut first, api) = serve(&app, "first").await;
    let mut ids = place(&api, 100).await;
    wait_firing(&api).await;
    first.signal(Signal::Term).unwrap();
    let (status, took) = first
        .wait(Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "SIGTERM ends with success: {status}");
    assert!(took < Duration::from_secs(21), "shutdown took {took:?}");

    // SIGKILL in the middle of the next batch: the broker and the outbox keep everything.
    let (mut second, api) = serve(&app, "second").await;
    ids.extend(place(&api, 100).await);
    wait_firing(&api).await;
    second.signal(Signal::Kill).unwrap();
    second
        .wait(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let (_third, api) = serve(&app, "third").await;
    for id in &ids {
        api.wait_status(id, "cancelled", Duration::from_secs(30))
            .await;
    }
    assert_cancelled_once(&api, &ids).await;
    assert_eq!(
        api.stock("A").await,
        json!({"sku": "A", "available": 1000, "reserved": 0, "sold": 0})
    );
}

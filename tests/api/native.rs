//! The native stage (RabbitMQ 4.3 and later): timers held by a quorum queue
//! until their delivery time (switching to and from it: `stages::`). The
//! held timers are counted by the broker (`messages_delayed`), the
//! `waiting_timers` gauge and `doctor`; one timer held across thirty service
//! restarts and a broker restart is applied on time, never dropped by a
//! delivery limit. On an older broker these tests skip, saying why (and fail
//! where `ORDER_TIMEOUT_REQUIRE_NATIVE` is set).

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;
use crate::stages::assert_cancelled_once_by_timer;

/// Held timers are visible where an operator looks: the broker counts them
/// as the queue's `messages_delayed` (none ready), the
/// `order_timeout_waiting_timers{stage="native"}` gauge and `doctor` report
/// them, and the queue has no delivery limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_timers_are_counted_everywhere_postgres() {
    run(Backend::Postgres, DelayMode::Native, held_timers_counted).await
}

async fn held_timers_counted(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 3).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(app.order(&[("A", 1)], "60s").await);
    }
    app.wait_stage_timers(mode, 3, Duration::from_secs(15))
        .await;
    let path = format!(
        "/queues/{}/{}",
        url_encode(&app.vhost),
        url_encode(&app.names.wait())
    );
    let queue = wait_until(
        Duration::from_secs(15),
        "the broker reporting 3 held timers",
        || async {
            let q = api_get(&path).await;
            (q["messages_delayed"] == 3).then_some(q)
        },
    )
    .await;
    assert_eq!(queue["type"], "quorum", "{queue}");
    assert_eq!(queue["messages_ready"], 0, "{queue}");
    assert_eq!(queue["arguments"]["x-delivery-limit"], -1, "{queue}");
    assert_eq!(
        queue["arguments"]["x-dead-letter-strategy"], "at-least-once",
        "{queue}"
    );
    wait_until(
        Duration::from_secs(20),
        "order_timeout_waiting_timers{stage=\"native\"} = 3",
        || async {
            let n = app
                .metric("order_timeout_waiting_timers", &["stage=\"native\""])
                .await;
            (n == 3.0).then_some(())
        },
    )
    .await;
    let (ok, out) = doctor(&app, &[]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!(
            "{} (quorum queue), 3 timers held (in use)",
            app.names.wait()
        )),
        "{out}"
    );
    assert!(
        out.contains("delay mode") && out.contains("native"),
        "{out}"
    );
    // On a broker with native delays the plugin is never asked for.
    assert!(out.contains("not probed"), "{out}");
    // Paying one takes nothing out of the queue early: its timer comes back
    // at its time and finds the order paid. The others are unaffected.
    let (status, _) = app.post(&ids[0], "pay").await;
    assert_eq!(status, 200);
    assert_eq!(app.stage_timers(mode).await, 3);
}

/// `auto` on a broker with native delays chooses them, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_chooses_native_sqlite() {
    run(
        Backend::Sqlite,
        DelayMode::Native,
        |backend, _| async move {
            let app = spawn_app(
                Spawn::new(backend, DelayMode::Native)
                    .env("ORDER_TIMEOUT__AMQP__DELAY_MODE", "auto"),
            )
            .await;
            assert_eq!(app.ctx.resolved_mode().map(|m| m.as_str()), Some("native"));
            app.put_stock("A", 1).await;
            let id = app.order(&[("A", 1)], "2s").await;
            app.cancelled_on_time(&id, Duration::from_secs(10)).await;
            assert_cancelled_once_by_timer(&app, &id).await;
            assert!(app.drain_parked().await.is_empty(), "nothing parked");
        },
    )
    .await
}

/// Over `amqps://`, the deferrer's AMQP 1.0 connection trusts what lapin's
/// trust (the system's roots and `amqp.tls_ca_file`), and timers are held
/// and released through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_sqlite() {
    run(Backend::Sqlite, DelayMode::Native, crate::tls::amqps_cycle).await
}

/// A thousand timers held in the quorum queue through a broker restart, the
/// short ones due while it is down (`stages::broker_restart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: make test and make test-broker run it alone"]
async fn broker_restart_native_keeps_every_timer() {
    run(
        Backend::Postgres,
        DelayMode::Native,
        crate::stages::broker_restart,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: make test and make test-broker run it alone"]
async fn broker_restart_native_timer_held_across_thirty_service_restarts() {
    run(Backend::Postgres, DelayMode::Native, held_across_restarts).await
}

/// How many times the service restarts while the timer is held.
const RESTARTS: usize = 30;

/// One timer, held in the queue while the service restarts thirty times and
/// the broker once: applied on time, exactly once, by its timer. (Each
/// restart closes the deferrer's link with what it had unsettled; the queue
/// has no delivery limit, so nothing is ever dead-lettered for coming back.)
async fn held_across_restarts(backend: Backend, mode: DelayMode) {
    let mut app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 2).await;
    // Long enough for the restarts on a busy machine; a short one comes due
    // amid them, and one while the broker is down.
    let long = app.order(&[("A", 1)], "120s").await;
    app.wait_stage_timers(mode, 1, Duration::from_secs(15))
        .await;
    app.stop().await;
    let mut short = None;
    for i in 0..RESTARTS {
        let mut next = app.spawn_variant(&[]).await;
        if i == RESTARTS / 2 {
            short = Some(next.order(&[("A", 1)], "3s").await);
        }
        next.stop().await;
    }
    rabbitmqctl("stop_app");
    tokio::time::sleep(Duration::from_secs(5)).await;
    rabbitmqctl("start_app");
    rabbitmqctl("await_startup");
    let next = app.spawn_variant(&[]).await;
    let short = short.expect("placed amid the restarts");
    let order = next
        .wait_status(&short, "cancelled", Duration::from_secs(60))
        .await;
    assert!(
        ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"),
        "never early: {order}"
    );
    next.cancelled_on_time(&long, Duration::from_secs(150))
        .await;
    for id in [&long, &short] {
        assert_cancelled_once_by_timer(&next, id).await;
    }
    assert_eq!(
        next.stock("A").await,
        json!({"sku": "A", "available": 2, "reserved": 0, "sold": 0})
    );
    // Waited for: the native stage's count is statistics, seconds late.
    next.wait_stage_timers(mode, 0, Duration::from_secs(1))
        .await;
    assert!(next.drain_parked().await.is_empty(), "nothing parked");
}

//! A delivery wakes the consumer; the database decides. One due timeout
//! message makes its kind's consumer apply every order of the kind already
//! due, ahead of their own messages (here never published: the relay is
//! off), with the cause `timeout`, none early, and nothing not yet due.

use std::time::Duration;

use crate::helpers::*;

async fn one_message_wakes_every_due_order(backend: Backend, mode: DelayMode) {
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    app.put_stock("A", 100).await;
    let mut due = Vec::new();
    for _ in 0..20 {
        due.push(app.order(&[("A", 1)], "1s").await);
    }
    let later = app.order(&[("A", 1)], "1h").await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Only the first order's timeout comes; the other 19 lag (not published).
    app.publish_timeout(&due[0], "payment", 1).await;
    for id in &due {
        let order = app
            .wait_status(id, "cancelled", Duration::from_secs(10))
            .await;
        assert!(
            ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"),
            "early: {order}"
        );
        let trail = app.order_with_audit(id).await;
        let last = &trail["audit"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(
            (last["event"].as_str(), last["cause"].as_str()),
            (Some("cancelled"), Some("timeout"))
        );
    }
    assert_eq!(app.get_order(&later).await["status"], "pending_payment");
    assert_eq!(app.stock("A").await["available"], 99, "released once each");
    let caught = app
        .metric("order_timeout_catch_ups_total", &["kind=\"payment\""])
        .await;
    assert_eq!(
        caught, 19.0,
        "the message applied its own order, the catch-up the rest"
    );
}

matrix!(one_message_wakes_every_due_order);

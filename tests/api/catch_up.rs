//! A delivery wakes the consumer; the database decides. One due timeout
//! message makes its kind's consumer apply every order of the kind already
//! due, ahead of their own messages (here never published: the relay is
//! off), with the cause `timeout`, none early, and nothing not yet due.

use std::time::{Duration, Instant};

use sea_orm::ConnectionTrait;

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
    each_cancelled_by_its_timeout(&app, &due, Duration::from_secs(10)).await;
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

each_mode!(one_message_wakes_every_due_order);

/// Waits until each order is cancelled, none before its deadline, its last
/// audit row the timeout's.
async fn each_cancelled_by_its_timeout(app: &TestApp, ids: &[String], within: Duration) {
    for id in ids {
        let order = app.wait_status(id, "cancelled", within).await;
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
}

/// With `consumer.wake_at_deadline` on (the default; the harness turns it
/// off), no message is needed at all: the catch-up reads its kind's next
/// deadline and runs when it passes. Here no timeout is ever published (the
/// relay is off), the first deadline known is an hour away, and orders
/// placed afterwards with a one-second window are seen at the next read of
/// the next deadline, then cancelled by the catch-up at theirs, none early,
/// and nothing not yet due.
async fn deadlines_wake_the_catch_up_without_a_message(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "true"),
    )
    .await;
    app.put_stock("A", 100).await;
    let later = app.order(&[("A", 1)], "1h").await;
    let mut due = Vec::new();
    for _ in 0..10 {
        due.push(app.order(&[("A", 1)], "1s").await);
    }
    each_cancelled_by_its_timeout(&app, &due, Duration::from_secs(20)).await;
    assert_eq!(app.get_order(&later).await["status"], "pending_payment");
    assert_eq!(app.stock("A").await["available"], 99, "released once each");
    let caught = app
        .metric("order_timeout_catch_ups_total", &["kind=\"payment\""])
        .await;
    assert_eq!(caught, 10.0, "every one by a catch-up: no message came");
}

each_mode!(deadlines_wake_the_catch_up_without_a_message);

/// An order the database refused once (here a trigger; in production a
/// deadlock or a lock timeout) is passed over by catch-ups for a while only:
/// once the refusal is gone, a later catch-up applies it, although its own
/// message never comes and the sweeper is off.
async fn a_refused_order_is_tried_again_later(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl).env("ORDER_TIMEOUT__RELAY__ENABLED", "false"),
    )
    .await;
    app.put_stock("A", 100).await;
    // Nothing applies them before the test's message (no relay, no sweeper,
    // no wake at deadlines): the windows need only pass before it.
    let refused = app.order(&[("A", 1)], "100ms").await;
    let woken = app.order(&[("A", 1)], "100ms").await;
    let caught = app.order(&[("A", 1)], "100ms").await;
    let db = app.ctx.db.clone();
    let on = "BEFORE UPDATE ON orders";
    let condition = format!("OLD.id = {refused}");
    refusing_trigger(&db, backend, "refuse_once", on, &condition, "test: refused").await;
    // All three due (the last placed falls due last) before the message comes.
    let last_deadline = ms(&app.get_order(&caught).await, "pay_deadline");
    wait_until(Duration::from_secs(5), "every order due", || async {
        (chrono::Utc::now().timestamp_millis() > last_deadline).then_some(())
    })
    .await;
    app.publish_timeout(&woken, "payment", 1).await;
    app.wait_status(&woken, "cancelled", Duration::from_secs(10))
        .await;
    // Applied by the catch-up in the round that met the refusal.
    app.wait_status(&caught, "cancelled", Duration::from_secs(10))
        .await;
    // That round ended about now: the refusal is remembered from here.
    let refused_at = Instant::now();
    assert_eq!(app.get_order(&refused).await["status"], "pending_payment");
    let drop = match backend {
        Backend::Postgres => "DROP FUNCTION refuse_once() CASCADE",
        _ => "DROP TRIGGER refuse_once",
    };
    db.execute_unprepared(drop).await.unwrap();
    // The next catch-up comes with the next due message, after the refusal
    // is forgotten: 30 s (`REFUSED_FOR` in src/amqp/catch_up.rs, not a
    // setting) after that round, a second to spare. The message and its
    // order fall due then; the consumer holds the message until the order's
    // deadline passes.
    let until = (refused_at + Duration::from_secs(31)).saturating_duration_since(Instant::now());
    let until = i64::try_from(until.as_millis()).unwrap();
    let later = app.order(&[("A", 1)], &format!("{until}ms")).await;
    app.publish_timeout(&later, "payment", until).await;
    app.wait_status(&later, "cancelled", Duration::from_secs(60))
        .await;
    let order = app
        .wait_status(&refused, "cancelled", Duration::from_secs(10))
        .await;
    assert!(ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"));
    assert_eq!(app.stock("A").await["reserved"], 0, "released once each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_order_is_tried_again_later_sqlite() {
    a_refused_order_is_tried_again_later(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_order_is_tried_again_later_postgres() {
    a_refused_order_is_tried_again_later(Backend::Postgres).await
}

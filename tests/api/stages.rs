//! The delay stages, on the real delayed-message plugin, the real TTL levels
//! and the real quorum queue of native mode: switching modes loses no timer,
//! the sign of `x-delay` after the plugin's delay means nothing, a timer that comes due while the service is
//! down is handled when it starts, timers survive a broker restart, and no
//! publish is `mandatory` (the plugin would return every one).

use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use order_timeout::domain::TimeoutKind;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

use crate::helpers::*;

each_mode!(due_while_the_service_is_down);
each_mode!(publisher_expiration_never_drops_a_timer);

/// A timer whose deadline passes while no service runs is handled when one
/// starts: the message waited in its work queue, and the first consumer takes it.
async fn due_while_the_service_is_down(backend: Backend, mode: DelayMode) {
    let mut app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 1).await;
    let window = format!("{}s", 2 + counting_lag(mode).as_secs());
    let id = app.order(&[("A", 1)], &window).await;
    // The relay has handed the timer to the delay stage before the service stops.
    app.wait_stage_timers(mode, 1, Duration::from_secs(5)).await;
    let deadline = ms(&app.get_order(&id).await, "pay_deadline");
    // The deadline passes with no service running.
    stop_until_due_unconsumed(&mut app, mode).await;
    let started = chrono::Utc::now().timestamp_millis();
    let next = app.spawn_variant(&[]).await;
    let order = next
        .wait_status(&id, "cancelled", Duration::from_secs(10))
        .await;
    let cancelled = ms(&order, "cancelled_at");
    assert!(cancelled >= deadline, "never early: {order}");
    // A hang guard, not a speed target: the restart itself (connecting,
    // declaring the topology) can take seconds on a busy machine.
    assert!(
        cancelled - started < 20_000,
        "handled {} ms after the service started",
        cancelled - started
    );
    assert_cancelled_once_by_timer(&next, &id).await;
}

/// A publisher's `expiration` (a per-message TTL) does not travel with its
/// timer: the timer waits its whole delay in the stage, then waits in its work
/// queue (which has no dead-letter exchange) until a consumer takes it, even
/// when no service runs as it comes due.
async fn publisher_expiration_never_drops_a_timer(backend: Backend, mode: DelayMode) {
    let mut app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    app.put_stock("A", 1).await;
    let delay_ms = 3000 + counting_lag(mode).as_millis() as i64;
    let id = app.order(&[("A", 1)], &format!("{delay_ms}ms")).await;
    let body = json!({"order_id": id, "kind": "payment"}).to_string();
    let entry = app.names.entry().to_string();
    // Had it travelled on, a 1 s TTL would expire it in the work queue soon
    // after the plugin let it go: lost, with no dead-letter exchange behind.
    // (In ttl mode it would leave the levels early, and RabbitMQ drops the
    // expiration when it dead-letters, so there it only makes a timer early.)
    let props = contract_properties(delay(delay_ms)).with_expiration("1000".into());
    app.publish_with(&entry, "payment", props, body.as_bytes())
        .await;
    app.wait_stage_timers(mode, 1, Duration::from_secs(2)).await;
    stop_until_due_unconsumed(&mut app, mode).await;
    // The scenario: the message's 1 s expiration passes while it waits unconsumed.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Where it waits unconsumed: its work queue, or in native mode the
    // quorum queue (nothing lets it on while no service runs).
    let waiting = match mode {
        DelayMode::Native => app.names.wait(),
        _ => app.names.work(TimeoutKind::Payment),
    };
    assert_eq!(
        app.queue_depth(&waiting).await,
        1,
        "still there, past its expiration"
    );
    let next = app.spawn_variant(&[]).await;
    let order = next
        .wait_status(&id, "cancelled", Duration::from_secs(10))
        .await;
    assert!(
        ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"),
        "never early"
    );
    assert_cancelled_once_by_timer(&next, &id).await;
}

/// How much longer than the others a stage may take to count a timer that
/// entered it (the native stage is counted by the management API's
/// statistics): a timer must not come due before the count shows it.
fn counting_lag(mode: DelayMode) -> Duration {
    match mode {
        DelayMode::Native => STATISTICS_LAG,
        DelayMode::Ttl | DelayMode::Plugin => Duration::ZERO,
    }
}

/// Stops the service and waits until its one payment timer has come due into
/// the work queue, where nothing consumes it now. In native mode no service
/// means no deferrer to let the due timer on: it waits in the quorum queue,
/// no longer held (ready), until a service starts.
async fn stop_until_due_unconsumed(app: &mut TestApp, mode: DelayMode) {
    app.stop().await;
    if mode == DelayMode::Native {
        let path = format!(
            "/queues/{}/{}",
            url_encode(&app.vhost),
            url_encode(&app.names.wait())
        );
        wait_until(
            Duration::from_secs(20),
            "the timer ready again in the native stage",
            || async {
                let q = api_get(&path).await;
                (q["messages_ready"] == 1 && q["messages_delayed"] == 0).then_some(())
            },
        )
        .await;
        return;
    }
    let work = app.names.work(TimeoutKind::Payment);
    wait_until(
        Duration::from_secs(10),
        "the timer in its work queue",
        || async { (app.queue_depth(&work).await == 1).then_some(()) },
    )
    .await;
}

/// The order was cancelled exactly once, by its timer (not the sweeper, not twice).
pub(crate) async fn assert_cancelled_once_by_timer(app: &TestApp, id: &str) {
    let order = app.order_with_audit(id).await;
    let cancels: Vec<&serde_json::Value> = order["audit"]
        .as_array()
        .expect("audit trail")
        .iter()
        .filter(|e| e["event"] == "cancelled")
        .collect();
    assert_eq!(cancels.len(), 1, "one cancel: {order}");
    assert_eq!(cancels[0]["cause"], "timeout", "{order}");
    assert_eq!(order["version"], 1, "one transition: {order}");
}

/// ttl → auto on a broker with the plugin, as a shop that enables the plugin
/// later and restarts: ready at once, new timers go to the plugin, the one
/// waiting in the levels still fires on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_ttl_to_plugin_sqlite() {
    run(Backend::Sqlite, DelayMode::Plugin, |backend, _| {
        mode_switch(backend, DelayMode::Ttl, "auto", DelayMode::Plugin)
    })
    .await
}

/// plugin → ttl forced by configuration (the plugin about to be removed):
/// the timer waiting in the plugin still fires on time, new ones go to the levels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_plugin_to_ttl_postgres() {
    run(Backend::Postgres, DelayMode::Plugin, |backend, _| {
        mode_switch(backend, DelayMode::Plugin, "ttl", DelayMode::Ttl)
    })
    .await
}

/// ttl → auto on RabbitMQ 4.3, as a shop that upgraded its broker and lets
/// the service choose: new timers wait in the quorum queue, the one waiting
/// in the levels still fires on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_ttl_to_native_postgres() {
    run(Backend::Postgres, DelayMode::Native, |backend, _| {
        mode_switch(backend, DelayMode::Ttl, "auto", DelayMode::Native)
    })
    .await
}

/// native → ttl forced by configuration: the timer deferred in the quorum
/// queue still fires on time, new ones go to the levels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_native_to_ttl_sqlite() {
    run(Backend::Sqlite, DelayMode::Native, |backend, _| {
        mode_switch(backend, DelayMode::Native, "ttl", DelayMode::Ttl)
    })
    .await
}

/// The window of the order placed before the mode switch (longer by the
/// stage's [`counting_lag`]).
const OLD_WINDOW: Duration = Duration::from_secs(20);

async fn mode_switch(backend: Backend, from: DelayMode, setting: &str, to: DelayMode) {
    let mut app = spawn_app(Spawn::new(backend, from)).await;
    app.put_stock("A", 10).await;
    // Long enough to be still waiting after a restart on a busy machine (the
    // restart and the checks below took 0.2 to 4 s here, four tests at once;
    // a window too short fails the count of the old stage below, it cannot
    // pass by it).
    let old_window = OLD_WINDOW + counting_lag(from);
    let placed = Instant::now();
    let old = app
        .order(&[("A", 2)], &format!("{}s", old_window.as_secs()))
        .await;
    app.wait_stage_timers(from, 1, Duration::from_secs(5)).await;
    app.stop().await;

    // A real restart in the other mode, on the same vhost and database.
    let next = app
        .spawn_variant(&[("ORDER_TIMEOUT__AMQP__DELAY_MODE", setting.to_string())])
        .await;
    let resolved = next.ctx.resolved_mode().map(|m| m.as_str());
    assert_eq!(resolved, Some(to.as_str()), "the mode after the switch");
    let lag = counting_lag(to);
    let new = next
        .order(&[("A", 3)], &format!("{}s", 4 + lag.as_secs()))
        .await;
    next.wait_stage_timers(to, 1, Duration::from_secs(5)).await;
    // The old timer is still where it was (the management API's count can
    // lag a restart on a busy broker: waited for, not read once).
    next.wait_stage_timers(from, 1, Duration::from_secs(15))
        .await;
    eprintln!(
        "mode switch: the old timer seen in the {} stage after the restart, {:?} before its deadline",
        from.as_str(),
        old_window.saturating_sub(placed.elapsed())
    );

    next.cancelled_on_time(&new, Duration::from_secs(10) + lag)
        .await;
    next.cancelled_on_time(&old, old_window + Duration::from_secs(15))
        .await;
    for id in [&old, &new] {
        assert_cancelled_once_by_timer(&next, id).await;
    }
    assert_eq!(
        next.stock("A").await,
        json!({"sku": "A", "available": 10, "reserved": 0, "sold": 0})
    );
    // Waited for: the native stage's count is statistics, seconds late.
    next.wait_stage_timers(from, 0, Duration::from_secs(1))
        .await;
    next.wait_stage_timers(to, 0, Duration::from_secs(1)).await;
    assert!(next.drain_parked().await.is_empty(), "nothing parked");
}

/// After the plugin's delay the `x-delay` header may keep its sign or be
/// negated, depending on the broker and on how the message was published
/// (upstream issue #64). Two timers put straight into the plugin stage, one
/// over AMQP and one through the management API: both cancel their orders on
/// time, and a spy queue on the stage shows which sign each arrived with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_delay_sign_after_the_plugin_means_nothing() {
    run(Backend::Sqlite, DelayMode::Plugin, x_delay_sign).await
}

async fn x_delay_sign(backend: Backend, mode: DelayMode) {
    // Relay off: the two timers below are the only ones.
    let app =
        spawn_app(Spawn::new(backend, mode).env("ORDER_TIMEOUT__RELAY__ENABLED", "false")).await;
    let stage = app.names.delay();
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    let spy = "spy";
    channel
        .queue_declare(
            spy.into(),
            // Exclusive: RabbitMQ 4.3 refuses a transient queue that is not.
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            spy.into(),
            stage.as_str().into(),
            "payment".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    app.put_stock("A", 2).await;
    let over_amqp = app.order(&[("A", 1)], "2s").await;
    let over_http = app.order(&[("A", 1)], "2s").await;
    let body = |id: &str| json!({"order_id": id, "kind": "payment"}).to_string();
    app.publish_with(
        &stage,
        "payment",
        contract_properties(delay(2000)),
        body(&over_amqp).as_bytes(),
    )
    .await;
    let message = json!({
        "routing_key": "payment",
        "payload": body(&over_http),
        "payload_encoding": "string",
        "properties": {"content_type": "application/json", "delivery_mode": 2, "headers": {"x-delay": 2000}},
    });
    broker_api()
        .post(
            &format!(
                "/exchanges/{}/{}/publish",
                url_encode(&app.vhost),
                url_encode(&stage)
            ),
            &message,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let published = chrono::Utc::now().timestamp_millis();

    for id in [&over_amqp, &over_http] {
        let order = app
            .wait_status(id, "cancelled", Duration::from_secs(8))
            .await;
        let cancelled = ms(&order, "cancelled_at");
        assert!(
            cancelled >= ms(&order, "pay_deadline"),
            "never early: {order}"
        );
        assert!(
            cancelled - (published + 2000) < 1000,
            "on time: {} ms after the message was due",
            cancelled - (published + 2000)
        );
        assert_cancelled_once_by_timer(&app, id).await;
    }

    // What the consumer was handed, seen through the spy, once both copies
    // are there: the first due timer may cancel both orders (catch-up) while
    // the management API's publish is still on its way on a busy machine.
    wait_until(
        Duration::from_secs(10),
        "both copies in the spy",
        || async {
            let passive = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let q = channel
                .queue_declare(spy.into(), passive, FieldTable::default())
                .await
                .unwrap();
            (q.message_count() == 2).then_some(())
        },
    )
    .await;
    let mut seen = std::collections::HashMap::new();
    while let Some(msg) = channel
        .basic_get(spy.into(), Default::default())
        .await
        .unwrap()
    {
        let m: serde_json::Value = serde_json::from_slice(&msg.delivery.data).unwrap();
        let x_delay = order_timeout::amqp::wire::header_int(
            msg.delivery.properties.headers().as_ref(),
            "x-delay",
        )
        .and_then(Result::ok);
        seen.insert(m["order_id"].as_str().unwrap().to_string(), x_delay);
    }
    conn.close(200, "done".into()).await.ok();
    let version = broker_version().await;
    // Observed: RabbitMQ 3.10 with plugin 3.10.2 keeps an AMQP publisher's
    // value and negates the management API's; 4.0 with plugin 4.0.7 negates both.
    let amqp_sign = if version.starts_with("3.") {
        2000
    } else {
        -2000
    };
    assert_eq!(
        seen.get(&over_amqp),
        Some(&Some(amqp_sign)),
        "{version}: {seen:?}"
    );
    assert_eq!(
        seen.get(&over_http),
        Some(&Some(-2000)),
        "{version}: {seen:?}"
    );
}

/// The plugin returns a `mandatory` publish to a delayed exchange as
/// unroutable every time, and schedules it all the same (it routes when the
/// delay ends): so the service never sets `mandatory`, and its own publishes
/// into the same stage are confirmed without a return. The timers that wait are counted in
/// `order_timeout_waiting_timers{stage="plugin"}`, and no ttl stage is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_stage_never_mandatory_and_counted() {
    run(Backend::Sqlite, DelayMode::Plugin, mandatory).await
}

async fn mandatory(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    let stage = app.names.delay();
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let body = json!({"order_id": "999999", "kind": "payment"}).to_string();
    let confirm = channel
        .basic_publish(
            stage.as_str().into(),
            "payment".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body.as_bytes(),
            contract_properties(delay(600_000)),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(
        confirm.take_message().is_some(),
        "the plugin returns a mandatory publish as unroutable"
    );
    assert!(!order_timeout::amqp::publish_options().mandatory);
    order_timeout::amqp::publish_confirmed(
        &channel,
        &stage,
        "payment",
        body.as_bytes(),
        contract_properties(delay(600_000)),
    )
    .await
    .expect("the service's own publish into the plugin stage is confirmed, not returned");
    conn.close(200, "done".into()).await.ok();
    // Returned, and scheduled all the same: both wait in the plugin, 10
    // minutes. A publisher that took the return for a failure and published
    // again would have doubled its timer.
    app.wait_stage_timers(DelayMode::Plugin, 2, Duration::from_secs(5))
        .await;
    wait_until(
        Duration::from_secs(15),
        "the plugin stage's gauge",
        || async {
            let gauge = app
                .metric("order_timeout_waiting_timers", &["stage=\"plugin\""])
                .await;
            (gauge == 2.0).then_some(())
        },
    )
    .await;
    assert!(
        !app.metrics().await.contains("stage=\"ttl\""),
        "no ttl stage in this vhost"
    );
}

/// The broker application restarted (`rabbitmqctl stop_app`, `start_app`)
/// while 1,000 timers wait in the delay stage. Stops the broker for every
/// test: run alone (`make test` runs it after the rest, serially).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: make test runs it alone"]
async fn broker_restart_keeps_every_timer_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, broker_restart).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: make test runs it alone"]
async fn broker_restart_keeps_every_timer_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, broker_restart).await
}

/// Orders of the restart test: (count, window). The short ones come due while
/// the broker is stopped, the long ones well after it is back.
const RESTART_ORDERS: [(usize, u64); 2] = [(800, 40), (200, 8)];

pub(crate) async fn broker_restart(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 1000).await;
    let app = &app;
    let mut ids = Vec::new();
    for (count, window_s) in RESTART_ORDERS {
        // Sixteen checkouts at a time; the long windows spread over 8 s.
        for chunk in (0..count).collect::<Vec<_>>().chunks(16) {
            let placed = futures_util::future::join_all(chunk.iter().map(|i| {
                let window = format!("{}ms", window_s * 1000 + (*i as u64 % 8) * 1000);
                async move { app.order(&[("A", 1)], &window).await }
            }))
            .await;
            ids.extend(placed);
        }
    }
    let total = ids.len() as u64;
    app.wait_stage_timers(mode, total, Duration::from_secs(30))
        .await;

    let stopped = Instant::now();
    rabbitmqctl("stop_app");
    // The scenario: the outage lasts 10 s, long enough for every short
    // deadline to pass while the broker is down.
    tokio::time::sleep(Duration::from_secs(10)).await;
    rabbitmqctl("start_app");
    rabbitmqctl("await_startup");
    let back = chrono::Utc::now().timestamp_millis();
    eprintln!("broker down for {:?}", stopped.elapsed());

    let db = &app.ctx.db;
    let rows = wait_until(Duration::from_secs(90), "every order cancelled", || async {
        let rows = db
            .query_all_raw(Statement::from_string(
                db.get_database_backend(),
                "SELECT o.id, o.pay_deadline_ms, o.cancelled_at_ms, CAST(o.version AS BIGINT) AS version, \
                 (SELECT COUNT(*) FROM order_events e WHERE e.order_id = o.id AND e.event = 'cancelled' AND e.cause = 'timeout') AS by_timer, \
                 (SELECT COUNT(*) FROM order_events e WHERE e.order_id = o.id AND e.event = 'cancelled') AS cancels \
                 FROM orders o WHERE o.status = 'cancelled'",
            ))
            .await
            .ok()?;
        (rows.len() as u64 == total).then_some(rows)
    })
    .await;
    let mut late_after_restart = 0;
    let mut worst_on_time = 0;
    for row in rows {
        let get = |c: &str| row.try_get::<i64>("", c).unwrap();
        let (deadline, cancelled) = (get("pay_deadline_ms"), get("cancelled_at_ms"));
        assert!(cancelled >= deadline, "never early: order {}", get("id"));
        assert_eq!(
            (get("cancels"), get("by_timer"), get("version")),
            (1, 1, 1),
            "once, by its timer: order {}",
            get("id")
        );
        if deadline < back + 15_000 {
            // Due while the broker was down or reconnecting: at once when back.
            late_after_restart = late_after_restart.max(cancelled - back.max(deadline));
        } else {
            worst_on_time = worst_on_time.max(cancelled - deadline);
        }
    }
    eprintln!(
        "worst lateness: {worst_on_time} ms on time, {late_after_restart} ms after the restart"
    );
    assert!(
        worst_on_time < 1000,
        "due after the restart: at most {worst_on_time} ms late"
    );
    assert!(
        late_after_restart < 15_000,
        "due during the outage: handled {late_after_restart} ms after the broker was back"
    );
    assert_eq!(app.stock("A").await["available"], 1000);
}

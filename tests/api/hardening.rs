//! Failure paths that a well-formed flow never reaches: statement sizes past
//! the databases' bind limits, one order the database refuses, relays of
//! several instances on one outbox, rows the broker keeps refusing or no relay
//! can publish, and the order in which rows are locked.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use order_timeout::db::entities::{inventory, outbox};
use order_timeout::db::store::{self, CLAIM_LEASE, Cause, ExpiryOutcome, NewItem};
use order_timeout::domain::{Millis, OrderId, TimeoutKind};
use sea_orm::{
    ColumnTrait, ConnectionTrait, Database, DatabaseConnection, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use serde_json::json;

use crate::helpers::*;

fn database_url(app: &TestApp) -> String {
    app.env["ORDER_TIMEOUT__DATABASE__URL"].clone()
}

/// `orders × skus_per_order` distinct SKUs, one unit of each reserved by an
/// order whose payment window has just passed; returns the orders.
async fn orders_over_many_skus(
    db: &DatabaseConnection,
    tag: &str,
    orders: usize,
    skus_per_order: usize,
) -> Vec<OrderId> {
    let skus: Vec<String> = (0..orders * skus_per_order)
        .map(|i| format!("{tag}-{i:06}"))
        .collect();
    for chunk in skus.chunks(1000) {
        inventory::Entity::insert_many(chunk.iter().map(|sku| inventory::ActiveModel {
            sku: Set(sku.clone()),
            available: Set(1),
            reserved: Set(0),
            sold: Set(0),
            updated_at_ms: Set(0),
        }))
        .exec_without_returning(db)
        .await
        .unwrap();
    }
    let mut ids = Vec::with_capacity(orders);
    for items in skus.chunks(skus_per_order) {
        let items: Vec<NewItem> = items
            .iter()
            .map(|sku| NewItem {
                sku: sku.clone(),
                quantity: 1,
            })
            .collect();
        let order = store::checkout(db, &items, Duration::from_millis(1), Millis::now(), None)
            .await
            .unwrap();
        ids.push(order.id);
    }
    // The scenario: the 1 ms windows pass, so every order is due.
    tokio::time::sleep(Duration::from_millis(5)).await;
    ids
}

/// Every SKU of `tag` has its unit back on sale.
async fn all_released(db: &DatabaseConnection, tag: &str, expected: usize) {
    let rows = inventory::Entity::find()
        .filter(inventory::Column::Sku.starts_with(format!("{tag}-")))
        .all(db)
        .await
        .unwrap();
    assert_eq!(rows.len(), expected);
    let held: Vec<&inventory::Model> = rows
        .iter()
        .filter(|r| r.available != 1 || r.reserved != 0)
        .collect();
    assert!(held.is_empty(), "{} SKUs not released", held.len());
}

/// 200 orders of 70 SKUs each (14,000 SKUs: a stock move of 70,000 bind
/// parameters in one statement, past SQLite's 32,766 and PostgreSQL's and
/// MariaDB's 65,535) are released in one consumer batch and in one sweep. The
/// broker plays no part: the relay is off, and the mode does not matter.
async fn large_batches_fit_the_database(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "500")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s"),
    )
    .await;
    let db = &app.ctx.db;

    // As the consumer decides a batch of 200 deliveries.
    let ids = orders_over_many_skus(db, "batch", 200, 70).await;
    let outcomes = store::expire(
        db,
        TimeoutKind::Payment,
        &ids,
        Millis::now(),
        Cause::Timeout,
        "hardening",
    )
    .await
    .expect("one batch of 200 orders over 14,000 SKUs");
    let applied = outcomes
        .values()
        .filter(|o| matches!(o, ExpiryOutcome::Applied { .. }))
        .count();
    assert_eq!(applied, 200);
    all_released(db, "batch", 14_000).await;

    // As the sweeper takes them, 500 at most per page.
    orders_over_many_skus(db, "sweep", 200, 70).await;
    let caught = order_timeout::sweeper::sweep(&app.ctx, Millis::now())
        .await
        .expect("one sweep of 200 orders over 14,000 SKUs");
    assert_eq!(caught, 200);
    all_released(db, "sweep", 14_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_fit_sqlite() {
    large_batches_fit_the_database(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_fit_postgres() {
    large_batches_fit_the_database(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_fit_mariadb() {
    large_batches_fit_the_database(Backend::MariaDb).await
}

/// A trigger that makes the database refuse any update of one order, as a
/// constraint or a broken row would.
async fn refuse_updates_of(db: &DatabaseConnection, backend: Backend, id: &str) {
    let (on, condition) = ("BEFORE UPDATE ON orders", format!("OLD.id = {id}"));
    let message = "test: this order is refused";
    refusing_trigger(db, backend, "refuse_order", on, &condition, message).await;
}

/// One order whose transition the database refuses does not hold up the
/// timeouts around it: the consumer halves the batch down to that order,
/// parks its delivery (`database_refused`) and cancels the rest on time.
async fn one_refused_order_does_not_stop_the_rest(backend: Backend, mode: DelayMode) {
    let app = spawn_app(one_batch(Spawn::new(backend, mode))).await;
    let db = app.ctx.db.clone();
    let (refused, _) = one_order_refused(&app, 8, |id| async move {
        refuse_updates_of(&db, backend, &id).await
    })
    .await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 99, "reserved": 1, "sold": 0})
    );
    assert_eq!(app.get_order(&refused).await["status"], "pending_payment");
}

/// Every delivery that is ready joins one batch.
pub fn one_batch(spawn: Spawn) -> Spawn {
    spawn.env("ORDER_TIMEOUT__CONSUMER__BATCH_WAIT", "200ms")
}

/// Places one order and `n` more, all due in 2 s, then lets `refuse` make
/// the database refuse the first one's transition (given its id); waits
/// until the others are cancelled on time and the first one's timeout is
/// parked as `database_refused` with the refusal's words. Returns the
/// refused order and the others.
pub async fn one_order_refused<F, Fut>(app: &TestApp, n: usize, refuse: F) -> (String, Vec<String>)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    app.put_stock("A", 100).await;
    let refused = app.order(&[("A", 1)], "2s").await;
    let mut rest = Vec::new();
    for _ in 0..n {
        rest.push(app.order(&[("A", 1)], "2s").await);
    }
    refuse(refused.clone()).await;
    // Deadlines past: the sweeper (off here) plays no part. The others are
    // cancelled never early and within seconds, not the usual second: each
    // batch the refused delivery is in is refused whole first, then halved
    // down to it (a rollback a round), and it comes back up to three times,
    // each time in a batch with the deliveries that arrived meanwhile; on
    // two busy cores that has taken 1.7 s.
    for id in &rest {
        let order = app
            .wait_status(id, "cancelled", Duration::from_secs(30))
            .await;
        assert_on_time_within(&order, "cancelled_at", "pay_deadline", 5_000);
    }
    let parked = wait_until(
        Duration::from_secs(30),
        "the refused order's timeout parked",
        || async {
            let parked = app.drain_parked().await;
            (!parked.is_empty()).then_some(parked)
        },
    )
    .await;
    assert_eq!(parked.len(), 1, "{parked:?}");
    let (reason, detail, body) = &parked[0];
    assert_eq!(reason, "database_refused");
    assert!(detail.contains("test: this"), "{detail}");
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["order_id"], json!(refused));
    (refused, rest)
}

each_mode!(one_refused_order_does_not_stop_the_rest, MariaDb);

/// How far ahead the rows written here fall due: none does during a test.
const MINUTE: Duration = Duration::from_secs(60);

/// Outbox rows as a checkout writes them, `n` of them, due in `due_in`.
pub async fn outbox_rows(db: &DatabaseConnection, n: usize, kind: &str, due_in: Duration) {
    let now = Millis::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        outbox::Entity::insert_many(chunk.iter().map(|i| outbox::ActiveModel {
            order_id: Set(*i as i64 + 1),
            kind: Set(kind.to_string()),
            due_at_ms: Set(now.plus(due_in).0),
            created_at_ms: Set(now.0),
            attempts: Set(0),
            ..Default::default()
        }))
        .exec_without_returning(db)
        .await
        .unwrap();
    }
}

/// Relays of four instances on one outbox: every row is claimed by exactly
/// one of them; a claim whose relay died comes back when its lease ends.
async fn relays_claim_disjoint_rows(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl).env("ORDER_TIMEOUT__RELAY__ENABLED", "false"),
    )
    .await;
    let db = Arc::new(app.ctx.db.clone());
    outbox_rows(&db, 2000, "payment", MINUTE).await;
    let mut relays = Vec::new();
    for _ in 0..4 {
        let db = db.clone();
        relays.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let rows = store::outbox_claim::<outbox::Entity>(&db, 50, Millis::now())
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return mine;
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                // As the relay does: a delete that lost a deadlock is tried again.
                while let Err(e) = store::outbox_delete::<outbox::Entity>(&db, &ids).await {
                    assert!(store::is_deadlock(&e), "{e}");
                }
                mine.extend(ids);
            }
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for relay in relays {
        for id in relay.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "row {id} claimed twice");
        }
    }
    assert_eq!(total, 2000);

    // A relay that claimed rows and died: nobody else takes them until the
    // lease is over, then anybody does.
    outbox_rows(&db, 10, "payment", MINUTE).await;
    let now = Millis::now();
    let orphaned = store::outbox_claim::<outbox::Entity>(&db, 100, now)
        .await
        .unwrap();
    assert_eq!(orphaned.len(), 10);
    assert!(
        store::outbox_claim::<outbox::Entity>(&db, 100, now)
            .await
            .unwrap()
            .is_empty()
    );
    let later = now.plus(CLAIM_LEASE + Duration::from_millis(1));
    assert_eq!(
        store::outbox_claim::<outbox::Entity>(&db, 100, later)
            .await
            .unwrap()
            .len(),
        10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_claim_disjoint_rows_sqlite() {
    relays_claim_disjoint_rows(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_claim_disjoint_rows_postgres() {
    relays_claim_disjoint_rows(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_claim_disjoint_rows_mariadb() {
    relays_claim_disjoint_rows(Backend::MariaDb).await
}

/// Rows the broker refuses wait and are set aside after `relay.max_attempts`,
/// and the rows behind them go out meanwhile. Only in ttl mode: the refusal
/// comes from a queue (`overflow = reject-publish` on a full level), and the
/// plugin's exchange confirms every message it takes, whatever its queues.
async fn refused_rows_wait_and_are_set_aside(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__RELAY__BATCH_SIZE", "2")
            .env("ORDER_TIMEOUT__RELAY__MAX_ATTEMPTS", "3"),
    )
    .await;
    // 40 s lands in level 5 (32 s); 2 s never touches it.
    let full = app.names.level(5);
    let policy = format!("/policies/{}/reject-level-5", url_encode(&app.vhost));
    let rule = json!({
        "pattern": format!("^{}$", regex_escape(&full)),
        "definition": {"max-length": 0, "overflow": "reject-publish"},
        "apply-to": "queues",
        "priority": 10
    });
    broker_api()
        .put(&policy, Some(&rule))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for_policy(&app, &full, "overflow", true).await;

    app.put_stock("A", 10).await;
    let mut refused = Vec::new();
    for _ in 0..3 {
        refused.push(app.order(&[("A", 1)], "40s").await);
    }
    // Behind three refused rows, with two rows a round: published anyway.
    let behind = app.order(&[("A", 1)], "2s").await;
    let order = app
        .wait_status(&behind, "cancelled", Duration::from_secs(20))
        .await;
    assert_on_time(&order, "cancelled_at", "pay_deadline");

    wait_until(Duration::from_secs(60), "three rows set aside", || async {
        (app.metric("order_timeout_outbox_set_aside", &[]).await == 3.0).then_some(())
    })
    .await;
    let rows = outbox::Entity::find().all(&app.ctx.db).await.unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in &rows {
        assert_eq!(row.attempts, 3);
        let reason = row.set_aside_reason.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with("refused 3 times by the broker"),
            "{reason}"
        );
    }
    assert!(
        app.metric("order_timeout_outbox_publish_failures_total", &[])
            .await
            >= 9.0
    );

    // The operator removes the cause and puts the rows back, as docs/operations.md says.
    broker_api()
        .delete(&policy)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for_policy(&app, &full, "overflow", false).await;
    app.ctx
        .db
        .execute_unprepared(
            "UPDATE outbox SET set_aside_at_ms = NULL, set_aside_reason = NULL, attempts = 0 \
             WHERE set_aside_at_ms IS NOT NULL",
        )
        .await
        .unwrap();
    wait_until(Duration::from_secs(20), "the rows published", || async {
        outbox::Entity::find()
            .all(&app.ctx.db)
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    for id in &refused {
        assert_eq!(app.get_order(id).await["status"], "pending_payment");
    }
}

/// Waits until a policy's `key` applies to one of our queues (`applied`), or
/// no longer does: the broker applies a policy change a moment after the call.
async fn wait_for_policy(app: &TestApp, queue: &str, key: &str, applied: bool) {
    let path = format!("/queues/{}/{}", url_encode(&app.vhost), url_encode(queue));
    let what = format!(
        "policy key {key} {} {queue}",
        if applied { "applied to" } else { "gone from" }
    );
    wait_until(Duration::from_secs(20), &what, || async {
        let q = api_get(&path).await;
        let has = !q["effective_policy_definition"][key].is_null();
        (has == applied).then_some(())
    })
    .await;
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_wait_and_are_set_aside_sqlite() {
    refused_rows_wait_and_are_set_aside(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_wait_and_are_set_aside_postgres() {
    refused_rows_wait_and_are_set_aside(Backend::Postgres).await
}

/// An outbox row of a kind this version does not know (a newer version wrote
/// it) is set aside and kept, not deleted; the others go out as usual.
async fn unknown_rows_are_kept(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    outbox_rows(&app.ctx.db, 1, "refund", MINUTE).await;
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1500ms").await;
    app.cancelled_on_time(&id, Duration::from_secs(20)).await;
    wait_until(Duration::from_secs(20), "the row set aside", || async {
        (app.metric("order_timeout_outbox_set_aside", &[]).await == 1.0).then_some(())
    })
    .await;
    let rows = outbox::Entity::find().all(&app.ctx.db).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].kind, "refund");
    assert!(rows[0].set_aside_at_ms.is_some());
    let reason = rows[0].set_aside_reason.as_deref().unwrap_or_default();
    assert!(reason.contains("does not know"), "{reason}");
    assert_eq!(app.metric("order_timeout_outbox_backlog", &[]).await, 0.0);
}

each_mode!(unknown_rows_are_kept);

/// Whether another transaction can lock this row now (`FOR UPDATE NOWAIT`).
async fn lockable(url: &str, table: &str, key: &str, value: &str) -> bool {
    let db = Database::connect(url).await.unwrap();
    let txn = db.begin().await.unwrap();
    let ok = txn
        .execute_unprepared(&format!(
            "SELECT 1 FROM {table} WHERE {key} = '{value}' FOR UPDATE NOWAIT"
        ))
        .await
        .is_ok();
    let _ = txn.rollback().await;
    let _ = db.close().await;
    ok
}

/// Stock rows and order rows are locked in one order everywhere: SKUs in the
/// order of the database's index on them (its collation: PostgreSQL's `C`
/// sorts `B1` before `a1`, MariaDB's default collation the other way), by
/// checkout and by every stock move alike; orders by id. Shown by holding the
/// first row from another transaction: a checkout or a batch that needs it
/// must wait there, before it locks any later row. SQLite has one writer at a
/// time and takes no row locks.
async fn locks_follow_one_order(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl).env("ORDER_TIMEOUT__RELAY__ENABLED", "false"),
    )
    .await;
    let url = database_url(&app);
    let db = &app.ctx.db;
    for sku in ["B1", "a1"] {
        app.put_stock(sku, 100).await;
    }
    let items = |skus: &[&str]| -> Vec<NewItem> {
        skus.iter()
            .map(|s| NewItem {
                sku: s.to_string(),
                quantity: 1,
            })
            .collect()
    };
    let mut ids = Vec::new();
    for _ in 0..20 {
        let order = store::checkout(
            db,
            &items(&["a1", "B1"]),
            Duration::from_millis(1),
            Millis::now(),
            None,
        )
        .await
        .unwrap();
        ids.push(order.id);
    }
    // The scenario: the 1 ms windows pass, so every order is due.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let in_index_order: Vec<(String,)> = inventory::Entity::find()
        .select_only()
        .column(inventory::Column::Sku)
        .order_by_asc(inventory::Column::Sku)
        .into_tuple()
        .all(db)
        .await
        .unwrap();
    let (first, second) = (in_index_order[0].0.clone(), in_index_order[1].0.clone());

    let holder = Database::connect(&url).await.unwrap();
    for operation in ["checkout", "release"] {
        let txn = holder.begin().await.unwrap();
        txn.execute_unprepared(&format!(
            "SELECT 1 FROM inventory WHERE sku = '{first}' FOR UPDATE"
        ))
        .await
        .unwrap();
        let task = {
            let db = db.clone();
            let order = ids.pop().unwrap();
            let items = items(&["a1", "B1"]);
            tokio::spawn(async move {
                match operation {
                    "checkout" => {
                        store::checkout(&db, &items, Duration::from_secs(60), Millis::now(), None)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }
                    _ => store::expire(
                        &db,
                        TimeoutKind::Payment,
                        &[order],
                        Millis::now(),
                        Cause::Timeout,
                        "hardening",
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                }
            })
        };
        // The scenario: half a second in which the operation would finish, had
        // it not waited for the lock (no condition to wait for: it must not happen).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !task.is_finished(),
            "{operation} did not wait for '{first}'"
        );
        assert!(
            lockable(&url, "inventory", "sku", &second).await,
            "{operation} locked '{second}' before '{first}'"
        );
        txn.rollback().await.unwrap();
        task.await.unwrap().unwrap();
    }

    // Orders: the lowest id first, whatever order the batch lists them in.
    let rest: Vec<OrderId> = ids.iter().rev().copied().collect();
    let lowest = *ids.iter().min_by_key(|id| id.get()).unwrap();
    let txn = holder.begin().await.unwrap();
    txn.execute_unprepared(&format!(
        "SELECT 1 FROM orders WHERE id = {} FOR UPDATE",
        lowest.get()
    ))
    .await
    .unwrap();
    let batch = {
        let db = db.clone();
        let rest = rest.clone();
        tokio::spawn(async move {
            store::expire(
                &db,
                TimeoutKind::Payment,
                &rest,
                Millis::now(),
                Cause::Timeout,
                "hardening",
            )
            .await
        })
    };
    // The scenario: half a second in which the batch would finish, had it not
    // waited for the lock (no condition to wait for: it must not happen).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!batch.is_finished());
    let mut locked = BTreeMap::new();
    for id in &rest {
        if *id != lowest {
            locked.insert(
                id.get(),
                !lockable(&url, "orders", "id", &id.get().to_string()).await,
            );
        }
    }
    assert!(
        locked.values().all(|l| !l),
        "the batch locked orders before the lowest id: {locked:?}"
    );
    txn.rollback().await.unwrap();
    let outcomes = batch.await.unwrap().unwrap();
    assert_eq!(outcomes.len(), rest.len());
    let _ = holder.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_follow_one_order_postgres() {
    locks_follow_one_order(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_follow_one_order_mariadb() {
    locks_follow_one_order(Backend::MariaDb).await
}

/// Removes both bindings of the due exchange to one work queue, as a stale
/// topology or an operator's slip would.
async fn unbind_work_queue(app: &TestApp, kind: TimeoutKind) {
    let vhost = url_encode(&app.vhost);
    let due = url_encode(&app.names.due());
    let work = url_encode(&app.names.work(kind));
    let bindings = api_get(&format!("/bindings/{vhost}/e/{due}/q/{work}")).await;
    let bindings = bindings.as_array().cloned().unwrap_or_default();
    assert_eq!(bindings.len(), 2, "{bindings:?}");
    for b in bindings {
        let props = url_encode(b["properties_key"].as_str().unwrap());
        broker_api()
            .delete(&format!("/bindings/{vhost}/e/{due}/q/{work}/{props}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A timer that comes due with no queue bound for it is parked by the due
/// exchange's alternate exchange, not dropped after the broker confirmed it.
async fn unroutable_timers_are_parked(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "2s").await;
    unbind_work_queue(&app, TimeoutKind::Payment).await;
    let parked = wait_until(Duration::from_secs(30), "the timer parked", || async {
        let parked = app.drain_parked().await;
        (!parked.is_empty()).then_some(parked)
    })
    .await;
    assert_eq!(parked.len(), 1, "{parked:?}");
    let body: serde_json::Value = serde_json::from_slice(&parked[0].2).unwrap();
    assert_eq!(body["order_id"], json!(id));
    assert_eq!(body["kind"], "payment");
    // Nothing decided it: the order waits for the sweeper (off here).
    assert_eq!(app.get_order(&id).await["status"], "pending_payment");
}

each_mode!(unroutable_timers_are_parked);

/// A message a work queue cannot deliver (here: expired by its own TTL while
/// the service is stopped; a length limit, a reject or a quorum queue's
/// delivery limit go the same way) is dead-lettered into `parked`. The work
/// queues are the same in both modes: ttl only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_queues_dead_letter_into_parked() {
    let mut app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.stop().await;
    let conn = app.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let body = json!({"order_id": "1", "kind": "receipt"}).to_string();
    channel
        .basic_publish(
            "".into(),
            app.names.work(TimeoutKind::Receipt).as_str().into(),
            lapin::options::BasicPublishOptions::default(),
            body.as_bytes(),
            contract_properties(Default::default()).with_expiration("1".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
    let parked = wait_until(Duration::from_secs(20), "the message parked", || async {
        let parked = app.drain_parked().await;
        (!parked.is_empty()).then_some(parked)
    })
    .await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].2, body.as_bytes());
}

/// A vhost whose names exist without an alternate or dead-letter exchange
/// into `parked` (declared by hand, say) keeps working with no manual step, and `doctor` says what it
/// lacks and where UPGRADING.md says how to add it.
async fn an_earlier_topology_still_works(backend: Backend, mode: DelayMode) {
    use order_timeout::amqp::topology::{self, ExchangeSpec, QueueSpec, QueueType};
    let vhost = Vhost::create().await;
    let conn = lapin::Connection::connect(
        &format!("{BROKER}/{}", vhost.name()),
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let names = topology::Names::new("order.timeouts");
    let mode = mode.service();
    let mut before = 0;
    for x in topology::exchanges(&names, mode) {
        let spec = ExchangeSpec {
            arguments: x.earlier.clone().unwrap_or(x.arguments.clone()),
            ..x
        };
        before += usize::from(spec.earlier.is_some());
        topology::declare_exchange(&channel, &spec).await.unwrap();
    }
    for q in topology::queues(&names, mode, QueueType::Classic) {
        let spec = QueueSpec {
            arguments: q.earlier.clone().unwrap_or(q.arguments.clone()),
            ..q
        };
        before += usize::from(spec.earlier.is_some());
        topology::declare_queue(&channel, &spec).await.unwrap();
    }
    let _ = conn.close(200, "done".into()).await;

    let app = spawn_app(Spawn::new(backend, mode_of(mode)).vhost(vhost)).await;
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1500ms").await;
    app.cancelled_on_time(&id, Duration::from_secs(20)).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
        .arg("doctor")
        .envs(app.env.clone())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{before} declared without an alternate or dead-letter exchange into"
        )),
        "{stdout}"
    );

    // UPGRADING.md's policies give such a vhost the same safety nets.
    let vhost = url_encode(&app.vhost);
    for (name, apply_to, pattern, key) in [
        (
            "order-timeout-alternate",
            "exchanges",
            r"^order\.timeouts(\.due|\.out\.[0-9]{2})?$",
            "alternate-exchange",
        ),
        (
            "order-timeout-dead-letter",
            "queues",
            r"^order\.timeouts\.(ingest|work\.[a-z]+)$",
            "dead-letter-exchange",
        ),
    ] {
        let rule = json!({
            "pattern": pattern,
            "apply-to": apply_to,
            "definition": {key: "order.timeouts.parked"},
        });
        broker_api()
            .put(&format!("/policies/{vhost}/{name}"), Some(&rule))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    unbind_work_queue(&app, TimeoutKind::Payment).await;
    app.put_stock("A", 1).await;
    let id = app.order(&[("A", 1)], "1500ms").await;
    let parked = wait_until(Duration::from_secs(30), "the timer parked", || async {
        let parked = app.drain_parked().await;
        (!parked.is_empty()).then_some(parked)
    })
    .await;
    let body: serde_json::Value = serde_json::from_slice(&parked[0].2).unwrap();
    assert_eq!(body["order_id"], json!(id));
}

fn mode_of(mode: order_timeout::amqp::topology::Mode) -> DelayMode {
    DelayMode::named(mode.as_str())
}

each_mode!(an_earlier_topology_still_works);

/// The parked queue keeps at most 1 GiB of bodies, the oldest dropped first:
/// a flood of bad messages cannot fill the broker's disk. (What a parked
/// message was for is never only there: every deadline is in the database.)
/// Shown with a policy that lowers the bound to 2 KB: the broker takes the
/// smaller of the two.
async fn parked_queue_is_bounded(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    let parked = app.names.parked();
    let q = api_get(&format!(
        "/queues/{}/{}",
        url_encode(&app.vhost),
        url_encode(&parked)
    ))
    .await;
    assert_eq!(
        q["arguments"]["x-max-length-bytes"],
        json!(1u64 << 30),
        "{q}"
    );
    let rule = json!({
        "pattern": format!("^{}$", regex_escape(&parked)),
        "apply-to": "queues",
        "definition": {"max-length-bytes": 2000},
    });
    broker_api()
        .put(
            &format!("/policies/{}/small-parked", url_encode(&app.vhost)),
            Some(&rule),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for_policy(&app, &parked, "max-length-bytes", true).await;
    // Five bad bodies of 900 bytes, each parked by the router in turn.
    for i in 0..5u8 {
        let body = vec![b'a' + i; 900];
        app.publish_raw("payment", delay(1000), &body).await;
    }
    wait_until(Duration::from_secs(20), "the newest two kept", || async {
        (app.queue_depth(&parked).await == 2).then_some(())
    })
    .await;
    let newest: Vec<u8> = app
        .drain_parked()
        .await
        .into_iter()
        .map(|p| p.2[0])
        .collect();
    assert_eq!(newest, vec![b'd', b'e']);
}

each_mode!(parked_queue_is_bounded);

/// Every test a "Guarantees" section of the documentation (README.md and
/// docs/*.md) names exists, so no section can point at a test that was
/// renamed or removed.
#[test]
fn the_guarantees_name_real_tests() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut pages = vec![std::path::PathBuf::from(format!("{root}/README.md"))];
    for entry in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut section = String::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        section.push_str(&guarantees_sections(&text));
    }
    let mut named = 0;
    for quoted in section.split('`').skip(1).step_by(2) {
        let Some((module, name)) = quoted.split_once("::") else {
            continue;
        };
        if !module.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let name = name.trim_end_matches("_*");
        let source = std::fs::read_to_string(format!("{root}/tests/api/{module}.rs"))
            .unwrap_or_else(|_| panic!("no tests/api/{module}.rs for `{quoted}`"));
        assert!(
            source.contains(&format!("fn {name}")),
            "the documentation names `{quoted}`, which tests/api/{module}.rs does not define"
        );
        named += 1;
    }
    assert!(named > 20, "only {named} tests named");
}

/// The text of every section whose heading names "Guarantees", each up to
/// the next heading of the same or a higher level.
fn guarantees_sections(text: &str) -> String {
    let mut out = String::new();
    let mut level = None;
    for line in text.lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let heading = hashes > 0 && line[hashes..].starts_with(' ');
        if heading && level.is_some_and(|l| hashes <= l) {
            level = None;
        }
        if heading && level.is_none() && line.contains("Guarantees") {
            level = Some(hashes);
        }
        if level.is_some() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The sweeper sweeps each kind on its own: a kind whose every transition
/// the database refuses (here a trigger on unpaid orders) does not keep the
/// other kinds from their turn, and the refused orders are passed over, not
/// taken again and again.
async fn the_sweeper_sweeps_each_kind_on_its_own(backend: Backend, mode: DelayMode) {
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__RELAY__ENABLED", "false")
            .env("ORDER_TIMEOUT__SWEEPER__GRACE", "0s")
            .env("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "2")
            .env("ORDER_TIMEOUT__WINDOWS__RECEIPT", "1ms"),
    )
    .await;
    app.put_stock("A", 10).await;
    let shipped = app.order(&[("A", 1)], "1m").await;
    assert_eq!(app.post(&shipped, "pay").await.0, 200);
    assert_eq!(app.post(&shipped, "ship").await.0, 200);
    let mut unpaid = Vec::new();
    for _ in 0..5 {
        unpaid.push(app.order(&[("A", 1)], "1ms").await);
    }
    // The scenario: the 1 ms windows pass, so every order is due.
    tokio::time::sleep(Duration::from_millis(20)).await;
    refusing_trigger(
        &app.ctx.db,
        backend,
        "refuse_unpaid",
        "BEFORE UPDATE ON orders",
        "OLD.status = 'pending_payment'",
        "test: unpaid orders are refused",
    )
    .await;
    let caught = order_timeout::sweeper::sweep(&app.ctx, Millis::now())
        .await
        .expect("the database answers: no error, whatever it refused");
    assert_eq!(caught, 1);
    assert_eq!(app.get_order(&shipped).await["status"], "completed");
    for id in &unpaid {
        assert_eq!(app.get_order(id).await["status"], "pending_payment");
    }
}

each_mode!(the_sweeper_sweeps_each_kind_on_its_own);

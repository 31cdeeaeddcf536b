//! Checkout with an `Idempotency-Key` (issue 11, item 7): a client that lost
//! the answer retries with the same key and gets the same order, not a second
//! order and a second reservation.

use std::time::Duration;

use reqwest::header::HeaderValue;
use serde_json::{Value, json};

use order_timeout::db::entities::idempotency_keys;
use sea_orm::{EntityTrait, PaginatorTrait};

use crate::helpers::*;

each_mode!(a_retry_gets_the_same_order, MariaDb);

/// A raw checkout: (status, `Idempotent-Replayed` header, body text).
async fn post_order(
    app: &TestApp,
    key: Option<&[u8]>,
    body: &str,
) -> (u16, Option<String>, String) {
    post_order_as(&app.http, &app.base, key, body).await
}

/// A raw checkout by the caller whose client this is.
async fn post_order_as(
    http: &reqwest::Client,
    base: &str,
    key: Option<&[u8]>,
    body: &str,
) -> (u16, Option<String>, String) {
    let mut request = http
        .post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", HeaderValue::from_bytes(key).unwrap());
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_string());
    (status, replayed, resp.text().await.unwrap())
}

async fn a_retry_gets_the_same_order(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    app.put_stock("A", 10).await;
    app.put_stock("B", 5).await;
    let key = Some(b"checkout-7f3a".as_slice());
    let (status, replayed, first) = post_order(
        &app,
        key,
        r#"{"items": [{"sku": "B", "quantity": 1}, {"sku": "A", "quantity": 2}], "payment_window": "2s"}"#,
    )
    .await;
    assert_eq!((status, replayed), (201, None), "{first}");
    let order: Value = serde_json::from_str(&first).unwrap();
    let id = order["id"].as_str().unwrap().to_string();

    // The same request written differently: key order, whitespace, line
    // order and the window's spelling do not make it another request.
    let (status, replayed, again) = post_order(
        &app,
        key,
        r#"{ "payment_window":"2000ms","items":[ {"quantity":2,"sku":"A"}, {"sku":"B","quantity":1} ] }"#,
    )
    .await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again, first, "the first answer, byte for byte");
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 8, "reserved": 2, "sold": 0})
    );
    assert_eq!(app.stock("B").await["reserved"], 1);

    // One order, one timeout: it is cancelled once, and its stock comes back in full.
    app.cancelled_on_time(&id, Duration::from_secs(8)).await;
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 10, "reserved": 0, "sold": 0})
    );
    assert_eq!(
        app.stock("B").await,
        json!({"sku": "B", "available": 5, "reserved": 0, "sold": 0})
    );
    // A retry after the order moved on still repeats the first answer and reserves nothing.
    let (status, replayed, late) = post_order(
        &app,
        key,
        r#"{"items": [{"sku": "A", "quantity": 2}, {"sku": "B", "quantity": 1}], "payment_window": "2s"}"#,
    )
    .await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(late, first);
    assert_eq!(app.stock("A").await["available"], 10);
    let next = (id.parse::<i64>().unwrap() + 1).to_string();
    let resp = app
        .http
        .get(format!("{}/orders/{next}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "no second order");
    assert_eq!(
        app.metric("order_timeout_orders_created_total", &[]).await,
        1.0
    );
    assert_eq!(
        app.metric("order_timeout_checkouts_replayed_total", &[])
            .await,
        2.0
    );
    assert_eq!(
        app.metric("order_timeout_outbox_published_total", &[])
            .await,
        1.0,
        "one timeout published"
    );
    // (In TTL mode the timer may also come a little early and be held: not counted here.)
    for (outcome, n) in [("applied", 1.0), ("not_applicable", 0.0)] {
        let label = format!("outcome=\"{outcome}\"");
        assert_eq!(
            app.metric("order_timeout_timeouts_handled_total", &[&label])
                .await,
            n,
            "payment timeouts {outcome}"
        );
    }
}

/// The same key with other items or another window: 422, nothing reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_used_for_another_request_is_refused() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("A", 10).await;
    let key = Some(b"k-1".as_slice());
    let (status, _, body) = post_order(
        &app,
        key,
        r#"{"items": [{"sku": "A", "quantity": 2}], "payment_window": "30m"}"#,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    for other in [
        r#"{"items": [{"sku": "A", "quantity": 3}], "payment_window": "30m"}"#,
        r#"{"items": [{"sku": "A", "quantity": 2}], "payment_window": "10m"}"#,
        // No window: the default (30m in tests too), so only the items differ.
        r#"{"items": [{"sku": "A", "quantity": 1}]}"#,
    ] {
        let (status, replayed, body) = post_order(&app, key, other).await;
        assert_eq!((status, replayed), (422, None), "{other}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("different request"),
            "{body}"
        );
    }
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 8, "reserved": 2, "sold": 0})
    );
    // Keys are compared exactly: another case is another key.
    let (status, replayed, _) = post_order(
        &app,
        Some(b"K-1"),
        r#"{"items": [{"sku": "A", "quantity": 3}], "payment_window": "30m"}"#,
    )
    .await;
    assert_eq!((status, replayed), (201, None));
}

/// Twenty requests at once with one key: one order, nineteen replays of its answer.
async fn racing_retries_make_one_order(backend: Backend) {
    let app = spawn_app(Spawn::new(backend, DelayMode::Ttl)).await;
    app.put_stock("A", 100).await;
    let body = r#"{"items": [{"sku": "A", "quantity": 3}], "payment_window": "30m"}"#;
    let answers =
        futures_util::future::join_all((0..20).map(|_| post_order(&app, Some(b"race-key"), body)))
            .await;
    let first = answers
        .iter()
        .find(|(_, replayed, _)| replayed.is_none())
        .expect("one answer created the order")
        .2
        .clone();
    for (status, _, text) in &answers {
        assert_eq!(*status, 201, "{text}");
        assert_eq!(text, &first);
    }
    let created = answers.iter().filter(|(_, r, _)| r.is_none()).count();
    assert_eq!(created, 1, "exactly one request created the order");
    assert_eq!(
        app.stock("A").await,
        json!({"sku": "A", "available": 97, "reserved": 3, "sold": 0})
    );
    assert_eq!(
        app.metric("order_timeout_orders_created_total", &[]).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_make_one_order_sqlite() {
    racing_retries_make_one_order(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_make_one_order_postgres() {
    racing_retries_make_one_order(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_make_one_order_mariadb() {
    racing_retries_make_one_order(Backend::MariaDb).await
}

/// An empty key, one too long, or one that is not visible ASCII: 400 naming
/// the header, nothing reserved. 255 visible characters are fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_refused() {
    let app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("A", 10).await;
    let body = r#"{"items": [{"sku": "A", "quantity": 1}]}"#;
    let long = vec![b'k'; 256];
    for bad in [
        b"".as_slice(),
        long.as_slice(),
        b"two words",
        b"tab\there",
        "cl\u{e9}".as_bytes(),
    ] {
        let (status, _, text) = post_order(&app, Some(bad), body).await;
        assert_eq!(status, 400, "{:?}: {text}", String::from_utf8_lossy(bad));
        assert!(text.contains("Idempotency-Key"), "{text}");
    }
    // The header twice.
    let resp = app
        .http
        .post(format!("{}/orders", app.base))
        .header("content-type", "application/json")
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(app.stock("A").await["reserved"], 0);

    let longest = vec![b'~'; 255];
    let (status, _, text) = post_order(&app, Some(&longest), body).await;
    assert_eq!(status, 201, "{text}");
    // Without the header, checkout is as before: every request is an order.
    for _ in 0..2 {
        let (status, replayed, text) = post_order(&app, None, body).await;
        assert_eq!((status, replayed), (201, None), "{text}");
    }
    assert_eq!(app.stock("A").await["reserved"], 3);
}

/// The id of a checkout's answer.
fn id_of(body: &str) -> String {
    let order: Value = serde_json::from_str(body).unwrap();
    order["id"].as_str().unwrap().to_string()
}

/// Two storefronts (two checkout tokens) using the same key get two orders,
/// whatever their requests; each one's retry replays its own order. The
/// database keeps a hash of each token, never the token.
async fn keys_belong_to_their_caller(backend: Backend) {
    let (a, b) = (new_token("shop-a"), new_token("shop-b"));
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", format!("{a},{b}")),
    )
    .await;
    app.put_stock("A", 10).await;
    let (shop_a, shop_b) = (api_client(Some(&a)), api_client(Some(&b)));
    let key = Some(b"cart-1001".as_slice());
    let one = r#"{"items": [{"sku": "A", "quantity": 1}]}"#;
    let two = r#"{"items": [{"sku": "A", "quantity": 2}]}"#;

    let (status, replayed, first_a) = post_order_as(&shop_a, &app.base, key, one).await;
    assert_eq!((status, replayed), (201, None), "{first_a}");
    // The same request from the other storefront: its own order, no replay.
    let (status, replayed, first_b) = post_order_as(&shop_b, &app.base, key, one).await;
    assert_eq!((status, replayed), (201, None), "{first_b}");
    assert_ne!(id_of(&first_a), id_of(&first_b));
    // Each one's retry replays its own order.
    for (shop, first) in [(&shop_a, &first_a), (&shop_b, &first_b)] {
        let (status, replayed, again) = post_order_as(shop, &app.base, key, one).await;
        assert_eq!(
            (status, replayed.as_deref()),
            (201, Some("true")),
            "{again}"
        );
        assert_eq!(&again, first);
    }
    // Another request under the key is refused to its owner only.
    let (status, _, _) = post_order_as(&shop_a, &app.base, key, two).await;
    assert_eq!(status, 422);
    let (status, replayed, third) = post_order_as(&app.http, &app.base, key, two).await;
    assert_eq!(
        (status, replayed),
        (201, None),
        "the admin token is a third caller: {third}"
    );
    assert_eq!(app.stock("A").await["reserved"], 4);

    let rows = idempotency_keys::Entity::find()
        .all(&app.ctx.db)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    for row in &rows {
        assert_eq!(row.scope.len(), 64, "{}", row.scope);
        assert!(row.scope.bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(!row.scope.contains(&a) && !row.scope.contains(&b));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_belong_to_their_caller_sqlite() {
    keys_belong_to_their_caller(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_belong_to_their_caller_postgres() {
    keys_belong_to_their_caller(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_belong_to_their_caller_mariadb() {
    keys_belong_to_their_caller(Backend::MariaDb).await
}

/// With a one-second retention, the cleaner deletes a used key and the key
/// then makes a new order instead of replaying the old one.
async fn expired_keys_are_deleted_and_used_anew(backend: Backend) {
    let app = spawn_app(
        Spawn::new(backend, DelayMode::Ttl).env("ORDER_TIMEOUT__HTTP__IDEMPOTENCY_RETENTION", "1s"),
    )
    .await;
    app.put_stock("A", 10).await;
    let key = Some(b"cart-7".as_slice());
    let body = r#"{"items": [{"sku": "A", "quantity": 1}]}"#;
    let (status, replayed, first) = post_order(&app, key, body).await;
    assert_eq!((status, replayed), (201, None), "{first}");
    let db = app.ctx.db.clone();
    wait_until(
        Duration::from_secs(15),
        "the cleaner deletes the expired key",
        || {
            let db = db.clone();
            async move {
                let left = idempotency_keys::Entity::find().count(&db).await.unwrap();
                (left == 0).then_some(())
            }
        },
    )
    .await;
    let (status, replayed, second) = post_order(&app, key, body).await;
    assert_eq!((status, replayed), (201, None), "{second}");
    assert_ne!(id_of(&first), id_of(&second));
    assert_eq!(app.stock("A").await["reserved"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_keys_are_deleted_and_used_anew_sqlite() {
    expired_keys_are_deleted_and_used_anew(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_keys_are_deleted_and_used_anew_postgres() {
    expired_keys_are_deleted_and_used_anew(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_keys_are_deleted_and_used_anew_mariadb() {
    expired_keys_are_deleted_and_used_anew(Backend::MariaDb).await
}

/// The scoping migration goes down (one row per key kept, in the old shape)
/// and up again (the rows written before it get the scope `unscoped`, so they
/// replay to no one).
async fn the_scoping_migration_goes_down_and_up(backend: Backend) {
    use migrations::{Migrator, MigratorTrait};
    use sea_orm::{ConnectionTrait, Statement};
    let app = spawn_app(Spawn::new(backend, DelayMode::Ttl)).await;
    app.put_stock("A", 10).await;
    let body = r#"{"items": [{"sku": "A", "quantity": 1}]}"#;
    let (status, _, first) = post_order(&app, Some(b"before-down"), body).await;
    assert_eq!(status, 201, "{first}");
    let db = &app.ctx.db;
    // Down to before the scoping migration: it, and every migration that
    // came after it.
    let migrations: Vec<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let scoping = migrations
        .iter()
        .position(|name| name.contains("scope_idempotency_keys"))
        .expect("the scoping migration is one of the service's");
    let steps = u32::try_from(migrations.len() - scoping).unwrap();
    Migrator::down(db, Some(steps)).await.unwrap();
    let count = |sql: &'static str| async move {
        let row = db
            .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    };
    assert_eq!(count("SELECT COUNT(*) FROM idempotency_keys").await, 1);
    Migrator::up(db, None).await.unwrap();
    assert_eq!(
        count("SELECT COUNT(*) FROM idempotency_keys WHERE scope = 'unscoped'").await,
        1
    );
    // A key from before scoping is no one's: the same key makes a new order.
    let (status, replayed, again) = post_order(&app, Some(b"before-down"), body).await;
    assert_eq!((status, replayed), (201, None), "{again}");
    assert_ne!(id_of(&first), id_of(&again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scoping_migration_goes_down_and_up_sqlite() {
    the_scoping_migration_goes_down_and_up(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scoping_migration_goes_down_and_up_postgres() {
    the_scoping_migration_goes_down_and_up(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scoping_migration_goes_down_and_up_mariadb() {
    the_scoping_migration_goes_down_and_up(Backend::MariaDb).await
}

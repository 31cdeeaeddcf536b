//! The transactions on an in-memory SQLite database (the real SQL, every
//! migration applied): what each family writes, and what it refuses.
//! PostgreSQL and MariaDB run the same code in the integration tests; the
//! checkout, which writes differently on each backend, is also checked here
//! on a fresh database of the local PostgreSQL and MariaDB servers
//! ([`on_each_backend`]): those variants are `#[ignore]`d, so that the unit
//! tier needs no server, and `make test` runs them with `--ignored`.

use super::*;

async fn db() -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new("sqlite::memory:");
    // An in-memory database exists once per connection.
    options.max_connections(1).sqlx_logging(false);
    let db = sea_orm::Database::connect(options).await.unwrap();
    crate::db::migrate(
        &db,
        crate::db::MigrationLock::quiet(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    db
}

fn windows() -> Windows {
    Windows {
        payment: Duration::from_secs(60),
        fulfillment: Duration::from_secs(60),
        receipt: Duration::from_secs(60),
        max_payment: Duration::from_secs(600),
    }
}

fn line(sku: &str, quantity: i64) -> NewItem {
    NewItem {
        sku: sku.into(),
        quantity,
    }
}

async fn stock(db: &DatabaseConnection, sku: &str) -> (i64, i64, i64) {
    let s = get_stock(db, sku).await.unwrap().unwrap();
    (s.available, s.reserved, s.sold)
}

#[tokio::test]
async fn checkout_reserves_every_line_or_nothing() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    put_stock(&db, "B", 1, now).await.unwrap();
    let short = checkout(
        &db,
        &[line("A", 2), line("B", 2)],
        Duration::from_secs(1),
        now,
        None,
    )
    .await;
    assert!(matches!(
        short,
        Err(CheckoutError::InsufficientStock { ref sku, requested: 2, available: 1 }) if sku == "B"
    ));
    assert_eq!(
        stock(&db, "A").await,
        (5, 0, 0),
        "the short line rolled back the other"
    );
    let order = checkout(
        &db,
        &[line("B", 1), line("A", 2)],
        Duration::from_secs(1),
        now,
        None,
    )
    .await
    .unwrap();
    assert_eq!(order.status, OrderStatus::PendingPayment);
    assert_eq!(order.pay_deadline, Millis(1_001_000));
    let skus: Vec<&str> = order.items.iter().map(|i| i.sku.as_str()).collect();
    assert_eq!(skus, ["A", "B"], "items in SKU order");
    assert_eq!(stock(&db, "A").await, (3, 2, 0));
    let claimed = outbox_claim::<outbox::Entity>(&db, 10, now).await.unwrap();
    assert_eq!(claimed.len(), 1, "one payment timeout in the outbox");
    assert_eq!(claimed[0].kind, "payment");
    assert_eq!(claimed[0].due_at_ms, 1_001_000);
}

#[tokio::test]
async fn a_key_replays_its_first_answer_and_refuses_another_request() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let answer = |o: &Order| Ok(format!("order {} v{}", o.id, o.version));
    let items = [line("A", 1)];
    let key = IdempotencyKey::new(
        "anonymous".into(),
        "k1".into(),
        Duration::from_secs(86_400),
        &items,
        Duration::from_secs(1),
        answer,
    );
    let first = checkout(&db, &items, Duration::from_secs(1), now, Some(&key))
        .await
        .unwrap();
    match checkout(&db, &items, Duration::from_secs(1), now, Some(&key)).await {
        Err(CheckoutError::Replay { order, answer }) => {
            assert_eq!(order, first.id);
            assert_eq!(answer, format!("order {} v0", first.id));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let other = IdempotencyKey::new(
        "anonymous".into(),
        "k1".into(),
        Duration::from_secs(86_400),
        &[line("A", 2)],
        Duration::from_secs(1),
        answer,
    );
    assert!(matches!(
        checkout(
            &db,
            &[line("A", 2)],
            Duration::from_secs(1),
            now,
            Some(&other)
        )
        .await,
        Err(CheckoutError::KeyReused)
    ));
    assert_eq!(stock(&db, "A").await, (4, 1, 0), "only the first reserved");
}

#[tokio::test]
async fn a_timeout_applies_once_and_only_after_the_deadline() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let order = checkout(&db, &[line("A", 2)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    let early = expire(
        &db,
        TimeoutKind::Payment,
        &[order.id],
        now,
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    assert_eq!(
        early[&order.id],
        ExpiryOutcome::NotDue {
            deadline: Millis(1_001_000)
        }
    );
    let due = Millis(1_001_000);
    let first = expire(
        &db,
        TimeoutKind::Payment,
        &[order.id],
        due,
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    assert_eq!(first[&order.id], ExpiryOutcome::Applied { deadline: due });
    let again = expire(
        &db,
        TimeoutKind::Payment,
        &[order.id],
        due,
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    assert_eq!(
        again[&order.id],
        ExpiryOutcome::Inapplicable {
            status: OrderStatus::Cancelled.as_str().to_string()
        }
    );
    assert_eq!(stock(&db, "A").await, (5, 0, 0), "released once");
    let unknown = OrderId::new(order.id.get() + 1);
    let missing = expire(
        &db,
        TimeoutKind::Payment,
        &[unknown],
        due,
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    assert_eq!(missing[&unknown], ExpiryOutcome::NotFound);
    let audit = get_order(&db, order.id, true)
        .await
        .unwrap()
        .unwrap()
        .audit
        .unwrap();
    let events: Vec<(&str, &str)> = audit
        .iter()
        .map(|e| (e.event.as_str(), e.cause.as_str()))
        .collect();
    assert_eq!(events, [("created", "api"), ("cancelled", "timeout")]);
}

#[tokio::test]
async fn a_payment_after_the_deadline_cancels_and_is_recorded_once() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let order = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    let late = Millis(1_002_000);
    for attempt in 0..2 {
        match act(&db, order.id, Action::Pay, &windows(), late).await {
            Err(TransitionError::Conflict {
                order,
                late_payment,
                ..
            }) => {
                assert_eq!(order.status, OrderStatus::Cancelled);
                assert_eq!(late_payment, attempt == 0, "recorded the first time only");
                assert_eq!(order.late_payment_at, Some(late));
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
    assert_eq!(stock(&db, "A").await, (5, 0, 0));
    let paid = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    let paid = act(&db, paid.id, Action::Pay, &windows(), now)
        .await
        .unwrap();
    assert_eq!(paid.status, OrderStatus::Paid);
    assert_eq!(paid.ship_deadline, Some(Millis(1_060_000)));
    assert_eq!(stock(&db, "A").await, (4, 0, 1));
}

#[tokio::test]
async fn with_payment_timeouts_paused_a_late_payment_is_taken() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let order = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    let late = Millis(1_002_000);
    let paid = act_during(
        &db,
        order.id,
        Action::Pay,
        &windows(),
        late,
        Deadline::Paused,
    )
    .await
    .unwrap();
    assert_eq!(paid.status, OrderStatus::Paid);
    assert_eq!(paid.paid_at, Some(late));
    assert_eq!(paid.late_payment_at, None, "not a late payment to refund");
    assert_eq!(stock(&db, "A").await, (4, 0, 1));
    // The timeout that comes when payment resumes finds it paid.
    let outcomes = expire(
        &db,
        TimeoutKind::Payment,
        &[order.id],
        Millis(1_003_000),
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    assert!(
        !matches!(outcomes[&order.id], ExpiryOutcome::Applied { .. }),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn a_corrupt_status_is_an_error_not_another_status() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let order = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    orders::Entity::update_many()
        .col_expr(orders::Column::Status, Expr::value("lost"))
        .exec(&db)
        .await
        .unwrap();
    let err = get_order(&db, order.id, false).await.unwrap_err();
    assert!(err.to_string().contains("corrupt order row"), "{err}");
}

#[tokio::test]
async fn the_outbox_claims_releases_sets_aside_and_counts_its_rows() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 10, now).await.unwrap();
    for _ in 0..3 {
        checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
            .await
            .unwrap();
    }
    let state = outbox_backlog::<outbox::Entity>(&db).await.unwrap();
    assert_eq!(
        (state.waiting, state.set_aside, state.oldest),
        (3, 0, Some(now))
    );
    let claimed = outbox_claim::<outbox::Entity>(&db, 10, now).await.unwrap();
    assert_eq!(claimed.len(), 3);
    assert!(
        outbox_claim::<outbox::Entity>(&db, 10, now)
            .await
            .unwrap()
            .is_empty(),
        "held by the first claim"
    );
    let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    outbox_release::<outbox::Entity>(&db, &ids[..1])
        .await
        .unwrap();
    let again = outbox_claim::<outbox::Entity>(&db, 10, now).await.unwrap();
    assert_eq!(again.iter().map(|r| r.id).collect::<Vec<_>>(), ids[..1]);
    outbox_set_aside::<outbox::Entity>(&db, &ids[1..2], "unknown kind", now)
        .await
        .unwrap();
    outbox_delete::<outbox::Entity>(&db, &ids[2..])
        .await
        .unwrap();
    let state = outbox_backlog::<outbox::Entity>(&db).await.unwrap();
    assert_eq!((state.waiting, state.set_aside), (1, 1));
    let after_lease = now.plus(CLAIM_LEASE).plus(Duration::from_millis(1));
    let back = outbox_claim::<outbox::Entity>(&db, 10, after_lease)
        .await
        .unwrap();
    assert_eq!(
        back.iter().map(|r| r.id).collect::<Vec<_>>(),
        ids[..1],
        "not the row set aside"
    );
}

/// What the relay's rounds in flight rest on: while earlier rounds hold their
/// rows, each claim takes the next ones, oldest first, and one release gives
/// back the rows of several rounds (a broken connection) for the next claim.
#[tokio::test]
async fn claims_while_rounds_are_out_take_the_next_rows() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 10, now).await.unwrap();
    for _ in 0..7 {
        checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
            .await
            .unwrap();
    }
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let round = outbox_claim::<outbox::Entity>(&db, 3, now).await.unwrap();
        rounds.push(round.iter().map(|r| r.id).collect::<Vec<_>>());
    }
    let all: Vec<i64> = rounds.concat();
    assert_eq!(rounds.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "oldest first, no row twice: {rounds:?}"
    );
    // The first round settled; the two others given back at once.
    outbox_delete::<outbox::Entity>(&db, &rounds[0])
        .await
        .unwrap();
    outbox_release::<outbox::Entity>(&db, &all[3..])
        .await
        .unwrap();
    let again = outbox_claim::<outbox::Entity>(&db, 10, now).await.unwrap();
    assert_eq!(again.iter().map(|r| r.id).collect::<Vec<_>>(), all[3..]);
}

/// The event outbox's rows, oldest first: `(order_id, event, body)`.
async fn events(db: &DatabaseConnection) -> Vec<(String, String, serde_json::Value)> {
    use super::super::entities::order_timeout_events as e;
    e::Entity::find()
        .order_by_asc(e::Column::Id)
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.order_id, r.event, serde_json::from_str(&r.body).unwrap()))
        .collect()
}

#[tokio::test]
async fn every_committed_transition_appends_its_event_and_nothing_else_does() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    put_stock(&db, "B", 5, now).await.unwrap();
    let window = Duration::from_secs(1);
    let kept = checkout(&db, &[line("A", 1)], window, now, None)
        .await
        .unwrap();
    let lapsed = checkout(&db, &[line("B", 1), line("A", 2)], window, now, None)
        .await
        .unwrap();
    // Refused, so rolled back: no event.
    assert!(
        checkout(&db, &[line("A", 9)], window, now, None)
            .await
            .is_err()
    );
    for action in [Action::Pay, Action::Ship, Action::Confirm] {
        act(&db, kept.id, action, &windows(), now).await.unwrap();
    }
    // Refused by the state diagram: no event.
    assert!(
        act(&db, kept.id, Action::Cancel, &windows(), now)
            .await
            .is_err()
    );
    let due = Millis(1_001_000);
    expire(
        &db,
        TimeoutKind::Payment,
        &[lapsed.id],
        due,
        Cause::Timeout,
        "test-1",
    )
    .await
    .unwrap();
    // The late payment is told once; its retry is a plain conflict.
    for _ in 0..2 {
        assert!(
            act(&db, lapsed.id, Action::Pay, &windows(), due)
                .await
                .is_err()
        );
    }
    let (k, l) = (kept.id.to_string(), lapsed.id.to_string());
    // One line per event: order, event, cause, from, to.
    let told: Vec<String> = events(&db)
        .await
        .iter()
        .map(|(id, event, b)| {
            assert_eq!(b["order_id"], id.as_str());
            assert_eq!(b["event"], event.as_str());
            assert_eq!(b["version"], 1);
            let order = if *id == k {
                "kept"
            } else if *id == l {
                "lapsed"
            } else {
                "?"
            };
            let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
            let fields = [&b["event"], &b["cause"], &b["from"], &b["to"]].map(text);
            format!("{order} {}", fields.join(" "))
        })
        .collect();
    assert_eq!(
        told,
        [
            "kept created buyer - pending_payment",
            "lapsed created buyer - pending_payment",
            "kept paid buyer pending_payment paid",
            "kept shipped shop paid shipped",
            "kept completed buyer shipped completed",
            "lapsed cancelled timeout pending_payment cancelled",
            "lapsed late_payment buyer cancelled cancelled",
        ]
    );
    let bodies = events(&db).await;
    let cancel = &bodies[5].2;
    assert_eq!(
        cancel["released"],
        serde_json::json!([{"sku": "A", "quantity": 2}, {"sku": "B", "quantity": 1}])
    );
    assert_eq!(cancel["at"], "1970-01-01T00:16:41.000Z");
    for (_, event, body) in &bodies {
        assert_eq!(
            body.get("released").is_some(),
            event == "cancelled",
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_batch_of_cancels_tells_each_order_what_it_released() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 2_000, now).await.unwrap();
    put_stock(&db, "B", 2_000, now).await.unwrap();
    let mut ids = Vec::new();
    // More orders than one chunk: the lines are read a chunk at a time.
    for i in 0..(LIST_CHUNK as i64 + 20) {
        let items = [line("A", 1 + i % 3), line("B", 1)];
        let lines = if i % 2 == 0 { &items[..] } else { &items[..1] };
        let order = checkout(&db, lines, Duration::from_secs(1), now, None)
            .await
            .unwrap();
        ids.push((order.id, 1 + i % 3, i % 2 == 0));
    }
    let all: Vec<OrderId> = ids.iter().map(|(id, _, _)| *id).collect();
    expire(
        &db,
        TimeoutKind::Payment,
        &all,
        Millis(1_001_000),
        Cause::Sweeper,
        "test-1",
    )
    .await
    .unwrap();
    let told: HashMap<String, serde_json::Value> = events(&db)
        .await
        .into_iter()
        .filter(|(_, event, _)| event == "cancelled")
        .map(|(id, _, body)| (id, body))
        .collect();
    assert_eq!(told.len(), ids.len());
    for (id, a, with_b) in ids {
        let body = &told[&id.to_string()];
        assert_eq!(body["cause"], "sweeper");
        let mut expected = vec![serde_json::json!({"sku": "A", "quantity": a})];
        if with_b {
            expected.push(serde_json::json!({"sku": "B", "quantity": 1}));
        }
        assert_eq!(body["released"], serde_json::Value::Array(expected), "{id}");
    }
}

#[tokio::test]
async fn the_event_outbox_is_claimed_refused_and_set_aside_like_the_timeout_outbox() {
    use super::super::entities::order_timeout_events as e;
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 10, now).await.unwrap();
    checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    // Only the event outbox's rows: the timeout outbox keeps its own.
    let state = outbox_backlog::<e::Entity>(&db).await.unwrap();
    assert_eq!((state.waiting, state.oldest), (1, Some(now)));
    let claimed = outbox_claim::<e::Entity>(&db, 10, now).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].event, "created");
    assert!(uuid::Uuid::parse_str(&claimed[0].message_id).is_ok());
    let message_id = claimed[0].message_id.clone();
    assert!(
        outbox_claim::<e::Entity>(&db, 10, now)
            .await
            .unwrap()
            .is_empty()
    );
    // Refused once: it waits (its lease moved on), then comes back as it was.
    let refused = [(&claimed[0], "nacked".to_string())];
    assert!(
        outbox_refused::<e::Entity>(&db, &refused, 2, now)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        outbox_claim::<e::Entity>(&db, 10, now)
            .await
            .unwrap()
            .is_empty()
    );
    let later = now.plus(Duration::from_secs(3));
    let again = outbox_claim::<e::Entity>(&db, 10, later).await.unwrap();
    assert_eq!((again[0].attempts, &again[0].message_id), (1, &message_id));
    // Refused a second time: set aside, kept, counted.
    let refused = [(&again[0], "nacked".to_string())];
    let set_aside = outbox_refused::<e::Entity>(&db, &refused, 2, later)
        .await
        .unwrap();
    assert_eq!(set_aside, [again[0].id]);
    let state = outbox_backlog::<e::Entity>(&db).await.unwrap();
    assert_eq!((state.waiting, state.set_aside), (0, 1));
    let far = later.plus(CLAIM_LEASE).plus(Duration::from_secs(120));
    assert!(
        outbox_claim::<e::Entity>(&db, 10, far)
            .await
            .unwrap()
            .is_empty()
    );
    outbox_delete::<e::Entity>(&db, &set_aside).await.unwrap();
    assert_eq!(outbox_backlog::<e::Entity>(&db).await.unwrap().set_aside, 0);
    assert_eq!(
        outbox_backlog::<outbox::Entity>(&db).await.unwrap().waiting,
        1
    );
}

/// The gauges' reading: the sweeper's condition per kind, overdue past the
/// threshold, the oldest's age; a timeout applied leaves it at once.
#[tokio::test]
async fn backlog_counts_what_waits_and_what_is_overdue() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 10, now).await.unwrap();
    let mut ids = Vec::new();
    for window in [1, 2, 100] {
        let order = checkout(&db, &[line("A", 1)], Duration::from_secs(window), now, None)
            .await
            .unwrap();
        ids.push(order.id);
    }
    let after = Duration::from_secs(2);
    let payment = |at: i64| backlog(&db, TimeoutKind::Payment, Millis(at), after);
    let none = Backlog {
        pending: 3,
        overdue: 0,
        oldest_overdue: Duration::ZERO,
    };
    // Past the deadline, but not by more than the threshold: not overdue.
    assert_eq!(payment(1_003_000).await.unwrap(), none);
    assert_eq!(
        payment(1_004_500).await.unwrap(),
        Backlog {
            pending: 3,
            overdue: 2,
            oldest_overdue: Duration::from_millis(3_500),
        }
    );
    // A paid order waits for its shipping instead.
    act(&db, ids[2], Action::Pay, &windows(), now)
        .await
        .unwrap();
    let fulfillment = backlog(&db, TimeoutKind::Fulfillment, Millis(1_004_500), after)
        .await
        .unwrap();
    assert_eq!((fulfillment.pending, fulfillment.overdue), (1, 0));
    // The oldest applied: the next one is the oldest now.
    expire(
        &db,
        TimeoutKind::Payment,
        &ids[..1],
        Millis(1_004_500),
        Cause::Sweeper,
        "test-1",
    )
    .await
    .unwrap();
    assert_eq!(
        payment(1_004_500).await.unwrap(),
        Backlog {
            pending: 1,
            overdue: 1,
            oldest_overdue: Duration::from_millis(2_500),
        }
    );
    let receipt = backlog(&db, TimeoutKind::Receipt, Millis(1_004_500), after)
        .await
        .unwrap();
    assert_eq!(receipt, Backlog::default());
}

#[test]
fn every_column_the_domain_names_is_an_orders_column() {
    let kinds = crate::domain::KINDS.iter().map(|k| k.deadline);
    let stamps = crate::domain::DIAGRAM.iter().map(|e| e.stamps);
    for name in kinds.chain(stamps) {
        assert!(name.parse::<orders::Column>().is_ok(), "{name}");
    }
}

/// A fresh database on a local server (the integration tests' servers),
/// every migration applied; [`Scratch::drop`] drops it.
struct Scratch {
    db: DatabaseConnection,
    admin: &'static str,
    name: String,
}

impl Scratch {
    async fn new(backend: DbBackend) -> Self {
        let (admin, base) = match backend {
            DbBackend::Postgres => (
                "postgres://postgres@127.0.0.1:5432/postgres",
                "postgres://postgres@127.0.0.1:5432",
            ),
            _ => (
                "mysql://root@127.0.0.1:3306/mysql",
                "mysql://root@127.0.0.1:3306",
            ),
        };
        let name = format!("ot_store_{}", uuid::Uuid::new_v4().simple());
        Self::admin(admin, &format!("CREATE DATABASE {name}")).await;
        let mut options = sea_orm::ConnectOptions::new(format!("{base}/{name}"));
        options.max_connections(8).sqlx_logging(false);
        let db = sea_orm::Database::connect(options).await.unwrap();
        crate::db::migrate(
            &db,
            crate::db::MigrationLock::quiet(Duration::from_secs(60)),
        )
        .await
        .unwrap();
        Self { db, admin, name }
    }

    async fn admin(url: &str, sql: &str) {
        let admin = sea_orm::Database::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url} reachable: {e}"));
        admin.execute_unprepared(sql).await.unwrap();
        admin.close().await.unwrap();
    }

    async fn drop(self) {
        let backend = self.db.get_database_backend();
        self.db.close().await.unwrap();
        let force = if backend == DbBackend::Postgres {
            " WITH (FORCE)"
        } else {
            ""
        };
        let sql = format!("DROP DATABASE IF EXISTS {}{force}", self.name);
        Self::admin(self.admin, &sql).await;
    }
}

/// Runs a checkout scenario on SQLite (in memory), PostgreSQL and MariaDB:
/// each backend places an order its own way (`checkout::Placing`).
macro_rules! on_each_backend {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn sqlite() {
                super::$name(&db().await).await
            }
            #[tokio::test]
            #[ignore = "needs the local PostgreSQL: the integration tier runs it (make test)"]
            async fn postgres() {
                let scratch = Scratch::new(DbBackend::Postgres).await;
                super::$name(&scratch.db).await;
                scratch.drop().await
            }
            #[tokio::test]
            #[ignore = "needs the local MariaDB: the integration tier runs it (make test)"]
            async fn mariadb() {
                let scratch = Scratch::new(DbBackend::MySql).await;
                super::$name(&scratch.db).await;
                scratch.drop().await
            }
        }
    };
}

/// How many rows each table a checkout writes holds: orders, items, outbox,
/// events, audit.
async fn written(db: &DatabaseConnection) -> [u64; 5] {
    use super::super::entities::order_timeout_events;
    use sea_orm::PaginatorTrait;
    [
        orders::Entity::find().count(db).await.unwrap(),
        order_items::Entity::find().count(db).await.unwrap(),
        outbox::Entity::find().count(db).await.unwrap(),
        order_timeout_events::Entity::find()
            .count(db)
            .await
            .unwrap(),
        order_events::Entity::find().count(db).await.unwrap(),
    ]
}

on_each_backend!(a_checkout_writes_every_row_by_the_database_clock);
async fn a_checkout_writes_every_row_by_the_database_clock(db: &DatabaseConnection) {
    use super::super::entities::order_timeout_events;
    let now = crate::db::clock::now(db).await.unwrap();
    put_stock(db, "A", 5, now).await.unwrap();
    put_stock(db, "B", 1, now).await.unwrap();
    let window = Duration::from_secs(60);
    let order = checkout(db, &[line("B", 1), line("A", 2)], window, now, None)
        .await
        .unwrap();
    assert_eq!(order.pay_deadline, now.plus(window));
    assert_eq!((order.created_at, order.updated_at), (now, now));
    assert_eq!(
        get_order(db, order.id, false).await.unwrap(),
        Some(order.clone()),
        "the order answered is the order stored"
    );
    assert_eq!(
        (stock(db, "A").await, stock(db, "B").await),
        ((3, 2, 0), (0, 1, 0))
    );
    assert_eq!(written(db).await, [1, 2, 1, 1, 1]);
    let timeout = outbox::Entity::find().one(db).await.unwrap().unwrap();
    assert_eq!(
        (timeout.order_id, timeout.kind.as_str(), timeout.due_at_ms),
        (order.id.get(), "payment", now.plus(window).0)
    );
    assert_eq!((timeout.created_at_ms, timeout.attempts), (now.0, 0));
    assert_eq!(timeout.claim, None);
    let event = order_timeout_events::Entity::find()
        .one(db)
        .await
        .unwrap()
        .unwrap();
    let id = order.id.to_string();
    assert_eq!(
        (event.order_id.as_str(), event.event.as_str()),
        (id.as_str(), "created")
    );
    assert_eq!((event.created_at_ms, event.attempts), (now.0, 0));
    assert!(uuid::Uuid::parse_str(&event.message_id).is_ok());
    // Byte for byte what the events' encoder makes of the created event.
    let told = DomainEvent {
        order_id: id,
        event: "created".into(),
        cause: "buyer".into(),
        from: None,
        to: "pending_payment".into(),
        at: now,
        released: None,
    };
    assert_eq!(event.body, told.body());
    let trail = audit(db, order.id).await.unwrap();
    assert_eq!(
        trail,
        [AuditEntry {
            event: "created".into(),
            from: None,
            to: "pending_payment".into(),
            cause: "api".into(),
            at: now,
            detail: None,
        }]
    );
}

on_each_backend!(a_short_or_unknown_line_reserves_nothing);
async fn a_short_or_unknown_line_reserves_nothing(db: &DatabaseConnection) {
    let now = crate::db::clock::now(db).await.unwrap();
    put_stock(db, "A", 5, now).await.unwrap();
    put_stock(db, "B", 1, now).await.unwrap();
    let window = Duration::from_secs(60);
    let short = checkout(db, &[line("A", 2), line("B", 2)], window, now, None).await;
    assert!(
        matches!(
            short,
            Err(CheckoutError::InsufficientStock { ref sku, requested: 2, available: 1 }) if sku == "B"
        ),
        "{short:?}"
    );
    // The first short line in SKU order is the one named.
    let both = checkout(db, &[line("B", 3), line("A", 9)], window, now, None).await;
    assert!(
        matches!(
            both,
            Err(CheckoutError::InsufficientStock { ref sku, requested: 9, available: 5 }) if sku == "A"
        ),
        "{both:?}"
    );
    let unknown = checkout(db, &[line("A", 1), line("Z", 1)], window, now, None).await;
    assert!(
        matches!(unknown, Err(CheckoutError::UnknownSku(ref sku)) if sku == "Z"),
        "{unknown:?}"
    );
    let twice = checkout(db, &[line("A", 1), line("A", 1)], window, now, None).await;
    assert!(matches!(twice, Err(CheckoutError::Db(_))), "{twice:?}");
    assert_eq!(
        (stock(db, "A").await, stock(db, "B").await),
        ((5, 0, 0), (1, 0, 0))
    );
    assert_eq!(written(db).await, [0; 5], "a refusal writes nothing");
}

on_each_backend!(a_key_is_settled_with_its_order_or_not_kept);
async fn a_key_is_settled_with_its_order_or_not_kept(db: &DatabaseConnection) {
    let now = crate::db::clock::now(db).await.unwrap();
    put_stock(db, "A", 1, now).await.unwrap();
    let answer = |o: &Order| Ok(format!("order {} due {}", o.id, o.pay_deadline.0));
    let window = Duration::from_secs(60);
    let key = |items: &[NewItem]| {
        IdempotencyKey::new(
            "anonymous".into(),
            "k1".into(),
            Duration::from_secs(86_400),
            items,
            window,
            answer,
        )
    };
    let items = [line("A", 2)];
    let refused = checkout(db, &items, window, now, Some(&key(&items))).await;
    assert!(matches!(
        refused,
        Err(CheckoutError::InsufficientStock { .. })
    ));
    put_stock(db, "A", 5, now).await.unwrap();
    // The refusal kept no key: the retry with it places the order.
    let first = checkout(db, &items, window, now, Some(&key(&items)))
        .await
        .unwrap();
    match checkout(db, &items, window, now, Some(&key(&items))).await {
        Err(CheckoutError::Replay { order, answer }) => {
            assert_eq!(order, first.id);
            assert_eq!(
                answer,
                format!("order {} due {}", first.id, now.plus(window).0)
            );
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let other = [line("A", 1)];
    let reused = checkout(db, &other, window, now, Some(&key(&other))).await;
    assert!(
        matches!(reused, Err(CheckoutError::KeyReused)),
        "{reused:?}"
    );
    assert_eq!(stock(db, "A").await, (3, 2, 0), "only the first reserved");
    assert_eq!(written(db).await, [1, 1, 1, 1, 1]);
}

on_each_backend!(racing_checkouts_sell_the_stock_once);
async fn racing_checkouts_sell_the_stock_once(db: &DatabaseConnection) {
    let now = crate::db::clock::now(db).await.unwrap();
    put_stock(db, "A", 7, now).await.unwrap();
    put_stock(db, "B", 100, now).await.unwrap();
    let racers = (0..20).map(|i| {
        let db = db.clone();
        // Lines given in either order: the lock order is the SKUs'.
        let lines = if i % 2 == 0 {
            [line("A", 1), line("B", 2)]
        } else {
            [line("B", 2), line("A", 1)]
        };
        tokio::spawn(async move { checkout(&db, &lines, Duration::from_secs(60), now, None).await })
    });
    let mut placed = 0;
    for racer in futures_util::future::join_all(racers).await {
        match racer.unwrap() {
            Ok(_) => placed += 1,
            Err(CheckoutError::InsufficientStock {
                sku, available: 0, ..
            }) => assert_eq!(sku, "A"),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(placed, 7);
    assert_eq!(
        (stock(db, "A").await, stock(db, "B").await),
        ((0, 7, 0), (86, 14, 0))
    );
    assert_eq!(written(db).await, [7, 14, 7, 7, 7]);
}

#[tokio::test]
async fn a_story_says_what_waits_and_how_late_each_timeout_was_applied() {
    let db = db().await;
    let now = Millis(1_000_000);
    put_stock(&db, "A", 5, now).await.unwrap();
    let paid = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    act(&db, paid.id, Action::Pay, &windows(), Millis(1_000_500))
        .await
        .unwrap();
    let ship_by = Millis(1_060_500);
    let told = story(&db, paid.id, Millis(1_001_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(told.status, OrderStatus::Paid);
    assert_eq!(
        told.deadlines,
        [
            (TimeoutKind::Payment, Millis(1_001_000)),
            (TimeoutKind::Fulfillment, ship_by)
        ]
    );
    assert_eq!(told.waiting, [(TimeoutKind::Fulfillment, ship_by)]);
    // Flagged 700 ms late: nothing waits any more, though the status stays.
    expire(
        &db,
        TimeoutKind::Fulfillment,
        &[paid.id],
        Millis(1_061_200),
        Cause::Sweeper,
        "shop-1",
    )
    .await
    .unwrap();
    let told = story(&db, paid.id, Millis(1_061_300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(told.status, OrderStatus::Paid);
    assert!(told.waiting.is_empty(), "{told:?}");
    let flagged = told.trail.last().unwrap();
    assert_eq!(flagged.event, "fulfillment_overdue");
    assert_eq!(
        (flagged.late_ms, flagged.instance.as_deref()),
        (Some(700), Some("shop-1"))
    );
    // A client's action records neither.
    let paying = &told.trail[1];
    assert_eq!((paying.late_ms, paying.instance.as_deref()), (None, None));

    // A payment after the deadline applies the timeout first, in the
    // request: its lateness is recorded, no instance.
    let late = checkout(&db, &[line("A", 1)], Duration::from_secs(1), now, None)
        .await
        .unwrap();
    let refused = act(&db, late.id, Action::Pay, &windows(), Millis(1_001_250)).await;
    assert!(matches!(refused, Err(TransitionError::Conflict { .. })));
    let told = story(&db, late.id, Millis(1_001_300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(told.status, OrderStatus::Cancelled);
    let cancel = told
        .trail
        .iter()
        .find(|row| row.event == "cancelled")
        .unwrap();
    assert_eq!(
        (cancel.late_ms, cancel.instance.as_deref()),
        (Some(250), None)
    );
    assert!(story(&db, OrderId::new(999), now).await.unwrap().is_none());
}

//! The transactions on an in-memory SQLite database (the real SQL, every
//! migration applied): what each family writes, and what it refuses.
//! PostgreSQL and MariaDB run the same code in the integration tests.

use super::*;

async fn db() -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new("sqlite::memory:");
    // An in-memory database exists once per connection.
    options.max_connections(1).sqlx_logging(false);
    let db = sea_orm::Database::connect(options).await.unwrap();
    crate::db::migrate(&db).await.unwrap();
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
    let early = expire(&db, TimeoutKind::Payment, &[order.id], now, Cause::Timeout)
        .await
        .unwrap();
    assert_eq!(
        early[&order.id],
        ExpiryOutcome::NotDue {
            deadline: Millis(1_001_000)
        }
    );
    let due = Millis(1_001_000);
    let first = expire(&db, TimeoutKind::Payment, &[order.id], due, Cause::Timeout)
        .await
        .unwrap();
    assert_eq!(first[&order.id], ExpiryOutcome::Applied { deadline: due });
    let again = expire(&db, TimeoutKind::Payment, &[order.id], due, Cause::Timeout)
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
    let missing = expire(&db, TimeoutKind::Payment, &[unknown], due, Cause::Timeout)
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
    expire(&db, TimeoutKind::Payment, &[lapsed.id], due, Cause::Timeout)
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

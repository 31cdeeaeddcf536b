//! Timeouts: the conditional transition of each kind, in batches, for the
//! consumers and the sweeper, the sweeper's query for overdue orders, and
//! the on-call gauges' count of them.

use sea_orm::UpdateMany;
use sea_orm::sea_query::Asterisk;

use super::*;

/// Applies the timeout of `kind` to each order whose deadline has passed by
/// `now`, in one transaction, and says for every id what it found. The
/// audit rows name `instance` as the one that applied it.
pub async fn expire(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    ids: &[OrderId],
    now: Millis,
    cause: Cause,
    instance: &str,
) -> Result<HashMap<OrderId, ExpiryOutcome>, DbErr> {
    let txn = db.begin().await?;
    let applied = apply_expiry(&txn, kind, ids, now, cause, Some(instance)).await?;
    let mut outcomes: HashMap<OrderId, ExpiryOutcome> = applied
        .into_iter()
        .map(|(id, deadline)| (id, ExpiryOutcome::Applied { deadline }))
        .collect();
    let rest: Vec<i64> = ids
        .iter()
        .filter(|id| !outcomes.contains_key(id))
        .map(|id| id.get())
        .collect();
    // Read after the conditional update only to say why it did not apply.
    for chunk in rest.chunks(LIST_CHUNK) {
        let found = orders::Entity::find()
            .filter(orders::Column::Id.is_in(chunk.iter().copied()))
            .all(&txn)
            .await?;
        for order in found {
            let status = parse_status(&order.status)?;
            let outcome = match deadline_of(kind, &order) {
                Some(deadline)
                    if status == kind.acts_on() && deadline > now && not_flagged(kind, &order) =>
                {
                    ExpiryOutcome::NotDue { deadline }
                }
                _ => ExpiryOutcome::Inapplicable {
                    status: status.as_str().to_string(),
                },
            };
            outcomes.insert(OrderId::new(order.id), outcome);
        }
    }
    txn.commit().await?;
    for id in ids {
        outcomes.entry(*id).or_insert(ExpiryOutcome::NotFound);
    }
    Ok(outcomes)
}

/// The orders among `ids` that an earlier, failed attempt of this timeout
/// applied after all: a commit whose answer was lost (the connection cut
/// right after it) leaves the transition committed with its audit row, of
/// `kind`'s event and `cause`, stamped with that attempt's clock reading,
/// one of `attempts`. The retry finds such an order no longer applicable;
/// this says it was applied, by whom the database records, so that what is
/// counted is what the database holds. Each with the attempt's time and the
/// deadline.
pub async fn applied_earlier(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    ids: &[OrderId],
    attempts: &[Millis],
    cause: Cause,
) -> Result<HashMap<OrderId, (Millis, Millis)>, DbErr> {
    let mut found = HashMap::new();
    if attempts.is_empty() {
        return Ok(found);
    }
    let event = kind.edge().event;
    for chunk in ids.chunks(LIST_CHUNK) {
        let at: HashMap<i64, i64> = order_events::Entity::find()
            .filter(order_events::Column::OrderId.is_in(chunk.iter().map(|id| id.get())))
            .filter(order_events::Column::Event.eq(event))
            .filter(order_events::Column::Cause.eq(cause.as_str()))
            .filter(order_events::Column::AtMs.is_in(attempts.iter().map(|m| m.0)))
            .all(db)
            .await?
            .into_iter()
            .map(|row| (row.order_id, row.at_ms))
            .collect();
        if at.is_empty() {
            continue;
        }
        let applied = orders::Entity::find()
            .filter(orders::Column::Id.is_in(at.keys().copied()))
            .all(db)
            .await?;
        for order in applied {
            if let (Some(deadline), Some(at)) = (deadline_of(kind, &order), at.get(&order.id)) {
                found.insert(OrderId::new(order.id), (Millis(*at), deadline));
            }
        }
    }
    Ok(found)
}

/// Whether the database accepts a transition of `kind` at all: the same
/// statements as [`expire`], for an id no order has. When a batch fails and
/// this succeeds, the batch itself is the problem (one order a trigger or a
/// constraint refuses); when this fails too, the database is (away, a table
/// renamed, a migration half done), and nothing is to be given up.
pub async fn probe(db: &DatabaseConnection, kind: TimeoutKind) -> Result<(), DbErr> {
    expire(
        db,
        kind,
        &[OrderId::new(0)],
        Millis::now(),
        Cause::Timeout,
        // No order has id 0: no audit row names an instance.
        "",
    )
    .await
    .map(|_| ())
}

/// Whether a flag-only timeout has not flagged the order yet (always, for
/// one that moves it).
pub(super) fn not_flagged(kind: TimeoutKind, order: &orders::Model) -> bool {
    let e = kind.edge();
    !e.flag_only || matches!(order.get(column(e.stamps)), sea_orm::Value::BigInt(None))
}

/// The sweeper's and the gauges' condition on top of the status: a
/// flag-only timeout leaves the orders it flagged alone.
pub(super) fn unflagged<Q: QueryFilter>(kind: TimeoutKind, query: Q) -> Q {
    let e = kind.edge();
    if e.flag_only {
        query.filter(column(e.stamps).is_null())
    } else {
        query
    }
}

/// The conditional update of a timeout, its side effects (its edge's stock
/// move) and its audit rows, which say how late it was and, when known,
/// the `instance` that applied it. Returns the ids it changed with their
/// deadlines.
pub(super) async fn apply_expiry(
    txn: &DatabaseTransaction,
    kind: TimeoutKind,
    ids: &[OrderId],
    now: Millis,
    cause: Cause,
    instance: Option<&str>,
) -> Result<Vec<(OrderId, Millis)>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let (update, event, to) = expiry_update(kind, now);
    // Ascending and without repeats: every batch locks its orders in one order.
    let unique: Vec<i64> = ids
        .iter()
        .map(|i| i.get())
        .collect::<BTreeSet<i64>>()
        .into_iter()
        .collect();
    let mut applied = Vec::new();
    for chunk in unique.chunks(LIST_CHUNK) {
        lock_orders(txn, chunk).await?;
        applied.extend(apply_chunk(txn, &update, kind, chunk).await?);
    }
    let changed: Vec<OrderId> = applied.iter().map(|(id, _)| *id).collect();
    let from = Some(kind.acts_on());
    // A cancel's lines are read once, for its events and its stock release;
    // the stock rows, which every concurrent batch also wants, are locked
    // last, so that they are held for the shortest time.
    let deadlines: HashMap<OrderId, Millis> = applied.iter().copied().collect();
    let stamp = Applied {
        deadlines: &deadlines,
        instance,
    };
    let lines = record(
        txn,
        &changed,
        event,
        from,
        to,
        cause,
        now,
        None,
        Some(stamp),
    )
    .await?;
    move_edge_stock(txn, &kind.edge(), &changed, &lines, now).await?;
    Ok(applied)
}

/// The conditional update of a timeout of `kind` (its edge of the diagram,
/// deadline passed), with its audit event and the status it leads to.
fn expiry_update(
    kind: TimeoutKind,
    now: Millis,
) -> (UpdateMany<orders::Entity>, &'static str, OrderStatus) {
    let edge = kind.edge();
    let update = edge_update(&edge, now).filter(deadline_column(kind).lte(now.0));
    (update, edge.event, edge.to)
}

/// Runs the update on one chunk of ids (locked, ascending); returns the ids it
/// changed with their deadlines.
async fn apply_chunk(
    txn: &DatabaseTransaction,
    update: &UpdateMany<orders::Entity>,
    kind: TimeoutKind,
    chunk: &[i64],
) -> Result<Vec<(OrderId, Millis)>, DbErr> {
    let mut applied = Vec::new();
    if txn.support_returning() {
        let changed = update
            .clone()
            .filter(orders::Column::Id.is_in(chunk.iter().copied()))
            .exec_with_returning(txn)
            .await?;
        for order in changed {
            if let Some(d) = deadline_of(kind, &order) {
                applied.push((OrderId::new(order.id), d));
            }
        }
        return Ok(applied);
    }
    // MariaDB/MySQL have no UPDATE … RETURNING: one conditional update per id,
    // in id order, each still deciding by its own row count.
    for &id in chunk {
        let result = update
            .clone()
            .filter(orders::Column::Id.eq(id))
            .exec(txn)
            .await?;
        if result.rows_affected == 1
            && let Some(order) = orders::Entity::find_by_id(id).one(txn).await?
            && let Some(d) = deadline_of(kind, &order)
        {
            applied.push((OrderId::new(id), d));
        }
    }
    Ok(applied)
}

/// Orders in the status `kind` acts on whose deadline is before `before`, with
/// their deadlines, oldest deadline first (for the sweeper); `after` continues
/// from the last `(id, deadline)` of the previous page.
pub async fn overdue(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    before: Millis,
    after: Option<(OrderId, Millis)>,
    limit: u64,
) -> Result<Vec<(OrderId, Millis)>, DbErr> {
    let deadline = deadline_column(kind);
    let mut query = orders::Entity::find()
        .select_only()
        .column(orders::Column::Id)
        .column(deadline)
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()))
        .filter(deadline.lt(before.0));
    query = unflagged(kind, query);
    if let Some((id, at)) = after {
        query = query.filter(
            Condition::any().add(deadline.gt(at.0)).add(
                Condition::all()
                    .add(deadline.eq(at.0))
                    .add(orders::Column::Id.gt(id.get())),
            ),
        );
    }
    let rows: Vec<(i64, i64)> = query
        .order_by_asc(deadline)
        .order_by_asc(orders::Column::Id)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, at)| (OrderId::new(id), Millis(at)))
        .collect())
}

/// The earliest deadline of `kind` at or after `now`, of an order in the
/// status the timeout acts on: when the catch-up should next look. One read
/// of the first entry of the (status, deadline) index from `now` on; orders
/// already overdue are not its concern (the catch-up that asks has just
/// applied them or passed them over).
pub async fn next_deadline(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    now: Millis,
) -> Result<Option<Millis>, DbErr> {
    let deadline = deadline_column(kind);
    let mut query = orders::Entity::find()
        .select_only()
        .column(deadline)
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()))
        .filter(deadline.gte(now.0));
    query = unflagged(kind, query);
    let first: Option<i64> = query
        .order_by_asc(deadline)
        .limit(1)
        .into_tuple()
        .one(db)
        .await?;
    Ok(first.map(Millis))
}

/// The orders waiting for a timeout of one kind, for the on-call gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Orders the timeout would act on once due: in the status it acts on
    /// (and, for fulfillment, not flagged yet).
    pub pending: u64,
    /// Of those, the ones past their deadline by more than the threshold asked for.
    pub overdue: u64,
    /// How long ago the oldest overdue one's deadline passed (zero when none is).
    pub oldest_overdue: Duration,
}

/// The backlog of `kind` at `now`, overdue meaning past the deadline by more
/// than `overdue_after`: one aggregate over the sweeper's condition, which the
/// index on (status, deadline) answers.
pub async fn backlog(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    now: Millis,
    overdue_after: Duration,
) -> Result<Backlog, DbErr> {
    let deadline = deadline_column(kind);
    let before = now.minus(overdue_after);
    // No ELSE: COUNT skips the NULL of every order not overdue, and COUNT
    // is a BIGINT on every backend (a SUM is a NUMERIC on PostgreSQL).
    let overdue: Expr = CaseStatement::new().case(deadline.lt(before.0), 1).into();
    // COUNT(*) and the deadline only: an index-only scan of that index.
    let mut query = orders::Entity::find()
        .select_only()
        .expr(Expr::col(Asterisk).count())
        .expr(overdue.count())
        .expr(Expr::col(deadline).min())
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()));
    query = unflagged(kind, query);
    let (pending, overdue, oldest): (i64, i64, Option<i64>) = query
        .into_tuple()
        .one(db)
        .await?
        .ok_or_else(|| DbErr::Custom("an aggregate query returned no row".into()))?;
    let overdue = u64::try_from(overdue).unwrap_or(0);
    Ok(Backlog {
        pending: u64::try_from(pending).unwrap_or(0),
        overdue,
        // The oldest deadline of all is the oldest overdue one, if any is.
        oldest_overdue: match oldest {
            Some(at) if overdue > 0 => now.since(Millis(at)),
            _ => Duration::ZERO,
        },
    })
}

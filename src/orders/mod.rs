//! The orders the timeouts act on: the service's own (`orders.source =
//! owned`, the default: [`owned`], over `db::store`, filled by the checkout
//! API), or a shop's existing table described by `mapping.*` ([`mapped`]).
//! Each is an [`OrderStore`]; the consumers, the sweeper and the gauges go
//! through [`Orders`], which holds the one in use. The state-checked rule is
//! the same either way, and an order is named by its [`OrderKey`] from the
//! delivery to the statement and back.
//!
//! Each store also tells one order's [`Story`] (for `GET /admin/orders/{id}`),
//! to which [`Orders::story`] adds the state of its domain events.
//!
//! [`Orders`] is also the layer that commits what the outbox relay publishes
//! (a timeout applied, a checkout, a client's action): it raises
//! [`Committed`] after each such commit, and the relay waits on it.

pub mod mapped;
mod owned;
pub mod story;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::Notify;

use crate::db::store::{
    self, Backlog, CheckoutError, Deadline, DueAhead, IdempotencyKey, NewItem, Order,
    TransitionError,
};
use crate::domain::{Action, Millis, OrderId, OrderKey, TimeoutKind};
pub use crate::domain::{Cause, ExpiryOutcome};
use crate::settings::{OrdersSource, Settings, Windows};
pub use mapped::{Mapped, MappingError};
pub use owned::Owned;
pub use story::{EventState, Story, Transition};

/// What failed attempts applied after all ([`OrderStore::applied_earlier`]):
/// each order with the attempt's clock reading and its outcome.
pub type AppliedEarlier = HashMap<OrderKey, (Millis, ExpiryOutcome)>;

/// A store of orders the timeouts act on. Every method takes keys the store
/// [`accept`](OrderStore::accept)ed and answers by the same keys.
pub trait OrderStore: std::fmt::Debug + Send + Sync {
    /// Whether timeouts of `kind` act on anything.
    fn maps(&self, kind: TimeoutKind) -> bool;

    /// An id from the wire in its canonical spelling, or why these orders
    /// cannot have it.
    fn accept(&self, key: &OrderKey) -> Result<OrderKey, String>;

    /// Applies the timeout of `kind` to each order whose deadline has passed,
    /// in one transaction; says for every key what it found. Each audit row
    /// says how late (`now` minus the deadline, both by the database's
    /// clock) and names `instance` as the one that applied it.
    fn expire<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        keys: &'a [OrderKey],
        now: Millis,
        cause: Cause,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<OrderKey, ExpiryOutcome>, DbErr>>;

    /// The orders among `keys` that an earlier, failed attempt of this
    /// timeout (its clock readings: `attempts`) applied after all, its
    /// commit's answer lost: found by the audit row it wrote. Each with the
    /// attempt's time and `Applied` with the deadline.
    fn applied_earlier<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        keys: &'a [OrderKey],
        attempts: &'a [Millis],
        cause: Cause,
    ) -> BoxFuture<'a, Result<AppliedEarlier, DbErr>>;

    /// Whether the database accepts a transition of `kind` at all: the same
    /// statements as [`expire`](OrderStore::expire), for an id no order has.
    /// When a batch fails and this succeeds, the batch itself is the
    /// problem; when this fails too, the database is.
    fn probe<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
    ) -> BoxFuture<'a, Result<(), DbErr>>;

    /// The orders waiting for a timeout of `kind` at `now`, overdue meaning
    /// past the deadline by more than `overdue_after`; `None` when timeouts
    /// of `kind` act on nothing.
    fn backlog<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        overdue_after: Duration,
    ) -> BoxFuture<'a, Result<Option<Backlog>, DbErr>>;

    /// How long from `now` until the earliest deadline of `kind` still
    /// ahead, by the database's clock; `None` when no order waits for one.
    fn until_next<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
    ) -> BoxFuture<'a, Result<Option<Duration>, DbErr>>;

    /// How many orders wait for a timeout of `kind` whose deadline falls
    /// within each of `horizons` (ascending; the last bounds the read) from
    /// `now`, minute by minute, and how many are overdue already: one
    /// aggregate in the database, by its clock. `None` when timeouts of
    /// `kind` act on nothing.
    fn due_ahead<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        horizons: &'a [Duration],
    ) -> BoxFuture<'a, Result<Option<DueAhead>, DbErr>>;

    /// One page of orders overdue by more than `grace`, with their
    /// deadlines; `after` is the previous page's [`OverduePage::next`].
    fn overdue<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        grace: Duration,
        after: Option<&'a Cursor>,
        limit: u64,
    ) -> BoxFuture<'a, Result<OverduePage, DbErr>>;

    /// One order's status, deadlines, recorded transitions and the timeouts
    /// still ahead of it at `now` (the database's clock); `None` when there
    /// is no such order. `key` was [`accept`](OrderStore::accept)ed.
    fn story<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        key: &'a OrderKey,
        now: Millis,
    ) -> BoxFuture<'a, Result<Option<Story>, DbErr>>;
}

/// Raised after a transaction committed rows the outbox relay publishes
/// (domain events, outbox rows): the relay, waiting on it, publishes them at
/// once instead of at its next interval.
#[derive(Debug, Clone, Default)]
pub struct Committed(Arc<Notify>);

impl Committed {
    /// Something was committed. A raise with no one waiting is kept for the
    /// next wait: the relay misses none.
    fn raise(&self) {
        self.0.notify_one();
    }

    /// Waits for the next commit (or returns at once for one raised meanwhile).
    pub async fn wait(&self) {
        self.0.notified().await;
    }
}

/// The orders in use, and the signal of what commits through them.
#[derive(Debug, Clone)]
pub struct Orders {
    /// The store the timeouts act on.
    store: Arc<dyn OrderStore>,
    /// Whether it is the service's own (which serves checkout).
    owned: bool,
    /// Raised after each commit the relay publishes from.
    committed: Committed,
    /// The shop's table, when the orders are mapped.
    mapped: Option<Arc<Mapped>>,
}

impl Orders {
    /// The service's own orders.
    pub fn owned() -> Self {
        Self::of(Arc::new(Owned), true)
    }

    fn of(store: Arc<dyn OrderStore>, owned: bool) -> Self {
        Self {
            store,
            owned,
            committed: Committed::default(),
            mapped: None,
        }
    }

    /// The shop's table, when the orders are mapped.
    pub fn mapped(&self) -> Option<&Arc<Mapped>> {
        self.mapped.as_ref()
    }

    /// The orders the settings name; a mapping is checked against the
    /// database first (read-only).
    pub async fn load(settings: &Settings, db: &DatabaseConnection) -> Result<Self, MappingError> {
        match settings.mapping.source {
            OrdersSource::Owned => Ok(Self::owned()),
            OrdersSource::Mapped => {
                let mapped =
                    Arc::new(Mapped::load(&settings.mapping, &settings.windows, db).await?);
                Ok(Self {
                    mapped: Some(mapped.clone()),
                    ..Self::of(mapped, false)
                })
            }
        }
    }

    /// Whether the service owns the orders (and serves checkout).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The signal raised after each commit the outbox relay publishes from.
    pub fn committed(&self) -> &Committed {
        &self.committed
    }

    /// Whether timeouts of `kind` act on anything.
    pub fn maps(&self, kind: TimeoutKind) -> bool {
        self.store.maps(kind)
    }

    /// An id from the wire in its canonical spelling, or why these orders
    /// cannot have it (the service's own ids are positive integers).
    pub fn accept(&self, key: &OrderKey) -> Result<OrderKey, String> {
        self.store.accept(key)
    }

    /// Applies the timeout of `kind` to each order whose deadline has passed,
    /// in one transaction; says for every key what it found. The keys were
    /// [`accept`](Self::accept)ed. What it applied is committed with its
    /// domain events: [`Committed`] is raised.
    pub async fn expire(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        now: Millis,
        cause: Cause,
        instance: &str,
    ) -> Result<HashMap<OrderKey, ExpiryOutcome>, DbErr> {
        let outcomes = self
            .store
            .expire(db, kind, keys, now, cause, instance)
            .await?;
        if outcomes
            .values()
            .any(|o| matches!(o, ExpiryOutcome::Applied { .. }))
        {
            self.committed.raise();
        }
        Ok(outcomes)
    }

    /// See [`OrderStore::applied_earlier`].
    pub async fn applied_earlier(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        attempts: &[Millis],
        cause: Cause,
    ) -> Result<AppliedEarlier, DbErr> {
        if attempts.is_empty() || keys.is_empty() {
            return Ok(HashMap::new());
        }
        self.store
            .applied_earlier(db, kind, keys, attempts, cause)
            .await
    }

    /// See [`OrderStore::probe`].
    pub async fn probe(&self, db: &DatabaseConnection, kind: TimeoutKind) -> Result<(), DbErr> {
        self.store.probe(db, kind).await
    }

    /// See [`OrderStore::backlog`]; the same condition as [`Orders::overdue`].
    pub async fn backlog(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        overdue_after: Duration,
    ) -> Result<Option<Backlog>, DbErr> {
        self.store.backlog(db, kind, now, overdue_after).await
    }

    /// See [`OrderStore::until_next`].
    pub async fn until_next(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
    ) -> Result<Option<Duration>, DbErr> {
        self.store.until_next(db, kind, now).await
    }

    /// See [`OrderStore::due_ahead`].
    pub async fn due_ahead(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        horizons: &[Duration],
    ) -> Result<Option<DueAhead>, DbErr> {
        self.store.due_ahead(db, kind, now, horizons).await
    }

    /// See [`OrderStore::overdue`].
    pub async fn overdue(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        grace: Duration,
        after: Option<&Cursor>,
        limit: u64,
    ) -> Result<OverduePage, DbErr> {
        self.store.overdue(db, kind, now, grace, after, limit).await
    }

    /// One order's story at `now` (the database's clock): what its store
    /// records, and where each transition's domain event is. `None` when
    /// there is no such order.
    pub async fn story(
        &self,
        db: &DatabaseConnection,
        key: &OrderKey,
        now: Millis,
    ) -> Result<Option<(Story, Vec<EventState>)>, DbErr> {
        let Some(story) = self.store.story(db, key, now).await? else {
            return Ok(None);
        };
        let events = story::event_states(db, &story.key, &story.transitions).await?;
        Ok(Some((story, events)))
    }

    /// A checkout in the service's own tables ([`store::checkout`]); the
    /// order, its outbox row and its `created` event committed, [`Committed`]
    /// is raised.
    pub async fn checkout(
        &self,
        db: &DatabaseConnection,
        items: &[NewItem],
        window: Duration,
        now: Millis,
        key: Option<&IdempotencyKey>,
    ) -> Result<Order, CheckoutError> {
        let order = store::checkout(db, items, window, now, key).await?;
        self.committed.raise();
        Ok(order)
    }

    /// A client's action on one of the service's own orders
    /// ([`store::act_during`]). Every action writes its domain event (pay
    /// and ship an outbox row too), and a refused payment that is the
    /// order's late payment writes its own: [`Committed`] is raised for each.
    pub async fn act(
        &self,
        db: &DatabaseConnection,
        id: OrderId,
        action: Action,
        windows: &Windows,
        now: Millis,
        deadline: Deadline,
    ) -> Result<Order, TransitionError> {
        let acted = store::act_during(db, id, action, windows, now, deadline).await;
        if matches!(
            acted,
            Ok(_)
                | Err(TransitionError::Conflict {
                    late_payment: true,
                    ..
                })
        ) {
            self.committed.raise();
        }
        acted
    }
}

impl OrderStore for Mapped {
    fn maps(&self, kind: TimeoutKind) -> bool {
        Mapped::maps(self, kind)
    }

    fn accept(&self, key: &OrderKey) -> Result<OrderKey, String> {
        Mapped::accept(self, key)
    }

    fn expire<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        keys: &'a [OrderKey],
        now: Millis,
        cause: Cause,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<OrderKey, ExpiryOutcome>, DbErr>> {
        Box::pin(Mapped::expire(self, db, kind, keys, now, cause, instance))
    }

    fn applied_earlier<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        keys: &'a [OrderKey],
        attempts: &'a [Millis],
        cause: Cause,
    ) -> BoxFuture<'a, Result<AppliedEarlier, DbErr>> {
        Box::pin(Mapped::applied_earlier(
            self, db, kind, keys, attempts, cause,
        ))
    }

    fn probe<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
    ) -> BoxFuture<'a, Result<(), DbErr>> {
        Box::pin(Mapped::probe(self, db, kind))
    }

    fn backlog<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        _now: Millis,
        overdue_after: Duration,
    ) -> BoxFuture<'a, Result<Option<Backlog>, DbErr>> {
        // The shop's table is judged by the database's own clock.
        Box::pin(Mapped::backlog(self, db, kind, overdue_after))
    }

    fn until_next<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        _now: Millis,
    ) -> BoxFuture<'a, Result<Option<Duration>, DbErr>> {
        // Reckoned by the database's clock in the shop's zone, as the backlog.
        Box::pin(Mapped::until_next(self, db, kind))
    }

    fn due_ahead<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        _now: Millis,
        horizons: &'a [Duration],
    ) -> BoxFuture<'a, Result<Option<DueAhead>, DbErr>> {
        // Reckoned by the database's clock in the shop's zone, as the backlog.
        Box::pin(Mapped::due_ahead(self, db, kind, horizons))
    }

    fn overdue<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        grace: Duration,
        after: Option<&'a Cursor>,
        limit: u64,
    ) -> BoxFuture<'a, Result<OverduePage, DbErr>> {
        Box::pin(Mapped::overdue(
            self,
            db,
            kind,
            now,
            grace,
            after.map(|c| c.raw.as_str()),
            limit,
        ))
    }

    fn story<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        key: &'a OrderKey,
        now: Millis,
    ) -> BoxFuture<'a, Result<Option<Story>, DbErr>> {
        Box::pin(Mapped::story(self, db, key, now))
    }
}

/// Where a page of overdue orders ended: the last row read, readable or not,
/// so that the next page continues after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The id as the database spells it (it may be no [`OrderKey`]).
    raw: String,
    /// Its deadline (the owned mode pages by deadline, then id).
    deadline: Millis,
}

impl Cursor {
    /// After the row with this id, as the database spelled it, and deadline.
    pub(crate) fn new(raw: String, deadline: Millis) -> Self {
        Self { raw, deadline }
    }
}

/// One page of overdue orders.
#[derive(Debug, Default)]
pub struct OverduePage {
    /// The orders, with their deadlines.
    pub orders: Vec<(OrderKey, Millis)>,
    /// Where the next page starts; `None` when no row was read.
    pub next: Option<Cursor>,
    /// Whether the page read as many rows as asked: more may follow. Judged
    /// by the rows read, not the orders kept, so that unreadable ids do not
    /// end a sweep early.
    pub full: bool,
    /// The rows read whose id is no order key: passed over.
    pub unreadable: Unreadable,
}

/// Rows whose id the service cannot read, by reason ([`OrderKey::fault`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// How many, by reason.
    pub counts: BTreeMap<&'static str, u64>,
    /// The first one met, escaped and truncated, for the log.
    pub sample: Option<String>,
}

impl Unreadable {
    /// Counts one row whose id `raw` is unreadable for `reason`.
    pub fn add(&mut self, reason: &'static str, raw: &str) {
        *self.counts.entry(reason).or_default() += 1;
        if self.sample.is_none() {
            // Escaped before truncating: no control character reaches the log.
            let escaped = raw.escape_debug().to_string();
            self.sample = Some(crate::domain::truncate(&escaped, 64));
        }
    }

    /// Adds another page's.
    pub fn merge(&mut self, other: Unreadable) {
        for (reason, n) in other.counts {
            *self.counts.entry(reason).or_default() += n;
        }
        if self.sample.is_none() {
            self.sample = other.sample;
        }
    }

    /// How many rows in all.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

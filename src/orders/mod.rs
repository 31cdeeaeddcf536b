//! The orders the timeouts act on: the service's own (`orders.source =
//! owned`, the default: `db::store`, filled by the checkout API), or a shop's
//! existing table described by `mapping.*` (`mapped`). The consumers, the
//! sweeper and `doctor` go through [`Orders`]; the state-checked rule is the
//! same either way.

pub mod mapped;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};

use crate::db::store::{self, Backlog, Cause, ExpiryOutcome};
use crate::domain::{Millis, OrderId, OrderKey, TimeoutKind};
use crate::settings::{OrdersSource, Settings};
pub use mapped::{Mapped, MappingError};

/// Whose orders.
#[derive(Debug, Clone)]
pub enum Orders {
    /// The service's own tables.
    Owned,
    /// A shop's table, its mapping checked against the database.
    Mapped(Arc<Mapped>),
}

impl Orders {
    /// The orders the settings name; a mapping is checked against the
    /// database first (read-only).
    pub async fn load(settings: &Settings, db: &DatabaseConnection) -> Result<Self, MappingError> {
        match settings.mapping.source {
            OrdersSource::Owned => Ok(Self::Owned),
            OrdersSource::Mapped => {
                let mapped = Mapped::load(&settings.mapping, &settings.windows, db).await?;
                Ok(Self::Mapped(Arc::new(mapped)))
            }
        }
    }

    /// Whether the service owns the orders (and serves checkout).
    pub fn is_owned(&self) -> bool {
        matches!(self, Self::Owned)
    }

    /// Whether timeouts of `kind` act on anything.
    pub fn maps(&self, kind: TimeoutKind) -> bool {
        match self {
            Self::Owned => true,
            Self::Mapped(m) => m.maps(kind),
        }
    }

    /// An id from the wire in its canonical spelling, or why these orders
    /// cannot have it (the service's own ids are positive integers).
    pub fn accept(&self, key: &OrderKey) -> Result<OrderKey, String> {
        match self {
            Self::Owned => key
                .as_str()
                .parse::<OrderId>()
                .map(OrderKey::from)
                .map_err(|e| format!("{e}: the service owns the orders (`orders.source = owned`)")),
            Self::Mapped(m) => m.accept(key),
        }
    }

    /// Applies the timeout of `kind` to each order whose deadline has passed,
    /// in one transaction; says for every key what it found. The keys were
    /// [`accept`](Self::accept)ed.
    pub async fn expire(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        now: Millis,
        cause: Cause,
    ) -> Result<HashMap<OrderKey, ExpiryOutcome>, DbErr> {
        match self {
            Self::Owned => {
                let ids = owned_ids(keys);
                let outcomes = store::expire(db, kind, &ids, now, cause).await?;
                Ok(outcomes
                    .into_iter()
                    .map(|(id, outcome)| (OrderKey::from(id), outcome))
                    .collect())
            }
            Self::Mapped(m) => m.expire(db, kind, keys, now, cause).await,
        }
    }

    /// The orders among `keys` that an earlier, failed attempt of this
    /// timeout (its clock readings: `attempts`) applied after all, its
    /// commit's answer lost; each with the attempt's time and `Applied` with
    /// the deadline (see [`store::applied_earlier`]).
    pub async fn applied_earlier(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: &[OrderKey],
        attempts: &[Millis],
        cause: Cause,
    ) -> Result<HashMap<OrderKey, (Millis, ExpiryOutcome)>, DbErr> {
        match self {
            Self::Owned => {
                let ids = owned_ids(keys);
                let found = store::applied_earlier(db, kind, &ids, attempts, cause).await?;
                Ok(found
                    .into_iter()
                    .map(|(id, (at, deadline))| {
                        (
                            OrderKey::from(id),
                            (at, ExpiryOutcome::Applied { deadline }),
                        )
                    })
                    .collect())
            }
            Self::Mapped(m) => m.applied_earlier(db, kind, keys, attempts, cause).await,
        }
    }

    /// After failed attempts of a batch (`failed`: their clock readings), the
    /// orders among the retry's `outcomes` found no longer applicable that
    /// one of those attempts applied after all, its commit's answer lost
    /// ([`Orders::applied_earlier`]): what is counted is then what the
    /// database holds. A database error here leaves them as they were.
    pub async fn recovered(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        outcomes: &HashMap<OrderKey, ExpiryOutcome>,
        failed: &[Millis],
        cause: Cause,
    ) -> HashMap<OrderKey, (Millis, ExpiryOutcome)> {
        // Every batch passes here: nothing to look at unless an attempt failed.
        if failed.is_empty() {
            return HashMap::new();
        }
        let moved: Vec<OrderKey> = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, ExpiryOutcome::Inapplicable { .. }))
            .map(|(key, _)| key.clone())
            .collect();
        if moved.is_empty() {
            return HashMap::new();
        }
        self.applied_earlier(db, kind, &moved, failed, cause)
            .await
            .unwrap_or_default()
    }

    /// After one failed attempt at `attempt` (the database answering again):
    /// what it applied after all among `keys`, its commit's answer lost, by
    /// its audit rows; `Applied` with the deadline each. And the keys it did
    /// not apply, still to decide. A database error here finds nothing.
    pub async fn applied_by(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        keys: Vec<OrderKey>,
        attempt: Millis,
        cause: Cause,
    ) -> (HashMap<OrderKey, ExpiryOutcome>, Vec<OrderKey>) {
        let applied: HashMap<OrderKey, ExpiryOutcome> = self
            .applied_earlier(db, kind, &keys, &[attempt], cause)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|(key, (_, outcome))| (key, outcome))
            .collect();
        let rest = keys
            .into_iter()
            .filter(|key| !applied.contains_key(key))
            .collect();
        (applied, rest)
    }

    /// Whether the database accepts a transition of `kind` at all (see
    /// [`store::probe`]).
    pub async fn probe(&self, db: &DatabaseConnection, kind: TimeoutKind) -> Result<(), DbErr> {
        match self {
            Self::Owned => store::probe(db, kind).await,
            Self::Mapped(m) => m.probe(db, kind).await,
        }
    }

    /// The orders waiting for a timeout of `kind` at `now`, overdue meaning
    /// past the deadline by more than `overdue_after`; `None` when timeouts
    /// of `kind` act on nothing. The same condition as [`Orders::overdue`].
    pub async fn backlog(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        overdue_after: Duration,
    ) -> Result<Option<Backlog>, DbErr> {
        match self {
            Self::Owned => store::backlog(db, kind, now, overdue_after).await.map(Some),
            Self::Mapped(m) => m.backlog(db, kind, overdue_after).await,
        }
    }

    /// One page of orders overdue by more than `grace`, with their
    /// deadlines; `after` is the previous page's [`OverduePage::next`].
    pub async fn overdue(
        &self,
        db: &DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        grace: Duration,
        after: Option<&Cursor>,
        limit: u64,
    ) -> Result<OverduePage, DbErr> {
        match self {
            Self::Owned => {
                // The service's own ids are integers: every row is readable.
                let after = after.map(|c| {
                    (
                        c.raw.parse::<OrderId>().unwrap_or(OrderId::new(0)),
                        c.deadline,
                    )
                });
                let page = store::overdue(db, kind, now.minus(grace), after, limit).await?;
                let next = page.last().map(|(id, at)| Cursor::new(id.to_string(), *at));
                Ok(OverduePage {
                    full: page.len() as u64 >= limit,
                    orders: page
                        .into_iter()
                        .map(|(id, at)| (OrderKey::from(id), at))
                        .collect(),
                    next,
                    unreadable: Unreadable::default(),
                })
            }
            Self::Mapped(m) => {
                m.overdue(db, kind, now, grace, after.map(|c| c.raw.as_str()), limit)
                    .await
            }
        }
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

/// Accepted keys of the owned mode are positive integers.
fn owned_ids(keys: &[OrderKey]) -> Vec<OrderId> {
    keys.iter()
        .map(|k| k.as_str().parse::<OrderId>().unwrap_or(OrderId::new(0)))
        .collect()
}

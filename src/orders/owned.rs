//! The service's own orders (`orders.source = owned`): the [`OrderStore`]
//! over `db::store`, whose ids are positive integers. A key is read as its id
//! once, at the statement, and every answer comes back by the key it was
//! asked with.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbErr};

use super::{AppliedEarlier, Cursor, OrderStore, OverduePage, Story, Transition, Unreadable};
use crate::db::store::{self, Backlog, DueAhead};
use crate::domain::{Cause, ExpiryOutcome, Millis, OrderId, OrderKey, TimeoutKind};

/// The service's own tables.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owned;

/// The ids of `keys`, each with the key it was read from. A key that is no
/// id (none was [`accept`](OrderStore::accept)ed) names no order: it is in
/// the second list.
fn ids(keys: &[OrderKey]) -> (HashMap<OrderId, &OrderKey>, Vec<&OrderKey>) {
    let mut ids = HashMap::with_capacity(keys.len());
    let mut none = Vec::new();
    for key in keys {
        match key.as_str().parse::<OrderId>() {
            Ok(id) => {
                ids.insert(id, key);
            }
            Err(_) => none.push(key),
        }
    }
    (ids, none)
}

impl OrderStore for Owned {
    fn maps(&self, _kind: TimeoutKind) -> bool {
        true
    }

    fn accept(&self, key: &OrderKey) -> Result<OrderKey, String> {
        key.as_str()
            .parse::<OrderId>()
            .map(OrderKey::from)
            .map_err(|e| format!("{e}: the service owns the orders (`orders.source = owned`)"))
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
        Box::pin(async move {
            let (ids, none) = ids(keys);
            let list: Vec<OrderId> = ids.keys().copied().collect();
            let found = store::expire(db, kind, &list, now, cause, instance).await?;
            let mut outcomes: HashMap<OrderKey, ExpiryOutcome> = found
                .into_iter()
                .filter_map(|(id, outcome)| Some(((*ids.get(&id)?).clone(), outcome)))
                .collect();
            outcomes.extend(
                none.into_iter()
                    .map(|k| (k.clone(), ExpiryOutcome::NotFound)),
            );
            Ok(outcomes)
        })
    }

    fn applied_earlier<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        keys: &'a [OrderKey],
        attempts: &'a [Millis],
        cause: Cause,
    ) -> BoxFuture<'a, Result<AppliedEarlier, DbErr>> {
        Box::pin(async move {
            let (ids, _) = ids(keys);
            let list: Vec<OrderId> = ids.keys().copied().collect();
            let found = store::applied_earlier(db, kind, &list, attempts, cause).await?;
            Ok(found
                .into_iter()
                .filter_map(|(id, (at, deadline))| {
                    let key = (*ids.get(&id)?).clone();
                    Some((key, (at, ExpiryOutcome::Applied { deadline })))
                })
                .collect())
        })
    }

    fn probe<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
    ) -> BoxFuture<'a, Result<(), DbErr>> {
        Box::pin(store::probe(db, kind))
    }

    fn backlog<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        overdue_after: Duration,
    ) -> BoxFuture<'a, Result<Option<Backlog>, DbErr>> {
        Box::pin(async move { store::backlog(db, kind, now, overdue_after).await.map(Some) })
    }

    fn until_next<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
    ) -> BoxFuture<'a, Result<Option<Duration>, DbErr>> {
        Box::pin(async move {
            let next = store::next_deadline(db, kind, now).await?;
            Ok(next.map(|at| at.since(now)))
        })
    }

    fn due_ahead<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        kind: TimeoutKind,
        now: Millis,
        horizons: &'a [Duration],
    ) -> BoxFuture<'a, Result<Option<DueAhead>, DbErr>> {
        Box::pin(async move { store::due_ahead(db, kind, now, horizons).await.map(Some) })
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
        Box::pin(async move {
            // The service's own ids are integers: every row is readable, and
            // every cursor is one of them.
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
        })
    }

    fn story<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        key: &'a OrderKey,
        now: Millis,
    ) -> BoxFuture<'a, Result<Option<Story>, DbErr>> {
        Box::pin(async move {
            let Ok(id) = key.as_str().parse::<OrderId>() else {
                return Ok(None);
            };
            let Some(found) = store::story(db, id, now).await? else {
                return Ok(None);
            };
            let transitions = found
                .trail
                .into_iter()
                .map(|row| Transition {
                    at: Millis(row.at_ms),
                    kind: Transition::kind_of(&row.event, &row.cause),
                    // A client's request is told by its party, as its event is.
                    cause: if row.cause == Cause::Api.as_str() {
                        Cause::Api.party(&row.event).to_string()
                    } else {
                        row.cause
                    },
                    event: row.event,
                    from: row.from_status,
                    to: row.to_status,
                    late_ms: row.late_ms,
                    instance: row.instance,
                    detail: row.detail,
                })
                .collect();
            Ok(Some(Story {
                key: OrderKey::from(id),
                status: found.status.as_str().to_string(),
                status_raw: None,
                deadlines: found.deadlines,
                transitions,
                waiting: found.waiting,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_read_as_its_id_once_and_answered_by_itself() {
        let keys: Vec<OrderKey> = ["7", "12", "not-an-id"]
            .iter()
            .map(|k| OrderKey::parse(k).unwrap())
            .collect();
        let (ids, none) = ids(&keys);
        assert_eq!(ids[&OrderId::new(7)], &keys[0]);
        assert_eq!(ids[&OrderId::new(12)], &keys[1]);
        // No id 0 stands in for it: it names no order.
        assert_eq!(none, vec![&keys[2]]);
        assert!(!ids.contains_key(&OrderId::new(0)));
    }

    #[test]
    fn only_positive_integers_are_accepted_in_their_canonical_spelling() {
        let key = |k: &str| OrderKey::parse(k).unwrap();
        assert_eq!(Owned.accept(&key("42")), Ok(key("42")));
        assert!(Owned.accept(&key("abc")).is_err());
    }
}

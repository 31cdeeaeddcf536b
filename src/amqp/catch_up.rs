//! A delivery wakes the consumer; the database decides. A timeout that comes
//! due says that deadlines are passing: after its batch, the consumer of that
//! kind applies every order of the kind already due (the sweeper's statement,
//! with no grace, in bounded pages), not only the ones its deliveries name;
//! and while a catch-up finds orders to apply, the next follows [`EVERY`]
//! later without waiting for a delivery, until one finds none. A
//! due burst is then cancelled at the database's speed while its messages are
//! still leaving the broker; those messages, when they come, find their orders
//! in a bounded memory of what the catch-up applied and are acked without a
//! database round trip (anything else still goes to the database). While
//! catch-ups are finding orders, a batch of deliveries first waits for the
//! next one (at most [`EVERY`]), so that the two do not race for the same
//! rows. A round reads up to [`MAX_PAGES`] pages through the status and
//! deadline index and applies [`SIDE_BY_SIDE`] of them at once, each in its
//! own transaction.
//!
//! The transitions are the same conditional ones, with the cause `timeout`;
//! the log says `by="catch_up"`, `catch_ups_total{kind}` counts them, and the
//! lateness histogram and `timeouts_handled_total{outcome="applied"}` count
//! them like the sweeper's (their own messages then count `not_applicable`).
//! Nothing acts early: only orders whose deadline has passed by the clock the
//! transitions use are taken.
//!
//! The catch-up belongs to its kind's consumer, and a pause of that consumer
//! stops it too: a round does not start while the kind is paused, reads no
//! further page once it is, and each page's transaction passes the kind's
//! gate ([`crate::control::Pauses::enter`]), so none starts after `pause`
//! answered.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures_util::{StreamExt, stream};
use tokio::time::Instant;

use crate::context::Context;
use crate::control::Pausable;
use crate::db::clock;
use crate::db::store::{Cause, ExpiryOutcome};
use crate::domain::{Millis, OrderKey, TimeoutKind};

/// Catch-ups run at most this often while deliveries flow: the lateness a
/// burst's orders can have beyond their own messages' is about this.
const EVERY: Duration = Duration::from_millis(20);

/// At most this many pages per catch-up, so that deliveries are not kept
/// waiting behind a very large backlog (the next batch continues it).
const MAX_PAGES: usize = 4;

/// Orders per page at least (`consumer.batch_size` when larger): a page is
/// one transaction, and a due burst is applied in as few as it takes.
const PAGE_AT_LEAST: u64 = 500;

/// Pages applied at once, each in its own transaction (and connection).
const SIDE_BY_SIDE: usize = 2;

/// How long an order applied by a catch-up is remembered: longer than a
/// message may lag behind its deadline in a loaded broker.
const REMEMBER: Duration = Duration::from_secs(600);

/// At most this many remembered orders (about 100 bytes each).
const REMEMBER_MAX: usize = 200_000;

/// The catch-up of one kind's consumer, and what it applied.
pub(super) struct CatchUp {
    kind: TimeoutKind,
    last: Option<Instant>,
    applied: HashSet<OrderKey>,
    order: VecDeque<(Instant, OrderKey)>,
    /// Whether the last catch-up applied anything: deadlines are passing
    /// now, and the next one need not wait for a delivery.
    found: bool,
    /// Orders the database refused alone (a trigger, a constraint): left to
    /// their own deliveries and the sweeper, so that one of them does not
    /// stop every catch-up.
    refused: HashSet<OrderKey>,
}

impl CatchUp {
    pub(super) fn new(kind: TimeoutKind) -> Self {
        Self {
            kind,
            last: None,
            applied: HashSet::new(),
            order: VecDeque::new(),
            refused: HashSet::new(),
            found: false,
        }
    }

    /// Whether the next catch-up should run on its own, [`EVERY`] after the last.
    pub(super) fn continuing(&self) -> bool {
        self.found
    }

    /// Sleeps until the next catch-up may run.
    pub(super) async fn next_round(&self) {
        if let Some(last) = self.last {
            tokio::time::sleep_until(last + EVERY).await;
        }
    }

    /// Waits for the next catch-up (at most [`EVERY`]), then runs it.
    pub(super) async fn run_next(&mut self, ctx: &Context) -> usize {
        self.next_round().await;
        self.run(ctx).await
    }

    /// Whether a catch-up applied this order (its message changes nothing).
    pub(super) fn applied(&self, key: &OrderKey) -> bool {
        self.applied.contains(key)
    }

    fn remember(&mut self, key: OrderKey, now: Instant) {
        if self.applied.insert(key.clone()) {
            self.order.push_back((now, key));
        }
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < REMEMBER && self.order.len() <= REMEMBER_MAX {
                break;
            }
            if let Some((_, old)) = self.order.pop_front() {
                self.applied.remove(&old);
            }
        }
    }

    /// Applies every order of the kind already due, unless a catch-up ran
    /// less than [`EVERY`] ago. Returns how many it applied. A database error
    /// ends it quietly: the deliveries and the sweeper still cover every
    /// order, and the consumer's own path reports the database's trouble.
    ///
    /// The due orders are read page by page (cheap reads through the status
    /// and deadline index), then [`SIDE_BY_SIDE`] pages are applied at once,
    /// each in its own transaction: one page's commit no longer waits for the
    /// other's statements.
    pub(super) async fn run(&mut self, ctx: &Context) -> usize {
        let started = Instant::now();
        if self
            .last
            .is_some_and(|last| started.duration_since(last) < EVERY)
        {
            return 0;
        }
        if ctx.pauses.kind_paused(self.kind) {
            // No round follows on its own until a resumed consumer asks.
            self.found = false;
            return 0;
        }
        self.last = Some(started);
        let limit = (ctx.live().consumer.batch_size as u64).max(PAGE_AT_LEAST);
        // One reading of the database's clock for the round: every page is
        // judged by it, and a failed page's audit rows are looked up by it.
        let Ok(now) = clock::now(&ctx.db).await else {
            return 0;
        };
        let mut pages = Vec::new();
        let mut after = None;
        // Paused meanwhile: the pages read so far are refused by the gate.
        while pages.len() < MAX_PAGES && !ctx.pauses.kind_paused(self.kind) {
            let page = match ctx
                .orders
                .overdue(
                    &ctx.db,
                    self.kind,
                    now,
                    Duration::ZERO,
                    after.as_ref(),
                    limit,
                )
                .await
            {
                Ok(page) if !page.is_empty() => page,
                _ => break,
            };
            let full = page.len() as u64 >= limit;
            after = page.last().cloned();
            let keys: Vec<OrderKey> = page
                .into_iter()
                .map(|(key, _)| key)
                .filter(|key| !self.refused.contains(key))
                .collect();
            pages.push(keys);
            if !full {
                break;
            }
        }
        let kind = self.kind;
        let results: Vec<Page> = stream::iter(pages)
            .map(|keys| apply(ctx, kind, keys, now))
            .buffer_unordered(SIDE_BY_SIDE)
            .collect()
            .await;
        let done = Instant::now();
        let mut caught = 0;
        for page in results {
            for (key, lateness) in page.applied {
                ctx.events.caught_up(self.kind, &key, lateness);
                self.remember(key, done);
                caught += 1;
            }
            for key in page.refused {
                if self.refused.len() < REMEMBER_MAX {
                    self.refused.insert(key);
                }
            }
        }
        if caught > 0 {
            // Committed with their domain events: let the relay publish them.
            ctx.relay_wakeup.notify_one();
        }
        self.found = caught > 0;
        caught
    }
}

/// What applying one page did: the orders it applied, with their lateness,
/// and those the database refused alone.
#[derive(Default)]
struct Page {
    applied: Vec<(OrderKey, i64)>,
    refused: Vec<OrderKey>,
}

/// Applies a page; a page the database refuses is halved down to the orders
/// it refuses alone, which later catch-ups pass over.
async fn apply(ctx: &Context, kind: TimeoutKind, keys: Vec<OrderKey>, now: Millis) -> Page {
    let mut page = Page::default();
    let mut parts = vec![keys];
    while let Some(part) = parts.pop() {
        if part.is_empty() {
            continue;
        }
        // Held until the page's transaction ends; paused: the page and what
        // is left of it wait for the resume (their deliveries, the sweeper).
        let Some(_pass) = ctx.pauses.enter(&[Pausable::Consumer(kind)]).await else {
            break;
        };
        let outcomes = match ctx
            .orders
            .expire(&ctx.db, kind, &part, now, Cause::Timeout)
            .await
        {
            Ok(outcomes) => outcomes,
            // The database is away: the consumer's own path pauses.
            Err(_) if ctx.orders.probe(&ctx.db, kind).await.is_err() => break,
            Err(_) => {
                // The attempt may have committed with its answer lost: what
                // its audit rows say it applied counts, and is not tried again.
                let (earlier, rest) = ctx
                    .orders
                    .applied_by(&ctx.db, kind, part, now, Cause::Timeout)
                    .await;
                if !earlier.is_empty() {
                    ctx.events.commit_answer_lost(kind, earlier.len());
                }
                if rest.len() > 1 {
                    let (left, right) = rest.split_at(rest.len() / 2);
                    parts.push(right.to_vec());
                    parts.push(left.to_vec());
                } else if let Some(key) = rest.first() {
                    page.refused.push(key.clone());
                }
                earlier
            }
        };
        for (key, outcome) in outcomes {
            if let ExpiryOutcome::Applied { deadline } = outcome {
                page.applied.push((key, now.signed_since(deadline)));
            }
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_bounded_recent_past() {
        let mut c = CatchUp::new(TimeoutKind::Payment);
        let t0 = Instant::now();
        let key = |n: u32| OrderKey::parse(&n.to_string()).unwrap();
        c.remember(key(1), t0);
        c.remember(key(1), t0);
        assert!(c.applied(&key(1)) && c.order.len() == 1);
        c.remember(key(2), t0 + REMEMBER + Duration::from_secs(1));
        assert!(!c.applied(&key(1)), "forgotten once old");
        assert!(c.applied(&key(2)));
    }
}

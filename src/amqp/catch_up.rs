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
//! own transaction. An order the database refuses alone is passed over for
//! [`REFUSED_FOR`], then tried again (its refusal may have been a deadlock).
//!
//! The transitions are the same conditional ones, with the cause `timeout`;
//! the log says `by="catch_up"`, `catch_ups_total{kind}` counts them, and the
//! lateness histogram and `timeouts_handled_total{outcome="applied"}` count
//! them like the sweeper's (their own messages then count `not_applicable`).
//! Nothing acts early: only orders whose deadline has passed by the clock the
//! transitions use are taken.
//!
//! A round that finds nothing reads when the kind's next deadline passes
//! (one read of the status and deadline index; `consumer.wake_at_deadline`),
//! and the next round runs then, without waiting for a delivery: the
//! database work of a due burst starts at its first deadline, while its
//! messages may still be leaving a loaded broker. The wait is reckoned from
//! the database's clock reading and ends a millisecond after the deadline,
//! never before it; a deadline written meanwhile by another instance is seen
//! at the latest [`REFRESH`] later (its own message wakes the consumer
//! anyway).
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

use crate::apply::{Decided, OnRefusal, apply};
use crate::context::Context;
use crate::db::clock;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::orders::Cause;

/// Catch-ups run at most this often while deliveries flow: the lateness a
/// burst's orders can have beyond their own messages' is about this.
pub(crate) const EVERY: Duration = Duration::from_millis(20);

/// At most this many pages per catch-up, so that deliveries are not kept
/// waiting behind a very large backlog (the next batch continues it).
pub(crate) const MAX_PAGES: usize = 4;

/// Orders per page at least (`consumer.batch_size` when larger): a page is
/// one transaction, and a due burst is applied in as few as it takes.
const PAGE_AT_LEAST: u64 = 500;

/// Orders per page of a catch-up with `consumer.batch_size` = `batch_size`.
pub(crate) fn page_size(batch_size: usize) -> u64 {
    (batch_size as u64).max(PAGE_AT_LEAST)
}

/// Most orders one catch-up round applies: what `doctor`'s dry run of the
/// first start reckons a due backlog in.
pub(crate) fn round_size(batch_size: usize) -> u64 {
    MAX_PAGES as u64 * page_size(batch_size)
}

/// Pages applied at once, each in its own transaction (and connection).
const SIDE_BY_SIDE: usize = 2;

/// How long an order applied by a catch-up is remembered: longer than a
/// message may lag behind its deadline in a loaded broker.
const REMEMBER: Duration = Duration::from_secs(600);

/// At most this many remembered orders (about 100 bytes each), in each memory.
const REMEMBER_MAX: usize = 200_000;

/// With nothing due and no deadline known ahead, or one further off than
/// this, the next deadline is read again this often: an order placed
/// meanwhile with a shorter window is seen within it.
const REFRESH: Duration = Duration::from_secs(5);

/// How long an order the database refused alone is passed over: a refusal is
/// often transient (a deadlock, a lock timeout), and the order must come back
/// to later catch-ups; one that is refused for good costs a few halvings of a
/// page this often, no more.
const REFUSED_FOR: Duration = Duration::from_secs(30);

/// Orders remembered for a while: at most [`REMEMBER_MAX`], each forgotten
/// `window` after it was remembered, oldest first.
struct Recent {
    window: Duration,
    keys: HashSet<OrderKey>,
    order: VecDeque<(Instant, OrderKey)>,
}

impl Recent {
    fn new(window: Duration) -> Self {
        Self {
            window,
            keys: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `key` is remembered (as of the last insert or
    /// [`Recent::forget_old`]).
    fn contains(&self, key: &OrderKey) -> bool {
        self.keys.contains(key)
    }

    /// Remembers `key` from `now` (an order remembered already keeps its
    /// first time), and forgets what is too old or too many.
    fn insert(&mut self, key: OrderKey, now: Instant) {
        if self.keys.insert(key.clone()) {
            self.order.push_back((now, key));
        }
        self.forget_old(now);
    }

    /// Forgets every order remembered a window or more before `now`, and
    /// the oldest beyond [`REMEMBER_MAX`].
    fn forget_old(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < self.window && self.order.len() <= REMEMBER_MAX {
                break;
            }
            if let Some((_, old)) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }
}

/// The catch-up of one kind's consumer, and what it applied.
pub(super) struct CatchUp {
    kind: TimeoutKind,
    last: Option<Instant>,
    /// Orders a catch-up applied, for [`REMEMBER`]: their messages change
    /// nothing.
    applied: Recent,
    /// Whether the last catch-up applied anything: deadlines are passing
    /// now, and the next one need not wait for a delivery.
    found: bool,
    /// Orders the database refused alone (a trigger, a constraint, a
    /// deadlock), for [`REFUSED_FOR`]: meanwhile left to their own deliveries
    /// and the sweeper, so that one of them does not stop every catch-up.
    refused: Recent,
    /// Whether rounds also run at the kind's deadlines, not only after
    /// deliveries (`consumer.catch_up` and `consumer.wake_at_deadline`).
    wakes: bool,
    /// When the next deadline the last round read passes (just after it, by
    /// this host's monotonic clock), or when to read it again.
    wake_at: Option<Instant>,
    /// Whether the last round stopped at [`MAX_PAGES`] full pages and
    /// applied orders: more are due than a round takes.
    behind: bool,
}

impl CatchUp {
    pub(super) fn new(kind: TimeoutKind, wakes: bool) -> Self {
        Self {
            kind,
            last: None,
            applied: Recent::new(REMEMBER),
            refused: Recent::new(REFUSED_FOR),
            found: false,
            wakes,
            wake_at: None,
            behind: false,
        }
    }

    /// Whether more orders are due than a round takes: the consumer then
    /// leaves its deliveries in the broker until the rounds catch up. Their
    /// orders are being applied anyway, and a broker that delivers and takes
    /// acks for them meanwhile takes the CPU the database needs; afterwards
    /// they are acked without a round trip.
    pub(super) fn behind(&self) -> bool {
        self.behind
    }

    /// Whether catch-ups are applying due orders now: the next one follows
    /// [`EVERY`] after the last, and deliveries wait for it.
    pub(super) fn continuing(&self) -> bool {
        self.found
    }

    /// When the next catch-up runs on its own, without a delivery: [`EVERY`]
    /// after the last while they find orders; else, where rounds wake at
    /// deadlines, when the next one passes (at once for the first round);
    /// else never.
    pub(super) fn scheduled(&self) -> Option<Instant> {
        let earliest = self.last.map(|last| last + EVERY);
        if self.found {
            return earliest;
        }
        if !self.wakes {
            return None;
        }
        let wake = self.wake_at.unwrap_or_else(Instant::now);
        Some(earliest.map_or(wake, |earliest| wake.max(earliest)))
    }

    /// Sleeps until the next catch-up may run.
    async fn next_round(&self) {
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
        self.applied.insert(key, now);
    }

    /// Passes `key` over in catch-ups for [`REFUSED_FOR`] from `now`.
    fn refuse(&mut self, key: OrderKey, now: Instant) {
        self.refused.insert(key, now);
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
            self.behind = false;
            self.wake_at = Some(started + REFRESH);
            return 0;
        }
        self.last = Some(started);
        // Until this round knows better: the database away, it tries again then.
        self.wake_at = Some(started + REFRESH);
        // Refusals age out: the order is tried again, alone if it must be.
        self.refused.forget_old(started);
        let limit = page_size(ctx.live().consumer.batch_size);
        // One reading of the database's clock picks the round's pages; each
        // page's transaction reads it again, and applies only what is due.
        let Ok(now) = clock::now(&ctx.db).await else {
            self.behind = false;
            return 0;
        };
        // The reading is of a moment before this one: a wait reckoned from
        // it and counted from here ends late, never early.
        let read_at = Instant::now();
        let mut pages = Vec::new();
        let mut after = None;
        let mut more = false;
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
                Ok(page) if page.next.is_some() => page,
                _ => break,
            };
            // Unreadable ids are passed over here; the sweeper tells them.
            let full = page.full;
            after = page.next;
            let keys: Vec<OrderKey> = page
                .orders
                .into_iter()
                .map(|(key, _)| key)
                .filter(|key| !self.refused.contains(key))
                .collect();
            pages.push(keys);
            more = full;
            if !full {
                break;
            }
        }
        // A page the database refuses is halved down to the orders it
        // refuses alone, which later catch-ups pass over; the database away
        // ends it quietly (the consumer's own path pauses).
        let kind = self.kind;
        let pages_read = pages.len();
        let results: Vec<Decided> = stream::iter(pages)
            .map(|keys| async move {
                apply(ctx, kind, keys, Cause::Timeout, OnRefusal::PassOver)
                    .await
                    .unwrap_or_default()
            })
            .buffer_unordered(SIDE_BY_SIDE)
            .collect()
            .await;
        let done = Instant::now();
        let mut caught = 0;
        for page in results {
            for (key, lateness) in page.applied() {
                ctx.telemetry.caught_up(self.kind, key, lateness);
                self.remember(key.clone(), done);
                caught += 1;
            }
            for key in page.refused.into_keys() {
                self.refuse(key, done);
            }
        }
        self.found = caught > 0;
        self.behind = self.found && more && pages_read == MAX_PAGES;
        if !self.found && self.wakes {
            self.wake_at = Some(read_at + next_wait(ctx, self.kind, now).await);
        }
        caught
    }
}

/// How long from the clock reading `now` until a round should look again:
/// a millisecond past the kind's next deadline, at most [`REFRESH`] (also
/// when the read fails: the database's trouble is reported elsewhere).
async fn next_wait(ctx: &Context, kind: TimeoutKind, now: Millis) -> Duration {
    match ctx.orders.until_next(&ctx.db, kind, now).await {
        // Past the deadline by a millisecond: the pages take only orders
        // whose deadline is before the round's reading.
        Ok(Some(until)) => (until + Duration::from_millis(1)).min(REFRESH),
        Ok(None) | Err(_) => REFRESH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_bounded_recent_past() {
        let mut c = CatchUp::new(TimeoutKind::Payment, false);
        let t0 = Instant::now();
        let key = |n: u32| OrderKey::parse(&n.to_string()).unwrap();
        c.remember(key(1), t0);
        c.remember(key(1), t0);
        assert!(c.applied(&key(1)) && c.applied.order.len() == 1);
        c.remember(key(2), t0 + REMEMBER + Duration::from_secs(1));
        assert!(!c.applied(&key(1)), "forgotten once old");
        assert!(c.applied(&key(2)));
    }

    #[test]
    fn refusals_are_forgotten_after_a_while() {
        let mut c = CatchUp::new(TimeoutKind::Payment, false);
        let t0 = Instant::now();
        let key = |n: u32| OrderKey::parse(&n.to_string()).unwrap();
        c.refuse(key(1), t0);
        c.refused
            .forget_old(t0 + REFUSED_FOR - Duration::from_secs(1));
        assert!(c.refused.contains(&key(1)), "passed over for a while");
        c.refuse(key(2), t0 + REFUSED_FOR - Duration::from_secs(1));
        c.refused.forget_old(t0 + REFUSED_FOR);
        assert!(!c.refused.contains(&key(1)), "tried again once old");
        assert!(c.refused.contains(&key(2)));
        assert!(!c.applied(&key(1)), "a refusal is no application");
    }
}

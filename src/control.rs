//! Live control of a running instance: which of its roles are paused.
//!
//! Each timeout consumer (one per kind), the router, the relay and the sweeper
//! can be paused and resumed while the process runs (`/admin/pause/{role}`,
//! `order-timeout ctl pause ROLE`). The state lives here, in memory, per
//! instance: a restart starts with nothing paused. Each role watches its own
//! flag: a consumer or the router cancels its AMQP consumer when paused and
//! consumes again when resumed; the relay and the sweeper skip their rounds.
//!
//! A flag alone is no barrier: a transaction that read it just before a
//! pause would commit after the pause answered. So each role also has a
//! gate ([`Pauses::enter`]): every transaction that changes orders on a
//! role's behalf holds it from before its first statement until it commits,
//! and [`Pauses::pause`] returns only once every transaction that entered
//! before the flag was set has ended. After `pause` answers, nothing of that
//! role changes an order until it is resumed.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use tokio::sync::{RwLock, RwLockReadGuard, watch};

use crate::domain::{Millis, TimeoutKind};

/// A part of the service that can be paused on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pausable {
    /// The timeout consumer of one kind (and the sweeper's work on that kind).
    Consumer(TimeoutKind),
    /// The router of `<prefix>.ingest`.
    Router,
    /// The outbox relay.
    Relay,
    /// The sweeper.
    Sweeper,
}

impl Pausable {
    /// Every pausable role, in the order `ctl status` lists them.
    pub const ALL: [Pausable; TimeoutKind::ALL.len() + Self::OTHERS.len()] = {
        // One consumer per kind, then the others (loops: no iterators in a const).
        let mut roles = [Self::Router; TimeoutKind::ALL.len() + Self::OTHERS.len()];
        let mut i = 0;
        while i < TimeoutKind::ALL.len() {
            roles[i] = Self::Consumer(TimeoutKind::ALL[i]);
            i += 1;
        }
        let mut j = 0;
        while j < Self::OTHERS.len() {
            roles[i + j] = Self::OTHERS[j];
            j += 1;
        }
        roles
    };

    /// The roles that are not a kind's consumer.
    const OTHERS: [Pausable; 3] = [Self::Router, Self::Relay, Self::Sweeper];

    /// The role's name in the API, the CLI and the `paused{role}` gauge: a
    /// consumer is named by its kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consumer(kind) => kind.as_str(),
            Self::Router => "router",
            Self::Relay => "relay",
            Self::Sweeper => "sweeper",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }

    /// The roles in prose, for help texts: `payment, fulfillment, receipt
    /// (the consumer of that kind), router, relay or sweeper`.
    pub fn help() -> String {
        let kinds = TimeoutKind::ALL.map(TimeoutKind::as_str).join(", ");
        format!("{kinds} (the consumer of that kind), router, relay or sweeper")
    }

    /// The names of every role as a sentence: `payment, …, relay or sweeper`.
    pub fn names_in_prose() -> String {
        let names = Self::ALL.map(Self::as_str);
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }

    /// The names of every role, for errors: `payment, fulfillment, …`.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl fmt::Display for Pausable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Pausable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "no role '{}': the roles are {}",
                    crate::domain::truncate(s, 32),
                    Self::names()
                )
            })
    }
}

/// How many roles there are.
const ROLES: usize = Pausable::ALL.len();

/// Which roles are paused, and since when.
#[derive(Debug)]
pub struct Pauses {
    /// One flag per role, in [`Pausable::ALL`]'s order; roles wait on changes.
    flags: watch::Sender<[bool; ROLES]>,
    /// When each paused role was paused.
    since: Mutex<[Option<Millis>; ROLES]>,
    /// One gate per role, in [`Pausable::ALL`]'s order: held shared by each
    /// of the role's transactions that change orders, taken exclusively by
    /// a pause to wait for them. Tokio's lock is fair: a transaction that
    /// comes while a pause waits queues behind it, then finds the flag set.
    gates: [RwLock<()>; ROLES],
}

/// Leave for one transaction to change orders on behalf of some roles, from
/// [`Pauses::enter`]. Hold it until the transaction has committed or rolled
/// back: a pause of any of those roles waits for it to be dropped.
#[must_use = "the pass must be held until the transaction ends"]
#[derive(Debug)]
pub struct Pass<'a> {
    _held: Vec<RwLockReadGuard<'a, ()>>,
}

impl Default for Pauses {
    fn default() -> Self {
        Self {
            flags: watch::Sender::new([false; ROLES]),
            since: Mutex::new([None; ROLES]),
            gates: std::array::from_fn(|_| RwLock::new(())),
        }
    }
}

impl Pauses {
    /// Pauses or resumes `role`; returns whether that changed anything.
    pub fn set(&self, role: Pausable, paused: bool) -> bool {
        let i = role.index();
        let changed = self.flags.send_if_modified(|flags| {
            let changed = flags[i] != paused;
            flags[i] = paused;
            changed
        });
        if changed && let Ok(mut since) = self.since.lock() {
            since[i] = paused.then(Millis::now);
        }
        changed
    }

    /// Pauses `role` and returns once no transaction of it is under way:
    /// those that entered its gate before the flag was set have ended, and
    /// any later one is refused. Returns whether that changed anything.
    pub async fn pause(&self, role: Pausable) -> bool {
        let changed = self.set(role, true);
        // Waits for every pass of the role to be dropped; at once when
        // none is held. Released at once: the flag refuses the next ones.
        drop(self.gates[role.index()].write().await);
        changed
    }

    /// The gate of one transaction that changes orders on behalf of `roles`
    /// (a consumer: its kind; the sweeper: itself and the kind it sweeps):
    /// `None`, and the transaction must not start, when any of them is
    /// paused; otherwise a [`Pass`] to hold until it commits. The one place
    /// that decides whether a change may start.
    pub async fn enter(&self, roles: &[Pausable]) -> Option<Pass<'_>> {
        // Gates taken in one order everywhere: a pass waiting for a second
        // gate holds none that a pause of the second is waiting for.
        let mut indices: Vec<usize> = roles.iter().map(|r| r.index()).collect();
        indices.sort_unstable();
        indices.dedup();
        let mut held = Vec::with_capacity(indices.len());
        for i in indices {
            held.push(self.gates[i].read().await);
            // Read with the gate held: a pause that set the flag earlier is
            // seen here; one that sets it later waits for this pass.
            if self.flags.borrow()[i] {
                return None;
            }
        }
        Some(Pass { _held: held })
    }

    /// Whether any of `roles` is paused now.
    pub fn any_paused(&self, roles: &[Pausable]) -> bool {
        roles.iter().any(|r| self.is_paused(*r))
    }

    /// Whether `role` is paused now.
    pub fn is_paused(&self, role: Pausable) -> bool {
        self.flags.borrow()[role.index()]
    }

    /// Whether the consumer of `kind` is paused now.
    pub fn kind_paused(&self, kind: TimeoutKind) -> bool {
        self.is_paused(Pausable::Consumer(kind))
    }

    /// `(role, paused since)` for every role; `None` when it runs.
    pub fn snapshot(&self) -> [(Pausable, Option<Millis>); ROLES] {
        let since = self.since.lock().map(|s| *s).unwrap_or([None; ROLES]);
        let flags = *self.flags.borrow();
        std::array::from_fn(|i| (Pausable::ALL[i], since[i].filter(|_| flags[i])))
    }

    /// The paused roles.
    pub fn paused(&self) -> Vec<Pausable> {
        let flags = *self.flags.borrow();
        Pausable::ALL
            .into_iter()
            .filter(|r| flags[r.index()])
            .collect()
    }

    /// Returns once `role` is (or already was) in the state `paused`.
    pub async fn until(&self, role: Pausable, paused: bool) {
        let i = role.index();
        let mut rx = self.flags.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|flags| flags[i] == paused).await;
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn every_role_reads_back_from_its_name() {
        for role in Pausable::ALL {
            assert_eq!(role.as_str().parse::<Pausable>(), Ok(role));
        }
        let err = "consumer".parse::<Pausable>().unwrap_err();
        assert!(err.contains("payment, fulfillment, receipt, router, relay, sweeper"));
        assert_eq!(
            Pausable::help(),
            "payment, fulfillment, receipt (the consumer of that kind), router, relay or sweeper"
        );
        assert_eq!(
            Pausable::names_in_prose(),
            "payment, fulfillment, receipt, router, relay or sweeper"
        );
    }

    #[tokio::test]
    async fn a_pause_is_seen_and_timed_until_resumed() {
        let pauses = Pauses::default();
        let payment = Pausable::Consumer(TimeoutKind::Payment);
        assert!(pauses.set(payment, true));
        assert!(!pauses.set(payment, true), "already paused: no change");
        assert!(pauses.kind_paused(TimeoutKind::Payment));
        assert!(!pauses.kind_paused(TimeoutKind::Receipt));
        assert_eq!(pauses.paused(), vec![payment]);
        assert!(pauses.snapshot()[0].1.is_some());
        // Already paused: returns at once.
        pauses.until(payment, true).await;
        let waiter = async { pauses.until(payment, false).await };
        let resume = async {
            tokio::task::yield_now().await;
            assert!(pauses.set(payment, false));
        };
        tokio::join!(waiter, resume);
        assert!(pauses.paused().is_empty());
        assert!(pauses.snapshot()[0].1.is_none());
    }

    #[tokio::test]
    async fn a_pause_waits_for_the_transactions_in_its_gate() {
        let pauses = Pauses::default();
        let payment = Pausable::Consumer(TimeoutKind::Payment);
        let pass = pauses.enter(&[payment, Pausable::Sweeper]).await;
        assert!(pass.is_some(), "nothing paused: the transaction starts");
        let mut pause = Box::pin(pauses.pause(payment));
        // The pass is still held: the pause sets the flag, but does not answer.
        assert!(pause.as_mut().now_or_never().is_none());
        assert!(pauses.kind_paused(TimeoutKind::Payment));
        // Another role's gate is not held up by it.
        assert!(
            pauses
                .enter(&[Pausable::Consumer(TimeoutKind::Receipt)])
                .await
                .is_some()
        );
        drop(pass);
        assert!(pause.await, "answers once the transaction has ended");
        assert!(
            pauses.enter(&[payment]).await.is_none(),
            "refused after the pause"
        );
        assert!(pauses.enter(&[Pausable::Sweeper, payment]).await.is_none());
        assert!(
            !pauses.pause(payment).await,
            "already paused, nothing in flight"
        );
        pauses.set(payment, false);
        assert!(pauses.enter(&[payment]).await.is_some(), "resumed");
    }

    #[tokio::test]
    async fn a_transaction_arriving_while_a_pause_waits_is_refused() {
        let pauses = Pauses::default();
        let sweeper = [Pausable::Sweeper];
        let pass = pauses.enter(&sweeper).await;
        let mut pause = Box::pin(pauses.pause(Pausable::Sweeper));
        assert!(pause.as_mut().now_or_never().is_none());
        // Queued behind the waiting pause, then refused by the flag.
        let mut late = Box::pin(pauses.enter(&sweeper));
        assert!(late.as_mut().now_or_never().is_none());
        drop(pass);
        let (answered, late) = tokio::join!(pause, late);
        assert!(answered);
        assert!(
            late.is_none(),
            "a transaction after the pause does not start"
        );
    }
}

//! Live control of a running instance: which of its roles are paused.
//!
//! Each timeout consumer (one per kind), the router, the relay and the sweeper
//! can be paused and resumed while the process runs (`/admin/pause/{role}`,
//! `order-timeout ctl pause ROLE`). A pause has a scope ([`PauseScope`]):
//! shared, the default, written in the database for every instance (see
//! [`crate::pausing`], which writes and follows it), or this instance's
//! only, in memory. A role is paused while either scope holds it; this module
//! keeps both, by role, and the one flag the roles watch: a consumer or the
//! router cancels its AMQP consumer when paused and consumes again when
//! resumed; the relay and the sweeper skip their rounds.
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

/// Where a pause holds. A role is paused while either holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseScope {
    /// Every instance on the database, written in `order_timeout_pauses`:
    /// survives restarts and reaches instances started later. The default.
    Shared,
    /// This process only, in memory: gone when it stops.
    Instance,
}

impl PauseScope {
    /// Both scopes, shared first.
    pub const ALL: [PauseScope; 2] = [Self::Shared, Self::Instance];

    /// The scope's name in the API (`?scope=`), `ctl status` and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Instance => "instance",
        }
    }
}

impl FromStr for PauseScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "no scope '{}': a pause is shared (every instance, the default) or instance (this one only)",
                    crate::domain::truncate(s, 32)
                )
            })
    }
}

/// Who paused a role, when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// When it was paused, by the database's clock (an instance-scoped pause
    /// made while the database does not answer: by the process's).
    pub since: Millis,
    /// Who asked: `token sha256:` and the first 12 hex digits of the token's hash,
    /// or `anonymous` on an API without tokens.
    pub by: String,
    /// The instance that was asked (`amqp.instance`).
    pub instance: String,
    /// What the operator gave as the reason.
    pub reason: Option<String>,
}

/// One role's pauses, by scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleState {
    /// The pause for every instance, as this instance last read it.
    pub shared: Option<Pause>,
    /// This instance's own pause.
    pub instance: Option<Pause>,
}

impl RoleState {
    /// Whether the role is paused, in either scope.
    pub fn paused(&self) -> bool {
        self.shared.is_some() || self.instance.is_some()
    }

    /// The pause of one scope.
    pub fn get(&self, scope: PauseScope) -> Option<&Pause> {
        match scope {
            PauseScope::Shared => self.shared.as_ref(),
            PauseScope::Instance => self.instance.as_ref(),
        }
    }

    fn slot(&mut self, scope: PauseScope) -> &mut Option<Pause> {
        match scope {
            PauseScope::Shared => &mut self.shared,
            PauseScope::Instance => &mut self.instance,
        }
    }

    /// The pauses in effect, shared first.
    pub fn pauses(&self) -> impl Iterator<Item = (PauseScope, &Pause)> {
        PauseScope::ALL
            .into_iter()
            .filter_map(|scope| self.get(scope).map(|p| (scope, p)))
    }
}

/// What a change of one scope's pause did to a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// Whether that scope's pause was set or cleared (false: it already was).
    pub scope: bool,
    /// Whether the role is paused now, in either scope.
    pub paused: bool,
}

/// Which roles are paused, in which scope, by whom and since when.
#[derive(Debug)]
pub struct Pauses {
    /// One flag per role, in [`Pausable::ALL`]'s order: paused in either
    /// scope. Roles wait on its changes.
    flags: watch::Sender<[bool; ROLES]>,
    /// Each role's pauses by scope; changed together with `flags`.
    states: Mutex<[RoleState; ROLES]>,
    /// One gate per role, in [`Pausable::ALL`]'s order: held shared by each
    /// of the role's transactions that change orders, taken exclusively by
    /// a pause to wait for them. Tokio's lock is fair: a transaction that
    /// comes while a pause waits queues behind it, then finds the flag set.
    gates: [RwLock<()>; ROLES],
    /// Held by whoever writes the shared pauses or applies what it read of
    /// them (the admin API, the follower of the table), never across the
    /// follower's read: it counts the writes, and a reading that began
    /// before a write is not applied after it.
    shared: tokio::sync::Mutex<u64>,
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
            states: Mutex::new(std::array::from_fn(|_| RoleState::default())),
            gates: std::array::from_fn(|_| RwLock::new(())),
            shared: tokio::sync::Mutex::new(0),
        }
    }
}

impl Pauses {
    /// Sets (`Some`) or clears (`None`) the pause of `role` in `scope`, and
    /// the role's flag with it. A pause of a scope that already holds one
    /// keeps the first pauser, except a shared one read from the table
    /// (`refresh`), which holds the truth. Does not wait for the gate: see
    /// [`Pauses::pause`].
    fn set(
        &self,
        role: Pausable,
        scope: PauseScope,
        pause: Option<Pause>,
        refresh: bool,
    ) -> Changed {
        let i = role.index();
        // A poisoned lock only means a panic elsewhere while it was held:
        // the states themselves are whole (each change is one assignment).
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        let slot = states[i].slot(scope);
        let changed = slot.is_some() != pause.is_some();
        if changed || refresh {
            *slot = pause;
        }
        let paused = states[i].paused();
        self.flags.send_if_modified(|flags| {
            let modified = flags[i] != paused;
            flags[i] = paused;
            modified
        });
        Changed {
            scope: changed,
            paused,
        }
    }

    /// Pauses `role` in `scope` and returns once no transaction of it is
    /// under way: those that entered its gate before the flag was set have
    /// ended, and any later one is refused. A scope already paused keeps
    /// its first pauser (`refresh`: the shared one read from the table
    /// takes what the table says).
    pub async fn pause(
        &self,
        role: Pausable,
        scope: PauseScope,
        pause: Pause,
        refresh: bool,
    ) -> Changed {
        let changed = self.set(role, scope, Some(pause), refresh);
        // Waits for every pass of the role to be dropped; at once when
        // none is held. Released at once: the flag refuses the next ones.
        drop(self.gates[role.index()].write().await);
        changed
    }

    /// Clears the pause of `role` in `scope`; the role runs again unless
    /// the other scope still holds it.
    pub fn resume(&self, role: Pausable, scope: PauseScope) -> Changed {
        self.set(role, scope, None, false)
    }

    /// Taken by whoever changes the shared pauses (for the write and its
    /// application together: it adds one to the count it guards) or applies
    /// a reading of them (if the count is still what it was before the read).
    pub async fn shared_lock(&self) -> tokio::sync::MutexGuard<'_, u64> {
        self.shared.lock().await
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

    /// Whether `role` is paused now, in either scope.
    pub fn is_paused(&self, role: Pausable) -> bool {
        self.flags.borrow()[role.index()]
    }

    /// Whether the consumer of `kind` is paused now.
    pub fn kind_paused(&self, kind: TimeoutKind) -> bool {
        self.is_paused(Pausable::Consumer(kind))
    }

    /// The pause of `role` on this instance only, if any.
    pub fn instance_pause(&self, role: Pausable) -> Option<Pause> {
        let states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states[role.index()].instance.clone()
    }

    /// Every role with its pauses by scope.
    pub fn snapshot(&self) -> [(Pausable, RoleState); ROLES] {
        let states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        std::array::from_fn(|i| (Pausable::ALL[i], states[i].clone()))
    }

    /// The paused roles, in either scope.
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

    fn by(who: &str) -> Pause {
        Pause {
            since: Millis(1_000),
            by: who.to_string(),
            instance: "shop-1".to_string(),
            reason: None,
        }
    }

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
        for scope in PauseScope::ALL {
            assert_eq!(scope.as_str().parse::<PauseScope>(), Ok(scope));
        }
        assert!("cluster".parse::<PauseScope>().is_err());
    }

    #[tokio::test]
    async fn a_pause_is_seen_and_timed_until_resumed() {
        let pauses = Pauses::default();
        let payment = Pausable::Consumer(TimeoutKind::Payment);
        let shared = PauseScope::Shared;
        let first = pauses.pause(payment, shared, by("a"), false).await;
        assert_eq!(
            first,
            Changed {
                scope: true,
                paused: true
            }
        );
        let again = pauses.pause(payment, shared, by("b"), false).await;
        assert!(!again.scope, "already paused: no change");
        assert_eq!(
            pauses.snapshot()[0]
                .1
                .shared
                .as_ref()
                .map(|p| p.by.as_str()),
            Some("a"),
            "the first pauser stays"
        );
        assert!(pauses.kind_paused(TimeoutKind::Payment));
        assert!(!pauses.kind_paused(TimeoutKind::Receipt));
        assert_eq!(pauses.paused(), vec![payment]);
        // Already paused: returns at once.
        pauses.until(payment, true).await;
        let waiter = async { pauses.until(payment, false).await };
        let resume = async {
            tokio::task::yield_now().await;
            assert_eq!(
                pauses.resume(payment, shared),
                Changed {
                    scope: true,
                    paused: false
                }
            );
        };
        tokio::join!(waiter, resume);
        assert!(pauses.paused().is_empty());
        assert!(!pauses.snapshot()[0].1.paused());
    }

    #[tokio::test]
    async fn a_role_is_paused_while_either_scope_holds_it() {
        let pauses = Pauses::default();
        let relay = Pausable::Relay;
        pauses
            .pause(relay, PauseScope::Shared, by("a"), false)
            .await;
        let local = pauses
            .pause(relay, PauseScope::Instance, by("b"), false)
            .await;
        assert_eq!(
            local,
            Changed {
                scope: true,
                paused: true
            }
        );
        let state = &pauses.snapshot()[relay.index()].1;
        let scopes: Vec<_> = state.pauses().map(|(s, p)| (s, p.by.clone())).collect();
        assert_eq!(
            scopes,
            vec![
                (PauseScope::Shared, "a".into()),
                (PauseScope::Instance, "b".into())
            ]
        );
        assert_eq!(
            pauses.resume(relay, PauseScope::Shared),
            Changed {
                scope: true,
                paused: true
            },
            "still paused on this instance"
        );
        assert!(pauses.is_paused(relay));
        assert!(pauses.enter(&[relay]).await.is_none());
        assert_eq!(
            pauses.resume(relay, PauseScope::Instance),
            Changed {
                scope: true,
                paused: false
            }
        );
        assert!(!pauses.is_paused(relay));
        assert!(!pauses.resume(relay, PauseScope::Instance).scope);
        // The table holds the truth: a reading replaces what was shown.
        pauses
            .pause(relay, PauseScope::Shared, by("a"), false)
            .await;
        pauses.pause(relay, PauseScope::Shared, by("c"), true).await;
        let shown = pauses.snapshot()[relay.index()].1.shared.clone();
        assert_eq!(shown.map(|p| p.by), Some("c".to_string()));
    }

    #[tokio::test]
    async fn a_pause_waits_for_the_transactions_in_its_gate() {
        let pauses = Pauses::default();
        let payment = Pausable::Consumer(TimeoutKind::Payment);
        let pass = pauses.enter(&[payment, Pausable::Sweeper]).await;
        assert!(pass.is_some(), "nothing paused: the transaction starts");
        let mut pause = Box::pin(pauses.pause(payment, PauseScope::Shared, by("a"), false));
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
        assert!(pause.await.scope, "answers once the transaction has ended");
        assert!(
            pauses.enter(&[payment]).await.is_none(),
            "refused after the pause"
        );
        assert!(pauses.enter(&[Pausable::Sweeper, payment]).await.is_none());
        assert!(
            !pauses
                .pause(payment, PauseScope::Shared, by("a"), false)
                .await
                .scope,
            "already paused, nothing in flight"
        );
        pauses.resume(payment, PauseScope::Shared);
        assert!(pauses.enter(&[payment]).await.is_some(), "resumed");
    }

    #[tokio::test]
    async fn a_transaction_arriving_while_a_pause_waits_is_refused() {
        let pauses = Pauses::default();
        let sweeper = [Pausable::Sweeper];
        let pass = pauses.enter(&sweeper).await;
        let mut pause =
            Box::pin(pauses.pause(Pausable::Sweeper, PauseScope::Instance, by("a"), false));
        assert!(pause.as_mut().now_or_never().is_none());
        // Queued behind the waiting pause, then refused by the flag.
        let mut late = Box::pin(pauses.enter(&sweeper));
        assert!(late.as_mut().now_or_never().is_none());
        drop(pass);
        let (answered, late) = tokio::join!(pause, late);
        assert!(answered.scope);
        assert!(
            late.is_none(),
            "a transaction after the pause does not start"
        );
    }
}

//! Applying a batch of timeouts: the one loop of the consumers, their
//! catch-ups and the sweeper.
//!
//! A batch is tried in one transaction. When the database answers but
//! refuses it (a trigger, a constraint, a deadlock), it is split in halves,
//! each decided on its own, down to the one order it refuses: one bad order
//! cannot stop every timeout behind it. What happens to that order, and to a
//! batch while the database is away, is the caller's [`OnRefusal`]: the
//! consumer tries it again after the rest and waits an outage out, its
//! deliveries unacked; the sweeper and the catch-up pass it over to a later
//! round, and stop.
//!
//! Every transaction passes the gates of the roles that a pause of stops it
//! ([`gates`], [`crate::control::Pauses::enter`]) and holds them until it
//! ends; paused first, the rest of the batch is left undecided. Each attempt
//! reads the database's clock (`db::clock`), which decides what is due.
//!
//! An attempt that fails may have committed with its answer lost (the
//! connection cut right after the COMMIT). Its clock reading is kept: an
//! order that a later attempt finds no longer applicable, or that is about to
//! be given up, is looked up by the audit row such an attempt wrote, and
//! counted as that attempt applied it, so that what is counted is what the
//! database holds.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Backoff, pause};
use crate::context::Context;
use crate::control::Pausable;
use crate::db::clock;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::orders::{Cause, ExpiryOutcome};

/// How often the consumer lets the database refuse one order's timeout,
/// alone, before it gives the order up (and parks its delivery).
pub const ISOLATED_ATTEMPTS: u32 = 3;

/// Failed attempts of a batch remembered, to find what they applied after all.
const MAX_FAILED_ATTEMPTS: usize = 64;

/// What a caller does with an order the database refuses alone, and with a
/// batch while the database is away (or refuses every transition, see
/// [`crate::orders::OrderStore::probe`]).
#[derive(Debug, Clone, Copy)]
pub enum OnRefusal<'a> {
    /// The consumer's: an order refused alone is tried again once the rest
    /// is decided, [`ISOLATED_ATTEMPTS`] times in all, then given up (its
    /// delivery is parked). While the database is away, the batch waits with
    /// backoff (told as `paused`, by kind) and is tried again, until this
    /// shutdown.
    Persist(&'a CancellationToken),
    /// The sweeper's and the catch-up's: an order refused alone is given up
    /// at once (a later round tries it again); the database away ends the
    /// batch ([`Decided::away`]).
    PassOver,
}

impl OnRefusal<'_> {
    /// How often an order may be refused alone before it is given up.
    fn isolated_attempts(self) -> u32 {
        match self {
            Self::Persist(_) => ISOLATED_ATTEMPTS,
            Self::PassOver => 1,
        }
    }
}

/// What the database said about a batch's orders.
#[derive(Debug, Default)]
pub struct Decided {
    /// Each order's outcome, with the clock reading of the attempt that
    /// decided it.
    pub outcomes: HashMap<OrderKey, (ExpiryOutcome, Millis)>,
    /// Orders whose transition the database refused alone, as often as the
    /// caller allows, with its last error: given up.
    pub refused: HashMap<OrderKey, String>,
    /// Orders not decided: a pause came first (their deliveries go back to
    /// the queue, neither acked nor counted), or the database went away.
    pub left: HashSet<OrderKey>,
    /// Why the batch ended before every order was decided, with
    /// [`OnRefusal::PassOver`]: the database is away.
    pub away: Option<DbErr>,
}

impl Decided {
    /// Whether the order was left undecided (a duplicate delivery of it
    /// decided in another part is decided).
    pub fn undecided(&self, id: &OrderKey) -> bool {
        self.left.contains(id) && !self.outcomes.contains_key(id) && !self.refused.contains_key(id)
    }

    /// Adds one part's outcomes. An order split across parts (duplicate
    /// deliveries) keeps the outcome that applied it.
    pub fn merge(&mut self, outcomes: HashMap<OrderKey, ExpiryOutcome>, now: Millis) {
        for (id, outcome) in outcomes {
            self.merge_one(id, outcome, now);
        }
    }

    fn merge_one(&mut self, id: OrderKey, outcome: ExpiryOutcome, now: Millis) {
        let applied_before = matches!(
            self.outcomes.get(&id),
            Some((ExpiryOutcome::Applied { .. }, _))
        );
        if !applied_before {
            self.outcomes.insert(id, (outcome, now));
        }
    }

    /// The orders applied, each with its lateness in milliseconds: from its
    /// deadline to the attempt that applied it.
    pub fn applied(&self) -> impl Iterator<Item = (&OrderKey, i64)> {
        self.outcomes
            .iter()
            .filter_map(|(key, (outcome, at))| match outcome {
                ExpiryOutcome::Applied { deadline } => Some((key, at.signed_since(*deadline))),
                _ => None,
            })
    }

    /// Leaves `keys` undecided.
    fn leave(&mut self, keys: impl IntoIterator<Item = OrderKey>) {
        self.left.extend(keys);
    }
}

/// The roles whose pause stops a transition of `kind` with this `cause`: the
/// kind's consumer always (a pause stops the kind's transitions on this
/// instance), and the sweeper for its own.
pub fn gates(kind: TimeoutKind, cause: Cause) -> Vec<Pausable> {
    match cause {
        Cause::Sweeper => vec![Pausable::Sweeper, Pausable::Consumer(kind)],
        Cause::Timeout | Cause::Api => vec![Pausable::Consumer(kind)],
    }
}

/// Applies the timeout of `kind` to the orders `keys` whose deadline has
/// passed, in as few transactions as the database allows, and says what it
/// found for each; a refusal and an outage are handled as `on_refusal` says
/// (see the module's notes). `None` when shutdown came first
/// ([`OnRefusal::Persist`] only): nothing is decided.
pub async fn apply(
    ctx: &Context,
    kind: TimeoutKind,
    keys: Vec<OrderKey>,
    cause: Cause,
    on_refusal: OnRefusal<'_>,
) -> Option<Decided> {
    let gates = gates(kind, cause);
    let mut decided = Decided::default();
    // Parts still to decide, each with how often the database refused it
    // alone. An order refused alone is tried again only once every other
    // part is decided: the rest of the batch does not wait on it.
    let mut parts = vec![(keys, 0u32)];
    let mut suspects: Vec<(Vec<OrderKey>, u32)> = Vec::new();
    let mut outage = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    // The clock readings of the attempts that failed: one of them may have
    // committed with its answer lost.
    let mut failed: Vec<Millis> = Vec::new();
    loop {
        let (part, refusals) = match parts.pop() {
            Some((part, _)) if part.is_empty() => continue,
            Some(next) => next,
            None if !suspects.is_empty() => {
                if let OnRefusal::Persist(shutdown) = on_refusal
                    && !pause(shutdown, retry.next_delay()).await
                {
                    return None;
                }
                parts.append(&mut suspects);
                continue;
            }
            None => return Some(decided),
        };
        // Held until the transaction ends. Paused first: this part and
        // every one still to decide are left undecided.
        let Some(pass) = ctx.pauses.enter(&gates).await else {
            let rest = parts.into_iter().chain(suspects).flat_map(|(p, _)| p);
            decided.leave(part.into_iter().chain(rest));
            return Some(decided);
        };
        // The database's clock decides what is due; a failed reading is a
        // failed attempt like any other.
        let attempt = match clock::now(&ctx.db).await {
            Ok(now) => ctx
                .orders
                .expire(
                    &ctx.db,
                    kind,
                    &part,
                    now,
                    cause,
                    &ctx.settings.amqp.instance,
                )
                .await
                .map(|outcomes| (now, outcomes))
                .map_err(|e| (Some(now), e)),
            Err(e) => Err((None, e)),
        };
        // Committed or rolled back: a pause waits for nothing that follows
        // (an outage's backoff least of all).
        drop(pass);
        let error = match attempt {
            Ok((now, outcomes)) => {
                let moved: Vec<OrderKey> = outcomes
                    .iter()
                    .filter(|(_, o)| matches!(o, ExpiryOutcome::Inapplicable { .. }))
                    .map(|(key, _)| key.clone())
                    .collect();
                decided.merge(outcomes, now);
                recover(ctx, kind, &moved, &failed, cause, &mut decided).await;
                continue;
            }
            Err((now, e)) => {
                if let Some(now) = now
                    && failed.len() < MAX_FAILED_ATTEMPTS
                    && !failed.contains(&now)
                {
                    failed.push(now);
                }
                e
            }
        };
        if let Err(away) = ctx.orders.probe(&ctx.db, kind).await {
            match on_refusal {
                // Keep the deliveries unacked and take no new ones; the
                // broker keeps the rest, and nothing spins meanwhile.
                OnRefusal::Persist(shutdown) => {
                    let delay = outage.next_delay();
                    ctx.telemetry
                        .paused(kind.as_str(), &error.to_string(), delay);
                    if !pause(shutdown, delay).await {
                        return None;
                    }
                    parts.push((part, refusals));
                }
                OnRefusal::PassOver => {
                    let rest = parts.into_iter().chain(suspects).flat_map(|(p, _)| p);
                    decided.leave(part.into_iter().chain(rest));
                    decided.away = Some(away);
                    return Some(decided);
                }
            }
        } else if part.len() > 1 {
            ctx.telemetry
                .batch_split(kind, part.len(), &error.to_string());
            let (left, right) = part.split_at(part.len() / 2);
            parts.push((right.to_vec(), 0));
            parts.push((left.to_vec(), 0));
        } else if refusals + 1 < on_refusal.isolated_attempts() {
            suspects.push((part, refusals + 1));
        } else if !recover(ctx, kind, &part, &failed, cause, &mut decided).await {
            decided.refused.insert(part[0].clone(), error.to_string());
        }
    }
}

/// Looks up which of `keys` one of the `failed` attempts applied after all,
/// its commit's answer lost; those are told and decided `Applied` as of that
/// attempt. Returns whether it found any. A database error here finds none.
async fn recover(
    ctx: &Context,
    kind: TimeoutKind,
    keys: &[OrderKey],
    failed: &[Millis],
    cause: Cause,
    decided: &mut Decided,
) -> bool {
    // Every part passes here: nothing to look at unless an attempt failed.
    if failed.is_empty() || keys.is_empty() {
        return false;
    }
    let found = ctx
        .orders
        .applied_earlier(&ctx.db, kind, keys, failed, cause)
        .await
        .unwrap_or_default();
    if found.is_empty() {
        return false;
    }
    ctx.telemetry.commit_answer_lost(kind, found.len());
    for (key, (at, outcome)) in found {
        // The lost commit's outcome replaces the retry's `Inapplicable`.
        decided.outcomes.remove(&key);
        decided.merge_one(key, outcome, at);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OrderStatus;

    #[test]
    fn a_split_batch_keeps_the_outcome_that_applied() {
        let id = OrderKey::parse("7").unwrap();
        let mut decided = Decided::default();
        let applied = ExpiryOutcome::Applied {
            deadline: Millis(900),
        };
        decided.merge(
            HashMap::from([(id.clone(), applied.clone())]),
            Millis(1_000),
        );
        // The same order's duplicate, decided in the other half, found it done.
        let done = ExpiryOutcome::Inapplicable {
            status: OrderStatus::Cancelled.as_str().into(),
        };
        decided.merge(HashMap::from([(id.clone(), done)]), Millis(1_100));
        assert_eq!(decided.outcomes[&id], (applied, Millis(1_000)));
        assert_eq!(decided.applied().collect::<Vec<_>>(), vec![(&id, 100)]);
    }

    #[test]
    fn the_sweeper_passes_its_own_gate_and_the_kinds() {
        let kind = TimeoutKind::Payment;
        assert_eq!(gates(kind, Cause::Timeout), [Pausable::Consumer(kind)]);
        assert_eq!(
            gates(kind, Cause::Sweeper),
            [Pausable::Sweeper, Pausable::Consumer(kind)]
        );
    }
}

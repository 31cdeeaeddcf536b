//! `GET /admin/overview` (admin scope): what the operator's page ([`super::ui`])
//! shows first, in one answer, so that its numbers are one reading: the delay
//! mode and the broker's nodes, each kind's waiting and overdue orders (the
//! numbers of the `pending_orders` and `overdue_orders` gauges, read from the
//! database by its clock), the roles as `/admin/status` shows them, and the
//! parked messages by reason.
//!
//! The broker side comes from the management API (`amqp.management_url`);
//! without it, or while it does not answer, the answer says so
//! (`reachable: false`, `checked: false`, with the error) instead of failing:
//! the database's numbers matter more than the broker's.

use super::admin::{RoleView, role_views};
use super::*;
use crate::amqp::management::{Management, Peek, Peeked};
use crate::domain::TimeoutKind;

/// Most parked messages read per answer to count their reasons: the page asks
/// every few seconds, and a flood of parked messages must not make each
/// answer read them all. The total is the queue's depth, whatever the bound.
pub(super) const PARKED_READ: u64 = 100;

/// The reason of a parked message that carries none of ours but the broker's
/// `x-death`: a queue dead-lettered it (a policy's TTL or length limit, a
/// quorum queue's delivery limit, a reject by another client).
const DEAD_LETTERED: &str = "dead_lettered";
/// The reason of a parked message with neither: an exchange's alternate
/// exchange took it, no queue being bound for it.
const UNROUTABLE: &str = "unroutable";

/// What the page shows first.
#[derive(Serialize, ToSchema)]
pub(super) struct OverviewView {
    /// `amqp.instance`.
    instance: String,
    /// The delay mode in effect: ttl, plugin or native (null until resolved).
    delay_mode: Option<&'static str>,
    /// The database's clock reading the numbers were taken at (RFC 3339).
    now: String,
    /// `metrics.overdue_after` in milliseconds: how far past its deadline
    /// an order is before it counts as overdue.
    overdue_after_ms: u64,
    /// The broker.
    broker: BrokerView,
    /// Each kind the orders map: its waiting and overdue orders.
    kinds: Vec<KindView>,
    /// Every pausable role, as `/admin/status` lists them.
    roles: Vec<RoleView>,
    /// The parked queue.
    parked: ParkedView,
}

/// The broker, as the management API and this instance's connections see it.
#[derive(Serialize, ToSchema)]
pub(super) struct BrokerView {
    /// The cluster's nodes (`rabbit@host`), as the management API names them.
    nodes: Vec<String>,
    /// Whether the management API answered.
    reachable: bool,
    /// Whether every broker connection of this instance is up.
    connected: bool,
    /// Why the management API was not read, when it was not.
    error: Option<String>,
}

/// One kind's orders.
#[derive(Serialize, ToSchema)]
pub(super) struct KindView {
    /// payment, fulfillment or receipt.
    kind: &'static str,
    /// Orders in the status the timeout acts on: waiting for it, overdue or not.
    waiting: u64,
    /// Of those, the ones past their deadline by more than `overdue_after_ms`.
    overdue: u64,
}

/// The parked queue `<prefix>.parked`.
#[derive(Serialize, ToSchema)]
pub(super) struct ParkedView {
    /// Its name.
    queue: String,
    /// Messages in it.
    total: u64,
    /// How many of the first `read` have each reason (`x-parked-reason` with `x-parked-by`;
    /// `dead_lettered` for a message a queue dead-lettered, `unroutable`
    /// for one no queue took), most first.
    by_reason: Vec<ReasonCount>,
    /// How many were read for `by_reason`: all of them up to 100.
    read: u64,
    /// Whether the queue could be read; `total` and `by_reason` mean nothing otherwise.
    checked: bool,
    /// Why it could not, when it could not.
    error: Option<String>,
}

/// Parked messages of one reason.
#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub(super) struct ReasonCount {
    /// The reason.
    reason: String,
    /// How many of those read have it.
    count: u64,
}

#[utoipa::path(
    get,
    path = "/admin/overview",
    tag = "admin",
    responses(
        (status = 200, description = "The delay mode and the broker's nodes, each kind's waiting and overdue orders by the database's clock, the roles, and the parked messages by reason (the first 100 read and put back in place); a management API that does not answer is reported in the answer", body = OverviewView),
        (status = 503, description = "The database did not answer", body = ErrorBody)
    )
)]
pub(super) async fn overview(
    State(ctx): State<Arc<Context>>,
) -> Result<Json<OverviewView>, ApiError> {
    let management: Option<Management> = ctx.settings.amqp.management.clone().map(Management::new);
    let parked_queue = ctx.names.parked();
    // The broker is asked while the database is.
    let broker = async {
        let management = management.as_ref()?;
        Some(tokio::join!(
            management.nodes(),
            management.peek(&parked_queue, PARKED_READ)
        ))
    };
    let (kinds, broker) = tokio::join!(kinds(&ctx), broker);
    let (now, overdue_after, kinds) = kinds?;
    let (nodes, peeked) = match broker {
        Some((nodes, peeked)) => (
            nodes.map_err(|e| e.to_string()),
            peeked.map_err(|e| e.to_string()),
        ),
        None => {
            let off = "the management API is off (amqp.management_url = off)".to_string();
            (Err(off.clone()), Err(off))
        }
    };
    let connected = ctx.health.broker().iter().all(|(_, up)| *up);
    let broker = match nodes {
        Ok(nodes) => BrokerView {
            nodes,
            reachable: true,
            connected,
            error: None,
        },
        Err(error) => BrokerView {
            nodes: Vec::new(),
            reachable: false,
            connected,
            error: Some(error),
        },
    };
    Ok(Json(OverviewView {
        instance: ctx.settings.amqp.instance.clone(),
        delay_mode: ctx.resolved_mode().map(|m| m.as_str()),
        now: now.to_rfc3339(),
        overdue_after_ms: u64::try_from(overdue_after.as_millis()).unwrap_or(u64::MAX),
        broker,
        kinds,
        roles: role_views(&ctx),
        parked: parked_view(parked_queue, peeked),
    }))
}

/// Each mapped kind's backlog at one reading of the database's clock, with
/// the threshold the gauges use.
async fn kinds(ctx: &Context) -> Result<(Millis, Duration, Vec<KindView>), ApiError> {
    let now = db::clock::now(&ctx.api_db).await?;
    let overdue_after = ctx.live().metrics.overdue_after;
    let mut kinds = Vec::new();
    for kind in TimeoutKind::ALL {
        if let Some(backlog) = ctx
            .orders
            .backlog(&ctx.api_db, kind, now, overdue_after)
            .await?
        {
            kinds.push(KindView {
                kind: kind.as_str(),
                waiting: backlog.pending,
                overdue: backlog.overdue,
            });
        }
    }
    Ok((now, overdue_after, kinds))
}

/// The parked queue as read (a queue not declared yet holds nothing).
fn parked_view(queue: String, peeked: Result<Peeked, String>) -> ParkedView {
    match peeked {
        Ok(peeked) => {
            ParkedView {
                queue,
                // The statistics lag the queue by up to their interval:
                // never fewer than were just read.
                total: peeked.in_queue.max(peeked.messages.len() as u64),
                by_reason: by_reason(&peeked.messages),
                read: peeked.messages.len() as u64,
                checked: true,
                error: None,
            }
        }
        Err(error) => ParkedView {
            queue,
            total: 0,
            by_reason: Vec::new(),
            read: 0,
            checked: false,
            error: Some(error),
        },
    }
}

/// The messages counted by reason, most first, then by name.
fn by_reason(messages: &[Peek]) -> Vec<ReasonCount> {
    let mut counts: std::collections::BTreeMap<&str, u64> = Default::default();
    for message in messages {
        *counts.entry(reason_of(message)).or_default() += 1;
    }
    let mut out: Vec<ReasonCount> = counts
        .into_iter()
        .map(|(reason, count)| ReasonCount {
            reason: reason.to_string(),
            count,
        })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    out
}

/// Why a message is in the parked queue.
fn reason_of(message: &Peek) -> &str {
    match message.parked_by_service() {
        Some((reason, _)) => reason,
        None if message.headers.get("x-death").is_some() => DEAD_LETTERED,
        None => UNROUTABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(headers: serde_json::Value) -> Peek {
        Peek {
            routing_key: "payment".into(),
            headers,
            body: None,
        }
    }

    #[test]
    fn parked_messages_are_counted_by_reason_most_first() {
        let messages = [
            message(json!({"x-parked-reason": "missing_delay", "x-parked-by": "router"})),
            message(json!({"x-parked-reason": "invalid_body", "x-parked-by": "consumer"})),
            message(json!({"x-parked-reason": "missing_delay", "x-parked-by": "router"})),
            message(json!({"x-death": [{"reason": "expired"}]})),
            message(json!({})),
            // Not the service's parking: a reason without who parked it.
            message(json!({"x-parked-reason": "forged", "x-death": [{"reason": "rejected"}]})),
        ];
        let counted = by_reason(&messages);
        let pairs: Vec<(&str, u64)> = counted
            .iter()
            .map(|r| (r.reason.as_str(), r.count))
            .collect();
        assert_eq!(
            pairs,
            [
                ("dead_lettered", 2),
                ("missing_delay", 2),
                ("invalid_body", 1),
                ("unroutable", 1)
            ]
        );
        let view = parked_view(
            "p.parked".into(),
            Ok(Peeked {
                in_queue: 250,
                messages: messages.to_vec(),
                complete: false,
            }),
        );
        assert_eq!((view.total, view.read, view.checked), (250, 6, true));
        let view = parked_view(
            "p.parked".into(),
            Err("the management API at x did not answer".into()),
        );
        assert!(!view.checked);
        assert_eq!(
            view.error.as_deref(),
            Some("the management API at x did not answer")
        );
        assert!(parked_view("p.parked".into(), Ok(Peeked::default())).checked);
        // Statistics older than the read: the read decides.
        let view = parked_view(
            "p.parked".into(),
            Ok(Peeked {
                in_queue: 0,
                messages: messages[..2].to_vec(),
                complete: true,
            }),
        );
        assert_eq!(view.total, 2);
    }
}

//! `GET /admin/orders/{id}` (admin scope): one order's whole story, for an
//! operator asked "why was this order cancelled?" or "why is it still
//! open?". What the order's store records (status, deadlines, every
//! transition with its cause, lateness and instance, the timeouts still
//! ahead), where each transition's domain event is, and whether a timeout
//! of the order lies in the parked queue. Every time is by the database's
//! clock, read once for the answer. `order-timeout ctl order ID` calls it.

use super::*;
use crate::amqp::management::{Management, Peek, Peeked};
use crate::amqp::wire::{X_ORIGINAL_ROUTING_KEY, X_PARKED_AT, X_PARKED_DETAIL};
use crate::domain::{OrderKey, TimeoutKind};
use crate::orders::{EventState, Story, Transition};

/// Most messages of the parked queue one answer reads: the queue is read
/// from its head, without taking anything (see [`Management::peek`]); the
/// answer says when it held more (`parked_complete`).
const PARKED_READ_LIMIT: u64 = 200;

/// One kind's deadline for the order.
#[derive(Serialize, ToSchema)]
pub(super) struct DeadlineView {
    /// payment, fulfillment or receipt.
    kind: &'static str,
    /// When (RFC 3339), by the database's clock.
    at: String,
    /// Whether it has passed at `now`.
    passed: bool,
}

/// One recorded transition (or late payment).
#[derive(Serialize, ToSchema)]
pub(super) struct TransitionView {
    /// When it committed (RFC 3339), by the database's clock.
    at: String,
    /// What happened: created, paid, shipped, completed, cancelled, fulfillment_overdue, late_payment.
    event: String,
    /// The status before (null at creation), as the orders table spells it.
    from: Option<String>,
    /// The status after.
    to: String,
    /// timeout, sweeper, buyer or shop (api for a client's request the store cannot attribute).
    cause: String,
    /// The timeout kind, for a timeout's or the sweeper's transition.
    kind: Option<&'static str>,
    /// How long after its deadline a timeout was applied, both by the
    /// database's clock; null for a client's request and for transitions
    /// recorded before this release.
    late_ms: Option<i64>,
    /// The instance (`amqp.instance`) that applied a timeout.
    instance: Option<String>,
    /// A sentence for people, when there is more to say.
    detail: Option<String>,
}

/// A transition's domain event.
#[derive(Serialize, ToSchema)]
pub(super) struct EventView {
    /// Its routing key on `<prefix>.events`: `order.<event>`.
    event: String,
    /// published (the broker confirmed it), pending (in the event outbox), or set_aside (the relay gave it up).
    state: &'static str,
    /// When its transition committed (RFC 3339).
    at: String,
    /// Why it was set aside.
    reason: Option<String>,
}

/// A timeout still ahead for the order's current status.
#[derive(Serialize, ToSchema)]
pub(super) struct WaitingView {
    /// payment, fulfillment or receipt.
    kind: &'static str,
    /// Its deadline (RFC 3339).
    due_at: String,
    /// Milliseconds from `now` to it.
    due_in_ms: i64,
}

/// A timeout message of the order in the parked queue.
#[derive(Serialize, ToSchema)]
pub(super) struct ParkedView {
    /// The kind its body or routing key names, if a known one.
    kind: Option<&'static str>,
    /// Why it was parked (`x-parked-reason`), or how it was dead-lettered there.
    reason: String,
    /// Whose reason it is: `router` or `consumer` (the service parked it and
    /// wrote the reason; the router strips such headers from what publishers
    /// send), `broker` (dead-lettered there: the reason is the broker's
    /// `x-death`), or `unknown`.
    parked_by: &'static str,
    /// More on why (`x-parked-detail`).
    detail: Option<String>,
    /// The queue it is in.
    queue: String,
    /// When it was parked (RFC 3339, by the parking instance's clock), if the message says.
    at: Option<String>,
}

/// One order's whole story.
#[derive(Serialize, ToSchema)]
pub(super) struct StoryView {
    /// The order's id, in its canonical spelling.
    id: String,
    /// owned (the service's own tables) or mapped (the shop's table).
    source: &'static str,
    /// Its status as the service names it (for a mapped order, the status the mapping gives that value).
    status: String,
    /// A mapped order's status as the shop's table spells it.
    #[serde(skip_serializing_if = "Option::is_none")]
    status_raw: Option<String>,
    /// The database's clock reading this answer is reckoned from (RFC 3339).
    now: String,
    /// One per kind that has a deadline for this order.
    deadlines: Vec<DeadlineView>,
    /// Every recorded transition, oldest first.
    transitions: Vec<TransitionView>,
    /// The domain event of each transition.
    events: Vec<EventView>,
    /// The timeouts the database says are still ahead for the current status.
    waiting: Vec<WaitingView>,
    /// Its timeout messages found in the parked queue.
    parked: Vec<ParkedView>,
    /// Whether the parked queue could be read (false: `amqp.management_url = off`, the API away, or a quorum queue).
    parked_checked: bool,
    /// Why it could not be.
    #[serde(skip_serializing_if = "Option::is_none")]
    parked_error: Option<String>,
    /// Whether every message of the parked queue was read (at most 200 are).
    parked_complete: bool,
    /// How many messages of the parked queue were read.
    parked_read: u64,
    /// How many it held, by the broker's statistics (a few seconds old).
    parked_in_queue: u64,
}

#[utoipa::path(
    get,
    path = "/admin/orders/{id}",
    tag = "admin",
    params(("id" = String, Path, description = "The order's id, as on the wire")),
    responses(
        (status = 200, description = "The order's status, deadlines, transitions, domain events, the timeouts still ahead and its parked timeouts, by the database's clock", body = StoryView),
        (status = 400, description = "An id these orders cannot have (the service's own are positive integers; a mapped id column's type decides)", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
pub(super) async fn order_story(
    State(ctx): State<Arc<Context>>,
    Path(raw): Path<String>,
) -> Result<Json<StoryView>, ApiError> {
    let key = OrderKey::parse(&raw)
        .and_then(|key| ctx.orders.accept(&key))
        .map_err(ApiError::bad_request)?;
    let now = db::clock::now(&ctx.api_db).await?;
    let Some((story, events)) = ctx.orders.story(&ctx.api_db, &key, now).await? else {
        return Err(ApiError::not_found(format!(
            "order '{}' not found",
            crate::domain::truncate(key.as_str(), 64)
        )));
    };
    let parked = parked_of(&ctx, &story.key).await;
    Ok(Json(view(&ctx, story, events, parked, now)))
}

/// What the parked queue holds of one order, or why it could not be read.
struct ParkedFound {
    views: Vec<ParkedView>,
    error: Option<String>,
    complete: bool,
    read: u64,
    in_queue: u64,
}

/// The order's messages among the first [`PARKED_READ_LIMIT`] of the parked
/// queue. An id is compared in its canonical spelling, as the consumer
/// would have read it.
async fn parked_of(ctx: &Context, key: &OrderKey) -> ParkedFound {
    let not_read = |error: String| ParkedFound {
        views: Vec::new(),
        error: Some(error),
        complete: false,
        read: 0,
        in_queue: 0,
    };
    let Some(api) = ctx.settings.amqp.management.clone() else {
        return not_read("amqp.management_url = off: the parked queue is not read".into());
    };
    let queue = ctx.names.parked();
    let peeked: Peeked = match Management::new(api).peek(&queue, PARKED_READ_LIMIT).await {
        Ok(peeked) => peeked,
        Err(e) => return not_read(e.to_string()),
    };
    let views = peeked
        .messages
        .iter()
        .filter(|m| {
            m.order_id()
                .and_then(|id| OrderKey::parse(&id).ok())
                .and_then(|id| ctx.orders.accept(&id).ok())
                .is_some_and(|id| &id == key)
        })
        .map(|m| parked_view(m, &queue))
        .collect();
    ParkedFound {
        views,
        error: None,
        complete: peeked.complete,
        read: peeked.messages.len() as u64,
        in_queue: peeked.in_queue,
    }
}

/// One parked message: the reason the service's parking wrote, or, for a
/// message the broker dead-lettered there, the broker's own (`x-death`).
fn parked_view(m: &Peek, queue: &str) -> ParkedView {
    let known = |s: &str| s.parse::<TimeoutKind>().ok().map(TimeoutKind::as_str);
    let kind = m
        .body_kind()
        .as_deref()
        .and_then(known)
        .or_else(|| m.header(X_ORIGINAL_ROUTING_KEY).and_then(known))
        .or_else(|| known(&m.routing_key));
    let death = &m.headers["x-death"][0];
    let (reason, parked_by) = match (
        m.parked_by_service(),
        death["reason"].as_str(),
        death["queue"].as_str(),
    ) {
        (Some((reason, by)), ..) => (reason.to_string(), by),
        (None, Some(why), Some(from)) => (format!("dead-lettered ({why}) from {from}"), "broker"),
        _ => (
            "unknown: neither the service's parking headers nor x-death".to_string(),
            "unknown",
        ),
    };
    ParkedView {
        kind,
        reason,
        parked_by,
        detail: m.header(X_PARKED_DETAIL).map(str::to_string),
        queue: queue.to_string(),
        at: m.header(X_PARKED_AT).map(str::to_string),
    }
}

fn view(
    ctx: &Context,
    story: Story,
    events: Vec<EventState>,
    parked: ParkedFound,
    now: Millis,
) -> StoryView {
    StoryView {
        id: story.key.as_str().to_string(),
        source: if ctx.orders.is_owned() {
            "owned"
        } else {
            "mapped"
        },
        status: story.status,
        status_raw: story.status_raw,
        now: now.to_rfc3339(),
        deadlines: story
            .deadlines
            .iter()
            .map(|(kind, at)| DeadlineView {
                kind: kind.as_str(),
                at: at.to_rfc3339(),
                passed: *at <= now,
            })
            .collect(),
        transitions: story.transitions.into_iter().map(transition).collect(),
        events: events
            .into_iter()
            .map(|e| EventView {
                event: e.event,
                state: e.state.as_str(),
                at: e.at.to_rfc3339(),
                reason: e.reason,
            })
            .collect(),
        waiting: story
            .waiting
            .iter()
            .map(|(kind, at)| WaitingView {
                kind: kind.as_str(),
                due_at: at.to_rfc3339(),
                due_in_ms: at.0 - now.0,
            })
            .collect(),
        parked_checked: parked.error.is_none(),
        parked: parked.views,
        parked_error: parked.error,
        parked_complete: parked.complete,
        parked_read: parked.read,
        parked_in_queue: parked.in_queue,
    }
}

fn transition(t: Transition) -> TransitionView {
    TransitionView {
        at: t.at.to_rfc3339(),
        event: t.event,
        from: t.from,
        to: t.to,
        cause: t.cause,
        kind: t.kind.map(TimeoutKind::as_str),
        late_ms: t.late_ms,
        instance: t.instance,
        detail: t.detail,
    }
}

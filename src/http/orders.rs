//! `/orders`: checkout (with `Idempotency-Key`), reading an order, and the
//! buyer's and merchant's actions on it.

use super::*;
use crate::traces;
use tracing::Instrument as _;

/// One line of a new order.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ItemBody {
    sku: String,
    quantity: i64,
}

/// A checkout.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OrderBody {
    items: Vec<ItemBody>,
    payment_window: Option<String>,
}

/// One line of an order, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, ToSchema)]
pub struct ItemView {
    /// The SKU.
    pub sku: String,
    /// How many.
    pub quantity: i64,
}

/// An order as the API shows it. Later deadlines and timestamps appear once they exist.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OrderView {
    /// The id, as a string.
    #[schema(value_type = String, example = "42")]
    pub id: OrderId,
    /// Current status.
    #[schema(value_type = String, example = "pending_payment")]
    pub status: OrderStatus,
    /// What was ordered.
    pub items: Vec<ItemView>,
    /// End of the payment window.
    #[schema(value_type = String, format = DateTime)]
    pub pay_deadline: Millis,
    /// Checkout time.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Millis,
    /// Last change.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Millis,
    /// Incremented by every transition.
    pub version: i32,
    /// Payment time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub paid_at: Option<Millis>,
    /// End of the fulfillment window.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ship_deadline: Option<Millis>,
    /// When the fulfillment timeout found it unshipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub fulfillment_overdue_at: Option<Millis>,
    /// Shipping time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub shipped_at: Option<Millis>,
    /// End of the receipt window.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub confirm_deadline: Option<Millis>,
    /// Completion time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completed_at: Option<Millis>,
    /// Cancellation time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub cancelled_at: Option<Millis>,
    /// When a payment first came after a timeout had cancelled the order: a
    /// refund is due. Recorded once, however often the client retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub late_payment_at: Option<Millis>,
    /// The audit trail, oldest first, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Vec<AuditView>>,
}

/// One audit-trail entry as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, ToSchema)]
pub struct AuditView {
    /// What happened.
    pub event: String,
    /// Status before (absent for `created`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Status after.
    pub to: String,
    /// `api`, `timeout` or `sweeper`.
    pub cause: String,
    /// When.
    #[schema(value_type = String, format = DateTime)]
    pub at: Millis,
    /// More to say, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl From<Order> for OrderView {
    fn from(o: Order) -> Self {
        Self {
            id: o.id,
            status: o.status,
            items: o
                .items
                .into_iter()
                .map(|i| ItemView {
                    sku: i.sku,
                    quantity: i.quantity,
                })
                .collect(),
            pay_deadline: o.pay_deadline,
            created_at: o.created_at,
            updated_at: o.updated_at,
            version: o.version,
            paid_at: o.paid_at,
            ship_deadline: o.ship_deadline,
            fulfillment_overdue_at: o.fulfillment_overdue_at,
            shipped_at: o.shipped_at,
            confirm_deadline: o.confirm_deadline,
            completed_at: o.completed_at,
            cancelled_at: o.cancelled_at,
            late_payment_at: o.late_payment_at,
            audit: o.audit.map(|entries| {
                entries
                    .into_iter()
                    .map(|e| AuditView {
                        event: e.event,
                        from: e.from,
                        to: e.to,
                        cause: e.cause,
                        at: e.at,
                        detail: e.detail,
                    })
                    .collect()
            }),
        }
    }
}

/// The body of a checkout's answer, as stored with its idempotency key so
/// that a retry is answered byte for byte the same.
fn checkout_answer(order: &Order) -> Result<String, serde_json::Error> {
    serde_json::to_string(&OrderView::from(order.clone()))
}

/// Validates a checkout request into items and a window: the default
/// payment window, or the one asked for, at most `windows.max_payment`.
fn checkout_request(
    body: OrderBody,
    windows: &Windows,
) -> Result<(Vec<NewItem>, Duration), ApiError> {
    if body.items.is_empty() {
        return Err(ApiError::unprocessable("an order needs at least one item"));
    }
    if body.items.len() > MAX_ITEMS {
        return Err(ApiError::unprocessable(format!(
            "an order has at most {MAX_ITEMS} items"
        )));
    }
    let mut items: Vec<NewItem> = Vec::with_capacity(body.items.len());
    for item in body.items {
        check_sku(&item.sku)?;
        if !(1..=MAX_QUANTITY).contains(&item.quantity) {
            return Err(ApiError::unprocessable(format!(
                "quantity of '{}' must be from 1 to {MAX_QUANTITY}, got {}",
                item.sku, item.quantity
            )));
        }
        if items.iter().any(|i| i.sku == item.sku) {
            return Err(ApiError::unprocessable(format!(
                "sku '{}' appears twice; give it once with the total",
                item.sku
            )));
        }
        items.push(NewItem {
            sku: item.sku,
            quantity: item.quantity,
        });
    }
    let window = match body.payment_window {
        None => windows.payment,
        Some(text) => parse_window("payment_window", &text)
            .map_err(|e| ApiError::unprocessable(e.to_string()))?,
    };
    if window > windows.max_payment {
        return Err(ApiError::unprocessable(format!(
            "payment_window {} is longer than the maximum, {} (windows.max_payment)",
            humantime::format_duration(window),
            humantime::format_duration(windows.max_payment)
        )));
    }
    Ok((items, window))
}

/// The `Idempotency-Key` of a request, if it has one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let ok = values.next().is_none()
        && (1..=MAX_KEY_BYTES).contains(&bytes.len())
        && bytes.iter().all(u8::is_ascii_graphic);
    match value.to_str() {
        Ok(key) if ok => Ok(Some(key.to_string())),
        _ => Err(ApiError::bad_request(format!(
            "the Idempotency-Key header must be given once, as 1 to {MAX_KEY_BYTES} visible ASCII characters"
        ))),
    }
}

#[utoipa::path(
    post,
    path = "/orders",
    tag = "orders",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters. A retry with the same key and the same request answers the first answer again (with `Idempotent-Replayed: true`) and reserves nothing; keys are the caller's own (per bearer token) and kept `http.idempotency_retention` (24h)"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the caller's span: with `tracing.otlp_endpoint` set, the checkout's span and the order's timeout join that trace; ignored when malformed or tracing is off"),
        ("tracestate" = Option<String>, Header, description = "W3C trace state, passed on with `traceparent`")
    ),
    request_body = OrderBody,
    responses(
        (status = 201, description = "Created `pending_payment`, stock reserved, payment timeout scheduled; or, with `Idempotent-Replayed: true`, the answer that created the order with this Idempotency-Key", body = OrderView,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the first answer given again for a retry with the same Idempotency-Key"))),
        (status = 409, description = "Stock is short; nothing was reserved", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Unknown SKU, quantity outside 1..1000000, no items, a SKU twice, a window under 1 ms or over `windows.max_payment` (default 7 days), or an Idempotency-Key already used for a different request; nothing was reserved", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse, or an Idempotency-Key that is empty, too long or not visible ASCII", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
pub(super) async fn create_order(
    State(ctx): State<Arc<Context>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<OrderBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    // With traces on, the checkout is a span (a child of the caller's own
    // `traceparent`, if it sent one) that the order's timeout carries on.
    let span = traces::span!(
        "checkout",
        otel.kind = "server",
        order.id = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    traces::follow_http(&span, &headers);
    let answer = checkout(ctx, caller, headers, body)
        .instrument(span.clone())
        .await;
    if span.is_none() {
        return answer;
    }
    let response = answer.unwrap_or_else(IntoResponse::into_response);
    span.record("http.response.status_code", response.status().as_u16());
    Ok(response)
}

/// Checkout itself, in its span.
async fn checkout(
    ctx: Arc<Context>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<OrderBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let Json(body) = body?;
    let (items, window) = checkout_request(body, &ctx.live().windows)?;
    let key = key.map(|key| {
        // Keys are the caller's own: another storefront's `cart-1001` is
        // another key (the authentication middleware always sets the caller).
        let scope = caller.map_or_else(
            || Caller::ANONYMOUS.to_string(),
            |Extension(c)| c.scope().to_string(),
        );
        let retention = ctx.settings.http.idempotency_retention;
        IdempotencyKey::new(scope, key, retention, &items, window, checkout_answer)
    });
    // The deadline is stamped by the database's clock, which every instance
    // judges it by (`db::clock`).
    let now = db::clock::now(&ctx.api_db).await?;
    match ctx
        .orders
        .checkout(&ctx.api_db, &items, window, now, key.as_ref())
        .await
    {
        Ok(order) => {
            tracing::Span::current().record("order.id", order.id.to_string());
            ctx.telemetry.order_created(order.id, order.pay_deadline);
            let location = format!("/orders/{}", order.id);
            Ok((
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(OrderView::from(order)),
            )
                .into_response())
        }
        Err(CheckoutError::InsufficientStock {
            sku,
            requested,
            available,
        }) => {
            let message = format!(
                "insufficient stock for sku '{sku}': {requested} requested, {available} available"
            );
            ctx.telemetry
                .checkout_rejected("insufficient_stock", &message);
            Err(ApiError::new(StatusCode::CONFLICT, message))
        }
        Err(CheckoutError::UnknownSku(sku)) => {
            let message = format!("unknown sku '{sku}'");
            ctx.telemetry.checkout_rejected("unknown_sku", &message);
            Err(ApiError::unprocessable(message))
        }
        Err(CheckoutError::Replay { order, answer }) => {
            // The same answer as the first time, byte for byte.
            ctx.telemetry.checkout_replayed(order);
            Ok((
                StatusCode::CREATED,
                [
                    (header::LOCATION, format!("/orders/{order}")),
                    (header::CONTENT_TYPE, "application/json".to_string()),
                    (
                        header::HeaderName::from_static(IDEMPOTENT_REPLAYED),
                        "true".to_string(),
                    ),
                ],
                answer,
            )
                .into_response())
        }
        Err(CheckoutError::KeyReused) => {
            let message = "this Idempotency-Key was already used for a different request (other items or payment window); use a new key for a new order";
            ctx.telemetry
                .checkout_rejected("idempotency_key_reused", message);
            Err(ApiError::unprocessable(message))
        }
        Err(CheckoutError::Db(e)) => Err(e.into()),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct OrderQuery {
    /// `audit` adds the audit trail to the order.
    include: Option<String>,
}

#[utoipa::path(
    get,
    path = "/orders/{id}",
    tag = "orders",
    params(("id" = String, Path, description = "The order id"), OrderQuery),
    responses(
        (status = 200, description = "The order (with its audit trail when `include=audit`)", body = OrderView),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
pub(super) async fn get_order(
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
    Query(query): Query<OrderQuery>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let with_audit = match query.include.as_deref() {
        None => false,
        Some("audit") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "include={} is not known; include=audit adds the audit trail",
                crate::domain::truncate(other, 32)
            )));
        }
    };
    match store::get_order(&ctx.api_db, id, with_audit).await? {
        Some(order) => Ok(Json(OrderView::from(order)).into_response()),
        None => Err(ApiError::not_found(format!("order {id} not found"))),
    }
}

#[utoipa::path(
    post,
    path = "/orders/{id}/{action}",
    tag = "orders",
    params(
        ("id" = String, Path, description = "The order id"),
        ("action" = String, Path, description = "`pay` (inside the window), `confirm` or `cancel` (before payment); shipping is `POST /orders/{id}/ship`")
    ),
    responses(
        (status = 200, description = "The order after the transition", body = OrderView),
        (status = 404, description = "No such order or action", body = ErrorBody),
        (status = 409, description = "The state diagram forbids it; `status` names the current status. A payment after the deadline cancels the order and is recorded as a late payment", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
pub(super) async fn order_action(
    State(ctx): State<Arc<Context>>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    // The action arrives percent-decoded: `%73hip` is `ship` here. Shipping
    // needs the admin scope and has its own route, which the router matches
    // on the path as written; any other spelling that decodes to it is no
    // route of ours, whoever asks.
    match action.parse::<Action>() {
        Ok(Action::Ship) | Err(_) => Err(ApiError::not_found(
            "no such endpoint (actions: pay, confirm, cancel; shipping is POST /orders/{id}/ship)",
        )),
        Ok(action) => act(&ctx, &id, action).await,
    }
}

#[utoipa::path(
    post,
    path = "/orders/{id}/ship",
    tag = "orders",
    params(("id" = String, Path, description = "The order id")),
    responses(
        (status = 200, description = "Shipped: the receipt window starts", body = OrderView),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 409, description = "The state diagram forbids it (only a `paid` order ships); `status` names the current status", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
pub(super) async fn ship_order(
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    act(&ctx, &id, Action::Ship).await
}

/// One action on one order, answered with the order after it.
async fn act(ctx: &Context, id: &str, action: Action) -> Result<Response, ApiError> {
    let id = parse_id(id)?;
    // While an operator has the timeouts this action races paused (payment
    // timeouts, for a payment), an order still waiting for it takes it, even
    // after its deadline.
    let races = crate::domain::edge(crate::domain::Trigger::Action(action)).within;
    let deadline = if races.is_some_and(|kind| ctx.pauses.kind_paused(kind)) {
        store::Deadline::Paused
    } else {
        store::Deadline::Enforced
    };
    // Late or not is judged by the database's clock, like the timeouts.
    let now = db::clock::now(&ctx.api_db).await?;
    match ctx
        .orders
        .act(
            &ctx.api_db,
            id,
            action,
            // Read now: a reload applies new windows to the orders acted on after it.
            &ctx.live().windows,
            now,
            deadline,
        )
        .await
    {
        Ok(order) => {
            ctx.telemetry.order_changed(id, action);
            Ok(Json(OrderView::from(order)).into_response())
        }
        Err(TransitionError::Conflict {
            order,
            reason,
            late_payment,
        }) => {
            ctx.telemetry
                .action_refused(id, action, order.status, late_payment);
            Err(TransitionError::Conflict {
                order,
                reason,
                late_payment,
            }
            .into())
        }
        Err(e) => Err(e.into()),
    }
}

//! The HTTP API (JSON). Errors are `{"error": "..."}` with a fitting status:
//! 400 for a body or path that does not parse, 404 for what does not exist,
//! 409 for a transition the order's state forbids or stock that is short, 422
//! for well-formed input that makes no sense, 503 when the database is away.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::app::Context;
use crate::db;
use crate::db::store::{self, Action, CheckoutError, NewItem, TransitionError};
use crate::domain::{Millis, OrderId, OrderStatus};
use crate::settings::parse_window;

/// Requests are small; anything larger is refused before it is read.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most lines in one order.
const MAX_ITEMS: usize = 100;
/// Most units of one SKU in one order line.
const MAX_QUANTITY: i64 = 1_000_000;
/// Most stock one SKU can be given.
const MAX_STOCK: i64 = 1_000_000_000_000;

/// An API error: a status and a message for people.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// The order's current status, on a 409 about a transition.
    current: Option<OrderStatus>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            current: None,
        }
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(status) = self.current {
            body["status"] = json!(status.as_str());
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        // The cause goes to the log; the client learns only that it is not its fault.
        tracing::error!(error = %e, "database error in an HTTP request");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable; try again",
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = match &rejection {
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, rejection.body_text())
    }
}

impl From<TransitionError> for ApiError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::NotFound(id) => Self::not_found(format!("order {id} not found")),
            TransitionError::Conflict { order, reason } => Self {
                status: StatusCode::CONFLICT,
                message: format!("order {} is {}: {reason}", order.id, order.status),
                current: Some(order.status),
            },
            TransitionError::Db(e) => e.into(),
        }
    }
}

/// All routes over the shared context.
pub fn router(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/inventory/{sku}", put(put_inventory).get(get_inventory))
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(get_order))
        .route("/orders/{id}/{action}", post(order_action))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

fn check_sku(sku: &str) -> Result<(), ApiError> {
    let ok = !sku.is_empty()
        && sku.len() <= 64
        && sku
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "a sku is 1 to 64 characters of A-Z a-z 0-9 - _ . :",
        ))
    }
}

fn parse_id(raw: &str) -> Result<OrderId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::not_found(format!(
            "order '{}' not found",
            crate::domain::truncate(raw, 64)
        ))
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StockBody {
    available: i64,
}

async fn put_inventory(
    State(ctx): State<Arc<Context>>,
    Path(sku): Path<String>,
    body: Result<Json<StockBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    check_sku(&sku)?;
    let Json(body) = body?;
    if !(0..=MAX_STOCK).contains(&body.available) {
        return Err(ApiError::unprocessable(format!(
            "available must be from 0 to {MAX_STOCK}"
        )));
    }
    let stock = store::put_stock(&ctx.db, &sku, body.available, Millis::now()).await?;
    Ok(Json(stock).into_response())
}

async fn get_inventory(
    State(ctx): State<Arc<Context>>,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    check_sku(&sku)?;
    match store::get_stock(&ctx.db, &sku).await? {
        Some(stock) => Ok(Json(stock).into_response()),
        None => Err(ApiError::not_found(format!("sku '{sku}' not found"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    sku: String,
    quantity: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderBody {
    items: Vec<ItemBody>,
    payment_window: Option<String>,
}

/// Validates a checkout request into items and a window.
fn checkout_request(
    body: OrderBody,
    default_window: Duration,
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
        None => default_window,
        Some(text) => parse_window("payment_window", &text)
            .map_err(|e| ApiError::unprocessable(e.to_string()))?,
    };
    Ok((items, window))
}

async fn create_order(
    State(ctx): State<Arc<Context>>,
    body: Result<Json<OrderBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let (items, window) = checkout_request(body, ctx.settings.windows.payment)?;
    match store::checkout(&ctx.db, &items, window, Millis::now()).await {
        Ok(order) => {
            // The outbox row is committed: let the relay publish it now.
            ctx.relay_wakeup.notify_one();
            ctx.events
                .order_created(order.id, &order.pay_deadline.to_rfc3339());
            let location = format!("/orders/{}", order.id);
            Ok((
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(order),
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
            ctx.events.checkout_rejected("insufficient_stock", &message);
            Err(ApiError::new(StatusCode::CONFLICT, message))
        }
        Err(CheckoutError::UnknownSku(sku)) => {
            let message = format!("unknown sku '{sku}'");
            ctx.events.checkout_rejected("unknown_sku", &message);
            Err(ApiError::unprocessable(message))
        }
        Err(CheckoutError::Db(e)) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct OrderQuery {
    /// `audit` adds the audit trail to the order.
    include: Option<String>,
}

async fn get_order(
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
    match store::get_order(&ctx.db, id, with_audit).await? {
        Some(order) => Ok(Json(order).into_response()),
        None => Err(ApiError::not_found(format!("order {id} not found"))),
    }
}

async fn order_action(
    State(ctx): State<Arc<Context>>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let action = match action.as_str() {
        "pay" => Action::Pay,
        "ship" => Action::Ship,
        "confirm" => Action::Confirm,
        "cancel" => Action::Cancel,
        _ => {
            return Err(ApiError::not_found(
                "no such endpoint (actions: pay, ship, confirm, cancel)",
            ));
        }
    };
    let id = parse_id(&id)?;
    match store::act(&ctx.db, id, action, &ctx.settings.windows, Millis::now()).await {
        Ok(order) => {
            // Pay and ship wrote an outbox row: let the relay publish it now.
            ctx.relay_wakeup.notify_one();
            ctx.events.order_changed(id, action);
            Ok(Json(order).into_response())
        }
        Err(TransitionError::Conflict { order, reason }) => {
            ctx.events.action_refused(id, action, order.status);
            Err(TransitionError::Conflict { order, reason }.into())
        }
        Err(e) => Err(e.into()),
    }
}

async fn healthz() -> Response {
    // Touches nothing: the process is alive and serving.
    Json(json!({ "status": "ok" })).into_response()
}

async fn readyz(State(ctx): State<Arc<Context>>) -> Response {
    let database = db::ping(&ctx.db).await;
    let broker = ctx.health.broker();
    let broker_ok = broker.iter().all(|(_, up)| *up);
    let ready = database.is_ok() && broker_ok;
    let body = json!({
        "status": if ready { "ready" } else { "unready" },
        "database": match &database {
            Ok(()) => json!({ "ok": true, "backend": db::backend_name(&ctx.db) }),
            Err(e) => json!({ "ok": false, "error": e.to_string() }),
        },
        "broker": {
            "ok": broker_ok,
            "mode": ctx.resolved_mode().map(|m| m.as_str()),
            "connections": broker.iter().map(|(role, up)| (role.to_string(), json!(up))).collect::<serde_json::Map<_, _>>(),
        },
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(ctx): State<Arc<Context>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        ctx.events.render(),
    )
        .into_response()
}

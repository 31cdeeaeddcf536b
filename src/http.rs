//! The HTTP API (JSON). Errors are `{"error": "..."}` with a fitting status:
//! 400 for a body or path that does not parse, 401 without a valid bearer
//! token, 403 for a token whose scope does not allow the request, 404 for what
//! does not exist, 409 for a transition the order's state forbids or stock that
//! is short, 422 for well-formed input that makes no sense, 503 when the
//! database is away (or, from [`crate::server`], when a request is refused by
//! the server's limits). Authentication ([`crate::auth`]) runs as a middleware
//! after routing and before any handler, so a refused request reads no body
//! and changes nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, Access, Denied, Need, Scope};
use crate::context::Context;
use crate::db;
use crate::db::store::{
    self, Action, CheckoutError, IdempotencyKey, NewItem, OrderView, StockView, TransitionError,
};
use crate::domain::{Millis, OrderId, OrderStatus};
use crate::metrics::Events;
use crate::settings::{Windows, parse_window};

/// Requests are small; anything larger is refused before it is read.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most lines in one order.
const MAX_ITEMS: usize = 100;
/// Most units of one SKU in one order line.
const MAX_QUANTITY: i64 = 1_000_000;
/// Most stock one SKU can be given.
const MAX_STOCK: i64 = 1_000_000_000_000;
/// The request header that makes a checkout safe to retry.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The answer header saying a checkout was answered from its idempotency key.
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Longest idempotency key, in bytes.
const MAX_KEY_BYTES: usize = 255;

/// An API error: a status and a message for people.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// The order's current status, on a 409 about a transition.
    current: Option<OrderStatus>,
    /// The `WWW-Authenticate` challenge, on a 401 or 403.
    challenge: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            current: None,
            challenge: None,
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
        let mut response = (self.status, Json(body)).into_response();
        if let Some(challenge) = self.challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<Denied> for ApiError {
    /// 401 with a challenge without a valid token (RFC 6750: `invalid_token`
    /// when one was presented), 403 naming the scope for a token that has
    /// another.
    fn from(denied: Denied) -> Self {
        let (status, message, challenge) = match denied {
            Denied::Missing => (
                StatusCode::UNAUTHORIZED,
                "this endpoint needs a bearer token: Authorization: Bearer <token>".to_string(),
                "Bearer",
            ),
            Denied::Invalid => (
                StatusCode::UNAUTHORIZED,
                "the bearer token is not valid".to_string(),
                "Bearer error=\"invalid_token\"",
            ),
            Denied::Forbidden { needs } => (
                StatusCode::FORBIDDEN,
                format!("this needs a token of the {} scope", needs.as_str()),
                match needs {
                    Scope::Admin => "Bearer error=\"insufficient_scope\", scope=\"admin\"",
                    Scope::Checkout => "Bearer error=\"insufficient_scope\", scope=\"checkout\"",
                },
            ),
        };
        Self {
            challenge: Some(challenge),
            ..Self::new(status, message)
        }
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
            TransitionError::Conflict { order, reason, .. } => Self {
                current: Some(order.status),
                ..Self::new(
                    StatusCode::CONFLICT,
                    format!("order {} is {}: {reason}", order.id, order.status),
                )
            },
            TransitionError::Db(e) => e.into(),
        }
    }
}

/// The OpenAPI document's frame; every path in it comes from a handler's
/// `#[utoipa::path]` through [`OpenApiRouter`], so a route cannot exist
/// undocumented or be documented without existing.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "order-timeout",
        description = "Closes e-commerce orders whose deadline passed: RabbitMQ keeps the deadlines, the database decides. Ids are strings, times RFC 3339 UTC, errors `{\"error\": \"...\"}`."
    ),
    tags(
        (name = "inventory", description = "Stock per SKU"),
        (name = "orders", description = "Checkout and the order lifecycle"),
        (name = "operations", description = "Health, readiness, metrics")
    )
)]
struct ApiDoc;

/// An error answer.
#[derive(Serialize, ToSchema)]
struct ErrorBody {
    /// What is wrong, for people.
    error: String,
    /// The order's current status, on a 409 about a transition.
    #[schema(nullable = false)]
    status: Option<String>,
}

/// The name of the bearer scheme in the OpenAPI document.
const BEARER: &str = "bearer";

/// The routes and the OpenAPI document they make, with the security each
/// route asks for (`/readyz` and `/metrics` too when `protect_operations`).
fn routes(protect_operations: bool) -> (Router<Arc<Context>>, utoipa::openapi::OpenApi) {
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(put_inventory, get_inventory))
        .routes(routes!(create_order))
        .routes(routes!(get_order))
        .routes(routes!(order_action))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .split_for_parts();
    declare_security(&mut doc, protect_operations);
    (router, doc)
}

/// Adds the bearer scheme and, to every operation that needs a token, its
/// requirement (the scope as a role name, which OpenAPI 3.1 allows for http
/// schemes) and its 401 and 403 answers. What needs what comes from
/// [`auth::need`], the function the middleware asks, so the two cannot differ.
fn declare_security(doc: &mut utoipa::openapi::OpenApi, protect_operations: bool) {
    let scheme = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some(
            "A token from `http.checkout_tokens` (checkout and the buyer's actions) or \
             `http.admin_tokens` (also inventory and `ship`). A service bound to loopback \
             with no token configured asks for none.",
        ))
        .build();
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        let scopes: Vec<&str> = match auth::need(Some(path), None) {
            Need::Open => continue,
            Need::Operations if !protect_operations => continue,
            Need::Operations => Vec::new(),
            Need::Scope(scope) => vec![scope.as_str()],
        };
        // Shipping is the one action of the admin scope.
        let admin_somewhere = auth::need(Some(path), Some("ship")) == Need::Scope(Scope::Admin);
        for op in [&mut item.get, &mut item.put, &mut item.post]
            .into_iter()
            .flatten()
        {
            op.security = Some(vec![SecurityRequirement::new(BEARER, scopes.clone())]);
            op.responses.responses.insert(
                "401".into(),
                error("No bearer token, or one that is not valid (`WWW-Authenticate: Bearer`); nothing was done").into(),
            );
            if admin_somewhere {
                op.responses.responses.insert(
                    "403".into(),
                    error("A valid token without the admin scope (inventory and `ship` need it); nothing was done").into(),
                );
            }
        }
    }
}

/// The OpenAPI document of the HTTP API as `/openapi.json` serves it with
/// `http.protect_operations` off (the default).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes(false).1
}

/// What the authentication middleware needs.
struct Gate {
    /// The tokens and what they may do.
    access: Access,
    /// Where refusals are counted.
    events: Arc<Events>,
}

/// All routes over the shared context.
pub fn router(ctx: Arc<Context>) -> Router {
    let (routes, doc) = routes(ctx.settings.http.protect_operations);
    let doc = Arc::new(doc);
    let gate = Arc::new(Gate {
        access: Access::new(&ctx.settings.http),
        events: ctx.events.clone(),
    });
    routes
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { Json(doc.as_ref().clone()) }
            }),
        )
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        })
        // `Router::layer` wraps each route after matching, so the middleware
        // sees the matched template; it runs before the body limit and any
        // extractor, so a refused request is never read.
        .layer(middleware::from_fn_with_state(gate, authenticate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

/// The authentication middleware: what the matched route needs, against the
/// request's `Authorization` header.
async fn authenticate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let action = request.uri().path().rsplit('/').next();
    let need = auth::need(template, action);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match gate.access.check(need, authorization) {
        Ok(()) => next.run(request).await,
        Err(denied) => {
            gate.events.auth_refused(
                denied.reason(),
                request.method().as_str(),
                &crate::domain::truncate(request.uri().path(), 64),
            );
            ApiError::from(denied).into_response()
        }
    }
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

/// New stock for a SKU.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StockBody {
    available: i64,
}

#[utoipa::path(
    put,
    path = "/inventory/{sku}",
    tag = "inventory",
    params(("sku" = String, Path, description = "1 to 64 of A-Z a-z 0-9 - _ . :")),
    request_body = StockBody,
    responses(
        (status = 200, description = "The SKU's stock; `available` set (restocking)", body = StockView),
        (status = 422, description = "`available` outside 0..10^12", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
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
    let stock = store::put_stock(&ctx.api_db, &sku, body.available, Millis::now()).await?;
    Ok(Json(stock).into_response())
}

#[utoipa::path(
    get,
    path = "/inventory/{sku}",
    tag = "inventory",
    params(("sku" = String, Path, description = "The SKU")),
    responses(
        (status = 200, description = "The SKU's stock", body = StockView),
        (status = 404, description = "Unknown SKU", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
async fn get_inventory(
    State(ctx): State<Arc<Context>>,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    check_sku(&sku)?;
    match store::get_stock(&ctx.api_db, &sku).await? {
        Some(stock) => Ok(Json(stock).into_response()),
        None => Err(ApiError::not_found(format!("sku '{sku}' not found"))),
    }
}

/// One line of a new order.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    sku: String,
    quantity: i64,
}

/// A checkout.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct OrderBody {
    items: Vec<ItemBody>,
    payment_window: Option<String>,
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
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters. A retry with the same key and the same request answers the first answer again (with `Idempotent-Replayed: true`) and reserves nothing; the key is kept with the order")
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
async fn create_order(
    State(ctx): State<Arc<Context>>,
    headers: HeaderMap,
    body: Result<Json<OrderBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let Json(body) = body?;
    let (items, window) = checkout_request(body, &ctx.settings.windows)?;
    let key = key.map(|key| IdempotencyKey::new(key, &items, window));
    match store::checkout(&ctx.api_db, &items, window, Millis::now(), key.as_ref()).await {
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
        Err(CheckoutError::Replay { order, answer }) => {
            // The same answer as the first time, byte for byte.
            ctx.events.checkout_replayed(order);
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
            ctx.events
                .checkout_rejected("idempotency_key_reused", message);
            Err(ApiError::unprocessable(message))
        }
        Err(CheckoutError::Db(e)) => Err(e.into()),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct OrderQuery {
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
    match store::get_order(&ctx.api_db, id, with_audit).await? {
        Some(order) => Ok(Json(order).into_response()),
        None => Err(ApiError::not_found(format!("order {id} not found"))),
    }
}

#[utoipa::path(
    post,
    path = "/orders/{id}/{action}",
    tag = "orders",
    params(
        ("id" = String, Path, description = "The order id"),
        ("action" = String, Path, description = "`pay` (inside the window), `ship`, `confirm` or `cancel` (before payment)")
    ),
    responses(
        (status = 200, description = "The order after the transition", body = OrderView),
        (status = 404, description = "No such order or action", body = ErrorBody),
        (status = 409, description = "The state diagram forbids it; `status` names the current status. A payment after the deadline cancels the order and is recorded as a late payment", body = ErrorBody),
        (status = 400, description = "A body or path that does not parse", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody)
    )
)]
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
    match store::act(
        &ctx.api_db,
        id,
        action,
        &ctx.settings.windows,
        Millis::now(),
    )
    .await
    {
        Ok(order) => {
            // Pay and ship wrote an outbox row: let the relay publish it now.
            ctx.relay_wakeup.notify_one();
            ctx.events.order_changed(id, action);
            Ok(Json(order).into_response())
        }
        Err(TransitionError::Conflict {
            order,
            reason,
            late_payment,
        }) => {
            ctx.events
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

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process is alive (touches nothing)", body = serde_json::Value))
)]
async fn healthz() -> Response {
    // Touches nothing: the process is alive and serving.
    Json(json!({ "status": "ok" })).into_response()
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Database and every broker role ready; per dependency", body = serde_json::Value),
        (status = 503, description = "Something is not ready; the body says what", body = serde_json::Value)
    )
)]
async fn readyz(State(ctx): State<Arc<Context>>) -> Response {
    let database = db::ping(&ctx.api_db).await;
    // The cause goes to the log; anonymous callers get a fixed sentence, not
    // the driver's text (host names, database and user names).
    ctx.events
        .database_checked(database.as_ref().err().map(|e| e.to_string()).as_deref());
    let broker = ctx.health.broker();
    let broker_ok = broker.iter().all(|(_, up)| *up);
    let ready = database.is_ok() && broker_ok;
    let body = json!({
        "status": if ready { "ready" } else { "unready" },
        "database": match &database {
            Ok(()) => json!({ "ok": true, "backend": db::backend_name(&ctx.api_db) }),
            Err(_) => json!({ "ok": false, "error": "the database did not answer; the service log says why" }),
        },
        "broker": {
            "ok": broker_ok,
            "mode": ctx.resolved_mode().map(|m| m.as_str()),
            "connections": broker.iter().map(|(role, up)| (role.as_str().to_string(), json!(up))).collect::<serde_json::Map<_, _>>(),
        },
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String))
)]
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

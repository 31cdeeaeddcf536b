//! The HTTP API (JSON). Errors are `{"error": "..."}` with a fitting status:
//! 400 for a body or path that does not parse, 401 without a valid bearer
//! token, 403 for a token whose scope does not allow the request (or a foreign
//! `Origin`), 404 for what does not exist, 409 for a transition the order's
//! state forbids or stock that is short, 415 for a state-changing request that
//! does not say `Content-Type: application/json`, 421 for a foreign `Host` on
//! a token-less API ([`cross_site`]), 422 for well-formed input that makes no
//! sense, 503 when the
//! database is away (or, from [`crate::server`], when a request is refused by
//! the server's limits). Authentication ([`crate::auth`]) runs as a middleware
//! after routing and before any handler, so a refused request reads no body
//! and changes nothing. The scope a request needs comes from the route the
//! router matched, never from the path as the client spelled it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, Access, Caller, Denied, Need, Scope};
use crate::context::Context;
use crate::db;
use crate::db::store::{
    self, Action, CheckoutError, IdempotencyKey, NewItem, Order, SkuStock, TransitionError,
};
use crate::domain::{Millis, OrderId, OrderStatus};
use crate::settings::{Windows, parse_window};

mod admin;
mod cross_site;
mod deadlines;
pub(crate) mod idempotency;
mod inventory;
mod operations;
mod orders;
mod overview;
mod shadow;
mod story;
pub mod ui;

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
    /// Why the database failed the request: for the log, never the client.
    database_failure: Option<String>,
}

/// A response's database failure, for [`authenticate`] to report through
/// the events once the handler has answered.
#[derive(Debug, Clone)]
struct DatabaseFailure(String);

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            current: None,
            challenge: None,
            database_failure: None,
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
        if let Some(cause) = self.database_failure {
            response.extensions_mut().insert(DatabaseFailure(cause));
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
            // No token would do: no challenge.
            Denied::Undeclared => {
                return Self::new(
                    StatusCode::FORBIDDEN,
                    "this endpoint declares no access rule, so it is refused to everyone",
                );
            }
        };
        Self {
            challenge: Some(challenge),
            ..Self::new(status, message)
        }
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        // The cause goes to the log (see `authenticate`); the client learns
        // only that it is not its fault.
        Self {
            database_failure: Some(e.to_string()),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; try again",
            )
        }
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
        (name = "operations", description = "Health, readiness, metrics"),
        (name = "admin", description = "Pause and resume a role, reload the settings, see what runs, follow one order (`order-timeout ctl`, the page `/ui`)")
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
        .routes(routes!(inventory::put_inventory, inventory::get_inventory))
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(orders::order_action))
        .routes(routes!(orders::ship_order))
        .routes(routes!(operations::healthz))
        .routes(routes!(operations::readyz))
        .routes(routes!(operations::metrics))
        .routes(routes!(admin::status))
        .routes(routes!(admin::pause))
        .routes(routes!(admin::resume))
        .routes(routes!(admin::reload))
        .routes(routes!(overview::overview))
        .routes(routes!(story::order_story))
        .routes(routes!(deadlines::deadlines))
        .routes(routes!(shadow::shadow))
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
             `http.admin_tokens` (also inventory, `ship` and `/admin`). A service bound to loopback \
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
        // A state-changing request without `Content-Type: application/json`
        // is refused before anything else (see `cross_site`).
        for op in [&mut item.put, &mut item.post].into_iter().flatten() {
            op.responses
                .responses
                .entry("415".into())
                .or_insert_with(|| error("Not `Content-Type: application/json`, which every PUT and POST needs, with a body or without; nothing was done").into());
        }
        let need = auth::need(Some(path));
        let scopes: Vec<&str> = match need {
            Need::Open | Need::Undeclared => continue,
            Need::Operations if !protect_operations => continue,
            Need::Operations => Vec::new(),
            Need::Scope(scope) => vec![scope.as_str()],
        };
        for op in [&mut item.get, &mut item.put, &mut item.post]
            .into_iter()
            .flatten()
        {
            op.security = Some(vec![SecurityRequirement::new(BEARER, scopes.clone())]);
            op.responses.responses.insert(
                "401".into(),
                error("No bearer token, or one that is not valid (`WWW-Authenticate: Bearer`); nothing was done").into(),
            );
            if need == Need::Scope(Scope::Admin) {
                op.responses.responses.insert(
                    "403".into(),
                    error("A valid token without the admin scope (inventory, `ship` and `/admin` need it); nothing was done").into(),
                );
            }
        }
    }
}

/// Where the OpenAPI document is served.
const OPENAPI_PATH: &str = "/openapi.json";

/// The OpenAPI document of the HTTP API as `/openapi.json` serves it with
/// `http.protect_operations` off (the default).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes(false).1
}

/// All routes over the shared context.
pub fn router(ctx: Arc<Context>) -> Router {
    let (routes, doc) = routes(ctx.settings.http.protect_operations);
    let doc = Arc::new(doc);
    let owned = ctx.orders.is_owned();
    let anonymous = !ctx.settings.http.has_tokens();
    routes
        // The operator's page: static, open; its script calls the admin API.
        .merge(ui::routes())
        .route(
            OPENAPI_PATH,
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
        .layer(middleware::from_fn_with_state(ctx.clone(), authenticate))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            orders_api_gate(owned, request, next)
        }))
        // Outermost: what a web page may not send is refused before routing
        // or tokens matter (`cross_site`).
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            cross_site::guard(anonymous, request, next)
        }))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

/// With a shop's own table (`orders.source = mapped`), the shop's code
/// places and changes orders: the checkout, order and inventory endpoints
/// answer 404 saying so, whoever asks.
async fn orders_api_gate(owned: bool, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if !owned && (path.starts_with("/orders") || path.starts_with("/inventory")) {
        return ApiError::not_found(
            "this instance acts on the shop's own orders table (`orders.source = mapped`): \
             orders and stock are placed and changed by the shop's code, not through this API",
        )
        .into_response();
    }
    next.run(request).await
}

/// The authentication middleware: what the matched route needs, against the
/// request's `Authorization` header, checked against the tokens in effect now
/// (a reload may have rotated them); and, once a handler has answered, the
/// report of a database failure it met.
async fn authenticate(State(ctx): State<Arc<Context>>, request: Request, next: Next) -> Response {
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    // The matched route alone decides: never the path as the client spelled it.
    let need = auth::need(template);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    // The settings in effect are taken for this decision only, not held
    // while the handler runs.
    let (decision, caller) = {
        let live = ctx.live();
        let access = Access::new(&live.http);
        let decision = access.check(need, authorization);
        // Whose request it is (a hash of its token): its idempotency keys are its own.
        (
            decision,
            auth::Caller::of(access.has_tokens(), authorization),
        )
    };
    match decision {
        Ok(()) => {
            let mut request = request;
            request.extensions_mut().insert(caller);
            // Cheap clones (shared bytes); the path is only worded on a failure.
            let (method, uri) = (request.method().clone(), request.uri().clone());
            let response = next.run(request).await;
            if let Some(DatabaseFailure(cause)) = response.extensions().get() {
                let path = crate::domain::truncate(uri.path(), 64);
                ctx.telemetry
                    .request_database_failed(method.as_str(), &path, cause);
            }
            response
        }
        Err(denied) => {
            ctx.telemetry.auth_refused(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Default deny holds only if no route is left undeclared: every route
    /// the router is built from (the documented ones, the page's files and
    /// the document itself) has a need of its own.
    #[test]
    fn every_route_declares_what_it_needs() {
        let (_, doc) = routes(false);
        let mut paths: Vec<&str> = doc.paths.paths.keys().map(String::as_str).collect();
        paths.extend(ui::FILES.iter().map(|(path, ..)| *path));
        paths.push(OPENAPI_PATH);
        assert!(paths.len() >= 20, "{paths:?}");
        for path in paths {
            assert_ne!(auth::need(Some(path)), Need::Undeclared, "{path}");
        }
    }
}

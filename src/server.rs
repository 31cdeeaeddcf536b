//! Serving the HTTP API, with the limits that keep slow or too many clients
//! from holding the service: a header-read timeout, a cap on open connections,
//! a cap on requests in flight and a request timeout.
//!
//! `axum::serve` has none of these (it gives hyper no timer, so hyper's own
//! header-read timeout is off): this module runs hyper's HTTP/1 connection
//! itself, with a timer, in an accept loop that stops accepting at the cap,
//! and drains in-flight requests on shutdown as `axum::serve` did.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::settings::HttpSettings;
use crate::telemetry::Telemetry;

/// What an overloaded server asks clients to wait before trying again, in seconds.
const RETRY_AFTER_SECS: &str = "1";
/// Pause after an accept error (out of file descriptors, say), so the loop
/// does not spin while the cause lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` fires, then stops accepting
/// and waits for the requests in flight (idle connections are closed).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: HttpSettings,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
) {
    let app = with_limits(router, &settings, telemetry.clone());
    let mut http = http1::Builder::new();
    // hyper's header-read timeout needs a timer; it also ends idle
    // keep-alive connections, since the next request head is awaited the same way.
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    let connections = Arc::new(Semaphore::new(settings.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        // At the cap the loop stops accepting: further clients wait in the
        // kernel's backlog instead of each getting a task and a socket here.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    telemetry.accept_failed(&e.to_string());
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        let telemetry = telemetry.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                telemetry.connection_failed(&e.to_string());
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The per-request limits, shared by every connection.
struct Limits {
    /// One permit per request being handled (`http.max_in_flight`).
    in_flight: Semaphore,
    /// `http.request_timeout`.
    timeout: Duration,
    /// Counts and logs refusals.
    telemetry: Arc<Telemetry>,
}

/// `router` with the in-flight cap and the request timeout around every route.
/// Outermost, so they bound whatever the routes do, authentication included.
pub fn with_limits(router: Router, settings: &HttpSettings, telemetry: Arc<Telemetry>) -> Router {
    let limits = Arc::new(Limits {
        in_flight: Semaphore::new(settings.max_in_flight),
        timeout: settings.request_timeout,
        telemetry,
    });
    router.layer(middleware::from_fn_with_state(limits, limit))
}

async fn limit(State(limits): State<Arc<Limits>>, request: Request, next: Next) -> Response {
    // These touch no database: an overloaded instance still answers that it
    // is alive and what its metrics say.
    if matches!(request.uri().path(), "/healthz" | "/metrics") {
        return next.run(request).await;
    }
    // Refuse at once rather than queue: a queue of requests waiting for the
    // database pool only makes every one of them late.
    let Ok(_permit) = limits.in_flight.try_acquire() else {
        limits
            .telemetry
            .request_refused("overloaded", request.uri().path());
        let mut response = refusal("the server is busy; try again shortly");
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECS),
        );
        return response;
    };
    let path = request.uri().path().to_string();
    // On timeout the handler's future is dropped: its database work stops
    // (an open transaction rolls back) and its permit is free again.
    match tokio::time::timeout(limits.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            limits.telemetry.request_refused("timeout", &path);
            refusal(&format!(
                "the request took longer than {}; it was abandoned, and may or may not have taken effect",
                humantime::format_duration(limits.timeout)
            ))
        }
    }
}

/// A 503 in the API's error shape.
fn refusal(message: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({ "error": message })),
    )
        .into_response()
}

//! `/healthz`, `/readyz` and `/metrics`.

use super::*;

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process is alive (touches nothing)", body = serde_json::Value))
)]
pub(super) async fn healthz() -> Response {
    // Touches nothing: the process is alive and serving.
    Json(json!({ "status": "ok" })).into_response()
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Database and every broker role ready; per dependency, and the roles paused with who paused them, when and in which scope (a pause is deliberate: it leaves the instance ready)", body = serde_json::Value),
        (status = 503, description = "Something is not ready; the body says what", body = serde_json::Value)
    )
)]
pub(super) async fn readyz(State(ctx): State<Arc<Context>>) -> Response {
    let database = db::ping(&ctx.api_db).await;
    // The cause goes to the log; anonymous callers get a fixed sentence, not
    // the driver's text (host names, database and user names).
    ctx.telemetry
        .database_checked(database.as_ref().err().map(|e| e.to_string()).as_deref());
    let broker = ctx.health.broker();
    let broker_ok = broker.iter().all(|(_, up)| *up);
    // A kind whose zone a new order contradicted closes nothing: not ready.
    let zone = ctx.zone_checks.mismatched();
    let ready = database.is_ok() && broker_ok && zone.is_empty();
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
            // The node (`host:port` of `amqp.url`) each connection is on.
            "nodes": ctx.health.nodes().iter().map(|(role, node)| (role.as_str().to_string(), json!(node))).collect::<serde_json::Map<_, _>>(),
        },
        // A mapped table read in a guessed zone (`zone_check`): per kind,
        // unconfirmed (held until a new order confirms it), fits, or off
        // (held, unready), with the sentence the log and doctor give.
        "time_zone": {
            "ok": zone.is_empty(),
            "kinds": ctx.zone_checks.all().into_iter().map(|(kind, v)| {
                let detail = ctx.orders.mapped().map(|m| crate::zone_check::describe(m, kind, &v));
                (kind.as_str().to_string(), json!({ "state": v.state(), "detail": detail }))
            }).collect::<serde_json::Map<_, _>>(),
        },
        // Paused in either scope; `pauses` says by whom, since when and in
        // which scope (shared: every instance; instance: this one only).
        "paused": ctx.pauses.paused().iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "pauses": super::admin::pause_entries(&ctx),
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
pub(super) async fn metrics(State(ctx): State<Arc<Context>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        ctx.telemetry.render(),
    )
        .into_response()
}

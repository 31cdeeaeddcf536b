//! `/admin/*`: what an operator does to a running instance (admin scope):
//! see what is paused and what a reload left for a restart, pause and resume
//! a role, reload the settings. `order-timeout ctl` calls these.

use super::*;
use crate::control::Pausable;
use crate::reload::{ReloadError, Reloaded};
use crate::settings::Change;

/// One role: whether it is paused, and since when.
#[derive(Serialize, ToSchema)]
pub(super) struct RoleView {
    /// payment, fulfillment, receipt (the consumer of that kind), router, relay or sweeper.
    role: &'static str,
    /// Whether it is paused.
    paused: bool,
    /// When it was paused (RFC 3339), while it is.
    since: Option<String>,
    /// Whether the role runs on this instance at all (`relay.enabled`,
    /// `sweeper.enabled`); one that does not cannot be paused.
    enabled: bool,
}

/// A setting whose new value waits for a restart.
#[derive(Serialize, ToSchema)]
pub(super) struct RestartView {
    /// The dotted key.
    key: &'static str,
    /// The value it runs with (secrets redacted).
    running: String,
    /// The value the settings now give it.
    configured: String,
}

/// A setting a reload changed while running.
#[derive(Serialize, ToSchema)]
pub(super) struct ChangeView {
    /// The dotted key.
    key: &'static str,
    /// Its value before.
    from: String,
    /// Its value now.
    to: String,
}

/// The last reload.
#[derive(Serialize, ToSchema)]
pub(super) struct ReloadStatusView {
    /// When it was (RFC 3339); null before the first.
    last_at: Option<String>,
    /// applied, unchanged or refused; null before the first.
    last_outcome: Option<&'static str>,
    /// Settings changed since the start that only a restart applies.
    restart_needed: Vec<RestartView>,
}

/// What an instance runs and what is paused.
#[derive(Serialize, ToSchema)]
pub(super) struct StatusView {
    /// `amqp.instance`.
    instance: String,
    /// The delay mode in effect (null until resolved).
    mode: Option<&'static str>,
    /// Every pausable role.
    roles: Vec<RoleView>,
    /// Reloads.
    reload: ReloadStatusView,
}

/// A role after a pause or resume.
#[derive(Serialize, ToSchema)]
pub(super) struct PauseView {
    /// The role.
    role: &'static str,
    /// Whether it is paused now.
    paused: bool,
    /// Whether this request changed that (false: it already was).
    changed: bool,
}

/// What a reload did.
#[derive(Serialize, ToSchema)]
pub(super) struct ReloadView {
    /// applied (a setting changed while running) or unchanged.
    outcome: &'static str,
    /// The settings changed, in effect now.
    changed: Vec<ChangeView>,
    /// Settings changed since the start that only a restart applies.
    restart_needed: Vec<RestartView>,
    /// Anything applied otherwise than asked (`log.level` under `RUST_LOG`).
    notes: Vec<String>,
}

/// A reload refused: the new settings do not validate.
#[derive(Serialize, ToSchema)]
pub(super) struct ReloadRefusedView {
    /// The first wrong value, named by its key.
    error: String,
    /// Always `refused`.
    outcome: &'static str,
}

fn restart_views(changes: &[Change]) -> Vec<RestartView> {
    changes
        .iter()
        .map(|c| RestartView {
            key: c.key,
            running: c.from.clone(),
            configured: c.to.clone(),
        })
        .collect()
}

/// The setting that keeps `role` from running on this instance, if one does.
fn disabled(ctx: &Context, role: Pausable) -> Option<&'static str> {
    match role {
        Pausable::Relay if !ctx.settings.relay.enabled => Some("relay.enabled"),
        Pausable::Sweeper if !ctx.settings.sweeper.enabled => Some("sweeper.enabled"),
        _ => None,
    }
}

#[utoipa::path(
    get,
    path = "/admin/status",
    tag = "admin",
    responses((status = 200, description = "Every pausable role, and what a reload left for a restart", body = StatusView))
)]
pub(super) async fn status(State(ctx): State<Arc<Context>>) -> Json<StatusView> {
    let reload = ctx.reloader.status();
    Json(StatusView {
        instance: ctx.settings.amqp.instance.clone(),
        mode: ctx.resolved_mode().map(|m| m.as_str()),
        roles: ctx
            .pauses
            .snapshot()
            .into_iter()
            .map(|(role, since)| RoleView {
                role: role.as_str(),
                paused: since.is_some(),
                since: since.map(Millis::to_rfc3339),
                enabled: disabled(&ctx, role).is_none(),
            })
            .collect(),
        reload: ReloadStatusView {
            last_at: reload.last_at.map(Millis::to_rfc3339),
            last_outcome: reload.last_outcome.map(|o| o.as_str()),
            restart_needed: restart_views(&reload.restart_needed),
        },
    })
}

#[utoipa::path(
    post,
    path = "/admin/pause/{role}",
    tag = "admin",
    params(("role" = String, Path, description = Pausable::help())),
    responses(
        (status = 200, description = "Paused: a consumer or the router settles what it holds and leaves the rest in its queue; the relay and the sweeper skip their rounds. The sweeper also leaves a paused consumer's kind alone. Answered once the role's transactions under way have ended: from then on none of its changes starts until it is resumed", body = PauseView),
        (status = 400, description = "No such role", body = ErrorBody),
        (status = 409, description = "The role does not run on this instance", body = ErrorBody)
    )
)]
pub(super) async fn pause(
    State(ctx): State<Arc<Context>>,
    Path(role): Path<String>,
) -> Result<Json<PauseView>, ApiError> {
    set_paused(&ctx, &role, true).await
}

#[utoipa::path(
    post,
    path = "/admin/resume/{role}",
    tag = "admin",
    params(("role" = String, Path, description = Pausable::names_in_prose())),
    responses(
        (status = 200, description = "Running again: a consumer catches up with what waited in its queue, late and never early", body = PauseView),
        (status = 400, description = "No such role", body = ErrorBody),
        (status = 409, description = "The role does not run on this instance", body = ErrorBody)
    )
)]
pub(super) async fn resume(
    State(ctx): State<Arc<Context>>,
    Path(role): Path<String>,
) -> Result<Json<PauseView>, ApiError> {
    set_paused(&ctx, &role, false).await
}

async fn set_paused(ctx: &Context, role: &str, paused: bool) -> Result<Json<PauseView>, ApiError> {
    let role: Pausable = role.parse().map_err(ApiError::bad_request)?;
    if let Some(key) = disabled(ctx, role) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the {role} does not run on this instance ({key} = false)"),
        ));
    }
    // A pause answers only once the role's transactions under way have
    // committed: an operator can trust that nothing changes after the 200.
    let changed = if paused {
        ctx.pauses.pause(role).await
    } else {
        ctx.pauses.set(role, false)
    };
    match (changed, paused) {
        (true, true) => ctx.telemetry.role_paused(role),
        (true, false) => ctx.telemetry.role_resumed(role),
        (false, _) => {}
    }
    Ok(Json(PauseView {
        role: role.as_str(),
        paused,
        changed,
    }))
}

#[utoipa::path(
    post,
    path = "/admin/reload",
    tag = "admin",
    responses(
        (status = 200, description = "The settings were read again from the layers of the start; those that can change while running are applied, the others reported", body = ReloadView),
        (status = 422, description = "The new settings do not validate: none is applied, the running ones stay", body = ReloadRefusedView),
        (status = 409, description = "This instance has no settings source to read again", body = ErrorBody)
    )
)]
pub(super) async fn reload(State(ctx): State<Arc<Context>>) -> Result<Response, ApiError> {
    // Reads a file: off the async workers.
    let reloaded = tokio::task::spawn_blocking(move || ctx.reload())
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the reload failed: {e}"),
            )
        })?;
    match reloaded {
        Ok(reloaded) => Ok(Json(reload_view(reloaded)).into_response()),
        Err(ReloadError::Refused(error)) => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(ReloadRefusedView {
                error,
                outcome: "refused",
            }),
        )
            .into_response()),
        Err(e @ ReloadError::NoSource) => Err(ApiError::new(StatusCode::CONFLICT, e.to_string())),
    }
}

fn reload_view(reloaded: Reloaded) -> ReloadView {
    ReloadView {
        outcome: reloaded.outcome.as_str(),
        changed: reloaded
            .changed
            .into_iter()
            .map(|c| ChangeView {
                key: c.key,
                from: c.from,
                to: c.to,
            })
            .collect(),
        restart_needed: restart_views(&reloaded.restart_needed),
        notes: reloaded.notes,
    }
}

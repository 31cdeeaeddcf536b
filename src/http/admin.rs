//! `/admin/*`: what an operator does to a running instance (admin scope):
//! see what is paused and what a reload left for a restart, pause and resume
//! a role, reload the settings. `order-timeout ctl` calls these.

use super::*;
use crate::control::{Pausable, Pause, PauseScope};
use crate::pausing::{self, PausingError};
use crate::reload::{ReloadError, Reloaded};
use crate::settings::Change;

/// One pause of a role: its scope, who made it, when and why.
#[derive(Serialize, ToSchema)]
pub(super) struct PauseEntryView {
    /// shared (every instance, kept in the database) or instance (this one only, in memory).
    scope: &'static str,
    /// When (RFC 3339), by the database's clock.
    since: String,
    /// Who asked: `token sha256:` and the first 12 hex digits of the token's hash, or `anonymous`.
    by: String,
    /// The instance that was asked (`amqp.instance`).
    instance: String,
    /// The reason given with the pause, if any.
    reason: Option<String>,
}

impl PauseEntryView {
    fn new(scope: PauseScope, pause: &Pause) -> Self {
        Self {
            scope: scope.as_str(),
            since: pause.since.to_rfc3339(),
            by: pause.by.clone(),
            instance: pause.instance.clone(),
            reason: pause.reason.clone(),
        }
    }
}

/// One pause of one role, as `/readyz` lists it.
#[derive(Serialize)]
pub(super) struct RolePauseView {
    /// The role.
    role: &'static str,
    /// The pause.
    #[serde(flatten)]
    pause: PauseEntryView,
}

/// Every pause in effect on this instance, role by role (`/readyz`'s `pauses`).
pub(super) fn pause_entries(ctx: &Context) -> Vec<RolePauseView> {
    ctx.pauses
        .snapshot()
        .iter()
        .flat_map(|(role, state)| {
            state.pauses().map(move |(scope, pause)| RolePauseView {
                role: role.as_str(),
                pause: PauseEntryView::new(scope, pause),
            })
        })
        .collect()
}

/// One role: whether it is paused, since when, and by which pauses.
#[derive(Serialize, ToSchema)]
pub(super) struct RoleView {
    /// payment, fulfillment, receipt (the consumer of that kind), router, relay or sweeper.
    role: &'static str,
    /// Whether it is paused, in either scope.
    paused: bool,
    /// When it was paused (RFC 3339), while it is: the earlier of its pauses.
    since: Option<String>,
    /// Whether the role runs on this instance at all (`relay.enabled`,
    /// `sweeper.enabled`); one that does not cannot be paused.
    enabled: bool,
    /// The pauses that hold it, shared first; empty while it runs.
    pauses: Vec<PauseEntryView>,
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
    /// The scope asked for: shared or instance.
    scope: &'static str,
    /// Whether it is paused now, in either scope (a resume of one scope
    /// leaves it paused while the other holds it).
    paused: bool,
    /// Whether this request changed the pause of that scope (false: it
    /// already was paused, and its first pauser stays, or already was not).
    changed: bool,
}

/// Where a pause or resume applies.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ScopeQuery {
    /// `shared` (the default): every instance on the database, kept in it
    /// and followed by the others within `control.poll_interval`, and still
    /// paused after a restart. `instance`: this process only, in memory,
    /// gone when it stops.
    scope: Option<String>,
}

/// The optional body of a pause.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseBody {
    /// Why, for whoever looks at `ctl status` or `/readyz` (at most 500 characters).
    reason: Option<String>,
}

/// Longest reason a pause keeps, in characters.
const MAX_REASON: usize = 500;

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

/// Every pausable role as `/admin/status` shows it (and `/admin/overview`).
pub(super) fn role_views(ctx: &Context) -> Vec<RoleView> {
    ctx.pauses
        .snapshot()
        .into_iter()
        .map(|(role, state)| RoleView {
            role: role.as_str(),
            paused: state.paused(),
            since: state
                .pauses()
                .map(|(_, p)| p.since)
                .min()
                .map(Millis::to_rfc3339),
            enabled: disabled(ctx, role).is_none(),
            pauses: state
                .pauses()
                .map(|(scope, p)| PauseEntryView::new(scope, p))
                .collect(),
        })
        .collect()
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
        roles: role_views(&ctx),
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
    params(("role" = String, Path, description = Pausable::help()), ScopeQuery),
    request_body(content = Option<PauseBody>, description = "Optional: the reason, shown by `ctl status` and `/readyz`", content_type = "application/json"),
    responses(
        (status = 200, description = "Paused: a consumer or the router settles what it holds and leaves the rest in its queue; the relay and the sweeper skip their rounds. The sweeper also leaves a paused consumer's kind alone. Answered once the role's transactions under way on this instance have ended: from then on none of its changes starts here until it is resumed. A shared pause reaches the other instances within `control.poll_interval`, each applying it the same way", body = PauseView),
        (status = 400, description = "No such role or scope, or a body that does not parse", body = ErrorBody),
        (status = 409, description = "The role does not run on this instance", body = ErrorBody),
        (status = 422, description = "A reason over 500 characters", body = ErrorBody),
        (status = 503, description = "A shared pause, and the database did not answer: nothing was paused (`?scope=instance` pauses this instance without it)", body = ErrorBody)
    )
)]
pub(super) async fn pause(
    State(ctx): State<Arc<Context>>,
    Path(role): Path<String>,
    Query(query): Query<ScopeQuery>,
    caller: Option<Extension<Caller>>,
    body: axum::body::Bytes,
) -> Result<Json<PauseView>, ApiError> {
    let (role, scope) = target(&ctx, &role, &query)?;
    // No body, or `{}`, is a pause without a reason.
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let body: PauseBody = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body: {e}")))?;
        body.reason.filter(|r| !r.trim().is_empty())
    };
    if reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_REASON)
    {
        return Err(ApiError::unprocessable(format!(
            "a reason is at most {MAX_REASON} characters"
        )));
    }
    // The authentication middleware always sets the caller.
    let by = caller.map_or_else(
        || Caller::ANONYMOUS.to_string(),
        |Extension(c)| c.fingerprint(),
    );
    // A pause answers only once the role's transactions under way have
    // committed: an operator can trust that nothing changes after the 200.
    let changed = pausing::pause(&ctx, role, scope, by, reason)
        .await
        .map_err(refused)?;
    Ok(Json(PauseView {
        role: role.as_str(),
        scope: scope.as_str(),
        paused: changed.paused,
        changed: changed.scope,
    }))
}

#[utoipa::path(
    post,
    path = "/admin/resume/{role}",
    tag = "admin",
    params(("role" = String, Path, description = Pausable::names_in_prose()), ScopeQuery),
    responses(
        (status = 200, description = "The pause of that scope lifted: running again unless the other scope still holds it (`paused`). A consumer catches up with what waited in its queue, late and never early. A shared resume reaches the other instances within `control.poll_interval`", body = PauseView),
        (status = 400, description = "No such role or scope", body = ErrorBody),
        (status = 409, description = "The role does not run on this instance", body = ErrorBody),
        (status = 503, description = "A shared resume, and the database did not answer: the pause stays", body = ErrorBody)
    )
)]
pub(super) async fn resume(
    State(ctx): State<Arc<Context>>,
    Path(role): Path<String>,
    Query(query): Query<ScopeQuery>,
) -> Result<Json<PauseView>, ApiError> {
    let (role, scope) = target(&ctx, &role, &query)?;
    let changed = pausing::resume(&ctx, role, scope).await.map_err(refused)?;
    Ok(Json(PauseView {
        role: role.as_str(),
        scope: scope.as_str(),
        paused: changed.paused,
        changed: changed.scope,
    }))
}

/// The role and scope a pause or resume names, if this instance runs it.
fn target(
    ctx: &Context,
    role: &str,
    query: &ScopeQuery,
) -> Result<(Pausable, PauseScope), ApiError> {
    let role: Pausable = role.parse().map_err(ApiError::bad_request)?;
    let scope = match query.scope.as_deref() {
        None => PauseScope::Shared,
        Some(scope) => scope.parse().map_err(ApiError::bad_request)?,
    };
    if let Some(key) = disabled(ctx, role) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the {role} does not run on this instance ({key} = false)"),
        ));
    }
    Ok((role, scope))
}

/// A shared pause or resume the database did not take: 503, the cause in
/// the log.
fn refused(e: PausingError) -> ApiError {
    let PausingError::Database { source, .. } = e;
    let mut error = ApiError::from(source);
    error.message = "the database did not answer, so the shared pause was not changed; \
                     try again, or pause this instance only with ?scope=instance"
        .to_string();
    error
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

//! `GET /admin/deadlines` (admin scope): how many orders fall due in each
//! minute ahead, per kind, and how many are overdue already. Counted in the
//! database by its clock, one aggregate per kind over the (status, deadline)
//! index, so an operator sees a burst coming before it lands.

use super::*;
use crate::db::store::DueAhead;
use crate::domain::TimeoutKind;
use crate::settings::parse_duration;

/// The shortest `next` asked for: one minute, the resolution of the answer.
const MIN_NEXT: Duration = Duration::from_secs(60);
/// The longest: a day, at most 1,440 rows per kind.
const MAX_NEXT: Duration = Duration::from_secs(24 * 3600);
/// Without `next`: an hour.
const DEFAULT_NEXT: Duration = Duration::from_secs(3600);

/// Which deadlines to count.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct DeadlinesQuery {
    /// `payment`, `fulfillment` or `receipt`; every kind the orders have when absent.
    kind: Option<String>,
    /// How far ahead, in whole minutes, from `1m` to `24h` (humantime: `90m`, `2h`); `1h` when absent.
    next: Option<String>,
}

/// One minute with deadlines in it.
#[derive(Serialize, ToSchema)]
pub(super) struct MinuteView {
    /// The minute's start (RFC 3339 UTC, on the minute); the first may have begun before `now`.
    start: String,
    /// Orders whose deadline falls in this minute, from `now` on.
    due: u64,
}

/// One kind's deadlines ahead.
#[derive(Serialize, ToSchema)]
pub(super) struct KindAheadView {
    /// payment, fulfillment or receipt.
    kind: &'static str,
    /// Orders whose deadline already passed, still in the status the timeout acts on.
    overdue: u64,
    /// Orders falling due within `next`: the sum of `minutes`.
    total: u64,
    /// Only the minutes with something due, ascending.
    minutes: Vec<MinuteView>,
}

/// The deadlines ahead.
#[derive(Serialize, ToSchema)]
pub(super) struct DeadlinesView {
    /// The database's clock reading the counts are reckoned from (RFC 3339 UTC).
    now: String,
    /// How far ahead was counted, in milliseconds.
    next_ms: u64,
    /// One entry per kind asked for whose timeouts act on something here
    /// (a kind a mapping leaves out has none).
    kinds: Vec<KindAheadView>,
}

/// The kinds and the horizon a query names, or a 400 naming the parameter.
fn parse(query: &DeadlinesQuery) -> Result<(Vec<TimeoutKind>, Duration), ApiError> {
    let kinds = match query.kind.as_deref() {
        None => TimeoutKind::ALL.to_vec(),
        Some(kind) => vec![
            kind.parse()
                .map_err(|e| ApiError::bad_request(format!("invalid value for `kind`: {e}")))?,
        ],
    };
    let next = match query.next.as_deref() {
        None => DEFAULT_NEXT,
        Some(text) => parse_duration("next", text, MIN_NEXT, MAX_NEXT)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    if next.as_millis() % MIN_NEXT.as_millis() != 0 {
        return Err(ApiError::bad_request(format!(
            "invalid value for `next`: '{}' is not a whole number of minutes (the answer is minute by minute)",
            crate::domain::truncate(query.next.as_deref().unwrap_or_default(), 64)
        )));
    }
    Ok((kinds, next))
}

fn kind_view(kind: TimeoutKind, due: DueAhead) -> KindAheadView {
    KindAheadView {
        kind: kind.as_str(),
        overdue: due.overdue,
        total: due.within.iter().copied().max().unwrap_or(0),
        minutes: due
            .minutes
            .into_iter()
            .map(|(start, due)| MinuteView {
                start: start.to_rfc3339(),
                due,
            })
            .collect(),
    }
}

#[utoipa::path(
    get,
    path = "/admin/deadlines",
    tag = "admin",
    params(DeadlinesQuery),
    responses(
        (status = 200, description = "Per kind: the orders overdue now, and those falling due within `next`, minute by minute, by the database's clock", body = DeadlinesView),
        (status = 400, description = "A `kind` or `next` that is not one (the message names which)", body = ErrorBody),
        (status = 503, description = "The database did not answer", body = ErrorBody)
    )
)]
pub(super) async fn deadlines(
    State(ctx): State<Arc<Context>>,
    Query(query): Query<DeadlinesQuery>,
) -> Result<Json<DeadlinesView>, ApiError> {
    let (kinds, next) = parse(&query)?;
    let now = db::clock::now(&ctx.api_db).await?;
    let mut views = Vec::new();
    for kind in kinds {
        if let Some(due) = ctx
            .orders
            .due_ahead(&ctx.api_db, kind, now, &[next])
            .await?
        {
            views.push(kind_view(kind, due));
        }
    }
    Ok(Json(DeadlinesView {
        now: now.to_rfc3339(),
        next_ms: u64::try_from(next.as_millis()).unwrap_or(u64::MAX),
        kinds: views,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(kind: Option<&str>, next: Option<&str>) -> DeadlinesQuery {
        DeadlinesQuery {
            kind: kind.map(str::to_string),
            next: next.map(str::to_string),
        }
    }

    #[test]
    fn defaults_are_every_kind_and_an_hour() {
        let (kinds, next) = parse(&query(None, None)).unwrap();
        assert_eq!(kinds, TimeoutKind::ALL.to_vec());
        assert_eq!(next, Duration::from_secs(3600));
        let (kinds, next) = parse(&query(Some("receipt"), Some("24h"))).unwrap();
        assert_eq!(kinds, vec![TimeoutKind::Receipt]);
        assert_eq!(next, MAX_NEXT);
    }

    #[test]
    fn bad_input_names_the_parameter() {
        for (q, names) in [
            (query(Some("refund"), None), "`kind`"),
            (query(Some(""), None), "`kind`"),
            (query(None, Some("soon")), "`next`"),
            (query(None, Some("30s")), "`next`"),
            (query(None, Some("25h")), "`next`"),
            (query(None, Some("90s")), "`next`"),
        ] {
            let e = parse(&q).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(names), "{}", e.message);
        }
    }
}

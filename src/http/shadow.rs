//! `GET /admin/shadow` (admin scope): shadow mode's report (`orders.shadow`),
//! per kind what the service would have done beside what the shop did:
//! counts, the shop's lateness against the service's, and the first orders
//! of each list that stands out. 409 outside shadow mode.

use super::*;
use crate::orders::mapped::ShadowReport;

/// One kind's report.
#[derive(Serialize, ToSchema)]
pub(super) struct KindShadowView {
    /// payment, fulfillment or receipt.
    kind: &'static str,
    /// `would_close`, `shop_closed_after_us`, `shop_closed_before_us`,
    /// `closed_early`, `still_open`, `disagreements`; `shop_late_ms` and
    /// `our_late_ms` ({n, p50, p99, max}: milliseconds after each deadline,
    /// negative before); `first_disagreements`, `first_early`,
    /// `first_still_open` ({order_id, status, after_deadline_ms}).
    #[schema(value_type = Object)]
    report: ShadowReport,
}

/// The report.
#[derive(Serialize, ToSchema)]
pub(super) struct ShadowView {
    /// The database's clock reading the report is reckoned from (RFC 3339 UTC).
    now: String,
    kinds: Vec<KindShadowView>,
}

#[utoipa::path(
    get,
    path = "/admin/shadow",
    tag = "admin",
    responses(
        (status = 200, description = "Per kind: what shadow mode would have done, beside what the shop did", body = ShadowView),
        (status = 409, description = "The service is not in shadow mode (`orders.shadow`)", body = ErrorBody),
        (status = 503, description = "The database did not answer", body = ErrorBody)
    )
)]
pub(super) async fn shadow(State(ctx): State<Arc<Context>>) -> Result<Json<ShadowView>, ApiError> {
    let Some((now, kinds)) = crate::shadow::report(&ctx, &ctx.api_db).await? else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not in shadow mode: set orders.shadow = true (with orders.source = mapped) to record what the service would do beside what the shop does",
        ));
    };
    Ok(Json(ShadowView {
        now: now.to_rfc3339(),
        kinds: kinds
            .into_iter()
            .map(|(kind, report)| KindShadowView {
                kind: kind.as_str(),
                report,
            })
            .collect(),
    }))
}

//! `/inventory/{sku}`: restocking and reading a SKU (admin scope).

use super::*;

/// New stock for a SKU.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StockBody {
    available: i64,
}

/// Stock of one SKU, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, ToSchema)]
pub struct StockView {
    /// The SKU.
    pub sku: String,
    /// On sale.
    pub available: i64,
    /// Held by unpaid orders.
    pub reserved: i64,
    /// Paid for.
    pub sold: i64,
}

impl From<SkuStock> for StockView {
    fn from(s: SkuStock) -> Self {
        Self {
            sku: s.sku,
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
        }
    }
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
pub(super) async fn put_inventory(
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
    let now = db::clock::now(&ctx.api_db).await?;
    let stock = store::put_stock(&ctx.api_db, &sku, body.available, now).await?;
    Ok(Json(StockView::from(stock)).into_response())
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
pub(super) async fn get_inventory(
    State(ctx): State<Arc<Context>>,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    check_sku(&sku)?;
    match store::get_stock(&ctx.api_db, &sku).await? {
        Some(stock) => Ok(Json(StockView::from(stock)).into_response()),
        None => Err(ApiError::not_found(format!("sku '{sku}' not found"))),
    }
}

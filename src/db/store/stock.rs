//! Stock: restocking and reading a SKU, and the stock moves every transition
//! makes, with the one lock order every transaction follows.

use super::*;

/// Sets or replaces the available stock of a SKU (restocking); `reserved` and
/// `sold` are kept.
pub async fn put_stock(
    db: &DatabaseConnection,
    sku: &str,
    available: i64,
    now: Millis,
) -> Result<SkuStock, DbErr> {
    let row = inventory::ActiveModel {
        sku: Set(sku.to_string()),
        available: Set(available),
        reserved: Set(0),
        sold: Set(0),
        updated_at_ms: Set(now.0),
    };
    inventory::Entity::insert(row)
        .on_conflict(
            OnConflict::column(inventory::Column::Sku)
                .update_columns([inventory::Column::Available, inventory::Column::UpdatedAtMs])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    get_stock(db, sku)
        .await?
        .ok_or_else(|| DbErr::Custom(format!("sku '{sku}' vanished after upsert")))
}

/// One SKU's stock.
pub async fn get_stock<C: ConnectionTrait>(db: &C, sku: &str) -> Result<Option<SkuStock>, DbErr> {
    Ok(inventory::Entity::find_by_id(sku.to_string())
        .one(db)
        .await?
        .map(|m| SkuStock {
            sku: m.sku,
            available: m.available,
            reserved: m.reserved,
            sold: m.sold,
        }))
}

/// The three stock columns.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stock {
    Available,
    Reserved,
    Sold,
}

impl Stock {
    fn column(self) -> inventory::Column {
        match self {
            Self::Available => inventory::Column::Available,
            Self::Reserved => inventory::Column::Reserved,
            Self::Sold => inventory::Column::Sold,
        }
    }
}

/// Moves the quantities of some orders' items from one stock column to another,
/// `LIST_CHUNK` SKUs at a time: each chunk's rows are first locked (see
/// [`lock_stock`]), then one `UPDATE … CASE sku …` moves the chunk.
pub(super) async fn move_stock(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
    from: Stock,
    to: Stock,
    now: Millis,
) -> Result<(), DbErr> {
    move_lines(txn, &order_lines(txn, ids).await?, from, to, now).await
}

/// [`move_stock`] for lines already read (a cancel reads them once, for its
/// events and its stock move).
pub(super) async fn move_lines(
    txn: &DatabaseTransaction,
    lines: &[order_items::Model],
    from: Stock,
    to: Stock,
    now: Millis,
) -> Result<(), DbErr> {
    let mut per_sku: BTreeMap<&str, i64> = BTreeMap::new();
    for line in lines {
        *per_sku.entry(line.sku.as_str()).or_insert(0) += line.quantity;
    }
    let per_sku: Vec<(&str, i64)> = per_sku.into_iter().collect();
    for chunk in per_sku.chunks(LIST_CHUNK) {
        let skus: Vec<&str> = chunk.iter().map(|(sku, _)| *sku).collect();
        lock_stock(txn, &skus).await?;
        let mut quantity = CaseStatement::new();
        for (sku, q) in chunk {
            quantity = quantity.case(inventory::Column::Sku.eq(*sku), *q);
        }
        let quantity: Expr = quantity.finally(0).into();
        inventory::Entity::update_many()
            .col_expr(
                from.column(),
                Expr::col(from.column()).sub(quantity.clone()),
            )
            .col_expr(to.column(), Expr::col(to.column()).add(quantity))
            .col_expr(inventory::Column::UpdatedAtMs, Expr::value(now.0))
            .filter(inventory::Column::Sku.is_in(skus))
            .exec(txn)
            .await?;
    }
    Ok(())
}

/// Locks inventory rows in the order of the column's index (its collation:
/// PostgreSQL's `C` sorts `B` before `a`, MariaDB's default collation the
/// other way), one statement for the lot. Checkout and every stock move lock
/// through here, so two transactions wanting the same SKUs queue instead of
/// deadlocking. SQLite has one writer at a time and takes no row locks.
pub(super) async fn lock_stock(txn: &DatabaseTransaction, skus: &[&str]) -> Result<(), DbErr> {
    if txn.get_database_backend() == DbBackend::Sqlite {
        return Ok(());
    }
    inventory::Entity::find()
        .select_only()
        .column(inventory::Column::Sku)
        .filter(inventory::Column::Sku.is_in(skus.iter().copied()))
        .order_by_asc(inventory::Column::Sku)
        .lock_exclusive()
        .into_tuple::<String>()
        .all(txn)
        .await?;
    Ok(())
}

/// Locks order rows in id order before a batch updates them, so two batches
/// that share orders (a consumer and the sweeper, two instances) queue instead
/// of deadlocking. SQLite has one writer and needs no lock.
pub(super) async fn lock_orders(txn: &DatabaseTransaction, ids: &[i64]) -> Result<(), DbErr> {
    if txn.get_database_backend() == DbBackend::Sqlite || ids.len() < 2 {
        return Ok(());
    }
    orders::Entity::find()
        .select_only()
        .column(orders::Column::Id)
        .filter(orders::Column::Id.is_in(ids.iter().copied()))
        .order_by_asc(orders::Column::Id)
        .lock_exclusive()
        .into_tuple::<i64>()
        .all(txn)
        .await?;
    Ok(())
}

/// The lines of some orders, one query per [`LIST_CHUNK`] of ids.
pub(super) async fn order_lines(
    txn: &DatabaseTransaction,
    ids: &[OrderId],
) -> Result<Vec<order_items::Model>, DbErr> {
    let raw: Vec<i64> = ids.iter().map(|i| i.get()).collect();
    let mut lines = Vec::new();
    for chunk in raw.chunks(LIST_CHUNK) {
        lines.extend(
            order_items::Entity::find()
                .filter(order_items::Column::OrderId.is_in(chunk.iter().copied()))
                .order_by_asc(order_items::Column::OrderId)
                .order_by_asc(order_items::Column::Sku)
                .all(txn)
                .await?,
        );
    }
    Ok(lines)
}

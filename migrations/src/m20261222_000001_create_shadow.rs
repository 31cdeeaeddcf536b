//! `order_timeout_shadow`: what the service would have done to a shop's own
//! table in shadow mode (`orders.shadow = true`), beside what the shop did.
//! One row per kind and order the service decided about: when it would have
//! closed it (or that the shop had moved it on before the service acted),
//! and, once the shop changed it, to what and when. Written only in shadow
//! mode; the report (`GET /admin/shadow`) reads it.
//!
//! A bookkeeping table, named `order_timeout_…`: it lives in the shop's own
//! database, next to the shop's tables.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutShadow {
    Table,
    Kind,
    OrderId,
    DeadlineMs,
    WouldAtMs,
    Cause,
    ShopStatus,
    ShopSeenAtMs,
    ShopAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use OrderTimeoutShadow as S;
        manager
            .create_table(
                Table::create()
                    .table(S::Table)
                    .if_not_exists()
                    // payment, fulfillment or receipt.
                    .col(string_len(S::Kind, 32))
                    // The shop's id, as the wire spells it.
                    .col(string_len(S::OrderId, 255))
                    // The deadline, by the database's clock (epoch ms).
                    .col(big_integer_null(S::DeadlineMs))
                    // When the service would have closed it; null: the shop
                    // had moved it on before the service acted.
                    .col(big_integer_null(S::WouldAtMs))
                    // What would have closed it: timeout, catch_up or sweeper.
                    .col(string_len_null(S::Cause, 16))
                    // The status the shop left it in, as text; null while open.
                    .col(string_len_null(S::ShopStatus, 64))
                    // When the service saw the shop's change (database clock).
                    .col(big_integer_null(S::ShopSeenAtMs))
                    // The shop's own stamp of it (mapping.stamp_column), if any.
                    .col(big_integer_null(S::ShopAtMs))
                    .primary_key(Index::create().col(S::Kind).col(S::OrderId))
                    .to_owned(),
            )
            .await?;
        // The watch reads the rows the shop has not changed yet, per kind.
        manager
            .create_index(
                Index::create()
                    .name("order_timeout_shadow_open_idx")
                    .table(S::Table)
                    .col(S::Kind)
                    .col(S::ShopSeenAtMs)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderTimeoutShadow::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

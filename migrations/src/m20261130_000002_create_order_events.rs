//! The audit trail: one row per transition (and per late payment), written in
//! the transaction of the change itself, so "why was my order cancelled, and by
//! what" always has an answer.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderEvents {
    Table,
    Id,
    OrderId,
    Event,
    FromStatus,
    ToStatus,
    Cause,
    AtMs,
    Detail,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(OrderEvents::Table)
                    .if_not_exists()
                    .col(big_pk_auto(OrderEvents::Id))
                    .col(big_integer(OrderEvents::OrderId))
                    // created, paid, shipped, completed, cancelled, fulfillment_overdue, late_payment
                    .col(string_len(OrderEvents::Event, 32))
                    // Null for the creation event.
                    .col(string_len_null(OrderEvents::FromStatus, 24))
                    .col(string_len(OrderEvents::ToStatus, 24))
                    // api, timeout or sweeper
                    .col(string_len(OrderEvents::Cause, 16))
                    .col(big_integer(OrderEvents::AtMs))
                    .col(string_len_null(OrderEvents::Detail, 255))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_order_events_order")
                    .table(OrderEvents::Table)
                    .col(OrderEvents::OrderId)
                    .col(OrderEvents::Id)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderEvents::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

//! `order_timeout_audit`: the audit trail of orders that live in a shop's
//! own tables (the mapped mode writes it, in the transaction of each
//! transition); the owned mode keeps its trail in `order_events`. Order ids
//! and statuses are text, as the shop spells them.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutAudit {
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
        use OrderTimeoutAudit as A;
        manager
            .create_table(
                Table::create()
                    .table(A::Table)
                    .if_not_exists()
                    .col(big_pk_auto(A::Id))
                    .col(string_len(A::OrderId, 255))
                    .col(string_len(A::Event, 32))
                    // A shop's status values (`0`, `unpaid`, `WAIT_PAY`…); null for a creation.
                    .col(string_len_null(A::FromStatus, 64))
                    .col(string_len(A::ToStatus, 64))
                    // timeout, sweeper, buyer or shop
                    .col(string_len(A::Cause, 16))
                    .col(big_integer(A::AtMs))
                    .col(string_len_null(A::Detail, 255))
                    .to_owned(),
            )
            .await?;
        // An order's trail, oldest first.
        manager
            .create_index(
                Index::create()
                    .name("idx_order_timeout_audit_order")
                    .table(A::Table)
                    .col(A::OrderId)
                    .col(A::Id)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderTimeoutAudit::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

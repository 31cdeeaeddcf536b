//! An index on `order_timeout_audit.at_ms`: the retention cleaner deletes
//! the oldest rows a bounded batch at a time (`audit.retention`), and each
//! batch must find them without reading the whole trail.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutAudit {
    Table,
    AtMs,
}

/// The index's name.
const NAME: &str = "idx_order_timeout_audit_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(NAME)
                    .table(OrderTimeoutAudit::Table)
                    .col(OrderTimeoutAudit::AtMs)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(NAME)
                    .table(OrderTimeoutAudit::Table)
                    .to_owned(),
            )
            .await
    }
}

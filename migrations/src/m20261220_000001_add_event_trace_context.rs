//! The trace context of the span whose transition wrote a domain event (the
//! consumer's apply of a timeout, a checkout), so that the relay's publish of
//! the event continues that trace: W3C `traceparent`, then a line feed and
//! `tracestate` when there is one. Null when traces are off, and in every row
//! an earlier release writes.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutEvents {
    Table,
    TraceContext,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(OrderTimeoutEvents::Table)
                    .add_column(string_len_null(OrderTimeoutEvents::TraceContext, 1024))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(OrderTimeoutEvents::Table)
                    .drop_column(OrderTimeoutEvents::TraceContext)
                    .to_owned(),
            )
            .await
    }
}

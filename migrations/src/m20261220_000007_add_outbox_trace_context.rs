//! The trace context of the span that wrote a timeout's outbox row (a
//! checkout's), so that the relay's publish continues that trace: W3C
//! `traceparent`, then a line feed and `tracestate` when there is one. Null
//! when traces are off, and in every row an earlier release writes.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Outbox {
    Table,
    TraceContext,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .add_column(string_len_null(Outbox::TraceContext, 1024))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .drop_column(Outbox::TraceContext)
                    .to_owned(),
            )
            .await
    }
}

//! `order_timeout_pauses`: the roles an operator paused for every instance
//! (`POST /admin/pause/{role}`, `order-timeout ctl pause ROLE`), one row per
//! paused role. Pausing inserts the row, resuming deletes it; every instance
//! reads the table at start, before any of its roles acts, and follows it
//! while it runs, so a pause survives restarts and reaches instances started
//! later. A pause of one instance only (`?scope=instance`) is not written
//! here: it lives in that process's memory.
//!
//! A bookkeeping table, named `order_timeout_…`: it may live in a shop's own
//! database, next to the shop's tables (the mapped mode).

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutPauses {
    Table,
    Role,
    PausedAtMs,
    PausedBy,
    Instance,
    Reason,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use OrderTimeoutPauses as P;
        manager
            .create_table(
                Table::create()
                    .table(P::Table)
                    .if_not_exists()
                    // payment, fulfillment, receipt, router, relay or sweeper:
                    // the key makes "pause" one conditional INSERT.
                    .col(string_len(P::Role, 32).primary_key())
                    // The database's clock, in epoch milliseconds.
                    .col(big_integer(P::PausedAtMs))
                    // Who asked: `token sha256:…` (a prefix of the
                    // token's hash, never the token) or `anonymous`.
                    .col(string_len(P::PausedBy, 128))
                    // `amqp.instance` of the instance that was asked.
                    .col(string_len(P::Instance, 255))
                    // What the operator said, if anything.
                    .col(string_len_null(P::Reason, 500))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderTimeoutPauses::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

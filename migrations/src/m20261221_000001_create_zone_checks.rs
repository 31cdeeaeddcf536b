//! `order_timeout_zone_checks`: what the service found of the zone a shop
//! writes its zone-less time columns in, when `mapping.time_zone` is left to
//! the database server's default (a guess): per kind, whether the newest
//! order seen appearing had a stamp that fits the zone in use (`fits`) or
//! lay more than 15 minutes from the database's now in it (`off`), with
//! what was seen. Read at start: a kind stays held until a row has
//! confirmed the zone, and a kind found `off` stays held across restarts.
//!
//! A bookkeeping table, named `order_timeout_…`: it lives in the shop's own
//! database, next to the shop's tables.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutZoneChecks {
    Table,
    Kind,
    Zone,
    Verdict,
    AheadMs,
    Fitting,
    Stamp,
    AtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use OrderTimeoutZoneChecks as Z;
        manager
            .create_table(
                Table::create()
                    .table(Z::Table)
                    .if_not_exists()
                    // payment, fulfillment or receipt.
                    .col(string_len(Z::Kind, 32).primary_key())
                    // The zone the verdict is about, as the service used it.
                    .col(string_len(Z::Zone, 64))
                    // `fits` or `off`.
                    .col(string_len(Z::Verdict, 8))
                    // How far the stamp lay after the database's now (negative: before).
                    .col(big_integer(Z::AheadMs))
                    // The UTC offset the stamp would fit, like `-05:00`.
                    .col(string_len_null(Z::Fitting, 16))
                    // The stamp, as the database spelled it.
                    .col(string_len_null(Z::Stamp, 64))
                    // The database's clock, in epoch milliseconds.
                    .col(big_integer(Z::AtMs))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderTimeoutZoneChecks::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

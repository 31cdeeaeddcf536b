//! Orders, their items, per-SKU inventory, and the outbox.
//!
//! Every time is an integer of milliseconds since the Unix epoch (`*_ms`), so a
//! deadline comparison means the same on SQLite, PostgreSQL and MariaDB.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Inventory {
    Table,
    Sku,
    Available,
    Reserved,
    Sold,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Orders {
    Table,
    Id,
    Status,
    PayDeadlineMs,
    ShipDeadlineMs,
    ConfirmDeadlineMs,
    CreatedAtMs,
    PaidAtMs,
    ShippedAtMs,
    CompletedAtMs,
    CancelledAtMs,
    FulfillmentOverdueAtMs,
    Version,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum OrderItems {
    Table,
    OrderId,
    Sku,
    Quantity,
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Id,
    OrderId,
    Kind,
    DueAtMs,
    CreatedAtMs,
    Attempts,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Inventory::Table)
                    .if_not_exists()
                    .col(string_len(Inventory::Sku, 64).primary_key())
                    .col(big_integer(Inventory::Available).default(0))
                    .col(big_integer(Inventory::Reserved).default(0))
                    .col(big_integer(Inventory::Sold).default(0))
                    .col(big_integer(Inventory::UpdatedAtMs))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Orders::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Orders::Id))
                    .col(string_len(Orders::Status, 24))
                    .col(big_integer(Orders::PayDeadlineMs))
                    .col(big_integer_null(Orders::ShipDeadlineMs))
                    .col(big_integer_null(Orders::ConfirmDeadlineMs))
                    .col(big_integer(Orders::CreatedAtMs))
                    .col(big_integer_null(Orders::PaidAtMs))
                    .col(big_integer_null(Orders::ShippedAtMs))
                    .col(big_integer_null(Orders::CompletedAtMs))
                    .col(big_integer_null(Orders::CancelledAtMs))
                    .col(big_integer_null(Orders::FulfillmentOverdueAtMs))
                    // Bumped by every transition: a cheap change detector for clients.
                    .col(integer(Orders::Version).default(0))
                    .col(big_integer(Orders::UpdatedAtMs))
                    .to_owned(),
            )
            .await?;
        // One index per deadline, led by status: the sweeper asks "orders in status
        // S whose deadline is before T", and the conditional updates filter the same way.
        for (name, deadline) in [
            ("idx_orders_status_pay_deadline", Orders::PayDeadlineMs),
            ("idx_orders_status_ship_deadline", Orders::ShipDeadlineMs),
            (
                "idx_orders_status_confirm_deadline",
                Orders::ConfirmDeadlineMs,
            ),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(Orders::Table)
                        .col(Orders::Status)
                        .col(deadline)
                        .if_not_exists()
                        .to_owned(),
                )
                .await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(OrderItems::Table)
                    .if_not_exists()
                    .col(big_integer(OrderItems::OrderId))
                    .col(string_len(OrderItems::Sku, 64))
                    .col(big_integer(OrderItems::Quantity))
                    .primary_key(
                        Index::create()
                            .col(OrderItems::OrderId)
                            .col(OrderItems::Sku),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_order_items_order")
                            .from(OrderItems::Table, OrderItems::OrderId)
                            .to(Orders::Table, Orders::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_order_items_sku")
                            .from(OrderItems::Table, OrderItems::Sku)
                            .to(Inventory::Table, Inventory::Sku),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Outbox::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Outbox::Id))
                    .col(big_integer(Outbox::OrderId))
                    .col(string_len(Outbox::Kind, 16))
                    .col(big_integer(Outbox::DueAtMs))
                    .col(big_integer(Outbox::CreatedAtMs))
                    .col(integer(Outbox::Attempts).default(0))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            Outbox::Table.into_iden(),
            OrderItems::Table.into_iden(),
            Orders::Table.into_iden(),
            Inventory::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}

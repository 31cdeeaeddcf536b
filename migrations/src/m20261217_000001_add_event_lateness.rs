//! How late a timeout was applied and which instance applied it, on the
//! owned orders' audit trail (`order_events`): what `GET /admin/orders/{id}`
//! and `ctl order` show for each transition. Both nullable: the previous
//! release, running beside this one during an upgrade, writes its rows
//! without them, and a client's action has neither.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderEvents {
    Table,
    LateMs,
    Instance,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(OrderEvents::Table)
                    .add_column(big_integer_null(OrderEvents::LateMs))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(OrderEvents::Table)
                    .add_column(string_len_null(OrderEvents::Instance, 255))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [OrderEvents::Instance, OrderEvents::LateMs] {
            manager
                .alter_table(
                    Table::alter()
                        .table(OrderEvents::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

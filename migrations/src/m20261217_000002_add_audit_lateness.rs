//! How late a timeout was applied and which instance applied it, on the
//! mapped orders' audit trail (`order_timeout_audit`): what
//! `GET /admin/orders/{id}` and `ctl order` show for each transition. Both
//! nullable: the previous release, running beside this one during an
//! upgrade, writes its rows without them.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutAudit {
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
                    .table(OrderTimeoutAudit::Table)
                    .add_column(big_integer_null(OrderTimeoutAudit::LateMs))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(OrderTimeoutAudit::Table)
                    .add_column(string_len_null(OrderTimeoutAudit::Instance, 255))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [OrderTimeoutAudit::Instance, OrderTimeoutAudit::LateMs] {
            manager
                .alter_table(
                    Table::alter()
                        .table(OrderTimeoutAudit::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

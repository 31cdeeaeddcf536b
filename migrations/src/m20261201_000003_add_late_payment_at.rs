//! When a payment arrived for an order that a timeout had cancelled: set once,
//! by one conditional UPDATE, so a late payment is recorded (and counted, and
//! refunded) once per order however often the client retries.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Orders {
    Table,
    LatePaymentAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Orders::Table)
                    .add_column(big_integer_null(Orders::LatePaymentAtMs))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Orders::Table)
                    .drop_column(Orders::LatePaymentAtMs)
                    .to_owned(),
            )
            .await
    }
}

//! Idempotency keys of checkouts: a client that lost the answer to
//! `POST /orders` retries with the same `Idempotency-Key` and gets the same
//! order instead of a second one. The key is the primary key, so two requests
//! racing with one key cannot both create an order; the row is written in the
//! checkout's transaction and kept with the order.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum IdempotencyKeys {
    Table,
    Key,
    OrderId,
    Request,
    Answer,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum Orders {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let mut key = string_len(IdempotencyKeys::Key, 255);
        if manager.get_database_backend() == sea_orm_migration::sea_orm::DbBackend::MySql {
            // MariaDB compares strings case-insensitively by default: keys are
            // compared byte for byte, as on PostgreSQL and SQLite.
            key.custom(Alias::new(
                "varchar(255) CHARACTER SET ascii COLLATE ascii_bin",
            ));
        }
        key.primary_key();
        manager
            .create_table(
                Table::create()
                    .table(IdempotencyKeys::Table)
                    .if_not_exists()
                    .col(key)
                    // Null only inside the checkout's own transaction, which
                    // claims the key before the order exists.
                    .col(big_integer_null(IdempotencyKeys::OrderId))
                    // The validated request in a canonical form, to tell a retry
                    // from another request under the same key.
                    .col(text(IdempotencyKeys::Request))
                    // The body of the first answer, given again to a retry.
                    .col(text_null(IdempotencyKeys::Answer))
                    .col(big_integer(IdempotencyKeys::CreatedAtMs))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_idempotency_keys_order")
                            .from(IdempotencyKeys::Table, IdempotencyKeys::OrderId)
                            .to(Orders::Table, Orders::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(IdempotencyKeys::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

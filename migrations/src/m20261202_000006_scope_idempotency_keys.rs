//! Idempotency keys scoped by their caller: the primary key becomes
//! (`scope`, `key`), where `scope` is the SHA-256 of the caller's bearer token
//! in hex (never the token), or `anonymous` on an API without tokens. Two
//! storefronts reusing `cart-1001` get two orders, and neither can squat the
//! other's keys. Rows written before have the scope `unscoped`: no caller
//! matches it, so they answer no retry and age out with the retention.
//!
//! A primary key cannot be changed in place on SQLite, so the table is
//! rebuilt: a new one is filled from the old, which is then dropped, and the
//! new one takes the old name. Index and foreign-key names are global on
//! PostgreSQL and MariaDB respectively, hence the rebuilt table's own names.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The scope of the rows written before scoping.
pub const UNSCOPED: &str = "unscoped";

#[derive(DeriveIden)]
enum IdempotencyKeys {
    Table,
    Scope,
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

/// The table being built, renamed to `idempotency_keys` once filled.
const BUILDING: &str = "idempotency_keys_rebuilt";

/// A `varchar(len)` column compared byte for byte on every backend.
fn ascii(name: IdempotencyKeys, len: u32, backend: DbBackend) -> ColumnDef {
    let mut column = string_len(name, len);
    if backend == DbBackend::MySql {
        // MariaDB compares strings case-insensitively by default.
        column.custom(Alias::new(format!(
            "varchar({len}) CHARACTER SET ascii COLLATE ascii_bin"
        )));
    }
    column
}

/// The table `idempotency_keys` in either shape, under the name `BUILDING`.
fn table(scoped: bool, backend: DbBackend) -> TableCreateStatement {
    let mut create = Table::create();
    create.table(Alias::new(BUILDING));
    let fk = if scoped {
        create
            .col(ascii(IdempotencyKeys::Scope, 64, backend).not_null())
            .col(ascii(IdempotencyKeys::Key, 255, backend).not_null())
            .primary_key(
                Index::create()
                    .col(IdempotencyKeys::Scope)
                    .col(IdempotencyKeys::Key),
            );
        "fk_idempotency_keys_scoped_order"
    } else {
        create.col(ascii(IdempotencyKeys::Key, 255, backend).primary_key());
        "fk_idempotency_keys_order"
    };
    create
        .col(big_integer_null(IdempotencyKeys::OrderId))
        .col(text(IdempotencyKeys::Request))
        .col(text_null(IdempotencyKeys::Answer))
        .col(big_integer(IdempotencyKeys::CreatedAtMs))
        .foreign_key(
            ForeignKey::create()
                .name(fk)
                .from(Alias::new(BUILDING), IdempotencyKeys::OrderId)
                .to(Orders::Table, Orders::Id)
                .on_delete(ForeignKeyAction::Cascade),
        )
        .to_owned()
}

/// Fills `BUILDING` from `idempotency_keys`, drops the latter and renames the
/// former in its place.
async fn rebuild(manager: &SchemaManager<'_>, scoped: bool, copy: &str) -> Result<(), DbErr> {
    let backend = manager.get_database_backend();
    manager.create_table(table(scoped, backend)).await?;
    manager.get_connection().execute_unprepared(copy).await?;
    manager
        .drop_table(Table::drop().table(IdempotencyKeys::Table).to_owned())
        .await?;
    manager
        .rename_table(
            Table::rename()
                .table(Alias::new(BUILDING), IdempotencyKeys::Table)
                .to_owned(),
        )
        .await?;
    if scoped {
        // The cleaner deletes by age.
        manager
            .create_index(
                Index::create()
                    .name("idx_idempotency_keys_created")
                    .table(IdempotencyKeys::Table)
                    .col(IdempotencyKeys::CreatedAtMs)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let copy = format!(
            "INSERT INTO {BUILDING} (scope, {k}, order_id, request, answer, created_at_ms) \
             SELECT '{UNSCOPED}', {k}, order_id, request, answer, created_at_ms FROM idempotency_keys",
            k = quoted_key(manager)
        );
        rebuild(manager, true, &copy).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One row per key survives (a key used by several callers keeps the
        // smallest scope's row): the old shape has room for one.
        let copy = format!(
            "INSERT INTO {BUILDING} ({k}, order_id, request, answer, created_at_ms) \
             SELECT i.{k}, i.order_id, i.request, i.answer, i.created_at_ms FROM idempotency_keys i \
             WHERE i.scope = (SELECT MIN(j.scope) FROM idempotency_keys j WHERE j.{k} = i.{k})",
            k = quoted_key(manager)
        );
        rebuild(manager, false, &copy).await
    }
}

/// `key` is a reserved word on MariaDB: quoted as each backend quotes.
fn quoted_key(manager: &SchemaManager) -> &'static str {
    match manager.get_database_backend() {
        DbBackend::MySql => "`key`",
        _ => "\"key\"",
    }
}

//! Outbox rows are claimed before they are published, so the relays of several
//! instances publish disjoint rows: `claim` names one relay round and
//! `claimed_until_ms` ends its lease (a relay that dies mid-round leaves rows
//! that the next round anywhere takes once the lease is over). A row the broker
//! keeps refusing, or one no relay can publish, is set aside
//! (`set_aside_at_ms`, `set_aside_reason`) instead of being retried forever or
//! deleted: it stays for an operator, and the sweeper still applies its
//! timeout.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Claim,
    ClaimedUntilMs,
    SetAsideAtMs,
    SetAsideReason,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one at a time.
        for column in [
            string_len_null(Outbox::Claim, 36),
            big_integer_null(Outbox::ClaimedUntilMs),
            big_integer_null(Outbox::SetAsideAtMs),
            string_len_null(Outbox::SetAsideReason, 250),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Outbox::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            Outbox::SetAsideReason,
            Outbox::SetAsideAtMs,
            Outbox::ClaimedUntilMs,
            Outbox::Claim,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Outbox::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

//! The event outbox: one row per domain event (an order cancelled, paid,
//! shipped…), written in the transaction of the transition itself and
//! published after commit by the relay to `<prefix>.events`. So an event is
//! never lost (it commits with the change) and never published for a change
//! that was rolled back (it rolls back with it).
//!
//! `body` is the complete JSON message, built at insert: the relay publishes
//! it as it is, whatever version of the service relays it. `message_id` is
//! made at insert too, so every re-publish of a row carries the same id (an
//! id taken from the row's primary key could come back after the table was
//! emptied and rebuilt). The claim, lease, attempt and set-aside columns mean
//! what they mean on the timeout `outbox` (migration
//! `m20261201_000005_add_outbox_claims`).
//!
//! Every table of [`crate::Bookkeeping`] is named `order_timeout_…`: it may
//! live in a shop's own database, next to the shop's tables.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OrderTimeoutEvents {
    Table,
    Id,
    MessageId,
    OrderId,
    Event,
    Body,
    CreatedAtMs,
    Attempts,
    Claim,
    ClaimedUntilMs,
    SetAsideAtMs,
    SetAsideReason,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use OrderTimeoutEvents as E;
        manager
            .create_table(
                Table::create()
                    .table(E::Table)
                    .if_not_exists()
                    .col(big_pk_auto(E::Id))
                    // A UUID; an AMQP message id holds at most 255 bytes.
                    .col(string_len(E::MessageId, 64))
                    // As on the wire: "42", a UUID, an order_sn.
                    .col(string_len(E::OrderId, 255))
                    // cancelled, paid, shipped, completed, fulfillment_overdue, late_payment, created
                    .col(string_len(E::Event, 32))
                    .col(text(E::Body))
                    .col(big_integer(E::CreatedAtMs))
                    .col(integer(E::Attempts).default(0))
                    .col(string_len_null(E::Claim, 36))
                    .col(big_integer_null(E::ClaimedUntilMs))
                    .col(big_integer_null(E::SetAsideAtMs))
                    .col(string_len_null(E::SetAsideReason, 250))
                    .to_owned(),
            )
            .await?;
        // The relay claims rows not set aside, oldest first: this index walks
        // them in that order and skips the set-aside ones.
        manager
            .create_index(
                Index::create()
                    .name("idx_order_timeout_events_claim")
                    .table(E::Table)
                    .col(E::SetAsideAtMs)
                    .col(E::Id)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OrderTimeoutEvents::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

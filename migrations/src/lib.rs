//! SeaORM migrations of order-timeout. `Migrator` lists them in order; each file
//! is named `mYYYYMMDD_NNNNNN_verb_noun.rs`. The service runs them on start
//! (unless `database.migrate_on_start = false`) and `order-timeout migrate`
//! runs them by hand.

pub use sea_orm_migration::prelude::*;

mod m20261130_000001_create_tables;
mod m20261130_000002_create_order_events;
mod m20261201_000003_add_late_payment_at;
mod m20261201_000004_create_idempotency_keys;
mod m20261201_000005_add_outbox_claims;

/// All migrations of the service, oldest first.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_tables::Migration),
            Box::new(m20261130_000002_create_order_events::Migration),
            Box::new(m20261201_000003_add_late_payment_at::Migration),
            Box::new(m20261201_000004_create_idempotency_keys::Migration),
            Box::new(m20261201_000005_add_outbox_claims::Migration),
        ]
    }
}

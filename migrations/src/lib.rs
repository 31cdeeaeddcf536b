//! SeaORM migrations of order-timeout, in two migrators, each listing its
//! migrations in order; each file is named `mYYYYMMDD_NNNNNN_verb_noun.rs`.
//!
//! - [`Migrator`]: the tables of the service's own orders, stock and timeout
//!   outbox (`seaql_migrations` records it).
//! - [`Bookkeeping`]: the tables the service keeps about orders whatever owns
//!   them (the event outbox, the audit trail of the mapped mode) and about
//!   its instances (the roles paused for all of them), all named
//!   `order_timeout_…`, recorded in `order_timeout_migrations`: they may be
//!   created inside a shop's own database, next to its tables, so no name of
//!   theirs may be a generic one.
//!
//! The service runs `Migrator` then `Bookkeeping` on start (unless
//! `database.migrate_on_start = false`), and `order-timeout migrate` runs
//! them by hand.

pub use sea_orm_migration::prelude::*;
pub use sea_orm_migration::{Migration, MigrationStatus};

mod m20261130_000001_create_tables;
mod m20261130_000002_create_order_events;
mod m20261201_000003_add_late_payment_at;
mod m20261201_000004_create_idempotency_keys;
mod m20261201_000005_add_outbox_claims;
mod m20261202_000006_scope_idempotency_keys;
mod m20261215_000001_create_event_outbox;
mod m20261215_000002_create_audit;
mod m20261215_000003_index_audit_time;
mod m20261216_000001_create_pauses;
mod m20261217_000001_add_event_lateness;
mod m20261217_000002_add_audit_lateness;
mod m20261220_000001_add_event_trace_context;
mod m20261220_000007_add_outbox_trace_context;
mod m20261221_000001_create_zone_checks;
mod m20261222_000001_create_shadow;

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
            Box::new(m20261202_000006_scope_idempotency_keys::Migration),
            Box::new(m20261217_000001_add_event_lateness::Migration),
            Box::new(m20261220_000007_add_outbox_trace_context::Migration),
        ]
    }
}

/// The bookkeeping tables (`order_timeout_…`), oldest first, with their own
/// migration table so that they can be migrated apart from [`Migrator`]'s.
pub struct Bookkeeping;

/// The table that records which [`Bookkeeping`] migrations were applied.
pub const BOOKKEEPING_MIGRATION_TABLE: &str = "order_timeout_migrations";

#[async_trait::async_trait]
impl MigratorTrait for Bookkeeping {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261215_000001_create_event_outbox::Migration),
            Box::new(m20261215_000002_create_audit::Migration),
            Box::new(m20261215_000003_index_audit_time::Migration),
            Box::new(m20261216_000001_create_pauses::Migration),
            Box::new(m20261217_000002_add_audit_lateness::Migration),
            Box::new(m20261220_000001_add_event_trace_context::Migration),
            Box::new(m20261221_000001_create_zone_checks::Migration),
            Box::new(m20261222_000001_create_shadow::Migration),
        ]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(BOOKKEEPING_MIGRATION_TABLE).into_iden()
    }
}

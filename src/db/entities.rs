//! SeaORM entities, one module per table (see the migration for the schema).

/// `inventory`: stock per SKU. `available + reserved + sold` changes only by restocking.
pub mod inventory {
    use sea_orm::entity::prelude::*;

    /// One SKU's stock.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "inventory")]
    pub struct Model {
        /// Stock-keeping unit, the shop's product code.
        #[sea_orm(primary_key, auto_increment = false)]
        pub sku: String,
        /// On sale now.
        pub available: i64,
        /// Held by unpaid orders.
        pub reserved: i64,
        /// Paid for.
        pub sold: i64,
        /// Last change.
        pub updated_at_ms: i64,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `orders`: one row per order, with every deadline and timestamp of its life.
pub mod orders {
    use sea_orm::entity::prelude::*;

    /// One order.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        /// Database-assigned id.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// `pending_payment`, `paid`, `shipped`, `completed` or `cancelled`.
        pub status: String,
        /// End of the payment window.
        pub pay_deadline_ms: i64,
        /// End of the fulfillment window, once paid.
        pub ship_deadline_ms: Option<i64>,
        /// End of the receipt window, once shipped.
        pub confirm_deadline_ms: Option<i64>,
        /// Checkout time.
        pub created_at_ms: i64,
        /// Payment time.
        pub paid_at_ms: Option<i64>,
        /// Shipping time.
        pub shipped_at_ms: Option<i64>,
        /// Completion time.
        pub completed_at_ms: Option<i64>,
        /// Cancellation time.
        pub cancelled_at_ms: Option<i64>,
        /// When the fulfillment timeout flagged it as not shipped in time.
        pub fulfillment_overdue_at_ms: Option<i64>,
        /// When a payment first came for it after a timeout had cancelled it.
        pub late_payment_at_ms: Option<i64>,
        /// Incremented by every transition.
        pub version: i32,
        /// Last change.
        pub updated_at_ms: i64,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `order_items`: what an order holds.
pub mod order_items {
    use sea_orm::entity::prelude::*;

    /// One line of an order.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_items")]
    pub struct Model {
        /// The order.
        #[sea_orm(primary_key, auto_increment = false)]
        pub order_id: i64,
        /// The SKU.
        #[sea_orm(primary_key, auto_increment = false)]
        pub sku: String,
        /// How many.
        pub quantity: i64,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `outbox`: timeouts to publish, written in the transaction that creates the need.
pub mod outbox {
    use sea_orm::entity::prelude::*;

    /// One timeout waiting to be published.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "outbox")]
    pub struct Model {
        /// Database-assigned id; part of the message id, so a re-publish is recognisable.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// The order.
        pub order_id: i64,
        /// `payment`, `fulfillment` or `receipt`.
        pub kind: String,
        /// The deadline the message is for.
        pub due_at_ms: i64,
        /// When the row was written.
        pub created_at_ms: i64,
        /// Publish attempts that did not get a broker ack.
        pub attempts: i32,
        /// The relay round that holds the row, while it publishes it.
        pub claim: Option<String>,
        /// End of that round's lease; after it, any relay may take the row.
        pub claimed_until_ms: Option<i64>,
        /// When the row was set aside (no relay takes it again).
        pub set_aside_at_ms: Option<i64>,
        /// Why it was set aside.
        pub set_aside_reason: Option<String>,
        /// The trace context of the span that wrote the row, which the
        /// relay's publish continues (`crate::traces::stored`); null when
        /// traces are off, and in rows of earlier releases.
        pub trace_context: Option<String>,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `order_events`: the audit trail, one row per transition or late payment.
pub mod order_events {
    use sea_orm::entity::prelude::*;

    /// One recorded event.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_events")]
    pub struct Model {
        /// Database-assigned id; orders events of one order.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// The order.
        pub order_id: i64,
        /// What happened: `created`, `paid`, `shipped`, `completed`, `cancelled`,
        /// `fulfillment_overdue` or `late_payment`.
        pub event: String,
        /// Status before (none for `created`).
        pub from_status: Option<String>,
        /// Status after.
        pub to_status: String,
        /// `api`, `timeout` or `sweeper`.
        pub cause: String,
        /// When.
        pub at_ms: i64,
        /// A sentence for people, when there is more to say.
        pub detail: Option<String>,
        /// For a timeout's transition: how long after the deadline it was
        /// applied, both by the database's clock (null for a client's action,
        /// and for rows of a release that did not record it).
        pub late_ms: Option<i64>,
        /// For a timeout's transition: the instance that applied it
        /// (`amqp.instance`).
        pub instance: Option<String>,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `idempotency_keys`: the checkouts made with an `Idempotency-Key`, per
/// caller, kept for `http.idempotency_retention`.
pub mod idempotency_keys {
    use sea_orm::entity::prelude::*;

    /// One key and what it was used for.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "idempotency_keys")]
    pub struct Model {
        /// Whose key: the SHA-256 of the caller's bearer token in hex,
        /// `anonymous` without tokens, `unscoped` for keys written before
        /// keys were scoped (no caller matches those).
        #[sea_orm(primary_key, auto_increment = false)]
        pub scope: String,
        /// The client's key: 1 to 255 visible ASCII characters.
        #[sea_orm(primary_key, auto_increment = false)]
        pub key: String,
        /// The order created with it; null only inside that checkout's transaction.
        pub order_id: Option<i64>,
        /// The validated request in canonical form (see `store::checkout`).
        pub request: String,
        /// The body of the first answer (the order as created), for retries.
        pub answer: Option<String>,
        /// When the key was used.
        pub created_at_ms: i64,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `order_timeout_events`: the event outbox, one row per domain event,
/// written in the transaction of its transition (see `db::events`).
pub mod order_timeout_events {
    use sea_orm::entity::prelude::*;

    /// One event waiting to be published.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_timeout_events")]
    pub struct Model {
        /// Database-assigned id: the relay publishes in this order.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// The message id every publish of this row carries (a UUID made at insert).
        pub message_id: String,
        /// The order, as on the wire.
        pub order_id: String,
        /// `cancelled`, `paid`, … : the routing key is `order.<event>`.
        pub event: String,
        /// The complete JSON message body.
        pub body: String,
        /// When the row was written.
        pub created_at_ms: i64,
        /// Publish attempts that did not get a broker ack.
        pub attempts: i32,
        /// The relay round that holds the row, while it publishes it.
        pub claim: Option<String>,
        /// End of that round's lease; after it, any relay may take the row.
        pub claimed_until_ms: Option<i64>,
        /// When the row was set aside (no relay takes it again).
        pub set_aside_at_ms: Option<i64>,
        /// Why it was set aside.
        pub set_aside_reason: Option<String>,
        /// The trace context of the span that wrote the row, which the
        /// relay's publish continues (`crate::traces::stored`); null when
        /// traces are off, and in rows of earlier releases.
        pub trace_context: Option<String>,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `order_timeout_audit`: the audit trail of orders in a shop's own tables
/// (the mapped mode's; the owned mode keeps `order_events`).
pub mod order_timeout_audit {
    use sea_orm::entity::prelude::*;

    /// One recorded transition.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_timeout_audit")]
    pub struct Model {
        /// Database-assigned id; orders the entries of one order.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// The order, as on the wire.
        pub order_id: String,
        /// What happened (the event names of `db::events`).
        pub event: String,
        /// Status before, as the shop spells it (none for a creation).
        pub from_status: Option<String>,
        /// Status after, as the shop spells it.
        pub to_status: String,
        /// `timeout`, `sweeper`, `buyer` or `shop`.
        pub cause: String,
        /// When.
        pub at_ms: i64,
        /// A sentence for people, when there is more to say.
        pub detail: Option<String>,
        /// For a timeout's transition: how long after the deadline it was
        /// applied, both by the database's clock (null for a client's action,
        /// and for rows of a release that did not record it).
        pub late_ms: Option<i64>,
        /// For a timeout's transition: the instance that applied it
        /// (`amqp.instance`).
        pub instance: Option<String>,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `order_timeout_pauses`: the roles paused for every instance, one row each.
pub mod order_timeout_pauses {
    use sea_orm::entity::prelude::*;

    /// One paused role.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_timeout_pauses")]
    pub struct Model {
        /// The role's name (`control::Pausable::as_str`).
        #[sea_orm(primary_key, auto_increment = false)]
        pub role: String,
        /// When, by the database's clock.
        pub paused_at_ms: i64,
        /// Who asked (a prefix of the token's hash, or `anonymous`).
        pub paused_by: String,
        /// The instance that was asked (`amqp.instance`).
        pub instance: String,
        /// What the operator gave as the reason.
        pub reason: Option<String>,
    }

    /// No relations are navigated through SeaORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

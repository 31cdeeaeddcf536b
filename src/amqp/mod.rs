//! Everything that talks to RabbitMQ, by concern:
//! - [`connection`]: named connections, backoff, the channels of a consuming role;
//! - [`mode`]: the delay mode, chosen once;
//! - [`supervise`](mod@supervise): every role re-established after a failure;
//! - [`topology`] (names, declarations, the delay stages) and [`definitions`]
//!   (the same topology as a definitions file);
//! - [`wire`]: the message contract; [`publish`]: confirmed publishes and parking;
//! - one file per actor: [`router`], [`consumer`] (with [`disposition`] and its
//!   catch-up of orders already due), [`relay`], and [`deferral`], the native
//!   stage's worker (AMQP 1.0);
//! - [`management`]: the management HTTP API, for what AMQP cannot tell.

pub(crate) mod catch_up;
pub(crate) mod connection;
pub(crate) mod consumer;
pub(crate) mod deferral;
pub mod definitions;
pub(crate) mod disposition;
pub(crate) mod management;
pub(crate) mod mode;
pub(crate) mod publish;
pub(crate) mod relay;
pub(crate) mod router;
pub(crate) mod supervise;
pub mod topology;
pub mod wire;

pub use connection::{
    Backoff, Node, channels, connect, connect_to_address, connect_to_any, connection_name, pause,
};
pub use mode::{Offers, choose_mode, delay_mode, probe, resolve_mode};
pub use publish::{confirmed, park_delivery, publish_confirmed, publish_options};
pub use supervise::{DECLARER, supervise};

/// Why a consumer's session on its channels (a timeout consumer's, the
/// router's) ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The service is stopping.
    Shutdown,
    /// An operator paused it.
    Paused,
}

/// What stops a broker worker; the supervisor logs it and reconnects.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connection or channel failed.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused to take responsibility for a message.
    #[error("the broker nacked a publish to '{0}'")]
    Nacked(String),
    /// The broker returned a message as unroutable (only a `mandatory` publish
    /// can be returned, and [`publish_options`] never sets it).
    #[error("the broker returned a publish to '{0}' as unroutable")]
    Returned(String),
    /// A publish on a channel without confirms: nobody knows whether it is safe.
    #[error("a publish to '{0}' was made on a channel without publisher confirms")]
    Unconfirmed(String),
    /// The connection's event stream ended: the connection is gone.
    #[error("the broker connection ended")]
    ConnectionEnded,
    /// The AMQP 1.0 connection of the native stage's deferrer failed.
    #[error("amqp 1.0: {0}")]
    Amqp10(String),
    /// The broker cancelled our consumer (queue deleted, for example).
    #[error("the broker ended the consumer of '{0}'")]
    ConsumerEnded(String),
}

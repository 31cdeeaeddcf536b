//! What the integration tests, the chaos test and the bench share around the
//! service: one way to run `order-timeout serve` as a child process
//! ([`Serve`], [`Process`]) and one client of the broker's management API
//! ([`Management`]), and the removal of the delayed-message plugin's timers
//! that deleting a vhost leaves on the node ([`delayed`]). Before this crate each of them had its own copy, and
//! the copies had drifted (one waited for readiness, one did not notice a
//! child that had died, one kept no log).
//!
//! Signals are sent with the `kill` command: the workspace forbids `unsafe`.

pub mod delayed;
mod management;
mod serve;

pub use management::{Error as ManagementError, Management, url_encode};
pub use serve::{Error, Process, Serve, Signal, free_port};

//! Waiting between attempts: an exponential backoff with a cap, and a sleep
//! that shutdown cuts short. The broker connections, the relay and the
//! timeouts' database outages all wait this way.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Exponential backoff with a cap, for reconnects and database pauses.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, doubles up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }
    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    /// Back to the first wait (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Sleeps unless shutdown comes first; returns false on shutdown.
pub async fn pause(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

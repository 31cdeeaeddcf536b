//! What a reload may change while the service runs, and how: the keys read
//! afresh at each use (a batch, a round, a checkout), copied from newly loaded
//! settings into the running ones; every other key is read once, at start, and
//! a new value of it waits for a restart.

use super::keys::{Key, keys};
use super::*;

/// The keys a reload applies while the service runs. The windows only for the
/// service's own orders (see [`is_live`]).
pub const LIVE_KEYS: &[&str] = &[
    "windows.payment",
    "windows.fulfillment",
    "windows.receipt",
    "windows.max_payment",
    "consumer.batch_size",
    "consumer.batch_wait",
    "consumer.hold_max",
    "relay.batch_size",
    "relay.interval",
    "sweeper.interval",
    "sweeper.grace",
    "sweeper.batch_size",
    "metrics.gauge_interval",
    "metrics.overdue_after",
    "log.level",
];

/// Whether a reload applies `key` while running `settings`. A checkout stores
/// its order's deadline, so a new window applies to later orders only; a
/// shop's mapped table computes deadlines from a start column plus the window
/// when they are read, so there a new window would move the deadlines of
/// orders already placed: it waits for a restart.
pub fn is_live(key: &str, settings: &Settings) -> bool {
    LIVE_KEYS.contains(&key)
        && !(key.starts_with("windows.") && settings.mapping.source == OrdersSource::Mapped)
}

/// One key whose value differs between two settings, as `doctor` shows
/// values: secrets redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The dotted key.
    pub key: &'static str,
    /// Its value in the first settings.
    pub from: String,
    /// Its value in the second.
    pub to: String,
}

/// Every key whose value differs from `a` to `b`, in table order.
pub fn changes(a: &Settings, b: &Settings) -> Vec<Change> {
    keys()
        .filter_map(|key: &Key| {
            let (from, to) = ((key.show)(a), (key.show)(b));
            (from != to).then_some(Change {
                key: key.name,
                from,
                to,
            })
        })
        .collect()
}

impl Settings {
    /// These settings with the live keys (see [`is_live`]) taken from `new`,
    /// every other key kept as it is.
    pub fn with_live(&self, new: &Settings) -> Settings {
        let mut out = self.clone();
        if is_live("windows.payment", self) {
            out.windows = new.windows.clone();
        }
        out.consumer.batch_size = new.consumer.batch_size;
        out.consumer.batch_wait = new.consumer.batch_wait;
        out.consumer.hold_max = new.consumer.hold_max;
        out.relay.batch_size = new.relay.batch_size;
        out.relay.interval = new.relay.interval;
        out.sweeper.interval = new.sweeper.interval;
        out.sweeper.grace = new.sweeper.grace;
        out.sweeper.batch_size = new.sweeper.batch_size;
        out.metrics = new.metrics.clone();
        out.log.level = new.log.level.clone();
        // Where each applied value came from, and its text, follow it.
        for name in LIVE_KEYS.iter().filter(|k| is_live(k, self)) {
            match new.sources.get(*name) {
                Some(source) => out.sources.insert(name.to_string(), source.clone()),
                None => out.sources.remove(*name),
            };
            match new.given.get(*name) {
                Some(text) => out.given.insert(name.to_string(), text.clone()),
                None => out.given.remove(*name),
            };
        }
        out
    }
}

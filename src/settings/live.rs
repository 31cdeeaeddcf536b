//! What a reload may change while the service runs, and how: the keys read
//! afresh at each use (a batch, a round, a checkout, a request's token),
//! copied from newly loaded settings into the running ones; every other key is
//! read once, at start, and a new value of it waits for a restart.

use super::keys::{Key, keys};
use super::*;

/// The keys a reload applies while the service runs. The windows only for the
/// service's own orders (see [`is_live`]).
pub const LIVE_KEYS: &[&str] = &[
    "windows.payment",
    "windows.fulfillment",
    "windows.receipt",
    "windows.max_payment",
    "http.checkout_tokens",
    "http.admin_tokens",
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
/// values: secrets redacted, so a rotated token or a new password can show
/// the same text on both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The dotted key.
    pub key: &'static str,
    /// Its value in the first settings.
    pub from: String,
    /// Its value in the second.
    pub to: String,
}

/// Every key whose value differs from `a` to `b`, in table order. A secret
/// is compared by its value, not by its redacted text, which hides the change
/// of a token or of a URL's password.
pub fn changes(a: &Settings, b: &Settings) -> Vec<Change> {
    keys()
        .filter_map(|key: &Key| {
            let (from, to) = ((key.show)(a), (key.show)(b));
            let secret_changed = key.secret.as_ref().is_some_and(|s| !(s.same)(a, b));
            (from != to || secret_changed).then_some(Change {
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
        // Read at each request (`crate::http`): a rotated-out token is
        // refused from the next request on.
        out.http.checkout_tokens = new.http.checkout_tokens.clone();
        out.http.admin_tokens = new.http.admin_tokens.clone();
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

/// Whether `applied` (the running settings with a reload's live keys, see
/// [`Settings::with_live`]) may run in place of `running`. The new file was
/// checked with its own `http.bind` and `http.protect_operations`, which a
/// reload does not apply, so the tokens are checked again with the running
/// ones; and a reload never takes every token away, which would open an API
/// that was protected: that is a restart's decision.
pub fn check_applied(running: &Settings, applied: &Settings) -> Result<(), SettingsError> {
    check_http(applied)?;
    if running.http.has_tokens() && !applied.http.has_tokens() {
        return Err(invalid(
            "http.admin_tokens",
            "a reload cannot remove every token, which would leave the API open to anyone: \
             keep at least one, or restart to run without tokens",
        ));
    }
    Ok(())
}

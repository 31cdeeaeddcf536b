//! What a reload may change while the service runs, and how: the keys read
//! afresh at each use (a batch, a round, a checkout, a request's token),
//! copied from newly loaded settings into the running ones; every other key is
//! read once, at start, and a new value of it waits for a restart.

use super::*;

/// The keys a reload applies while the service runs (marked `[live]` in the
/// table); the windows only for the service's own orders (see [`is_live`]).
pub fn live_keys() -> impl Iterator<Item = &'static str> {
    keys().filter(|k| k.live).map(|k| k.name)
}

/// Whether a reload applies `key` while running `settings`. A checkout stores
/// its order's deadline, so a new window applies to later orders only; a
/// shop's mapped table computes deadlines from a start column plus the window
/// when they are read, so there a new window would move the deadlines of
/// orders already placed: it waits for a restart.
pub fn is_live(key: &str, settings: &Settings) -> bool {
    keys().any(|k| k.live && k.name == key)
        && !(live_when_owned_only(key) && settings.mapping.source == OrdersSource::Mapped)
}

/// Whether `key`, a live one, is applied live only to the service's own
/// orders and waits for a restart with a mapped table (see [`is_live`]): the
/// windows. The settings file says so next to each.
pub(super) fn live_when_owned_only(key: &str) -> bool {
    key.starts_with("windows.")
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
        .filter_map(|key| {
            let (from, to) = ((key.show)(a), (key.show)(b));
            (from != to || !(key.same)(a, b)).then_some(Change {
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
        for key in keys().filter(|k| is_live(k.name, self)) {
            (key.copy)(&mut out, new);
            // Where the applied value came from, and its text, follow it.
            let name = key.name.to_string();
            match new.sources.get(key.name) {
                Some(source) => out.sources.insert(name.clone(), source.clone()),
                None => out.sources.remove(key.name),
            };
            match new.given.get(key.name) {
                Some(text) => out.given.insert(name, text.clone()),
                None => out.given.remove(key.name),
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

//! What must hold across the keys of a section, checked once all of them are
//! read: `http.*` (the tokens of each scope, and the refusal to start open on a
//! reachable address) and `windows.*`.

use super::*;

/// `http.*`: no token in both scopes, a token to protect the operations
/// endpoints with, and a reachable API only with tokens or said to be open.
pub(super) fn check_http(settings: &Settings) -> Result<(), SettingsError> {
    let http = &settings.http;
    if http
        .checkout_tokens
        .iter()
        .any(|t| http.admin_tokens.contains(t))
    {
        return Err(invalid(
            "http.checkout_tokens",
            "a token is also in `http.admin_tokens`: give each scope its own tokens",
        ));
    }
    if http.protect_operations && !http.has_tokens() {
        return Err(invalid(
            "http.protect_operations",
            "true needs a token in `http.admin_tokens` or `http.checkout_tokens` to read /readyz and /metrics with",
        ));
    }
    // Loopback without tokens is development (`make run`, tests); anything
    // reachable from elsewhere must say who may call it, or that anyone may.
    let bind = http.bind;
    let loopback = bind.ip().to_canonical().is_loopback();
    if !loopback && !http.has_tokens() && !http.allow_anonymous {
        return Err(invalid(
            "http.bind",
            format!(
                "{bind} is reachable from other machines and no token is configured: \
                 set `http.admin_tokens` and/or `http.checkout_tokens`, \
                 or `http.allow_anonymous = true` if anyone who reaches the port may \
                 set stock and act on every order"
            ),
        ));
    }
    Ok(())
}

/// `windows.*`: the default payment window must not exceed the longest a
/// checkout may ask for.
pub(super) fn check_windows(settings: &Settings) -> Result<(), SettingsError> {
    let windows = &settings.windows;
    if windows.payment > windows.max_payment {
        return Err(invalid(
            "windows.payment",
            format!(
                "{} is longer than `windows.max_payment` ({})",
                humantime::format_duration(windows.payment),
                humantime::format_duration(windows.max_payment)
            ),
        ));
    }
    Ok(())
}

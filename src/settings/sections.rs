//! Sections whose keys are checked together: `http.*` (bind, tokens and
//! the refusal to start open on a reachable address) and `windows.*`.

use super::*;

/// How `doctor` shows a token list: how many, never what.
pub(super) fn describe_tokens(tokens: &[Secret]) -> String {
    match tokens.len() {
        0 => String::new(),
        1 => "1 token (redacted)".to_string(),
        n => format!("{n} tokens (redacted)"),
    }
}

/// `http.*`: the bind address, the tokens of each scope, and whether a
/// reachable API without tokens is meant.
pub(super) fn parse_http<'v>(get: impl Fn(&str) -> &'v str) -> Result<HttpSettings, SettingsError> {
    let bind: SocketAddr = get("http.bind").parse().map_err(|_| {
        invalid(
            "http.bind",
            format!(
                "'{}' (expected host:port, e.g. 127.0.0.1:8080)",
                get("http.bind")
            ),
        )
    })?;
    let http = HttpSettings {
        bind,
        checkout_tokens: parse_tokens("http.checkout_tokens", get("http.checkout_tokens"))?,
        admin_tokens: parse_tokens("http.admin_tokens", get("http.admin_tokens"))?,
        allow_anonymous: parse_bool("http.allow_anonymous", get("http.allow_anonymous"))?,
        protect_operations: parse_bool("http.protect_operations", get("http.protect_operations"))?,
        header_read_timeout: parse_duration(
            "http.header_read_timeout",
            get("http.header_read_timeout"),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?,
        request_timeout: parse_duration(
            "http.request_timeout",
            get("http.request_timeout"),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?,
        max_connections: parse_range(
            "http.max_connections",
            get("http.max_connections"),
            1,
            1_000_000,
        )?,
        max_in_flight: parse_range(
            "http.max_in_flight",
            get("http.max_in_flight"),
            1,
            1_000_000,
        )?,
    };
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
    Ok(http)
}

/// Shortest bearer token accepted: 16 characters (a uuid without dashes has 32).
pub const MIN_TOKEN_LEN: usize = 16;

/// A comma-separated list of bearer tokens (several while one is rotated:
/// `old,new`). Spaces around the commas are ignored; each token must be at least
/// [`MIN_TOKEN_LEN`] printable ASCII characters without whitespace. Errors say
/// which token (by position) is wrong, never what it is.
pub fn parse_tokens(key: &str, value: &str) -> Result<Vec<Secret>, SettingsError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut tokens: Vec<Secret> = Vec::new();
    for (i, token) in value.split(',').map(str::trim).enumerate() {
        let n = i + 1;
        if token.is_empty() {
            return Err(invalid(
                key,
                format!("token {n} is empty (separate tokens with single commas)"),
            ));
        }
        if token.chars().any(char::is_whitespace) {
            return Err(invalid(key, format!("token {n} contains whitespace")));
        }
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid(
                key,
                format!(
                    "token {n} holds a character that is not printable ASCII (an HTTP header cannot carry it)"
                ),
            ));
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(invalid(
                key,
                format!(
                    "token {n} has {} characters; at least {MIN_TOKEN_LEN} are needed (a random uuid without dashes has 32)",
                    token.len()
                ),
            ));
        }
        let token = Secret::opaque(token);
        if tokens.contains(&token) {
            return Err(invalid(key, format!("token {n} is given twice")));
        }
        tokens.push(token);
    }
    Ok(tokens)
}

/// `windows.*`: the default windows, and the longest payment window a
/// checkout may ask for, which the default must not exceed.
pub(super) fn parse_windows<'v>(get: impl Fn(&str) -> &'v str) -> Result<Windows, SettingsError> {
    let windows = Windows {
        payment: parse_window("windows.payment", get("windows.payment"))?,
        fulfillment: parse_window("windows.fulfillment", get("windows.fulfillment"))?,
        receipt: parse_window("windows.receipt", get("windows.receipt"))?,
        max_payment: parse_window("windows.max_payment", get("windows.max_payment"))?,
    };
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
    Ok(windows)
}

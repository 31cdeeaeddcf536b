//! Parsers of single values: booleans, bounded numbers, choices, durations,
//! windows, addresses, log filters and bearer tokens. Every error names the key.

use super::*;

pub(super) fn parse_bool(key: &str, value: &str) -> Result<bool, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(key, format!("'{value}' (expected true or false)"))),
    }
}

/// One of a type's spellings; the error lists them all.
pub(super) fn parse_choice<T: Copy>(
    key: &str,
    value: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, SettingsError> {
    if let Some(found) = all.iter().copied().find(|t| name(*t) == value) {
        return Ok(found);
    }
    let names: Vec<&str> = all.iter().map(|t| name(*t)).collect();
    let (last, rest) = names.split_last().unwrap_or((&"", &[]));
    let expected = if rest.is_empty() {
        last.to_string()
    } else {
        format!("{} or {last}", rest.join(", "))
    };
    Err(invalid(key, format!("'{value}' (expected {expected})")))
}

pub(super) fn parse_range<T>(key: &str, value: &str, min: T, max: T) -> Result<T, SettingsError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
{
    match value.trim().parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(invalid(
            key,
            format!("'{value}' (expected a whole number from {min} to {max})"),
        )),
    }
}

/// Parses a humantime duration (`30m`, `1h 30m`, `250ms`) within bounds.
pub fn parse_duration(
    key: &str,
    value: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, SettingsError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| {
        invalid(
            key,
            format!("'{value}' is not a duration ({e}); write it like 30s, 15m, 7d or 250ms"),
        )
    })?;
    if d < min || d > max {
        return Err(invalid(
            key,
            format!(
                "'{value}' is out of range ({} to {})",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d)
}

/// A retention: `off` or `0` keeps for ever (`None`); anything else is a
/// duration within bounds.
pub(super) fn parse_retention(
    key: &str,
    value: &str,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>, SettingsError> {
    match value.trim() {
        "off" | "0" => Ok(None),
        v => parse_duration(key, v, min, max).map(Some),
    }
}

/// A window: at least one millisecond, at most what one `x-delay` can carry.
pub fn parse_window(key: &str, value: &str) -> Result<Duration, SettingsError> {
    parse_duration(key, value, Duration::from_millis(1), MAX_DELAY)
}

/// An address to listen on, `host:port`.
pub(super) fn parse_bind(key: &str, value: &str) -> Result<SocketAddr, SettingsError> {
    value.parse().map_err(|_| {
        invalid(
            key,
            format!("'{value}' (expected host:port, e.g. 127.0.0.1:8080)"),
        )
    })
}

/// A log filter in `RUST_LOG` syntax, checked the way the subscriber will read it.
pub(super) fn parse_log_level(key: &str, value: &str) -> Result<String, SettingsError> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map_err(|e| invalid(key, format!("'{value}': {e}")))?;
    Ok(value.to_string())
}

/// `tracing.otlp_endpoint`: empty (off), or an `http://` or `https://` base
/// URL without credentials, query or fragment; `/v1/traces` is added to it.
pub(super) fn parse_otlp_endpoint(key: &str, value: &str) -> Result<String, SettingsError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(String::new());
    }
    let url = url::Url::parse(value).map_err(|e| {
        invalid(
            key,
            format!("'{value}' is not a URL ({e}); write it like http://collector:4318"),
        )
    })?;
    if url.scheme() == "https" {
        // The exporter speaks plain HTTP: an https:// endpoint would get
        // every batch refused, and the spans lost without a word.
        return Err(invalid(
            key,
            format!(
                "'{value}': the exporter speaks plain HTTP, not TLS; give the http:// address of \
                 a collector beside the service (an OpenTelemetry Collector sidecar or agent), \
                 which forwards to the remote one over TLS"
            ),
        ));
    }
    if url.scheme() != "http" || url.host_str().is_none() {
        return Err(invalid(
            key,
            format!("'{value}' (expected http://HOST:PORT of an OTLP/HTTP receiver)"),
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(key, "credentials do not belong in the URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(
            key,
            format!("'{value}' (a base URL: no query or fragment; spans go to its /v1/traces)"),
        ));
    }
    Ok(value.trim_end_matches('/').to_string())
}

/// `tracing.service_name`: 1 to 255 visible characters.
pub(super) fn parse_service_name(key: &str, value: &str) -> Result<String, SettingsError> {
    let value = value.trim();
    if value.is_empty() || value.len() > 255 || value.chars().any(char::is_control) {
        return Err(invalid(
            key,
            format!("'{value}' (expected 1 to 255 characters, no control characters)"),
        ));
    }
    Ok(value.to_string())
}

/// A share from 0.0 to 1.0.
pub(super) fn parse_ratio(key: &str, value: &str) -> Result<f64, SettingsError> {
    match value.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(invalid(
            key,
            format!("'{value}' (expected a number from 0.0 to 1.0)"),
        )),
    }
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
        if token == REDACTED {
            return Err(invalid(
                key,
                format!(
                    "token {n} is redacted (as `order-timeout config` prints tokens): give the real tokens, best in the environment"
                ),
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

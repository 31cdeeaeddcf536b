//! The URLs of the database, the broker and its management API, checked
//! before any library sees them, and what comes with them (prefix, CA file,
//! instance name).

use super::*;

/// What to do about a URL that does not parse: reserved characters in a
/// password are the usual cause.
pub(super) const ENCODE_HINT: &str =
    "percent-encode reserved characters (: / ? # [ ] @ %) in the user name and password";

/// A URL the database or the AMQP library would quote whole if it could not
/// parse it: refused here, shown redacted.
fn parse_url(key: &str, value: &str) -> Result<url::Url, SettingsError> {
    url::Url::parse(value).map_err(|e| {
        let redacted = redact_url(value);
        invalid(
            key,
            format!("'{redacted}' is not a URL ({e}); {ENCODE_HINT}"),
        )
    })
}

/// `amqp.url`: one broker URL, or several separated by commas (the nodes of
/// a cluster, tried in turn: see `amqp::connect`), each checked with the parser
/// the AMQP client itself uses, so that no URL reaches the client that it
/// would refuse with an error quoting it whole (password included) on every
/// reconnect. The addresses must name the same vhost: they are one broker.
pub(super) fn parse_amqp_url(key: &str, value: &str) -> Result<String, SettingsError> {
    let addresses: Vec<&str> = value.split(',').map(str::trim).collect();
    let mut vhost = None;
    for (n, address) in addresses.iter().enumerate() {
        if address.is_empty() {
            return Err(invalid(
                key,
                format!(
                    "address {} of {} is empty (addresses are separated by commas;                      a comma in a password is written %2C)",
                    n + 1,
                    addresses.len()
                ),
            ));
        }
        let uri = parse_one_amqp_url(key, address)?;
        match &vhost {
            None => vhost = Some(uri.vhost),
            Some(first) if *first != uri.vhost => {
                return Err(invalid(
                    key,
                    format!(
                        "'{}' names vhost '{}' but the first address names '{first}': \
                         the addresses are the nodes of one broker",
                        redact_url(address),
                        uri.vhost
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(addresses.join(","))
}

/// One address of `amqp.url`.
fn parse_one_amqp_url(key: &str, value: &str) -> Result<lapin::uri::AMQPUri, SettingsError> {
    let redacted = redact_url(value);
    let url = parse_url(key, value)?;
    if url.scheme() != "amqp" && url.scheme() != "amqps" {
        return Err(invalid(
            key,
            format!("scheme '{}' (expected amqp:// or amqps://)", url.scheme()),
        ));
    }
    // The client's own error text quotes the URL: say what is wrong without it.
    let not_amqp = || {
        invalid(
            key,
            format!(
                "'{redacted}' is not an AMQP URL (amqp://user:password@host:port/vhost); {ENCODE_HINT}"
            ),
        )
    };
    if url.cannot_be_a_base() {
        return Err(not_amqp());
    }
    value.parse::<lapin::uri::AMQPUri>().map_err(|_| not_amqp())
}

/// `database.url`: `sqlite:…`, `postgres://…` or `mysql://…`, with a host. The
/// database library quotes a URL it cannot parse or has no driver for whole,
/// password included: such a URL stops start-up here, redacted.
pub(super) fn parse_database_url(key: &str, value: &str) -> Result<String, SettingsError> {
    if value.trim().is_empty() {
        return Err(invalid(key, "must not be empty"));
    }
    if value.starts_with("sqlite:") {
        return Ok(value.to_string());
    }
    let redacted = redact_url(value);
    let url = parse_url(key, value)?;
    match url.scheme() {
        "postgres" | "postgresql" | "mysql" => {}
        "mariadb" => {
            return Err(invalid(
                key,
                format!("'{redacted}': MariaDB is reached with mysql://, not mariadb://"),
            ));
        }
        other => {
            return Err(invalid(
                key,
                format!("scheme '{other}' (expected sqlite:, postgres:// or mysql://)"),
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(
            key,
            format!("'{redacted}' has no host; {ENCODE_HINT}"),
        ));
    }
    Ok(value.to_string())
}

/// `text` (a library's error message) with the secrets of `raw_url` replaced
/// by `***`: the URL itself, and its password as written and decoded. The last
/// line of defence behind the checks above, for errors quoting what they got.
pub fn scrub_url(text: &str, raw_url: &str) -> String {
    let mut out = text.replace(raw_url, &redact_url(raw_url));
    // Each address of a list (`amqp.url` for a cluster), and the whole.
    for one in raw_url.split(',').map(str::trim).chain([raw_url]) {
        out = out.replace(one, &redact_url(one));
        if let Ok(url) = url::Url::parse(one)
            && let Some(password) = url.password().filter(|p| !p.is_empty())
        {
            let decoded = percent_encoding::percent_decode_str(password).decode_utf8_lossy();
            out = out
                .replace(password, "***")
                .replace(decoded.as_ref(), "***");
        }
    }
    out
}

/// `amqp.management_url`: `off`; empty for the broker's host over http on
/// 15672; or an `http://` URL. Credentials not in the URL are those of
/// `amqp.url` (its first address), and so is the vhost. (No https: the
/// service's HTTP client is built without TLS; with an `amqps://` broker and
/// no URL it is off.)
pub(super) fn parse_management(
    key: &str,
    value: &str,
    amqp_url: &str,
) -> Result<Option<ManagementApi>, SettingsError> {
    if value == "off" {
        return Ok(None);
    }
    // amqp.url was validated first; its parts fill what this URL leaves out.
    let amqp_url = amqp_url.split(',').next().unwrap_or_default();
    let amqp: lapin::uri::AMQPUri = amqp_url
        .parse()
        .map_err(|e| invalid("amqp.url", format!("'{}' ({e})", redact_url(amqp_url))))?;
    let from_amqp = |base: String| ManagementApi {
        base,
        username: amqp.authority.userinfo.username.clone(),
        password: Secret::opaque(amqp.authority.userinfo.password.clone()),
        vhost: amqp.vhost.clone(),
    };
    if value.is_empty() {
        if amqp_url.starts_with("amqps:") {
            return Ok(None);
        }
        let host = &amqp.authority.host;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        return Ok(Some(from_amqp(format!("http://{host}:15672"))));
    }
    let url = url::Url::parse(value)
        .map_err(|e| invalid(key, format!("'{}' is not a URL ({e})", redact_url(value))))?;
    match url.scheme() {
        "http" => {}
        "https" => {
            return Err(invalid(
                key,
                "https is not supported (the service's HTTP client has no TLS): give an http:// listener or 'off'",
            ));
        }
        other => {
            return Err(invalid(
                key,
                format!("scheme '{other}' (expected http://, empty for the default, or off)"),
            ));
        }
    }
    let host = url
        .host_str()
        .ok_or_else(|| invalid(key, format!("'{}' has no host", redact_url(value))))?;
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = url.path().trim_end_matches('/').trim_end_matches("/api");
    let mut api = from_amqp(format!("http://{host}{port}{path}"));
    if !url.username().is_empty() {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        api.username = decode(url.username());
        api.password = Secret::opaque(decode(url.password().unwrap_or_default()));
    }
    Ok(Some(api))
}

pub(super) fn parse_prefix(key: &str, value: &str) -> Result<String, SettingsError> {
    // Names are AMQP short strings (≤ 255 bytes); the longest derived name adds
    // about 20 characters, so keep the prefix well under that.
    let ok = !value.is_empty()
        && value.len() <= 200
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !ok {
        return Err(invalid(
            key,
            format!("'{value}' (expected 1 to 200 characters of A-Z a-z 0-9 . - _ :)"),
        ));
    }
    Ok(value.to_string())
}

/// Reads a PEM file of CA certificates; empty means none.
pub(super) fn read_pem(key: &str, path: &str) -> Result<Option<String>, SettingsError> {
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read '{path}': {e}")))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(key, format!("'{path}' holds no PEM certificate")));
    }
    Ok(Some(text))
}

/// Longest `amqp.instance`, in bytes: it goes into AMQP short strings
/// (consumer tags such as `consumer shipping NAME`, 255 bytes at most) and
/// into 255-character columns, with room for what is put before it.
pub const INSTANCE_MAX_BYTES: usize = 128;

/// `amqp.instance`: the name given, or when empty this host's name and the
/// process id, so that the broker tells apart two instances on one host. A
/// name longer than [`INSTANCE_MAX_BYTES`] or holding a control character is
/// refused here, naming the key: past start-up it would stop the consumers.
pub(super) fn instance_name(key: &str, value: &str) -> Result<String, SettingsError> {
    if !value.is_empty() {
        if value.len() > INSTANCE_MAX_BYTES {
            return Err(invalid(
                key,
                format!(
                    "'{}' is {} bytes long; at most {INSTANCE_MAX_BYTES} (it names this instance \
                     in consumer tags, which AMQP keeps to 255 bytes)",
                    crate::domain::truncate(value, 32),
                    value.len()
                ),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(key, format!("{value:?} holds a control character")));
        }
        return Ok(value.to_string());
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        // A host name is at most 64 bytes (HOST_NAME_MAX); bounded all the same.
        crate::domain::truncate(&host, 64)
    };
    Ok(format!("{host}:{}", std::process::id()))
}

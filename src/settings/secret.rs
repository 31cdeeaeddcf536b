//! Secrets: values whose `Debug` and `Display` are redacted, and the
//! redaction of URLs in what is shown or logged.

use super::*;

/// What a secret is printed as: a whole token, or the password of a URL.
pub const REDACTED: &str = "***";

/// A value that must never be printed: its `Debug` and `Display` are redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Nothing of it may be shown (a bearer token); otherwise it is a URL,
    /// shown without its password.
    opaque: bool,
}

impl Secret {
    /// Wraps a URL (or a password) whose password part is secret.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        Self {
            value,
            opaque: false,
        }
    }
    /// Wraps a value that is secret as a whole, such as a bearer token.
    pub fn opaque(value: impl Into<String>) -> Self {
        let value = value.into();
        Self {
            value,
            opaque: true,
        }
    }
    /// The secret itself, for the one place that must use it (a connect call).
    pub fn expose(&self) -> &str {
        &self.value
    }
    /// The value with any password replaced, safe for logs and `doctor`.
    pub fn redacted(&self) -> String {
        if self.opaque {
            REDACTED.to_string()
        } else {
            redact_url(&self.value)
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Replaces the password of a URL (and any `password=` query value) with `***`.
/// Text that is not a URL is returned whole only when it cannot hold a password.
/// A list of URLs separated by commas (`amqp.url` for a cluster) is redacted
/// address by address; text with commas that is not such a list (a comma in a
/// password or a query) is redacted as one URL.
pub fn redact_url(raw: &str) -> String {
    if raw.contains(',') {
        let parts: Vec<&str> = raw.split(',').map(str::trim).collect();
        if parts
            .iter()
            .all(|p| url::Url::parse(p).is_ok_and(|u| !u.cannot_be_a_base()))
        {
            return parts
                .iter()
                .map(|p| redact_one_url(p))
                .collect::<Vec<_>>()
                .join(",");
        }
    }
    redact_one_url(raw)
}

fn redact_one_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        // `user:pass@host` parses as scheme `user` with an opaque path: hide it all.
        Ok(url) if url.cannot_be_a_base() && raw.contains('@') => REDACTED.to_string(),
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some(REDACTED));
            }
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k.eq_ignore_ascii_case("password") {
                        REDACTED.into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            url.to_string()
        }
        // Something like `user:pass@host` that is not a URL: hide everything after
        // the first colon rather than risk printing a password.
        Err(_) if raw.contains('@') => REDACTED.to_string(),
        Err(_) => raw.to_string(),
    }
}

//! Requests a web page may not make. A browser lets any page it shows send a
//! POST to `127.0.0.1` without asking anyone (a "simple" cross-origin request:
//! no custom header, a form's content type), and a page whose name an attacker
//! points at `127.0.0.1` (DNS rebinding) may even read the answers. With a
//! bearer token configured that does no harm: the page does not know the
//! token and a browser does not add it on its own. Without one (loopback, or
//! `http.allow_anonymous`), this is what stands between such a page and
//! `/admin/pause`. Three rules, checked before authentication and routing
//! matter:
//!
//! 1. Every state-changing request (PUT, POST, DELETE, PATCH) says
//!    `Content-Type: application/json`, with a body or without: a browser
//!    sends that cross-origin only after a CORS preflight, which this API never
//!    answers. 415 otherwise.
//! 2. An `Origin` header, when present, is the request's own origin (scheme
//!    `http` or `https`, the authority the `Host` names). 403 otherwise.
//! 3. With no token configured, the `Host` is an IP literal or `localhost`, in
//!    any case and with any port. A rebinding page reaches us under its own
//!    name, which is neither; the port is not checked because an SSH tunnel
//!    or a local proxy changes it without changing who is calling. 421
//!    otherwise. A request without a `Host` (HTTP/1.0) comes from no browser
//!    and passes.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    /// A state-changing request that does not say it sends JSON.
    #[error(
        "a {0} request needs `Content-Type: application/json`, with a body or without (nothing was done)"
    )]
    ContentType(String),
    /// An `Origin` that is not the request's own.
    #[error(
        "cross-origin requests are refused: Origin {0} is not this service's origin (nothing was done)"
    )]
    ForeignOrigin(String),
    /// A `Host` that is not an address of this machine, on a token-less API.
    #[error(
        "Host {0} is not an IP address or localhost; with no token configured this API answers only those (nothing was done)"
    )]
    ForeignHost(String),
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let status = match refusal {
            Refusal::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::ForeignOrigin(_) => StatusCode::FORBIDDEN,
            Refusal::ForeignHost(_) => StatusCode::MISDIRECTED_REQUEST,
        };
        ApiError::new(status, refusal.to_string())
    }
}

/// The middleware: refuses what [`check`] refuses, before anything else runs.
pub(super) async fn guard(anonymous: bool, request: Request, next: Next) -> Response {
    match check(
        request.method(),
        request.uri(),
        request.headers(),
        anonymous,
    ) {
        Ok(()) => next.run(request).await,
        Err(refusal) => ApiError::from(refusal).into_response(),
    }
}

/// The three rules of this module for one request; `anonymous`: no token is
/// configured.
fn check(
    method: &axum::http::Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    anonymous: bool,
) -> Result<(), Refusal> {
    use axum::http::Method;
    let changes = matches!(
        *method,
        Method::POST | Method::PUT | Method::DELETE | Method::PATCH
    );
    if changes && !is_json(headers.get(header::CONTENT_TYPE)) {
        return Err(Refusal::ContentType(method.to_string()));
    }
    // HTTP/1.1 names the authority in `Host`, HTTP/2 in `:authority`.
    let host = match headers.get(header::HOST) {
        Some(value) => Some(value.to_str().map_err(|_| foreign_host(value.as_bytes()))?),
        None => uri.authority().map(|a| a.as_str()),
    };
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = origin.to_str().ok().and_then(|origin| {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))?;
            host.filter(|host| host.eq_ignore_ascii_case(authority))
        });
        if own.is_none() {
            return Err(Refusal::ForeignOrigin(shown(origin.as_bytes())));
        }
    }
    match host {
        Some(host) if anonymous && !is_local_name(host) => Err(foreign_host(host.as_bytes())),
        _ => Ok(()),
    }
}

fn foreign_host(host: &[u8]) -> Refusal {
    Refusal::ForeignHost(shown(host))
}

/// A header value as an error message may quote it: printable, short.
fn shown(value: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(value)
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    format!("'{}'", crate::domain::truncate(&text, 64))
}

/// `application/json`, in any case, with or without parameters.
fn is_json(value: Option<&HeaderValue>) -> bool {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether a `Host` value names this machine in a way no web page's own name
/// can: an IPv4 or bracketed IPv6 literal, or `localhost`, with any port.
fn is_local_name(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        // `[::1]` alone: the last colon is inside the brackets.
        Some((name, port)) if !port.contains(']') => {
            if !port.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            name
        }
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<Ipv4Addr>().is_ok()
        || name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.parse::<Ipv6Addr>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{Method, Uri};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    header::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    fn run(
        method: Method,
        pairs: &[(&'static str, &'static str)],
        anonymous: bool,
    ) -> Result<(), Refusal> {
        check(
            &method,
            &Uri::from_static("/admin/reload"),
            &headers(pairs),
            anonymous,
        )
    }

    #[test]
    fn local_names_are_ip_literals_and_localhost() {
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:8080",
            "LOCALHOST:1",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:8080",
            "[2001:db8::1]:443",
        ] {
            assert!(is_local_name(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example:8080",
            "127.0.0.1.nip.io:8080",
            "localhost:80x",
            "[::1",
            "::1",
            "",
        ] {
            assert!(!is_local_name(host), "{host}");
        }
    }

    #[test]
    fn state_changes_need_the_json_content_type() {
        let host = ("host", "127.0.0.1:8080");
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(matches!(
                run(method.clone(), &[host], true),
                Err(Refusal::ContentType(_))
            ));
            for refused in [
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data",
                "application/jsonx",
            ] {
                let content_type = HeaderValue::from_static(refused);
                let mut h = headers(&[host]);
                h.insert(header::CONTENT_TYPE, content_type);
                assert!(
                    check(&method, &Uri::from_static("/"), &h, false).is_err(),
                    "{method} {refused}"
                );
            }
            for accepted in ["application/json", "Application/JSON; charset=utf-8"] {
                let mut h = headers(&[host]);
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static(accepted));
                assert_eq!(check(&method, &Uri::from_static("/"), &h, true), Ok(()));
            }
        }
        assert_eq!(run(Method::GET, &[host], true), Ok(()));
    }

    #[test]
    fn origins_must_be_the_requests_own() {
        let json = ("content-type", "application/json");
        let host = ("host", "127.0.0.1:8080");
        for own in ["http://127.0.0.1:8080", "https://127.0.0.1:8080"] {
            let mut h = headers(&[json, host]);
            h.insert(header::ORIGIN, HeaderValue::from_static(own));
            assert_eq!(
                check(&Method::POST, &Uri::from_static("/"), &h, true),
                Ok(()),
                "{own}"
            );
        }
        for foreign in [
            "http://evil.example",
            "http://127.0.0.1:8081",
            "http://127.0.0.1",
            "null",
            "file://",
            "ftp://127.0.0.1:8080",
        ] {
            for anonymous in [true, false] {
                let mut h = headers(&[json, host]);
                h.insert(header::ORIGIN, HeaderValue::from_static(foreign));
                assert!(
                    matches!(
                        check(&Method::POST, &Uri::from_static("/"), &h, anonymous),
                        Err(Refusal::ForeignOrigin(_))
                    ),
                    "{foreign}"
                );
            }
        }
    }

    #[test]
    fn a_foreign_host_is_refused_only_without_tokens() {
        let json = ("content-type", "application/json");
        let rebound = ("host", "evil.example:8080");
        assert!(matches!(
            run(Method::POST, &[json, rebound], true),
            Err(Refusal::ForeignHost(_))
        ));
        assert!(matches!(
            run(Method::GET, &[rebound], true),
            Err(Refusal::ForeignHost(_))
        ));
        assert_eq!(run(Method::POST, &[json, rebound], false), Ok(()));
        // No Host at all: no browser sent it.
        assert_eq!(run(Method::GET, &[], true), Ok(()));
    }
}

//! Who may call what on the HTTP API: bearer tokens of two scopes from the
//! settings (`http.checkout_tokens`, `http.admin_tokens`), what each route
//! needs, and the decision for one request. The HTTP layer ([`crate::http`])
//! asks [`Access::check`] before any handler reads the body, and turns a
//! refusal into a 401 or 403.
//!
//! A presented token is compared with every configured token, each comparison
//! without an early exit, so the answer's timing does not say how much of a
//! guess was right, nor which token came close.

use crate::settings::HttpSettings;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Checkout and the buyer's actions: place, read, pay, confirm, cancel.
    Checkout,
    /// Inventory, shipping and `/admin`, and everything the checkout scope may do.
    Admin,
}

impl Scope {
    /// The scope's name, as the OpenAPI document and error messages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checkout => "checkout",
            Self::Admin => "admin",
        }
    }

    /// Whether a token of this scope may do what `need` asks for.
    fn allows(self, need: Scope) -> bool {
        self == Scope::Admin || need == Scope::Checkout
    }
}

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: liveness, the OpenAPI document, an unknown path's 404.
    Open,
    /// `/readyz` and `/metrics`: open, unless `http.protect_operations` asks
    /// for a token of either scope.
    Operations,
    /// A token of this scope (or the admin scope).
    Scope(Scope),
    /// A route [`need`] does not know: refused to everyone, whatever the
    /// tokens, until it is given a need (default deny).
    Undeclared,
}

/// What a route needs, from its path template as the router matched it.
/// Shipping is the one merchant's action on an order and has its own route,
/// so the scope comes from the match alone: nothing here reads the request's
/// path, whose spelling (percent-encoding, case, slashes) a caller chooses.
/// A path that matched no route needs nothing: it is answered 404. A route
/// not named here is [`Need::Undeclared`], refused: a route added without
/// deciding who may call it is closed, not public.
pub fn need(template: Option<&str>) -> Need {
    let Some(path) = template else {
        return Need::Open;
    };
    match path {
        "/inventory/{sku}" | "/orders/{id}/ship" => Need::Scope(Scope::Admin),
        path if path.starts_with("/admin/") => Need::Scope(Scope::Admin),
        "/orders" | "/orders/{id}" | "/orders/{id}/{action}" => Need::Scope(Scope::Checkout),
        "/readyz" | "/metrics" => Need::Operations,
        "/healthz" | "/openapi.json" => Need::Open,
        // The operator's page holds no data: its script calls `/admin/*`
        // with the token the operator gives it.
        "/ui" | "/ui/app.js" | "/ui/style.css" => Need::Open,
        _ => Need::Undeclared,
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer …` header (none, another scheme, or empty).
    Missing,
    /// A bearer token that is not configured.
    Invalid,
    /// A valid token whose scope does not allow this.
    Forbidden {
        /// The scope the route needs.
        needs: Scope,
    },
    /// A route with no declared need ([`Need::Undeclared`]).
    Undeclared,
}

impl Denied {
    /// A label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing_token",
            Self::Invalid => "invalid_token",
            Self::Forbidden { .. } => "insufficient_scope",
            Self::Undeclared => "undeclared_route",
        }
    }
}

/// The configured tokens and what they may do: the HTTP settings in effect,
/// borrowed for one request so that a reload that rotates a token applies to
/// the next request.
pub struct Access<'a> {
    /// The tokens of each scope (none: the API is open), and whether
    /// `/readyz` and `/metrics` need one.
    http: &'a HttpSettings,
}

impl<'a> Access<'a> {
    /// The policy of these settings (validated at load: tokens well-formed,
    /// none in both scopes).
    pub fn new(http: &'a HttpSettings) -> Self {
        Self { http }
    }

    /// Whether any token is configured (else the API is open).
    pub fn has_tokens(&self) -> bool {
        self.http.has_tokens()
    }

    /// Decides a request that needs `need` and carries this `Authorization`
    /// header value (raw bytes, as received).
    pub fn check(&self, need: Need, authorization: Option<&[u8]>) -> Result<(), Denied> {
        let needs = match need {
            Need::Undeclared => return Err(Denied::Undeclared),
            // No tokens configured (allowed on loopback only, or when
            // `http.allow_anonymous` says so): the API is open.
            _ if !self.http.has_tokens() => return Ok(()),
            Need::Open => return Ok(()),
            Need::Operations if !self.http.protect_operations => return Ok(()),
            Need::Operations => Scope::Checkout,
            Need::Scope(scope) => scope,
        };
        let presented = authorization.and_then(bearer).ok_or(Denied::Missing)?;
        let scope = self.identify(presented).ok_or(Denied::Invalid)?;
        if scope.allows(needs) {
            Ok(())
        } else {
            Err(Denied::Forbidden { needs })
        }
    }

    /// The scope of a presented token, comparing it with every configured
    /// token (no early exit, neither inside a comparison nor across tokens).
    fn identify(&self, presented: &[u8]) -> Option<Scope> {
        let mut found = None;
        let admin = self.http.admin_tokens.iter().map(|t| (t, Scope::Admin));
        let checkout = self
            .http
            .checkout_tokens
            .iter()
            .map(|t| (t, Scope::Checkout));
        for (token, scope) in admin.chain(checkout) {
            if constant_time_eq(presented, token.expose().as_bytes()) {
                found = Some(scope);
            }
        }
        found
    }
}

/// Who is calling, as far as keeping things apart per caller goes: the
/// handlers find it in the request's extensions once [`Access::check`] let
/// the request through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The SHA-256 of the caller's token in hex, or `anonymous`.
    scope: String,
}

impl Caller {
    /// The scope of callers without a token (an API without tokens): they
    /// all share it.
    pub const ANONYMOUS: &str = "anonymous";

    /// The caller that sent this `Authorization` header value, on an API
    /// that asks for tokens when `has_tokens`. The token itself is never
    /// kept: only its hash, which says nothing about it.
    pub fn of(has_tokens: bool, authorization: Option<&[u8]>) -> Self {
        use sha2::{Digest, Sha256};
        let scope = match authorization.and_then(bearer) {
            // Without tokens any bearer is accepted: it names no one.
            Some(token) if has_tokens => Sha256::digest(token)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            _ => Self::ANONYMOUS.to_string(),
        };
        Self { scope }
    }

    /// The caller's scope: 64 hex digits or `anonymous`.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The caller as a record of who did something shows it (who paused a
    /// role): `token sha256:` and the first 12 hex digits of the token's
    /// hash, which an operator matches with `printf %s "$TOKEN" | sha256sum`
    /// and which says nothing about the token; or `anonymous`.
    pub fn fingerprint(&self) -> String {
        match self.scope.get(..12) {
            Some(start) if self.scope != Self::ANONYMOUS => format!("token sha256:{start}"),
            _ => Self::ANONYMOUS.to_string(),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value; `None` for
/// another scheme or an empty token. The scheme is case-insensitive (RFC 7235).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let token = value[SCHEME.len()..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `presented` equals `expected`, in a time that depends on the
/// length of `presented` only: every byte is looked at, whatever differs
/// first, and the lengths are compared the same way.
pub fn constant_time_eq(presented: &[u8], expected: &[u8]) -> bool {
    if expected.is_empty() {
        return presented.is_empty();
    }
    // Differences accumulate; nothing branches on the bytes' values.
    let mut diff = (presented.len() ^ expected.len()) as u64;
    for (i, byte) in presented.iter().enumerate() {
        diff |= u64::from(byte ^ expected[i % expected.len()]);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::parse_tokens;

    const ADMIN: &str = "admin-token-0123456789";
    const CHECKOUT: &str = "checkout-token-0123456789";

    fn http(admin: &str, checkout: &str, protect_operations: bool) -> HttpSettings {
        HttpSettings {
            bind: "127.0.0.1:0".parse().unwrap(),
            admin_tokens: parse_tokens("http.admin_tokens", admin).unwrap(),
            checkout_tokens: parse_tokens("http.checkout_tokens", checkout).unwrap(),
            allow_anonymous: false,
            protect_operations,
            header_read_timeout: std::time::Duration::from_secs(10),
            request_timeout: std::time::Duration::from_secs(30),
            idempotency_retention: std::time::Duration::from_secs(86_400),
            max_connections: 1024,
            max_in_flight: 100,
        }
    }

    fn header(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdeX", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"X123456789abcdef", b"0123456789abcdef"));
        // A prefix, a longer value, a repetition of the value: all different.
        assert!(!constant_time_eq(b"01234567", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!constant_time_eq(
            b"0123456789abcdef0123456789abcdef",
            b"0123456789abcdef"
        ));
        assert!(!constant_time_eq(b"", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"x", b""));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bearer_takes_the_token_of_a_bearer_header_only() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER abc"), Some(&b"abc"[..]));
        for refused in [
            &b"Bearer"[..],
            b"Bearer ",
            b"Bearer    ",
            b"Basic YWJjOmRlZg==",
            b"abc",
            b"",
            b"Bearerabc",
        ] {
            assert_eq!(
                bearer(refused),
                None,
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn scopes_decide_what_a_token_may_do() {
        let http = http(ADMIN, CHECKOUT, false);
        let access = Access::new(&http);
        let admin = header(ADMIN);
        let checkout = header(CHECKOUT);
        let (inventory, buyer) = (Need::Scope(Scope::Admin), Need::Scope(Scope::Checkout));
        assert_eq!(access.check(inventory, Some(&admin)), Ok(()));
        assert_eq!(access.check(buyer, Some(&admin)), Ok(()));
        assert_eq!(access.check(buyer, Some(&checkout)), Ok(()));
        assert_eq!(
            access.check(inventory, Some(&checkout)),
            Err(Denied::Forbidden {
                needs: Scope::Admin
            })
        );
        assert_eq!(access.check(buyer, None), Err(Denied::Missing));
        assert_eq!(
            access.check(buyer, Some(b"Basic YWJjOmRlZg==")),
            Err(Denied::Missing)
        );
        assert_eq!(
            access.check(buyer, Some(&header("wrong-token-0123456789"))),
            Err(Denied::Invalid)
        );
        // A prefix of a real token is no token.
        assert_eq!(
            access.check(buyer, Some(&header(&ADMIN[..16]))),
            Err(Denied::Invalid)
        );
        assert_eq!(access.check(Need::Open, None), Ok(()));
        assert_eq!(access.check(Need::Operations, None), Ok(()));
    }

    #[test]
    fn protected_operations_take_a_token_of_either_scope() {
        let http = http(ADMIN, CHECKOUT, true);
        let access = Access::new(&http);
        assert_eq!(access.check(Need::Operations, None), Err(Denied::Missing));
        for token in [ADMIN, CHECKOUT] {
            assert_eq!(access.check(Need::Operations, Some(&header(token))), Ok(()));
        }
        assert_eq!(access.check(Need::Open, None), Ok(()));
    }

    #[test]
    fn rotated_tokens_both_work() {
        let http = http("old-admin-token-0123,new-admin-token-0123", "", false);
        let access = Access::new(&http);
        for token in ["old-admin-token-0123", "new-admin-token-0123"] {
            assert_eq!(
                access.check(Need::Scope(Scope::Admin), Some(&header(token))),
                Ok(())
            );
        }
    }

    #[test]
    fn no_tokens_leave_the_api_open() {
        let http = http("", "", false);
        let access = Access::new(&http);
        assert_eq!(access.check(Need::Scope(Scope::Admin), None), Ok(()));
        assert_eq!(
            access.check(Need::Scope(Scope::Admin), Some(b"Bearer anything")),
            Ok(())
        );
    }

    #[test]
    fn callers_are_told_apart_by_a_hash_of_their_token() {
        let a = Caller::of(true, Some(&header(CHECKOUT)));
        let b = Caller::of(true, Some(&header(ADMIN)));
        assert_ne!(a, b);
        assert_eq!(
            a,
            Caller::of(true, Some(b"bearer checkout-token-0123456789 "))
        );
        assert_eq!(a.scope().len(), 64);
        assert!(!a.scope().contains(CHECKOUT));
        assert_eq!(Caller::of(true, None).scope(), Caller::ANONYMOUS);
        assert_eq!(
            a.fingerprint(),
            format!("token sha256:{}", &a.scope()[..12])
        );
        assert_eq!(Caller::of(true, None).fingerprint(), Caller::ANONYMOUS);
        // An open API: whatever is presented, one shared scope.
        assert_eq!(
            Caller::of(false, Some(&header(CHECKOUT))).scope(),
            Caller::ANONYMOUS
        );
    }

    #[test]
    fn routes_need_their_scope() {
        let admin = Need::Scope(Scope::Admin);
        let checkout = Need::Scope(Scope::Checkout);
        assert_eq!(need(Some("/inventory/{sku}")), admin);
        assert_eq!(need(Some("/orders")), checkout);
        assert_eq!(need(Some("/orders/{id}")), checkout);
        assert_eq!(need(Some("/orders/{id}/ship")), admin);
        assert_eq!(need(Some("/orders/{id}/{action}")), checkout);
        assert_eq!(need(Some("/admin/status")), admin);
        assert_eq!(need(Some("/readyz")), Need::Operations);
        assert_eq!(need(Some("/metrics")), Need::Operations);
        assert_eq!(need(Some("/healthz")), Need::Open);
        assert_eq!(need(Some("/openapi.json")), Need::Open);
        assert_eq!(need(Some("/ui")), Need::Open);
        assert_eq!(need(Some("/ui/app.js")), Need::Open);
        assert_eq!(need(Some("/admin/overview")), admin);
        assert_eq!(need(None), Need::Open);
        assert_eq!(need(Some("/debug/vars")), Need::Undeclared);
    }

    #[test]
    fn an_undeclared_route_is_refused_whatever_the_tokens() {
        let open = http("", "", false);
        assert_eq!(
            Access::new(&open).check(Need::Undeclared, None),
            Err(Denied::Undeclared)
        );
        let tokens = http(ADMIN, CHECKOUT, false);
        assert_eq!(
            Access::new(&tokens).check(Need::Undeclared, Some(&header(ADMIN))),
            Err(Denied::Undeclared)
        );
    }
}

//! The operator's page, `/ui`: a static HTML page, its script and its style,
//! compiled into the binary (no build step, nothing fetched from elsewhere).
//! The page holds no data and needs no token: its script reads the admin API
//! (`/admin/overview`, `/admin/deadlines`, `/admin/shadow`,
//! `/admin/orders/{id}`, pause and resume) with the admin token the operator types in, as any other client
//! of that API. So the page is routed open ([`crate::auth::need`]), and the
//! calls it makes are checked like every other call, `cross_site`'s rules
//! included.
//!
//! Every answer carries a Content-Security-Policy that allows this origin's
//! script and style only: no inline script, no `eval`, no connection
//! elsewhere, no framing. An injected string in an order's detail could not
//! run even if the script put it in as markup (it puts text only).

use axum::http::HeaderName;

use super::*;

/// The page. Its script and style are separate files so that the policy
/// can forbid inline ones.
const PAGE: &str = include_str!("ui/index.html");
/// Everything the page does.
const SCRIPT: &str = include_str!("ui/app.js");
/// How it looks.
const STYLE: &str = include_str!("ui/style.css");

/// The policy of every answer of the page: this origin's files and API, nothing else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's files: path, body and type.
pub(super) const FILES: [(&str, &str, &str); 3] = [
    ("/ui", PAGE, "text/html; charset=utf-8"),
    ("/ui/app.js", SCRIPT, "text/javascript; charset=utf-8"),
    ("/ui/style.css", STYLE, "text/css; charset=utf-8"),
];

/// The page's routes: open (no token), static.
pub(super) fn routes() -> Router<Arc<Context>> {
    FILES
        .into_iter()
        .fold(Router::new(), |router, (path, body, content_type)| {
            router.route(path, get(move || async move { asset(body, content_type) }))
        })
}

/// One file with its type and the headers that keep a browser to it.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let headers: [(HeaderName, &'static str); 6] = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        // Served as what it says it is, never sniffed into something else.
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        // Older browsers that ignore `frame-ancestors`.
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        // A new binary's page is seen at the next load, not a cached one.
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy forbids inline script and style: the page must have none,
    /// and must load nothing from elsewhere.
    #[test]
    fn the_page_has_no_inline_script_or_style_and_nothing_from_elsewhere() {
        assert!(PAGE.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(PAGE.contains(r#"<link rel="stylesheet" href="/ui/style.css">"#));
        assert_eq!(PAGE.matches("<script").count(), 1);
        for forbidden in [
            "<style",
            " style=",
            " onclick=",
            " onload=",
            " onsubmit=",
            "javascript:",
            "http://",
            "https://",
        ] {
            assert!(!PAGE.contains(forbidden), "the page has {forbidden}");
        }
        // The script talks to this origin only, and never parses markup.
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "eval(",
            "new Function",
            "https://",
        ] {
            assert!(!SCRIPT.contains(forbidden), "the script has {forbidden}");
        }
        assert!(!STYLE.contains("@import") && !STYLE.contains("url("));
    }
}

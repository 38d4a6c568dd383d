//! The operator console: a single-page web app served from the binary at `/console` on every node.
//!
//! The assets are compiled in (`include_str!`), so installing twinhub is still only `cargo build`, and
//! the page loads nothing from elsewhere: the Content-Security-Policy allows scripts, styles and
//! requests from this origin only, so the page cannot be framed or made to talk to another host.
//!
//! The console holds no credential of its own. The operator signs in with a shared-access-policy
//! connection string; it stays in the tab's `sessionStorage`, and the page signs each request with a
//! short-lived SAS token computed in the browser (WebCrypto HMAC-SHA256), exactly as an SDK would. So
//! every request it makes is an ordinary API request, authorized by the policy's permissions: a
//! `registryRead` sign-in can look but not change anything. These routes are open (like `/health`):
//! they serve the same fixed bytes to everyone, read no body and take nothing from the request.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Where the console lives. Every path below it is open.
pub const CONSOLE_PATH: &str = "/console";

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// This origin only; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The asset named by the path below `/console`, if there is one.
fn asset(rest: &str) -> Option<(&'static str, &'static str)> {
    match rest {
        "" | "/" | "/index.html" => Some((INDEX, "text/html; charset=utf-8")),
        "/console.js" => Some((SCRIPT, "text/javascript; charset=utf-8")),
        "/console.css" => Some((STYLE, "text/css; charset=utf-8")),
        _ => None,
    }
}

/// Is this path served by the console (and so open)?
pub fn is_console_path(path: &str) -> bool {
    path == CONSOLE_PATH || path.starts_with("/console/")
}

/// `GET /console[/asset]`.
pub async fn serve(uri: axum::http::Uri) -> Response {
    let rest = uri.path().strip_prefix(CONSOLE_PATH).unwrap_or("");
    let Some((body, content_type)) = asset(rest) else {
        return super::ApiError::NoRoute(uri.path().to_string()).into_response();
    };
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_references_is_served() {
        for (needle, path) in [("console.js", "/console.js"), ("console.css", "/console.css")] {
            assert!(INDEX.contains(needle), "index.html should reference {needle}");
            assert!(asset(path).is_some(), "{path} should be served");
        }
        assert!(asset("/../secrets").is_none());
        assert!(is_console_path("/console") && is_console_path("/console/console.js"));
        assert!(!is_console_path("/consoles") && !is_console_path("/devices"));
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for text in [INDEX, SCRIPT, STYLE] {
            assert!(!text.contains("http://") && !text.contains("https://"), "an asset names an external URL");
        }
        assert!(!INDEX.contains("<script>"), "inline scripts are refused by the CSP");
    }
}

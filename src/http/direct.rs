//! The twin routes served without the router.
//!
//! Reading, patching and replacing twins is nearly all of a service's traffic. Through the router each
//! such request pays for the route table's layers as services: a clone of the matched route's boxed
//! service for each middleware, a boxed future per layer, a map of extensions for the connection and
//! the path's parameters. Under a closed loop of twin patches that machinery was about 7 % of the
//! nodes' CPU, more than the handler's own work. So a connection's service looks at the request line
//! first: the three twin routes, for device and module twins, are called here directly, passing the same
//! steps the router's layers apply, in the same order and through the same functions (request metrics,
//! the credential check before any body is read, the body's size limit and pace, then the
//! handler). Any other request, and any twin path this does not recognise exactly, goes to the router,
//! which answers it as before (its 404, 405 and rejections included).

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use tower::ServiceExt;

use super::body::{self, Paced};
use super::serve::ConnState;
use super::{metrics, twins, Shared, BODY_LIMIT};
use crate::ids::TwinId;

/// The route patterns the router declares for the same requests: the `route` label of their metrics.
const DEVICE_TWIN: &str = "/twins/{id}";
const MODULE_TWIN: &str = "/twins/{id}/modules/{mid}";

/// The HTTPS API of a node: the router, and the state the twin routes served beside it need.
#[derive(Clone)]
pub struct App {
    router: Router,
    state: Shared,
}

impl App {
    pub fn new(state: Shared) -> App {
        App { router: super::router(state.clone()), state }
    }

    /// The service of one connection.
    pub(super) fn for_connection(&self, conn: Arc<ConnState>) -> Dispatch {
        Dispatch { app: self.clone(), conn }
    }
}

/// One connection's service: a twin route directly, anything else through the router with the
/// connection's state as an extension (which the credential check and MQTT over WebSockets read).
#[derive(Clone)]
pub(super) struct Dispatch {
    app: App,
    conn: Arc<ConnState>,
}

impl hyper::service::Service<Request<Incoming>> for Dispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        match TwinRequest::recognise(req.method(), req.uri().path()) {
            Some(twin) => Box::pin(serve_twin(self.app.state.clone(), self.conn.clone(), twin, req)),
            None => {
                req.extensions_mut().insert(self.conn.clone());
                Box::pin(self.app.router.clone().oneshot(req))
            }
        }
    }
}

/// What a twin request asks for.
#[derive(Debug, PartialEq)]
enum Action {
    Read,
    Patch,
    Replace,
}

/// A request line naming a twin route exactly as the router would match it.
#[derive(Debug, PartialEq)]
struct TwinRequest {
    id: TwinId,
    action: Action,
    /// The router's pattern for this route.
    pattern: &'static str,
}

impl TwinRequest {
    /// `/twins/{id}` or `/twins/{id}/modules/{mid}` with GET, PATCH or PUT, each segment non-empty and
    /// percent-decoded to UTF-8 as the router decodes path parameters. `None` for anything else,
    /// which the router then answers (HEAD, a trailing slash, a segment that is not UTF-8).
    fn recognise(method: &Method, path: &str) -> Option<TwinRequest> {
        let action = match *method {
            Method::GET => Action::Read,
            Method::PATCH => Action::Patch,
            Method::PUT => Action::Replace,
            _ => return None,
        };
        let mut segments = path.strip_prefix("/twins/")?.split('/');
        let device = decode(segments.next()?)?;
        let (id, pattern) = match (segments.next(), segments.next(), segments.next()) {
            (None, _, _) => (TwinId::device(device), DEVICE_TWIN),
            (Some("modules"), Some(module), None) => (TwinId::module(device, decode(module)?), MODULE_TWIN),
            _ => return None,
        };
        Some(TwinRequest { id, action, pattern })
    }
}

fn decode(segment: &str) -> Option<String> {
    if segment.is_empty() {
        return None;
    }
    percent_encoding::percent_decode_str(segment).decode_utf8().ok().map(Cow::into_owned)
}

/// A twin request through the steps the router's layers would apply (see the module comment).
async fn serve_twin(
    st: Shared,
    conn: Arc<ConnState>,
    twin: TwinRequest,
    req: Request<Incoming>,
) -> Result<Response, Infallible> {
    let start = Instant::now();
    let method = req.method().clone();
    let resp = answer(st, &conn, twin.id, twin.action, req).await;
    metrics::record(Cow::Borrowed(twin.pattern), &method, resp.status(), start);
    Ok(resp)
}

async fn answer(st: Shared, conn: &Arc<ConnState>, id: TwinId, action: Action, req: Request<Incoming>) -> Response {
    let _in_flight = conn.request();
    let (parts, body) = req.into_parts();
    if let Err(e) = super::admit(&st, Some(conn), &parts.headers) {
        return super::refused(e);
    }
    let result = match action {
        Action::Read => twins::get(st, id, parts.headers).await,
        Action::Patch | Action::Replace => {
            let raw = body::collect(Paced::new(body), BODY_LIMIT).await;
            twins::write(st, id, parts.headers, raw, action == Action::Replace).await
        }
    };
    result.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn twin(method: Method, path: &str) -> Option<TwinRequest> {
        TwinRequest::recognise(&method, path)
    }

    #[test]
    fn recognises_the_twin_routes_the_router_declares() {
        let t = twin(Method::PATCH, "/twins/dev-1").unwrap();
        assert_eq!((t.id, t.action, t.pattern), (TwinId::device("dev-1"), Action::Patch, DEVICE_TWIN));
        let t = twin(Method::GET, "/twins/d/modules/m").unwrap();
        assert_eq!((t.id, t.action, t.pattern), (TwinId::module("d", "m"), Action::Read, MODULE_TWIN));
        assert_eq!(twin(Method::PUT, "/twins/d").unwrap().action, Action::Replace);
    }

    #[test]
    fn decodes_segments_as_path_parameters() {
        let t = twin(Method::GET, "/twins/a%2Fb%20c/modules/m%3A1").unwrap();
        assert_eq!(t.id, TwinId::module("a/b c", "m:1"));
        // Not UTF-8 once decoded: the router's path extractor refuses it (400, IoT Hub's error body).
        assert_eq!(twin(Method::GET, "/twins/%FF"), None);
    }

    #[test]
    fn leaves_everything_else_to_the_router() {
        for (method, path) in [
            (Method::HEAD, "/twins/d"),
            (Method::POST, "/twins/d"),
            (Method::DELETE, "/twins/d"),
            (Method::GET, "/twins/"),
            (Method::GET, "/twins"),
            (Method::GET, "/twins/d/"),
            (Method::GET, "/twins//modules/m"),
            (Method::GET, "/twins/d/modules/"),
            (Method::GET, "/twins/d/modules/m/"),
            (Method::POST, "/twins/d/methods"),
            (Method::POST, "/twins/d/modules/m/methods"),
            (Method::GET, "/twins/d/other/m"),
            (Method::GET, "/devices/d"),
            (Method::GET, "/twinsd"),
        ] {
            assert_eq!(twin(method.clone(), path), None, "{method} {path}");
        }
    }
}

//! `GET /twin-changes`: the change feed (twin changes, device lifecycle, connection state) as
//! Server-Sent Events, for back ends that cannot use the event broker.
//!
//! Each event is one SSE message: `id:` the feed position (send it back as `Last-Event-ID` to resume),
//! `event:` the IoT Hub stream (`twinChangeEvents`, `deviceLifecycleEvents`,
//! `deviceConnectionStateEvents`) and one line of JSON `data:` `{"properties": {...}, "body": {...},
//! "merged": n}`. A consumer that cannot resume, or falls too far behind, gets `event: resync` with
//! `{"position", "reason"}`: re-read the twins it cares about and carry on. The response streams: the
//! hub hands out one event at a time as the connection drains, and while it does not, the consumer's
//! pending events coalesce in the hub rather than in a buffer here.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{ApiError, Shared};
use crate::auth::Permission;
use crate::notify::{ChangeFeed, FeedFilter, FeedItem, FeedPermit};

/// A comment line this often keeps proxies and idle timeouts from closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The SSE message for one feed item.
fn sse_event(item: FeedItem) -> Event {
    match item {
        FeedItem::Event(e) => {
            // JSON text is UTF-8.
            let data = String::from_utf8(e.to_json_bytes(false)).unwrap_or_else(|_| "{}".into());
            Event::default().id(&e.position).event(e.source.as_str()).data(data)
        }
        FeedItem::Resync { position, reason } => {
            let data = json!({"position": position, "reason": reason}).to_string();
            Event::default().id(&position).event("resync").data(data)
        }
    }
}

pub async fn twin_changes(
    State(st): State<Shared>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "twin-changes", Permission::ServiceConnect)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(format!("malformed query string: {e}")))?;
    let hub = st.hub.clone().ok_or_else(|| ApiError::Internal("notification hub not running".into()))?;
    let filter = FeedFilter { device_id: q.get("deviceId").cloned(), module_id: q.get("moduleId").cloned() };
    if filter.module_id.is_some() && filter.device_id.is_none() {
        return Err(ApiError::BadRequest("moduleId needs deviceId".into()));
    }
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
        .map(str::to_string)
        .or_else(|| q.get("lastEventId").cloned());
    let permit = hub.admit_client_feed().ok_or(ApiError::ConnectionLimit("change-feed streams"))?;
    let feed = hub.changes_filtered(last_event_id.as_deref(), filter);
    tracing::debug!(?last_event_id, "change feed consumer connected");
    // The permit lives as long as the stream: dropped with it when the client goes away.
    let stream = futures::stream::unfold((feed, permit), |(mut feed, permit): (ChangeFeed, FeedPermit)| async move {
        let item = feed.next().await?;
        Some((Ok::<_, Infallible>(sse_event(item)), (feed, permit)))
    });
    let mut resp =
        Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JsonText;
    use crate::notify::{ChangeEvent, Source};
    use http_body_util::BodyExt;

    async fn wire(items: Vec<FeedItem>) -> String {
        let events: Vec<Result<Event, Infallible>> = items.into_iter().map(|i| Ok(sse_event(i))).collect();
        let resp = Sse::new(futures::stream::iter(events)).into_response();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn sse_messages_have_id_event_and_one_line_of_json() {
        let e = ChangeEvent {
            position: "abc-7".into(),
            source: Source::TwinChangeEvents,
            device_id: "d".into(),
            module_id: None,
            properties: vec![("deviceId", "d".into()), ("opType", "updateTwin".into())],
            body: JsonText::render(&json!({"version": 3, "tags": {"t": "line\nbreak"}})),
            merged: 2,
        };
        let resync = FeedItem::Resync { position: "abc-9".into(), reason: "gone".into() };
        let text = wire(vec![FeedItem::Event(std::sync::Arc::new(e)), resync]).await;
        let messages: Vec<&str> = text.split("\n\n").filter(|m| !m.is_empty()).collect();
        assert_eq!(messages.len(), 2, "{text:?}");
        let lines: Vec<&str> = messages[0].lines().collect();
        assert_eq!(&lines[..2], ["id: abc-7", "event: twinChangeEvents"]);
        assert_eq!(lines.len(), 3, "data is one line: {text:?}");
        let data: serde_json::Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            data,
            json!({"properties": {"deviceId": "d", "opType": "updateTwin", "iothub-message-source": "twinChangeEvents"},
                   "body": {"version": 3, "tags": {"t": "line\nbreak"}}, "merged": 2})
        );
        assert_eq!(messages[1], "id: abc-9\nevent: resync\ndata: {\"position\":\"abc-9\",\"reason\":\"gone\"}");
    }
}

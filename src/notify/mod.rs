//! Notifications derived from committed state: desired-property pushes to connected devices and the
//! twin change feed for back ends (SSE on the HTTPS port, the embedded event broker).
//!
//! Every replica's state machine hands the events of each applied command to [`Hub::publish`] (through
//! [`Hub::sink`]), in log order per shard. Publishing only queues: each subscriber has its own bounded
//! queue, and while a subscriber is busy its pending notifications for one twin merge into one that
//! carries the latest version (architecture invariant 7: never backwards, never skipping the final state).
//!
//! INTERFACE STUB: the coalescing queues, the change ring and the broker are being implemented.

use std::sync::Arc;

use serde_json::Value;

use crate::ids::{ShardId, TwinId};
use crate::model::Event;
use crate::shard::EventSink;

/// Limits of the hub's queues.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// IoT Hub's name as it appears in change-event properties (`hubName`): the configured host name's
    /// first label.
    pub hub_name: String,
    /// Pending (already coalesced) desired pushes per device connection before the connection is
    /// closed so that the device re-reads its twin on reconnect.
    pub device_queue: usize,
    /// Pending change events per feed consumer before it is told to resync.
    pub feed_queue: usize,
    /// Change events kept for consumers resuming with `Last-Event-ID`.
    pub retained: usize,
}

impl HubConfig {
    pub fn new(hostname: &str) -> HubConfig {
        HubConfig {
            hub_name: hostname.split(['.', ':']).next().unwrap_or(hostname).to_string(),
            device_queue: 256,
            feed_queue: 8192,
            retained: 65_536,
        }
    }
}

/// The node's notification hub.
pub struct Hub {
    config: HubConfig,
}

/// One desired-property push for a device connection: publish `body` on
/// `$iothub/twin/PATCH/properties/desired/?$version={version}`.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredPush {
    pub version: i64,
    /// The JSON patch including `"$version"`.
    pub body: Vec<u8>,
    /// How many committed patches this push carries (1 when nothing was coalesced).
    pub merged: u32,
}

/// A device connection's registration for desired pushes; dropping it unregisters.
pub struct DesiredPushes {
    _hub: Arc<Hub>,
    _id: TwinId,
}

impl DesiredPushes {
    /// The next push. `None` means the queue overflowed: close the connection (the device re-reads its
    /// twin when it reconnects) — or the hub shut down.
    pub async fn next(&mut self) -> Option<DesiredPush> {
        std::future::pending().await
    }
}

/// Which IoT Hub event stream an event belongs to (`iothub-message-source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    TwinChangeEvents,
    DeviceLifecycleEvents,
    DeviceConnectionStateEvents,
}

/// One change event as back ends receive it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeEvent {
    /// Position in this node's feed, for `Last-Event-ID`.
    pub position: String,
    pub source: Source,
    pub device_id: String,
    pub module_id: Option<String>,
    /// Application properties: hubName, deviceId, moduleId, operationTimestamp, iothub-message-schema, opType.
    pub properties: Vec<(String, String)>,
    pub body: Value,
    /// How many committed changes this event carries.
    pub merged: u32,
}

/// What a feed consumer receives next.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedItem {
    Event(ChangeEvent),
    /// The consumer's position is no longer retained (too old, or from an earlier run of this node), or
    /// it fell too far behind: re-read the twins it cares about, then carry on from here.
    Resync { position: String, reason: String },
}

/// A consumer's view of the change feed; dropping it unregisters.
pub struct ChangeFeed {
    _hub: Arc<Hub>,
}

impl ChangeFeed {
    pub async fn next(&mut self) -> Option<FeedItem> {
        std::future::pending().await
    }
}

impl Hub {
    pub fn new(config: HubConfig) -> Arc<Hub> {
        Arc::new(Hub { config })
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The sink to give the shards.
    pub fn sink(self: &Arc<Self>) -> EventSink {
        let hub = self.clone();
        EventSink(Arc::new(move |shard, events| hub.publish(shard, events)))
    }

    /// Queues the events of one applied command. Never blocks.
    pub fn publish(&self, _shard: ShardId, _events: &[Event]) {}

    /// Registers a device connection of identity `id` for desired pushes.
    pub fn desired_pushes(self: &Arc<Self>, id: &TwinId) -> DesiredPushes {
        DesiredPushes { _hub: self.clone(), _id: id.clone() }
    }

    /// A consumer of the change feed, starting after `last_event_id` (live from now if `None`).
    pub fn changes(self: &Arc<Self>, _last_event_id: Option<&str>) -> ChangeFeed {
        ChangeFeed { _hub: self.clone() }
    }

    /// Devices with at least one open connection on this node (`/statistics/service`).
    pub fn connected_devices(&self) -> u64 {
        0
    }

    /// Wakes every subscriber with `None` (node shutdown).
    pub fn close(&self) {}
}

pub mod broker;

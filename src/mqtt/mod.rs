//! The device MQTT front door: MQTT 3.1.1 and 5 on one port, IoT Hub's `$iothub/twin/...` topics.
//!
//! INTERFACE STUB: being implemented.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::notify::Hub;
use crate::twin::Twins;

/// State shared by every MQTT listener of a node (TLS and plain share sessions, so a takeover works
/// across them).
pub struct Mqtt {
    pub twins: Arc<Twins>,
    pub hub: Arc<Hub>,
    /// Host name devices put in their SAS `sr` and username.
    pub hostname: String,
}

impl Mqtt {
    pub fn new(twins: Arc<Twins>, hub: Arc<Hub>, hostname: String) -> Arc<Mqtt> {
        Arc::new(Mqtt { twins, hub, hostname })
    }

    /// Accepts connections until `stop`, then closes them all.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>, stop: CancellationToken) {
        let _ = (listener, tls);
        stop.cancelled().await;
    }
}

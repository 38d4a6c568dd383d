//! The back-end event broker: rumqttd, with clients authenticated by a policy SAS token, publishing the
//! change feed on `twin-changes/{deviceId}[/{moduleId}]`.
//!
//! INTERFACE STUB: being implemented.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Hub;
use crate::auth::Policies;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("event broker: {0}")]
    Start(String),
}

/// Serves the event broker on `listener` (TLS with `tls`) until `stop`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    hub: Arc<Hub>,
    policies: Arc<Policies>,
    host: String,
    stop: CancellationToken,
) -> Result<(), BrokerError> {
    let _ = (listener, tls, hub, policies, host);
    stop.cancelled().await;
    Ok(())
}

//! Errors of the twin model. Protocol-free: the HTTP and MQTT edges map them to status codes and
//! IoT Hub error bodies in one place each.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum TwinError {
    #[error("Device {0} not found")]
    DeviceNotFound(String),
    #[error("Module {module} on device {device} not found")]
    ModuleNotFound { device: String, module: String },
    #[error("A device with ID '{0}' is already registered")]
    DeviceAlreadyExists(String),
    #[error("A module with ID '{module}' is already registered on device '{device}'")]
    ModuleAlreadyExists { device: String, module: String },
    #[error("Device {device} already has the maximum of {max} modules")]
    TooManyModulesOnDevice { device: String, max: usize },
    /// If-Match did not match the current etag.
    #[error("Precondition failed: {0}")]
    PreconditionFailed(String),
    /// Bad input: the message names the offending path and the limit.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("Configuration {0} not found")]
    ConfigurationNotFound(String),
    #[error("A configuration with ID '{0}' already exists")]
    ConfigurationAlreadyExists(String),
    #[error("Certificate {0} not found")]
    CertificateNotFound(String),
    /// The hub holds as many records of this kind as it may (configurations, CA certificates). New
    /// variants go last: refusals are kept in the retry window, which snapshots carry.
    #[error("The hub already has the maximum of {max} {what}")]
    QuotaExceeded { what: String, max: usize },
    /// As many jobs are queued, scheduled or running as may be at once.
    #[error("{max} jobs are already queued, scheduled or running; create another once one ends")]
    JobQuotaExceeded { max: usize },
}

//! IoT Hub's error codes: the one table both front doors answer from. The HTTPS API names the code
//! (`"Message": "ErrorCode:DeviceNotFound;…"`) and the device MQTT API numbers it (`"errorCode": 404001`);
//! the SDKs key their exceptions on either. A failure is classified once, here, into an [`ErrorCode`];
//! each front door only renders it.
//!
//! The numbers are IoT Hub's: the HTTP status followed by a three-digit detail. Codes IoT Hub has no
//! published number for (a missing configuration or CA certificate, an unknown route) use the
//! status's generic `xxx000`.

use crate::model::TwinError;
use crate::shard::ShardError;

/// An IoT Hub error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    ArgumentInvalid,
    IotHubUnauthorizedAccess,
    DeviceNotFound,
    JobNotFound,
    ModuleNotFound,
    DeviceNotOnline,
    ConfigurationNotFound,
    CertificateNotFound,
    NotFound,
    /// The hub holds as many records of a kind as it may.
    IotHubQuotaExceeded,
    /// As many jobs are active as may be.
    JobQuotaExceeded,
    MethodNotAllowed,
    DeviceAlreadyExists,
    ModuleAlreadyExistsOnDevice,
    ConfigurationAlreadyExists,
    PreconditionFailed,
    RequestEntityTooLarge,
    TooManyModulesOnDevice,
    ThrottlingException,
    ServerError,
    /// Retryable: no leader here yet, a slow or stopping shard, a connection limit.
    ServerBusy,
    GatewayTimeout,
}

impl ErrorCode {
    /// The HTTP status (and the MQTT response status) this code is answered with.
    pub fn status(self) -> u16 {
        use ErrorCode::*;
        match self {
            // IoT Hub refuses a device's module beyond the limit as a bad request, not a 413.
            ArgumentInvalid | TooManyModulesOnDevice => 400,
            IotHubUnauthorizedAccess => 401,
            IotHubQuotaExceeded | JobQuotaExceeded => 403,
            DeviceNotFound
            | JobNotFound
            | ModuleNotFound
            | DeviceNotOnline
            | ConfigurationNotFound
            | CertificateNotFound
            | NotFound => 404,
            MethodNotAllowed => 405,
            DeviceAlreadyExists | ModuleAlreadyExistsOnDevice | ConfigurationAlreadyExists => 409,
            PreconditionFailed => 412,
            RequestEntityTooLarge => 413,
            ThrottlingException => 429,
            ServerError => 500,
            ServerBusy => 503,
            GatewayTimeout => 504,
        }
    }

    /// The name the HTTPS API puts in `ErrorCode:`.
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            ArgumentInvalid => "ArgumentInvalid",
            IotHubUnauthorizedAccess => "IotHubUnauthorizedAccess",
            DeviceNotFound => "DeviceNotFound",
            JobNotFound => "JobNotFound",
            ModuleNotFound => "ModuleNotFound",
            DeviceNotOnline => "DeviceNotOnline",
            ConfigurationNotFound => "ConfigurationNotFound",
            CertificateNotFound => "CertificateNotFound",
            NotFound => "NotFound",
            IotHubQuotaExceeded => "IotHubQuotaExceeded",
            JobQuotaExceeded => "JobQuotaExceeded",
            MethodNotAllowed => "MethodNotAllowed",
            DeviceAlreadyExists => "DeviceAlreadyExists",
            ModuleAlreadyExistsOnDevice => "ModuleAlreadyExistsOnDevice",
            ConfigurationAlreadyExists => "ConfigurationAlreadyExists",
            PreconditionFailed => "PreconditionFailed",
            RequestEntityTooLarge => "RequestEntityTooLarge",
            TooManyModulesOnDevice => "TooManyModulesOnDevice",
            ThrottlingException => "ThrottlingException",
            ServerError => "ServerError",
            ServerBusy => "ServerBusy",
            GatewayTimeout => "GatewayTimeout",
        }
    }

    /// The number the device MQTT API puts in `errorCode`.
    pub fn number(self) -> u32 {
        use ErrorCode::*;
        match self {
            ArgumentInvalid => 400_004,
            IotHubUnauthorizedAccess => 401_002,
            JobQuotaExceeded => 403_001,
            IotHubQuotaExceeded => 403_002,
            DeviceNotFound => 404_001,
            JobNotFound => 404_002,
            ModuleNotFound => 404_010,
            DeviceNotOnline => 404_103,
            ConfigurationNotFound | CertificateNotFound | NotFound => 404_000,
            MethodNotAllowed => 405_000,
            DeviceAlreadyExists => 409_001,
            ModuleAlreadyExistsOnDevice => 409_301,
            ConfigurationAlreadyExists => 409_000,
            PreconditionFailed => 412_001,
            RequestEntityTooLarge => 413_001,
            TooManyModulesOnDevice => 413_003,
            ThrottlingException => 429_001,
            ServerError => 500_001,
            ServerBusy => 503_001,
            GatewayTimeout => 504_101,
        }
    }

    /// What a twin-model refusal is to a client.
    pub fn of_twin(e: &TwinError) -> ErrorCode {
        match e {
            TwinError::DeviceNotFound(_) => ErrorCode::DeviceNotFound,
            TwinError::ModuleNotFound { .. } => ErrorCode::ModuleNotFound,
            TwinError::DeviceAlreadyExists(_) => ErrorCode::DeviceAlreadyExists,
            TwinError::ModuleAlreadyExists { .. } => ErrorCode::ModuleAlreadyExistsOnDevice,
            TwinError::TooManyModulesOnDevice { .. } => ErrorCode::TooManyModulesOnDevice,
            TwinError::PreconditionFailed(_) => ErrorCode::PreconditionFailed,
            TwinError::InvalidArgument(_) => ErrorCode::ArgumentInvalid,
            TwinError::ConfigurationNotFound(_) => ErrorCode::ConfigurationNotFound,
            TwinError::ConfigurationAlreadyExists(_) => ErrorCode::ConfigurationAlreadyExists,
            TwinError::CertificateNotFound(_) => ErrorCode::CertificateNotFound,
            TwinError::QuotaExceeded { .. } => ErrorCode::IotHubQuotaExceeded,
            TwinError::JobQuotaExceeded { .. } => ErrorCode::JobQuotaExceeded,
        }
    }

    /// What a shard failure is to a client: retryable (503) unless the shard is broken (500) or the
    /// request was refused as invalid (400). Device SDKs retry 5xx and 429 but give up on 4xx.
    pub fn of_shard(e: &ShardError) -> ErrorCode {
        match e {
            ShardError::NotLeader { .. }
            | ShardError::Timeout { .. }
            | ShardError::ShuttingDown { .. }
            | ShardError::Storage { .. } => ErrorCode::ServerBusy,
            ShardError::Fatal { .. } => ErrorCode::ServerError,
            ShardError::Refused { .. } => ErrorCode::ArgumentInvalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode::{self, *};

    const ALL: [ErrorCode; 22] = [
        ArgumentInvalid,
        IotHubUnauthorizedAccess,
        IotHubQuotaExceeded,
        JobQuotaExceeded,
        DeviceNotFound,
        JobNotFound,
        ModuleNotFound,
        DeviceNotOnline,
        ConfigurationNotFound,
        CertificateNotFound,
        NotFound,
        MethodNotAllowed,
        DeviceAlreadyExists,
        ModuleAlreadyExistsOnDevice,
        ConfigurationAlreadyExists,
        PreconditionFailed,
        RequestEntityTooLarge,
        TooManyModulesOnDevice,
        ThrottlingException,
        ServerError,
        ServerBusy,
        GatewayTimeout,
    ];

    /// Every number starts with an HTTP status of its class, and IoT Hub's published numbers hold.
    #[test]
    fn numbers_follow_iot_hub() {
        for c in ALL {
            let class = c.number() / 1000;
            assert!((400..600).contains(&class), "{c:?}");
            if c != TooManyModulesOnDevice {
                assert_eq!(class, u32::from(c.status()), "{c:?}");
            }
            assert_eq!(format!("{c:?}"), c.name());
        }
        assert_eq!(DeviceNotFound.number(), 404_001);
        assert_eq!(IotHubQuotaExceeded.number(), 403_002);
        assert_eq!(PreconditionFailed.number(), 412_001);
        assert_eq!(ModuleAlreadyExistsOnDevice.number(), 409_301);
        assert_eq!(ServerBusy.number(), 503_001);
    }
}

//! Typed access to a [`Reply`]: each command produces one kind of reply, and its caller takes that
//! kind out with the accessor named after it. Any other kind is an [`UnexpectedReply`], a bug between
//! layers that the front doors answer as a server error, in one place, instead of each caller
//! matching on the whole union.

use serde_json::Value;

use super::bulk::BulkOutcome;
use super::{JsonText, Reply};

/// A command was answered with a kind of reply it never produces.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected a {wanted} reply, got a {got} reply")]
pub struct UnexpectedReply {
    pub wanted: &'static str,
    pub got: &'static str,
}

impl Reply {
    /// The kind of reply, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Device(_) => "device",
            Reply::Module(_) => "module",
            Reply::Twin(_) => "twin",
            Reply::Reported { .. } => "reported",
            Reply::Done => "done",
            Reply::Job(_) => "job",
            Reply::Bulk(_) => "bulk",
            Reply::Claim { .. } => "claim",
            Reply::Configuration(_) => "configuration",
            Reply::Certificate(_) => "certificate",
            Reply::Batch(_) => "batch",
        }
    }

    fn unexpected(&self, wanted: &'static str) -> UnexpectedReply {
        UnexpectedReply { wanted, got: self.kind() }
    }

    /// The Device document of `PutDevice` / `PutDeviceWithParent`.
    pub fn into_device(self) -> Result<Value, UnexpectedReply> {
        match self {
            Reply::Device(v) => Ok(v),
            other => Err(other.unexpected("device")),
        }
    }

    /// The Module document of `PutModule`.
    pub fn into_module(self) -> Result<Value, UnexpectedReply> {
        match self {
            Reply::Module(v) => Ok(v),
            other => Err(other.unexpected("module")),
        }
    }

    /// The twin document of a twin write (update or replace).
    pub fn into_twin(self) -> Result<JsonText, UnexpectedReply> {
        match self {
            Reply::Twin(t) => Ok(t),
            other => Err(other.unexpected("twin")),
        }
    }

    /// The new reported `$version` of a reported patch.
    pub fn into_reported_version(self) -> Result<i64, UnexpectedReply> {
        match self {
            Reply::Reported { version } => Ok(version),
            other => Err(other.unexpected("reported")),
        }
    }

    /// The job record of a job command.
    pub fn into_job(self) -> Result<Value, UnexpectedReply> {
        match self {
            Reply::Job(v) => Ok(v),
            other => Err(other.unexpected("job")),
        }
    }

    /// Each entry's outcome of a bulk registry command.
    pub fn into_bulk(self) -> Result<BulkOutcome, UnexpectedReply> {
        match self {
            Reply::Bulk(o) => Ok(o),
            other => Err(other.unexpected("bulk")),
        }
    }

    /// The configuration record of a configuration command (`Null` after a delete).
    pub fn into_configuration(self) -> Result<Value, UnexpectedReply> {
        match self {
            Reply::Configuration(v) => Ok(v),
            other => Err(other.unexpected("configuration")),
        }
    }

    /// The CA certificate record of a certificate command; `None` once deleted.
    pub fn into_certificate(self) -> Result<Option<Value>, UnexpectedReply> {
        match self {
            Reply::Certificate(v) => Ok(v),
            Reply::Done => Ok(None),
            other => Err(other.unexpected("certificate")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_accessor_takes_its_kind_and_names_any_other() {
        assert_eq!(Reply::Reported { version: 7 }.into_reported_version(), Ok(7));
        assert_eq!(Reply::Done.into_certificate(), Ok(None));
        let e = Reply::Done.into_twin().unwrap_err();
        assert_eq!(e, UnexpectedReply { wanted: "twin", got: "done" });
        assert_eq!(e.to_string(), "expected a twin reply, got a done reply");
        assert!(Reply::Job(Value::Null).into_device().is_err());
    }
}

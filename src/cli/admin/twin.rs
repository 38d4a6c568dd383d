//! `twinhub twin show|update|replace`: read a twin, merge-patch it, or replace its tags and desired
//! properties — with `--etag` for optimistic concurrency, as IoT Hub's `If-Match`.

use clap::{Args, Subcommand};

use super::{identity_path, if_match, print_json, resolve, IdArgs, JsonInput, TIMEOUT};
use crate::cli::remote::{RemoteError, Target};

#[derive(Subcommand, Debug)]
pub enum TwinCommand {
    /// Print a twin (tags, desired and reported properties, versions, etag).
    Show(IdArgs),
    /// Merge-patch tags and desired properties (`null` removes a property).
    Update(WriteArgs),
    /// Replace tags and desired properties with the given ones.
    Replace(WriteArgs),
}

#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Device id
    pub id: String,
    /// Module id
    #[arg(long)]
    pub module: Option<String>,
    #[command(flatten)]
    pub input: JsonInput,
    /// Write only if the twin still has this etag (exit code 4 if not); default: whatever it is
    #[arg(long)]
    pub etag: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

pub async fn main(cmd: TwinCommand) -> Result<(), RemoteError> {
    let (method, a) = match cmd {
        TwinCommand::Show(a) => {
            let r = resolve(&a.target)?;
            let path = identity_path("twins", &a.id, a.module.as_deref());
            print_json(&r.call(hyper::Method::GET, &path, &[], Vec::new(), TIMEOUT).await?.1);
            return Ok(());
        }
        TwinCommand::Update(a) => (hyper::Method::PATCH, a),
        TwinCommand::Replace(a) => (hyper::Method::PUT, a),
    };
    let body = a.input.read()?;
    let r = resolve(&a.target)?;
    let path = identity_path("twins", &a.id, a.module.as_deref());
    let headers: Vec<_> = a.etag.as_deref().map(if_match).into_iter().collect();
    let (_, twin) = r.call(method, &path, &headers, body.to_string().into_bytes(), TIMEOUT).await?;
    print_json(&twin);
    Ok(())
}

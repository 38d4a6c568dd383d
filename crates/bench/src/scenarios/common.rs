//! What the scenario commands share: getting a twinhub cluster (an existing `cluster.json` or one
//! started here), writing results.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::hub::Hub;
use crate::peers::twinhub::{default_bin, TwinhubCluster};

/// Where the scenario runs: a cluster started by someone else, or one this process starts and stops.
pub enum Cluster {
    Existing(Hub),
    Own(TwinhubCluster),
}

impl Cluster {
    /// `--cluster FILE` uses that cluster; otherwise 3 nodes are started with `--bin` (or the default).
    pub fn get(cluster: Option<&Path>, bin: Option<&Path>, shards: u32) -> anyhow::Result<Cluster> {
        Cluster::get_with(cluster, bin, shards, &[])
    }

    /// [`Cluster::get`]; a cluster started here gets `extra` `twinhub cluster up` options.
    pub fn get_with(
        cluster: Option<&Path>,
        bin: Option<&Path>,
        shards: u32,
        extra: &[String],
    ) -> anyhow::Result<Cluster> {
        match cluster {
            Some(p) => Ok(Cluster::Existing(Hub::load(p)?)),
            None => {
                let bin = default_bin(bin)?;
                Ok(Cluster::Own(TwinhubCluster::up_with(&bin, 3, shards, extra)?))
            }
        }
    }

    pub fn hub(&self) -> &Hub {
        match self {
            Cluster::Existing(h) => h,
            Cluster::Own(c) => &c.hub,
        }
    }

    pub fn version(&self) -> String {
        match self {
            Cluster::Existing(_) => "existing cluster".into(),
            Cluster::Own(c) => c.version.clone(),
        }
    }

    pub fn down(self) {
        if let Cluster::Own(c) = self {
            c.down();
        }
    }
}

/// Writes pretty JSON, creating the directory.
pub fn write_json(path: &Path, v: &Value) -> anyhow::Result<()> {
    if let Some(d) = path.parent() {
        if !d.as_os_str().is_empty() {
            std::fs::create_dir_all(d)?;
        }
    }
    std::fs::write(path, serde_json::to_string_pretty(v)?)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `FILE.json` → `FILE.svg` unless given.
pub fn svg_path(out: &Path, svg: Option<&Path>) -> PathBuf {
    svg.map(Path::to_path_buf).unwrap_or_else(|| out.with_extension("svg"))
}

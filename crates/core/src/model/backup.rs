//! Backup and restore of a cluster's state, the pieces the state machine hands out and takes back.
//!
//! A backup is read page by page (devices in id order, with their twins, modules and job rows), each
//! page a linearizable read taken after the backup started, plus the metadata group's job and
//! configuration records: so it holds every write acknowledged before the backup began. A restore
//! proposes the same pages to a new cluster's shards; a page only ever inserts devices the shard does
//! not have, so running a restore again after an interruption completes it and applies nothing twice.
//! Pure: no I/O (the file format is the CLI's, `cli::backup`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::ConfigsState;
use super::error::TwinError;
use super::jobs::{DeviceJobs, JobsState};
use super::registry::DeviceEntry;
use super::ShardState;

/// Devices of one shard, in id order, with their job rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackupPage {
    pub devices: BTreeMap<String, DeviceEntry>,
    pub device_jobs: DeviceJobs,
    /// The shard's etag counter when the page was read: a restored shard continues above it, so no
    /// etag is ever handed out twice.
    pub etag_seq: u64,
}

/// The metadata group's records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaBackup {
    pub jobs: JobsState,
    pub configs: ConfigsState,
}

impl ShardState {
    /// At most `limit` devices after `after`, in id order.
    pub fn backup_page(&self, after: Option<&str>, limit: usize) -> BackupPage {
        let range = match after {
            Some(a) => self.devices.range::<_, str>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => self.devices.range::<_, str>(..),
        };
        let devices: BTreeMap<String, DeviceEntry> =
            range.take(limit).map(|(k, v)| (k.to_string(), (**v).clone())).collect();
        let mut device_jobs: DeviceJobs = BTreeMap::new();
        for (job, rows) in &self.device_jobs {
            let mine: BTreeMap<_, _> =
                rows.iter().filter(|(d, _)| devices.contains_key(*d)).map(|(d, r)| (d.clone(), r.clone())).collect();
            if !mine.is_empty() {
                device_jobs.insert(job.clone(), mine);
            }
        }
        BackupPage { devices, device_jobs, etag_seq: self.etag_seq }
    }

    /// Inserts the page's devices this shard does not have (and their job rows); answers how many.
    /// A device that exists is left as it is: restoring twice applies nothing twice.
    pub fn restore_page(&mut self, page: &BackupPage) -> usize {
        let mut inserted = 0;
        for (id, entry) in &page.devices {
            if !self.devices.contains_key(id.as_str()) {
                let key = super::DeviceKey::from(id.as_str());
                self.tag_index.add(&key, entry.twin.tags.root());
                self.devices.insert(key, std::sync::Arc::new(entry.clone()));
                inserted += 1;
                for (job, rows) in &page.device_jobs {
                    if let Some(row) = rows.get(id) {
                        self.device_jobs.entry(job.clone()).or_default().insert(id.clone(), row.clone());
                    }
                }
            }
        }
        self.etag_seq = self.etag_seq.max(page.etag_seq);
        inserted
    }

    pub fn meta_backup(&self) -> MetaBackup {
        MetaBackup { jobs: self.jobs.clone(), configs: self.configs.clone() }
    }

    /// Takes the records into an empty metadata group (or one that already holds exactly them).
    pub fn restore_meta(&mut self, meta: &MetaBackup) -> Result<(), TwinError> {
        if self.jobs == meta.jobs && self.configs == meta.configs {
            return Ok(());
        }
        if !self.jobs.jobs.is_empty() || !self.configs.configs.is_empty() {
            return Err(TwinError::InvalidArgument(
                "the cluster already has jobs or configurations: restore into a new cluster".into(),
            ));
        }
        self.jobs = meta.jobs.clone();
        self.configs = meta.configs.clone();
        Ok(())
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
}

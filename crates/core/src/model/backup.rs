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

/// The largest counter (etag, `$version`, job count) a restore takes: 2^53 − 1, the largest integer
/// every JSON reader holds exactly (JavaScript and the SDKs read numbers as doubles). A cluster taking
/// a million writes a second would need centuries to count that far, so a larger one comes from a
/// damaged or hand-made backup; taken as it is, a later increment would wrap around and hand out an
/// etag or a `$version` again.
pub const MAX_RESTORED_COUNTER: u64 = (1 << 53) - 1;

/// Why a restore refuses a page: the first counter out of range, by where it is.
fn counter(what: impl FnOnce() -> String, value: i128) -> Result<(), String> {
    if (0..=i128::from(MAX_RESTORED_COUNTER)).contains(&value) {
        Ok(())
    } else {
        Err(format!("{} is {value}: a restored counter must be from 0 to {MAX_RESTORED_COUNTER}", what()))
    }
}

/// JSON text a restore carries inside a string (a job's `updateTwin`, a configuration's content, a
/// method call's payload or answer): read later as JSON, so it must be JSON as untrusted JSON is read
/// (see `json_tree`): the outer check of the body does not look inside strings.
fn embedded(what: impl FnOnce() -> String, text: &str) -> Result<(), String> {
    super::json_tree::parse(text).map(drop).map_err(|e| format!("{} is not JSON a client could send: {e}", what()))
}

fn twin_counters(at: &dyn Fn() -> String, t: &super::registry::TwinDoc) -> Result<(), String> {
    counter(|| format!("{} etag", at()), t.etag.into())?;
    counter(|| format!("{} $version", at()), t.version.into())?;
    counter(|| format!("{} desired $version", at()), t.desired_version.into())?;
    counter(|| format!("{} reported $version", at()), t.reported_version.into())
}

impl BackupPage {
    /// Checks every counter the page would set against [`MAX_RESTORED_COUNTER`], naming the first one
    /// out of range.
    pub fn check_counters(&self) -> Result<(), String> {
        counter(|| "the page's etag_seq".into(), self.etag_seq.into())?;
        for (job, rows) in &self.device_jobs {
            for (device, row) in rows {
                if let Some(answer) = &row.method_response_json {
                    embedded(|| format!("job {job}'s answer from {device}"), answer)?;
                }
            }
        }
        for (id, d) in &self.devices {
            twin_counters(&|| format!("device {id}'s twin"), &d.twin)?;
            for (mid, m) in &d.modules {
                twin_counters(&|| format!("module {id}/{mid}'s twin"), &m.twin)?;
            }
        }
        Ok(())
    }
}

impl MetaBackup {
    /// As [`BackupPage::check_counters`], for the jobs' statistics and the configurations' etags; and
    /// each job's method call against the method API's limits, as a new job's is checked.
    pub fn check_counters(&self) -> Result<(), String> {
        counter(|| "the configurations' etag_seq".into(), self.configs.etag_seq.into())?;
        for (id, c) in &self.configs.configs {
            counter(|| format!("configuration {id}'s etag"), c.etag.into())?;
            embedded(|| format!("configuration {id}'s content"), &c.spec.device_content_json)?;
            embedded(|| format!("configuration {id}'s desired patch"), &c.spec.desired_patch_json)?;
        }
        for (id, j) in &self.jobs.jobs {
            let s = &j.stats;
            for (name, v) in [
                ("device_count", s.device_count),
                ("failed", s.failed),
                ("succeeded", s.succeeded),
                ("running", s.running),
                ("pending", s.pending),
            ] {
                counter(|| format!("job {id}'s {name}"), v.into())?;
            }
            if let Some(m) = &j.method {
                m.check().map_err(|e| format!("job {id}'s method call: {e}"))?;
            }
            embedded(|| format!("job {id}'s updateTwin"), &j.spec.update_twin_json)?;
            embedded(|| format!("job {id}'s patch"), &j.spec.patch_json)?;
        }
        Ok(())
    }
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

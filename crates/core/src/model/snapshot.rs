//! Shard snapshots: the bytes a Raft snapshot of a shard holds, and the image they are encoded from.
//!
//! Three layouts are read; the last is the one written:
//! 1. JSON, `{"format":1,"state":{…}}`: the whole state as JSON.
//! 2. Binary with twin sections as trees: the tag [`NODE_TAG`], then as in 3 except that each
//!    section is its [`super::Node`] tree in postcard.
//! 3. Binary: the tag [`BINARY_TAG`], then postcard of [`Binary`] — the state's small parts (cluster
//!    map, jobs, configurations, certificates, dedupe windows: records that hold arbitrary JSON and
//!    are few) as JSON text, then the devices in postcard. Devices are nearly all of a loaded shard's
//!    bytes, and as JSON each node of a twin's tree spelled out its field names and timestamps: a
//!    1,165-byte twin took about 1.9 KB, and encoding 16 shards of 60k twins each took a fifth of the
//!    CPU of a bulk load (benches/README.md).
//!
//! Twin sections are written as the bytes a shard holds them in ([`super::packed`]), so encoding
//! copies them and decoding checks them, without building a tree.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::registry::DeviceEntry;
use super::{tag_index, ShardState};

/// The first bytes of a binary snapshot. A JSON snapshot starts with `{`.
const BINARY_TAG: &[u8; 8] = b"twinsnp3";

/// The first bytes of a binary snapshot written before twin sections were packed.
const NODE_TAG: &[u8; 8] = b"twinsnp2";

/// The only format number a JSON snapshot may carry.
const JSON_FORMAT: u32 = 1;

#[derive(Deserialize)]
struct Json {
    format: u32,
    state: ShardState,
}

#[derive(Serialize, Deserialize)]
struct Binary<'a> {
    /// JSON of the state with its devices left out.
    rest: &'a str,
    devices: BTreeMap<Arc<str>, Arc<DeviceEntry>>,
}

/// What [`ShardState::snapshot_image`] took: the state as it was then, good only for encoding (it has
/// no query index).
pub struct SnapshotImage(ShardState);

impl SnapshotImage {
    pub fn device_count(&self) -> usize {
        self.0.devices.len()
    }

    /// The snapshot bytes, in a buffer allocated for `size_hint` bytes (the size of the shard's
    /// previous snapshot, say): a snapshot of a loaded shard is tens of megabytes, and grown by
    /// doubling it was copied and faulted in again at every step.
    ///
    /// Encoding these types cannot fail (string map keys only, no foreign types); if it did, the
    /// answer would be empty, which [`ShardState::decode_snapshot`] refuses rather than read as an
    /// empty shard.
    pub fn encode(self, size_hint: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_hint);
        self.encode_into(&mut out);
        out
    }

    /// [`SnapshotImage::encode`] into `out`, which is cleared first: a node encodes its snapshots
    /// into one buffer it keeps, whose pages are already resident.
    pub fn encode_into(self, out: &mut Vec<u8>) {
        out.clear();
        let mut state = self.0;
        let devices = std::mem::take(&mut state.devices);
        let Ok(rest) = serde_json::to_string(&state) else { return };
        out.extend_from_slice(BINARY_TAG);
        if postcard::to_io(&Binary { rest: &rest, devices }, &mut *out).is_err() {
            out.clear();
        }
    }
}

impl ShardState {
    /// A copy of everything a snapshot holds, cheap to take (the twins are shared, not copied), so
    /// the snapshot is encoded without holding the state: apply goes on meanwhile. Encoding a loaded
    /// shard takes a good part of a second, and a leader that cannot apply for that long stalls
    /// every write to the shard — and every bulk call that has a device in it.
    pub fn snapshot_image(&self) -> SnapshotImage {
        SnapshotImage(ShardState {
            devices: self.devices.clone(),
            etag_seq: self.etag_seq,
            dedupe: self.dedupe.clone(),
            replies: self.replies.clone(),
            cluster: self.cluster.clone(),
            jobs: self.jobs.clone(),
            device_jobs: self.device_jobs.clone(),
            configs: self.configs.clone(),
            certificates: self.certificates.clone(),
            tag_index: tag_index::TagIndex::default(),
            quiet: false,
        })
    }

    /// Serializes the whole state for a Raft snapshot (see [`SnapshotImage::encode`]).
    pub fn encode_snapshot(&self) -> Vec<u8> {
        self.snapshot_image().encode(0)
    }

    /// Reads a snapshot in either layout and rebuilds the query index.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<ShardState, String> {
        let corrupt = |e: &dyn std::fmt::Display| format!("corrupt shard snapshot: {e}");
        let binary = |body: &[u8]| -> Result<ShardState, String> {
            let (binary, trailing) = postcard::take_from_bytes::<Binary>(body).map_err(|e| corrupt(&e))?;
            if !trailing.is_empty() {
                return Err(corrupt(&format_args!("{} bytes after the devices", trailing.len())));
            }
            let mut state: ShardState = serde_json::from_str(binary.rest).map_err(|e| corrupt(&e))?;
            state.devices = binary.devices;
            Ok(state)
        };
        let mut state = match (bytes.strip_prefix(BINARY_TAG), bytes.strip_prefix(NODE_TAG)) {
            (Some(body), _) => binary(body)?,
            (None, Some(body)) => super::packed::with_node_layout(|| binary(body))?,
            (None, None) => {
                let snap: Json = serde_json::from_slice(bytes).map_err(|e| corrupt(&e))?;
                if snap.format != JSON_FORMAT {
                    return Err(format!("unknown shard snapshot format {}", snap.format));
                }
                snap.state
            }
        };
        state.tag_index = state.rebuilt_tag_index();
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_truncated_and_padded_binary_snapshots() {
        let bytes = ShardState::default().encode_snapshot();
        assert!(bytes.starts_with(BINARY_TAG));
        assert!(ShardState::decode_snapshot(&bytes).is_ok());
        let cut = ShardState::decode_snapshot(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(cut.contains("corrupt shard snapshot"), "{cut}");
        let mut padded = bytes.clone();
        padded.push(0);
        let pad = ShardState::decode_snapshot(&padded).unwrap_err();
        assert!(pad.contains("after the devices"), "{pad}");
        assert!(ShardState::decode_snapshot(b"").is_err());
    }

    #[test]
    fn reads_the_layout_with_sections_as_trees() {
        let mut state = ShardState::default();
        let cmd = crate::model::Command::new(
            crate::model::Op::PutDevice { device: crate::model::DeviceSpec::test_sas("d1"), if_match: None },
            1_700_000_000_000,
        );
        state.apply(&cmd);
        let patch = r#"{"tags":{"b":43,"a":[1,{"x":"y"}]},"properties":{"desired":{"fw":{"v":"2.0"}}}}"#;
        let id = crate::TwinId::device("d1");
        let cmd = crate::model::Command::new(
            crate::model::Op::UpdateTwin { id, patch_json: patch.into(), if_match: None },
            1_700_000_000_500,
        );
        assert!(state.apply(&cmd).result.is_ok());
        let current = state.encode_snapshot();
        let old = super::super::packed::with_node_layout(|| state.snapshot_image().encode(0));
        assert_ne!(old[BINARY_TAG.len()..], current[BINARY_TAG.len()..], "sections differ in layout");
        let old = [&NODE_TAG[..], &old[BINARY_TAG.len()..]].concat();
        let read = ShardState::decode_snapshot(&old).expect("tree layout");
        assert_eq!(read, state);
        assert_eq!(ShardState::decode_snapshot(&current).expect("packed layout"), state);
        assert!(read.tag_index_is_consistent());
    }

    #[test]
    fn encodes_into_a_used_buffer_as_into_a_new_one() {
        let mut state = ShardState::default();
        for i in 0..20 {
            let device = crate::model::DeviceSpec::test_sas(&format!("d{i}"));
            let cmd =
                crate::model::Command::new(crate::model::Op::PutDevice { device, if_match: None }, 1_700_000_000_000);
            state.apply(&cmd);
        }
        let fresh = state.encode_snapshot();
        let mut used = vec![0xAB; fresh.len() * 3];
        state.snapshot_image().encode_into(&mut used);
        assert!(used == fresh, "a used buffer's old bytes leaked into the snapshot");
        assert_eq!(ShardState::decode_snapshot(&used).expect("decode"), state);
    }

    #[test]
    fn reads_the_json_layout() {
        let json = br#"{"format":1,"state":{"devices":{},"etag_seq":7,"dedupe":[]}}"#;
        let state = ShardState::decode_snapshot(json).expect("json snapshot");
        assert_eq!(state.etag_seq, 7);
        let other = br#"{"format":3,"state":{"devices":{},"etag_seq":7,"dedupe":[]}}"#;
        assert!(ShardState::decode_snapshot(other).unwrap_err().contains("unknown shard snapshot format 3"));
    }
}

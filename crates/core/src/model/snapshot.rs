//! Shard snapshots: the bytes a Raft snapshot of a shard holds, and the image they are encoded from.
//!
//! Four layouts are read; the last is the one written:
//! 1. JSON, `{"format":1,"state":{…}}`: the whole state as JSON.
//! 2. Binary with twin sections as trees: the tag [`NODE_TAG`], then as in 3 except that each
//!    section is its [`super::Node`] tree in postcard.
//! 3. Binary: the tag [`JSON_REPLIES_TAG`], then postcard of [`Binary3`] — the state's small parts
//!    (cluster map, jobs, configurations, certificates, dedupe windows: records that hold arbitrary
//!    JSON and are few) as JSON text, then the devices in postcard. Devices are nearly all of a
//!    loaded shard's bytes, and as JSON each node of a twin's tree spelled out its field names and
//!    timestamps: a 1,165-byte twin took about 1.9 KB, and encoding 16 shards of 60k twins each took
//!    a fifth of the CPU of a bulk load (benches/README.md).
//! 4. As 3, under the tag [`REPLIES_APART_TAG`] ([`Binary4`]), with the window of recent replies
//!    taken out of the JSON part and carried as length-prefixed text. The window is up to 4 MiB of
//!    twin documents, two thirds of a snapshot under write load; inside the JSON part, every encode
//!    parsed all of it again to embed it as JSON values. Reading checks each reply is one JSON value.
//! 5. As 4, under the tag [`BINARY_TAG`] ([`Binary`]), with the window of recent outcomes (ten
//!    thousand request ids and what each command did) taken out of the JSON part as well and written
//!    in postcard. As JSON, each 128-bit request id was spelled out in decimal and the text grew by
//!    doubling into fresh pages: about a third of what encoding a small shard cost after a write load.
//!
//! Twin sections are written as the bytes a shard holds them in ([`super::packed`]), so encoding
//! copies them and decoding checks them, without building a tree.

use serde::{Deserialize, Serialize};

use super::command::RequestId;
use super::dedupe::Dedupe;
use super::json_text::JsonText;
use super::{tag_index, Devices, ShardState};

/// The first bytes of a binary snapshot. A JSON snapshot starts with `{`.
const BINARY_TAG: &[u8; 8] = b"twinsnp5";

/// The first bytes of a binary snapshot written with the window of recent outcomes in its JSON part.
const REPLIES_APART_TAG: &[u8; 8] = b"twinsnp4";

/// The first bytes of a binary snapshot written with the replies inside its JSON part.
const JSON_REPLIES_TAG: &[u8; 8] = b"twinsnp3";

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
    /// JSON of the state with its devices and both windows left out.
    rest: &'a str,
    /// The window of recent outcomes, oldest first.
    outcomes: Dedupe,
    /// The window of recent replies, oldest first: request id and document text.
    #[serde(borrow)]
    replies: Vec<(RequestId, &'a str)>,
    devices: Devices,
}

#[derive(Serialize, Deserialize)]
struct Binary4<'a> {
    /// JSON of the state with its devices and replies left out.
    rest: &'a str,
    /// The window of recent replies, oldest first: request id and document text.
    #[serde(borrow)]
    replies: Vec<(RequestId, &'a str)>,
    devices: Devices,
}

#[derive(Serialize, Deserialize)]
struct Binary3<'a> {
    /// JSON of the state with its devices left out.
    rest: &'a str,
    devices: Devices,
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
        let window = std::mem::take(&mut state.replies);
        let outcomes = std::mem::take(&mut state.dedupe);
        let Ok(rest) = serde_json::to_string(&state) else { return };
        let replies = window.in_order().map(|(id, doc)| (id, doc.as_str())).collect();
        out.extend_from_slice(BINARY_TAG);
        if postcard::to_io(&Binary { rest: &rest, outcomes, replies, devices }, &mut *out).is_err() {
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
        let whole = |trailing: &[u8]| match trailing.len() {
            0 => Ok(()),
            n => Err(corrupt(&format_args!("{n} bytes after the devices"))),
        };
        let binary3 = |body: &[u8]| -> Result<ShardState, String> {
            let (binary, trailing) = postcard::take_from_bytes::<Binary3>(body).map_err(|e| corrupt(&e))?;
            whole(trailing)?;
            let mut state: ShardState = serde_json::from_str(binary.rest).map_err(|e| corrupt(&e))?;
            state.devices = binary.devices;
            Ok(state)
        };
        // The JSON part, then the replies' texts (each checked to be one JSON value) and the devices.
        let read = |rest: &str, replies: Vec<(RequestId, &str)>, devices: Devices| {
            let mut state: ShardState = serde_json::from_str(rest).map_err(|e| corrupt(&e))?;
            let replies = replies.into_iter().map(|(id, text)| Ok((id, JsonText::parse(text)?)));
            let replies: Result<Vec<_>, serde_json::Error> = replies.collect();
            state.replies = replies.map_err(|e| corrupt(&format_args!("a reply: {e}")))?.into();
            state.devices = devices;
            Ok::<_, String>(state)
        };
        let binary = |body: &[u8]| -> Result<ShardState, String> {
            let (binary, trailing) = postcard::take_from_bytes::<Binary>(body).map_err(|e| corrupt(&e))?;
            whole(trailing)?;
            let mut state = read(binary.rest, binary.replies, binary.devices)?;
            state.dedupe = binary.outcomes;
            Ok(state)
        };
        let binary4 = |body: &[u8]| -> Result<ShardState, String> {
            let (binary, trailing) = postcard::take_from_bytes::<Binary4>(body).map_err(|e| corrupt(&e))?;
            whole(trailing)?;
            read(binary.rest, binary.replies, binary.devices)
        };
        let tagged = |tag: &[u8; 8]| bytes.strip_prefix(tag.as_slice());
        let mut state = if let Some(body) = tagged(BINARY_TAG) {
            binary(body)?
        } else if let Some(body) = tagged(REPLIES_APART_TAG) {
            binary4(body)?
        } else if let Some(body) = tagged(JSON_REPLIES_TAG) {
            binary3(body)?
        } else if let Some(body) = tagged(NODE_TAG) {
            super::packed::with_node_layout(|| binary3(body))?
        } else {
            let snap: Json = serde_json::from_slice(bytes).map_err(|e| corrupt(&e))?;
            if snap.format != JSON_FORMAT {
                return Err(format!("unknown shard snapshot format {}", snap.format));
            }
            snap.state
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
        assert!(state.replies.get(&cmd.request_id).is_some(), "the write's reply is in the window");
        let current = state.encode_snapshot();
        assert!(current.starts_with(BINARY_TAG));
        assert!(state.dedupe.get(&cmd.request_id).is_some(), "the write's outcome is in the window");
        let v4 = [&REPLIES_APART_TAG[..], &layout4(&state)].concat();
        let v3 = [&JSON_REPLIES_TAG[..], &layout3(&state)].concat();
        let v2 = [&NODE_TAG[..], &super::super::packed::with_node_layout(|| layout3(&state))].concat();
        assert_ne!(v2[NODE_TAG.len()..], v3[JSON_REPLIES_TAG.len()..], "sections differ in layout");
        let layouts =
            [("tree", &v2), ("replies in JSON", &v3), ("outcomes in JSON", &v4), ("outcomes apart", &current)];
        for (name, bytes) in layouts {
            let read = ShardState::decode_snapshot(bytes).unwrap_or_else(|e| panic!("{name} layout: {e}"));
            assert_eq!(read, state, "{name} layout");
            assert!(read.tag_index_is_consistent(), "{name} layout");
        }
    }

    /// The body of the third layout: the state's JSON with the replies in it, then the devices.
    fn layout3(state: &ShardState) -> Vec<u8> {
        let mut state = state.clone();
        let devices = std::mem::take(&mut state.devices);
        let rest = serde_json::to_string(&state).expect("json");
        postcard::to_allocvec(&Binary3 { rest: &rest, devices }).expect("postcard")
    }

    /// The body of the fourth layout: the state's JSON with the outcomes in it, then the replies'
    /// texts and the devices.
    fn layout4(state: &ShardState) -> Vec<u8> {
        let mut state = state.clone();
        let devices = std::mem::take(&mut state.devices);
        let window = std::mem::take(&mut state.replies);
        let rest = serde_json::to_string(&state).expect("json");
        let replies = window.in_order().map(|(id, doc)| (id, doc.as_str())).collect();
        postcard::to_allocvec(&Binary4 { rest: &rest, replies, devices }).expect("postcard")
    }

    /// Every kind of outcome the window holds reads back from the binary window as it was.
    #[test]
    fn every_kind_of_outcome_survives_a_snapshot() {
        use super::super::dedupe::{Remembered, WrittenTwin};
        use super::super::TwinError;
        let outcomes = [
            Remembered::Err(TwinError::ModuleNotFound { device: "d".into(), module: "m".into() }),
            Remembered::Err(TwinError::TooManyModulesOnDevice { device: "d".into(), max: 50 }),
            Remembered::Done,
            Remembered::Reported(-3),
            Remembered::Device("d".into()),
            Remembered::Module("d".into(), "m".into()),
            Remembered::Twin(WrittenTwin::new(crate::model::DeviceKey::from("d"), None)),
            Remembered::Twin(WrittenTwin::new(crate::model::DeviceKey::from("d"), Some("m"))),
            Remembered::Job("j".into()),
            Remembered::Bulk(vec![None, Some(TwinError::DeviceAlreadyExists("e".into()))]),
            Remembered::Claim { claimed: true, running: false },
            Remembered::Configuration("c".into()),
            Remembered::Certificate("ca".into()),
            Remembered::BulkDone(7),
        ];
        let mut state = ShardState::default();
        for (i, outcome) in outcomes.iter().enumerate() {
            state.dedupe.remember(RequestId(u128::MAX - i as u128), outcome.clone());
        }
        let read = ShardState::decode_snapshot(&state.encode_snapshot()).expect("decode");
        assert_eq!(read.dedupe, state.dedupe);
        for (i, outcome) in outcomes.iter().enumerate() {
            assert_eq!(read.dedupe.get(&RequestId(u128::MAX - i as u128)), Some(outcome));
        }
    }

    #[test]
    fn a_reply_that_is_not_json_is_refused() {
        let mut state = ShardState::default();
        let device = crate::model::DeviceSpec::test_sas("d1");
        state.apply(&crate::model::Command::new(crate::model::Op::PutDevice { device, if_match: None }, 1));
        let cmd = crate::model::Command::new(
            crate::model::Op::UpdateTwin {
                id: crate::TwinId::device("d1"),
                patch_json: r#"{"properties":{"desired":{"fw":"2.0"}}}"#.into(),
                if_match: None,
            },
            2,
        );
        assert!(state.apply(&cmd).result.is_ok());
        let bytes = state.encode_snapshot();
        // The reply's text starts with the twin's `{"deviceId":"d1"`: make it not JSON.
        let at = bytes.windows(12).position(|w| w == br#"{"deviceId":"#).expect("the reply's text");
        let mut bad = bytes.clone();
        bad[at] = b'<';
        let refused = ShardState::decode_snapshot(&bad).unwrap_err();
        assert!(refused.contains("corrupt shard snapshot: a reply"), "{refused}");
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

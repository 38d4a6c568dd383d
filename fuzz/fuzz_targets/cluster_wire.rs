//! An inter-node path, body or signature-header block: every wire decoder. See `twinhub::fuzzing::cluster_wire`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::cluster_wire(data));

//! Any UTF-8 text as an IoT Hub query, a job `queryCondition` and a continuation token; whatever
//! parses is evaluated, projected, paged with its own tokens and aggregated through serialized shard
//! state. See `twinhub::fuzzing::query`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::query(data));

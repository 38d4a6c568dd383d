//! A twin body: JSON parse (serde_json's `Value` and the borrowing tree apply reads, which must agree) and the service PATCH / PUT and device reported-patch validation. See `twinhub::fuzzing::twin_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::twin_json(data));

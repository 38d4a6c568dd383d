//! A twin body: JSON parse and the service PATCH / PUT and device reported-patch validation. See `twinhub::fuzzing::twin_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::twin_json(data));

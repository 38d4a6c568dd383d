//! One HTTP request (text: request line, headers, body) through the real axum router without a twin layer. See `twinhub::fuzzing::http_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::http_request(data));

//! A SAS token (HTTP Authorization header or MQTT password): parse and every check. See `twinhub::fuzzing::sas_token`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::sas_token(data));

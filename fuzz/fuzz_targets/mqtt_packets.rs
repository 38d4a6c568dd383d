//! A device's MQTT byte stream from CONNECT on: codec, CONNECT identity and token, topics, `$rid`, reported patches, subscriptions. See `twinhub::fuzzing::mqtt_packets`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinhub::fuzzing::mqtt_packets(data));

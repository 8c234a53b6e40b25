//! Fuzz target: see `hccn_runtime::fuzzing::handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hccn_runtime::fuzzing::handshake(data));

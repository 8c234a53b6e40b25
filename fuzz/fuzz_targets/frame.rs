//! Fuzz target: see `hccn_runtime::fuzzing::frame_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hccn_runtime::fuzzing::frame_header(data));

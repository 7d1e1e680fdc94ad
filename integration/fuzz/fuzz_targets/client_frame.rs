#![no_main]
//! Fuzz target `client_frame`: see integration/src/fuzzing.rs.

#[path = "../../src/fuzzing.rs"]
#[allow(dead_code)]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::client_frame(data));

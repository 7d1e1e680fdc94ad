#![no_main]
//! Fuzz target `path`: see integration/src/fuzzing.rs.

#[path = "../../src/fuzzing.rs"]
#[allow(dead_code)]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::path(data));

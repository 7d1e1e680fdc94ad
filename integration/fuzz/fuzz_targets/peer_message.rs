#![no_main]
//! Fuzz target `peer_message`: see integration/src/fuzzing.rs.

#[path = "../../src/fuzzing.rs"]
#[allow(dead_code)]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::peer_message(data));

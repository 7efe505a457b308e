//! libFuzzer target: `esper_fuzz::json` (see fuzz/README.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| esper_fuzz::json(data));

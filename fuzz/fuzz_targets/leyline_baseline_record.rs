//! libFuzzer target: `esper_fuzz::baseline_record` (see fuzz/README.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| esper_fuzz::baseline_record(data));

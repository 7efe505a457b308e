//! libFuzzer target: `esper_fuzz::alpha_controller` (see fuzz/README.md). Needs libtorch:
//! run with `--features torch`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| esper_fuzz::alpha_controller(data));

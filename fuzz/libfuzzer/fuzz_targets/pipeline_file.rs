#![no_main]
// libFuzzer drives tidemark_fuzz::pipeline_file (see fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::pipeline_file(data));

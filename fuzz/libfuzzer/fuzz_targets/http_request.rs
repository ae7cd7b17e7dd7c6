#![no_main]
// libFuzzer drives tidemark_fuzz::http_request (see fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::http_request(data));

#![no_main]
// libFuzzer drives tidemark_fuzz::table_join_state (see fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::table_join_state(data));

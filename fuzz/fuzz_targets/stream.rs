#![no_main]
// See crates/vnet-fuzz: vnet_fuzz::stream.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vnet_fuzz::stream(data));

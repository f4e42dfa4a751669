#![no_main]
// See crates/vnet-fuzz: vnet_fuzz::offload_input.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vnet_fuzz::offload_input(data));

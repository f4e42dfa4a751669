#![no_main]
// See crates/vnet-fuzz: vnet_fuzz::control.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vnet_fuzz::control(data));

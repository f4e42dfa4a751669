#![no_main]
// See crates/vnet-fuzz: vnet_fuzz::reassembly.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vnet_fuzz::reassembly(data));

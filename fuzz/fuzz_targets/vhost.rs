#![no_main]
// See crates/vnet-fuzz: vnet_fuzz::vhost.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vnet_fuzz::vhost(data));

//! The GCP cloud config `gce.conf` (gcfg INI, `[global]`), parsed and rendered as the manager
//! would log it. Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    ccm_provider_gcp::config::fuzz_parse(text);
});

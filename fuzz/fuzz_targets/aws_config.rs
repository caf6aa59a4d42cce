//! The AWS cloud config (gcfg INI): never a panic, whatever the file holds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ccm_provider_aws::CloudConfig::parse(text);
    }
});

//! The Azure cloud config `azure.json` (JSON or YAML), parsed, validated and rendered as the
//! manager would log it. Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ccm_provider_azure::config::fuzz_parse(data);
});

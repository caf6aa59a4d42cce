//! The manager's own configuration inputs: the leader-migration config file (YAML), Go
//! durations in flags and `Retry-After` headers from clouds. Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = ccm_core::manager::migration::parse(text);
    let _ = ccm_core::manager::duration::parse(text);
    let _ = ccm_core::cloud_call::parse_retry_after(text);
});

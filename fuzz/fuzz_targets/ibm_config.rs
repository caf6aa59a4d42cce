//! The IBM cloud config (gcfg INI), with and without `ENABLE_VPC_PUBLIC_ENDPOINT`. Never a
//! panic.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = ccm_provider_ibm::config::Config::parse(text, &BTreeMap::new());
    let env = BTreeMap::from([("ENABLE_VPC_PUBLIC_ENDPOINT".to_string(), "true".to_string())]);
    let _ = ccm_provider_ibm::config::Config::parse(text, &env);
});

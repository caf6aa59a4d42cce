//! The vSphere cloud config (YAML or legacy INI, auto-detected), with and without `VSPHERE_*`
//! environment overrides. Never a panic.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ccm_provider_vsphere::config::Config::parse(data, &BTreeMap::new());
    let env: BTreeMap<String, String> = [
        ("VSPHERE_VCENTER", "10.0.0.1"),
        ("VSPHERE_USER", "user@vsphere.local"),
        ("VSPHERE_PASSWORD", "fuzz-password-value"),
        ("VSPHERE_INSECURE", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let _ = ccm_provider_vsphere::config::Config::parse(data, &env);
});

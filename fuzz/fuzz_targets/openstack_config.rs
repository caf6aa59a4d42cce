//! The OpenStack cloud config (gcfg INI) and, with `use-clouds = true`, the clouds.yaml /
//! secure.yaml it reads: the input after the first NUL byte (NUL is never valid in the INI).
//! With and without `OS_CCM_REGIONAL` and `OS_CLOUD`. Never a panic; no file is touched.
#![no_main]
use std::collections::BTreeMap;
use std::path::Path;

use ccm_provider_openstack::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (ini, yaml) = text.split_once('\0').unwrap_or((text, ""));
    let read = |path: &Path| -> std::io::Result<String> {
        if path.ends_with("clouds.yaml") || path.ends_with("secure.yaml") {
            Ok(yaml.to_string())
        } else {
            Err(std::io::ErrorKind::NotFound.into())
        }
    };
    let _ = Config::parse_with(ini, &BTreeMap::new(), &read);
    let env = BTreeMap::from([
        ("OS_CCM_REGIONAL".to_string(), "true".to_string()),
        ("OS_CLOUD".to_string(), "openstack".to_string()),
    ]);
    let _ = Config::parse_with(ini, &env, &read);
});

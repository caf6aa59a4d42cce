//! What `auth-provider-gcp` reads from outside: a `.dockercfg` (instance attribute or URL),
//! the `google-dockercfg-url` value, a dockercfg `auth` field, and its command line (one
//! argument per line). Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ccm_provider_gcp::credential::fuzz_replies(data);
});

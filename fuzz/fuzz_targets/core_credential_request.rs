//! The kubelet's CredentialProviderRequest (stdin of the image credential provider). Never a
//! panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ccm_core::credential::decode_request(data);
});

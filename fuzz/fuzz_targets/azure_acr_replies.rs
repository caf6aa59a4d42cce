//! What `acr-credential-provider` parses besides the kubelet's request: a registry's
//! `WWW-Authenticate` challenge, image names, `--registry-mirror` and the command line.
//! Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ccm_provider_azure::credential::fuzz_replies(data);
});

//! AWS identifiers read from outside: providerIDs (Node.spec.providerID), availability zones
//! from the instance metadata service (IMDS replies), ARNs, image references and ECR
//! authorization tokens (`ecr-credential-provider`). Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = ccm_provider_aws::instances::parse_provider_id(text);
    let _ = ccm_provider_aws::config::region_of_zone(text);
    let _ = ccm_provider_aws::config::arn_account(text);
    let _ = ccm_provider_aws::credential::parse_registry(text);
    let _ = ccm_provider_aws::credential::decode_token(text);
    let tags = text.lines().filter_map(|l| l.split_once('='));
    let _ = ccm_provider_aws::metadata::cluster_ids(tags);
});

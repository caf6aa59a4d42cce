//! IBM Cloud replies decoded by the hand-written client: VPC resources, pages and error bodies
//! (VPC, IAM, Resource Manager), and `ibm://` providerIDs. Never a panic.
#![no_main]
use ccm_provider_ibm::model;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<model::Instance>(data)
        .map(|i| ccm_provider_ibm::instances::metadata_from_instance(&i, "us-south"));
    let _ =
        serde_json::from_slice::<model::LoadBalancer>(data).map(|lb| (lb.status(), lb.is_active()));
    let _ = serde_json::from_slice::<model::Subnet>(data);
    let _ = serde_json::from_slice::<model::Pool>(data);
    let _ = serde_json::from_slice::<model::Listener>(data);
    let _ = serde_json::from_slice::<model::Member>(data);
    let _ = serde_json::from_slice::<model::ResourceGroup>(data);
    for status in [400, 401, 403, 404, 409, 429, 500, 503] {
        let _ = ccm_provider_ibm::fuzzing::error_body(status, data).to_string();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ccm_provider_ibm::instances::parse_provider_id(text, "acct", "cluster");
        let _ = ccm_provider_ibm::instances::looks_like_vpc_instance_id(text);
    }
});

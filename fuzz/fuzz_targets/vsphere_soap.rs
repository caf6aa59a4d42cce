//! vCenter's SOAP replies: the XML reader and the SOAP fault parser, and the certificate
//! thumbprints and BIOS UUIDs read from outside. Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(root) = ccm_provider_vsphere::client::xml::parse(text) {
        let _ = root.find("returnval").map(|e| e.xsi_type());
    }
    let _ = ccm_provider_vsphere::fuzzing::soap_fault(text);
    let _ = ccm_provider_vsphere::client::normalize_thumbprint(text);
    let _ = ccm_provider_vsphere::instances::swap_uuid_bytes(text);
});

//! A VM's guestinfo metadata (base64 YAML, the network config optionally gzip+base64), as read
//! from vCenter: the first line is `guestinfo.metadata`, the second (if any)
//! `network.encoding` is applied to the rest. Never a panic.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut guestinfo = BTreeMap::new();
    guestinfo.insert("guestinfo.metadata.encoding".to_string(), "base64".to_string());
    guestinfo.insert("guestinfo.metadata".to_string(), text.to_string());
    let _ = ccm_provider_vsphere::instances::static_addresses(&guestinfo);
    // The decoded form: the fuzzer's bytes as the YAML document itself.
    let encoded = b64(data);
    guestinfo.insert("guestinfo.metadata".to_string(), encoded);
    let _ = ccm_provider_vsphere::instances::static_addresses(&guestinfo);
});

fn b64(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

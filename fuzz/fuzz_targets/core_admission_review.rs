//! AdmissionReview bodies on the webhook port (the apiserver, or anyone who reaches it):
//! every webhook of the core answers any body with an HTTP response. Never a panic.
#![no_main]
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use ccm_core::manager::webhooks;
use ccm_core::testing::TestCloud;
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    for w in webhooks::all() {
        let req = http::Request::builder()
            .method("POST")
            .uri(w.path)
            .header("content-type", "application/json")
            .body(Bytes::copy_from_slice(data))
            .expect("request");
        let cloud = Arc::new(TestCloud::default());
        let _ = runtime().block_on(webhooks::handle(w, cloud, req));
    }
});

//! InstancesV2 against the emulator: labels first, VPC lookups batched, existence from the
//! VPC with the deletion-safety rule.

use ccm_core::cloud::{InstanceStatus, InstancesV2, ProviderError};
use ccm_emulators::admin::PauseMode;
use ccm_emulators::world::PowerState;

use crate::fixture::{CLUSTER, iks_labels, node, start};

fn addrs(md: &ccm_core::cloud::InstanceMetadata) -> Vec<(String, String)> {
    md.node_addresses.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[tokio::test]
async fn labelled_nodes_are_answered_from_their_labels_without_a_vpc_call() {
    let f = start().await;
    let inst = f.provider.ibm_instances();
    let mut labels = iks_labels("kube-clus1-default-00000101", "10.240.0.4", "us-south-1");
    labels.push(("ibm-cloud.kubernetes.io/external-ip", "169.48.0.9"));
    let labelled = node("10.240.0.4", &labels, None, None);
    let private_only = node(
        "10.240.0.5",
        &iks_labels("kube-clus1-default-00000102", "10.240.0.5", "us-south-1"),
        None,
        None,
    );
    let out = inst.instance_metadata_batch(&[labelled, private_only]).await;
    let a = out[0].as_ref().unwrap();
    let account = f.cloud.account_id();
    assert_eq!(a.provider_id, format!("ibm://{account}///{CLUSTER}/kube-clus1-default-00000101"));
    assert_eq!(a.instance_type, "bx2.4x16");
    assert_eq!((a.zone.as_str(), a.region.as_str()), ("us-south-1", "us-south"));
    assert_eq!(addrs(a), vec![pair("InternalIP", "10.240.0.4"), pair("ExternalIP", "169.48.0.9")]);
    // No external IP: upstream reports the internal one as ExternalIP.
    let b = out[1].as_ref().unwrap();
    assert_eq!(addrs(b), vec![pair("InternalIP", "10.240.0.5"), pair("ExternalIP", "10.240.0.5")]);
    let counters = f.server.counters();
    assert_eq!(counters.get("vpc.instances.list"), 0);
    assert_eq!(counters.get("iam.token"), 0, "no token needed for labelled nodes");
}

#[tokio::test]
async fn unlabelled_nodes_are_looked_up_in_the_vpc_with_one_list_call_per_batch() {
    let f = start().await;
    let inst = f.provider.ibm_instances();
    let nodes = [
        node("node-a", &[], None, None),
        node("node-b", &[], None, None),
        node("node-c", &[], None, None),
        node("missing", &[], None, None),
    ];
    let out = inst.instance_metadata_batch(&nodes).await;
    assert_eq!(f.server.counters().get("vpc.instances.list"), 1, "one list call for the batch");
    let account = f.cloud.account_id();
    let a = out[0].as_ref().unwrap();
    let id_a = f.cloud.instance_id("node-a").unwrap();
    assert_eq!(a.provider_id, format!("ibm://{account}///{CLUSTER}/{id_a}"));
    assert_eq!(a.instance_type, "bx2-4x16");
    assert_eq!((a.zone.as_str(), a.region.as_str()), ("us-south-1", "us-south"));
    assert_eq!(addrs(a), vec![pair("InternalIP", "10.240.0.4"), pair("ExternalIP", "10.240.0.4")]);
    assert_eq!(out[2].as_ref().unwrap().zone, "us-south-2");
    // Not found by name: "not yet" (retried), never an answer that deletes.
    assert!(matches!(out[3], Err(ProviderError::InstanceNotFound)), "{:?}", out[3]);

    // A single node uses upstream's exact call (name and vpc.name filters).
    let one = inst.instance_metadata(&node("node-b", &[], None, None)).await.unwrap();
    assert_eq!(one.instance_type, "bx2-2x8");
    assert_eq!(f.server.counters().get("vpc.instances.list"), 2);
}

#[tokio::test]
async fn existence_comes_from_the_vpc_and_only_a_404_for_a_known_instance_says_gone() {
    let f = start().await;
    let inst = f.provider.ibm_instances();
    let account = f.cloud.account_id();
    let pid =
        |name: &str| format!("ibm://{account}///{CLUSTER}/{}", f.cloud.instance_id(name).unwrap());
    let (pa, pb, pc) = (pid("node-a"), pid("node-b"), pid("node-c"));
    let iks_worker = node(
        "10.240.9.9",
        &iks_labels("kube-clus1-default-00000199", "10.240.9.9", "us-south-1"),
        Some(&format!("ibm://{account}///{CLUSTER}/kube-clus1-default-00000199")),
        None,
    );
    let nodes = vec![
        node("node-a", &[], Some(&pa), None),
        node("node-b", &[], Some(&pb), None),
        node("node-c", &[], Some(&pc), None),
        iks_worker,
        node("node-a", &[], None, None),
    ];
    let status = |out: Vec<Result<InstanceStatus, ProviderError>>| -> Vec<String> {
        out.into_iter()
            .map(|r| match r {
                Ok(s) => format!("{s:?}"),
                Err(_) => "error".into(),
            })
            .collect()
    };
    assert_eq!(
        status(inst.instance_status_batch(&nodes).await),
        ["Running", "Running", "Shutdown", "Running", "Running"]
    );
    assert_eq!(f.server.counters().get("vpc.instances.list"), 1, "one list call per pass");

    // A VPC outage: every node is an error, none is gone.
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    let out = inst.instance_status_batch(&nodes).await;
    assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    assert!(inst.instance_exists(&nodes[0]).await.is_err());
    f.server.admin().resume().await.unwrap();

    // node-b's instance is deleted: its providerID names a VPC instance, IBM answers 404 for
    // that ID: gone. The IKS worker (not a VPC instance) keeps upstream's "exists".
    assert!(f.cloud.delete_instance("node-b"));
    assert!(f.cloud.set_power("node-c", PowerState::Running));
    assert_eq!(
        status(inst.instance_status_batch(&nodes).await),
        ["Running", "NotFound", "Running", "Running", "Running"]
    );
    assert!(!inst.instance_exists(&nodes[1]).await.unwrap());
    assert!(inst.instance_exists(&nodes[3]).await.unwrap());
    // Without providerID the deleted instance is only "not found by name": kept.
    let by_name = node("node-b", &[], None, None);
    assert!(inst.instance_exists(&by_name).await.unwrap());
    // The 404 is asked of the exact ID, and only while the VPC answers.
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    assert!(inst.instance_exists(&nodes[1]).await.is_err());
    f.server.admin().resume().await.unwrap();

    // A providerID of another cluster or cloud is an error, never "gone".
    let foreign =
        node("x", &[], Some("ibm://other///clus9/0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0"), None);
    assert!(inst.instance_exists(&foreign).await.is_err());
    let aws = node("y", &[], Some("aws:///us-east-1a/i-0123"), None);
    assert!(inst.instance_exists(&aws).await.is_err());
}

/// A proxy's or gateway's HTML 404 page that echoes the request (and so the instance ID).
fn html_404(id: &str) -> String {
    format!(
        "<!DOCTYPE html><html><head><title>404 Not Found</title></head><body><h1>Not Found</h1>\
         <p>The requested URL /v1/instances/{id} was not found on this server.</p>\
         <hr><address>Apache/2.4.57 Server at vpc.internal Port 443</address></body></html>"
    )
}

#[tokio::test]
async fn a_404_that_is_not_ibms_typed_not_found_never_says_an_instance_is_gone() {
    use ccm_emulators::faults::{Fault, FaultRule};
    let f = start().await;
    let inst = f.provider.ibm_instances();
    let client = f.provider.client();
    let account = f.cloud.account_id();
    let id_a = f.cloud.instance_id("node-a").unwrap();
    // A VPC instance ID of the right form that the listing does not show: the provider asks
    // GetInstance for it, and only IBM's typed not-found may say gone.
    let unlisted = "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0";
    let unlisted_node =
        node("node-x", &[], Some(&format!("ibm://{account}///{CLUSTER}/{unlisted}")), None);
    let bodies = [
        ("an HTML page echoing the ID", html_404(unlisted)),
        ("a JSON body without IBM's code", format!(r#"{{"message":"{unlisted} not found"}}"#)),
        (
            "a JSON body with another code",
            r#"{"errors":[{"code":"no_route","message":"x"}]}"#.into(),
        ),
        ("an empty body", String::new()),
    ];
    for (what, body) in bodies {
        let rule =
            FaultRule::new("vpc.instances.get", Fault::Status { status: 404, body: Some(body) });
        let _id = f.server.inject(rule).unwrap();
        // The client: an error, not "no such instance" (node-a exists).
        let got = client.get_instance(&id_a).await;
        assert!(got.is_err(), "{what}: GetInstance answered {got:?}");
        // The provider: the Node is kept (an error), never NotFound.
        let out = inst.instance_status_batch(std::slice::from_ref(&unlisted_node)).await;
        assert!(out[0].is_err(), "{what}: the node's instance status was {:?}", out[0]);
        assert!(inst.instance_exists(&unlisted_node).await.is_err(), "{what}");
        f.server.admin().clear_faults().await.unwrap();
    }
    // IBM's own typed answer for that exact ID still says gone.
    let out = inst.instance_status_batch(std::slice::from_ref(&unlisted_node)).await;
    assert!(matches!(out[0], Ok(InstanceStatus::NotFound)), "{:?}", out[0]);
    assert!(client.get_instance(unlisted).await.unwrap().is_none());
}

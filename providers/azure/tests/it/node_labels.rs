//! Upstream's IMDS-derived Node labels from `cloud-node-manager-azure` (issue #33 item 9):
//! `topology.kubernetes.azure.com/interconnect-group` from the VM's
//! `Platform_Interconnect_Group` tag, as IMDS lists it in `tagsList`. IMDS answers for each
//! VM in turn (its providerID is that VM's), and a VM without the tag gets no label.

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::imds::ImdsClient;
use ccm_provider_azure::node_manager::{
    ImdsInstances, LABEL_INTERCONNECT_GROUP, Options, TAG_INTERCONNECT_GROUP, run,
};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::fixture;

fn world() -> String {
    format!(
        r#"
region: eastus
networks:
  - {{name: vnet, cidr: 10.0.0.0/8}}
subnets:
  - {{name: subnet, network: vnet, zone: "1", cidr: 10.240.0.0/16}}
instances:
  - {{name: gpu-0, zone: "1", private_ips: [10.240.0.4], tags: {{{TAG_INTERCONNECT_GROUP}: ig-east-7}}}}
  - {{name: cpu-0, zone: "1", private_ips: [10.240.0.5]}}
"#
    )
}

#[tokio::test]
async fn the_node_manager_labels_the_interconnect_group_from_imds() {
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(&world(), opts, |_| {}).await;
    let cp = ControlPlane::shared().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());

    for (vm, ip, want) in
        [("gpu-0", "10.240.0.4", Some("ig-east-7")), ("cpu-0", "10.240.0.5", None)]
    {
        assert!(f.cloud.set_imds_instance(vm));
        let name = unique_name(vm);
        nodes.create(&PostParams::default(), &kubelet_node(&name, ip, "True")).await.unwrap();
        let imds = ImdsClient::from_arm(&f.client).with_timeout(Duration::from_secs(5));
        let instances = Arc::new(ImdsInstances::new(imds, name.clone()));
        let opts = Options {
            status_update_frequency: Duration::from_millis(500),
            retry_base: Duration::from_millis(100),
            ..Options::new(name.clone())
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let manager = tokio::spawn(run(admin.clone(), instances, opts, async move {
            let _ = stopped.await;
        }));
        let n = wait_for(&format!("{vm} initialised"), Duration::from_secs(30), || async {
            let n = nodes.get(&name).await.ok()?;
            n.spec.as_ref()?.provider_id.is_some().then_some(n)
        })
        .await;
        assert_eq!(
            n.spec.as_ref().and_then(|s| s.provider_id.clone()),
            Some(fixture::vm_provider_id(vm)),
            "IMDS answered for {vm}"
        );
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(LABEL_INTERCONNECT_GROUP).map(String::as_str), want, "{labels:?}");
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), manager).await.unwrap().unwrap();
        let _ = nodes.delete(&name, &DeleteParams::default()).await;
    }
}

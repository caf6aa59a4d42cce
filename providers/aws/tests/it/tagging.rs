//! The `tagging` controller (issue #30) as the binary runs it: the manager in-process with
//! AWS's extensions, upstream's flags (`--controllers=tagging --tags=... --resources=instance`),
//! a real kube-apiserver and moto.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use ccm_core::cloud::CloudProvider;
use ccm_provider_aws::tagging::{CHECKSUM_LABEL, TaggingOptions};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};

use crate::moto::{Moto, network, node, run_instances};

/// The tags of instance `id` in moto.
async fn instance_tags(ec2: &aws_sdk_ec2::Client, id: &str) -> BTreeMap<String, String> {
    let out = ec2
        .describe_tags()
        .filters(Filter::builder().name("resource-id").values(id).build())
        .send()
        .await
        .unwrap();
    out.tags()
        .iter()
        .map(|t| {
            (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string())
        })
        .collect()
}

#[tokio::test]
async fn the_tagging_controller_tags_each_node_s_instance_labels_the_node_and_untags_on_delete() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "tg").await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "tg", 2, None).await.unwrap();
    let ids: Vec<String> = insts.iter().map(|i| i.instance_id().unwrap().to_string()).collect();

    // The manager's command line, as upstream's manifests write it.
    let ext = ccm_provider_aws::extensions();
    let cp = ccm_testbed::ControlPlane::shared().await.unwrap();
    let argv = [
        "cloud-controller-manager-aws".to_string(),
        "--cloud-provider=aws".into(),
        format!("--kubeconfig={}", cp.admin_kubeconfig_path().display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
        "--controllers=tagging".into(),
        "--tags=team=payments,env=prod".into(),
        "--tags".into(),
        "owner=ccm".into(),
        "--resources=instance".into(),
        "--tagging-controller-concurrent-node-syncs=2".into(),
    ];
    let flags = ccm_core::manager::parse_flags(&ext, argv).unwrap();
    let options = ext.validate(flags, "aws").unwrap();
    let want: BTreeMap<String, String> = [("team", "payments"), ("env", "prod"), ("owner", "ccm")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    let checksum = TaggingOptions { tags: want.clone(), ..TaggingOptions::default() }.checksum();

    // Node 0: to tag. Node 1: already labelled with the current checksum (tagged before, e.g.
    // by upstream's controller): left alone. Node 2: no providerID yet: skipped.
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let names: Vec<String> =
        (0..3).map(|i| ccm_testbed::unique_name(&format!("tagged-{i}"))).collect();
    let mut labelled = node(&names[1], Some(format!("aws:///us-east-1a/{}", ids[1])));
    labelled.metadata.labels = Some([(CHECKSUM_LABEL.to_string(), checksum.clone())].into());
    for n in [
        node(&names[0], Some(format!("aws:///us-east-1a/{}", ids[0]))),
        labelled,
        node(&names[2], None),
    ] {
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }

    let parsed = ext.parsed.clone();
    let (cloud, _) = moto.cloud("tg", "").await.unwrap();
    let factory: ccm_core::manager::CloudFactory = Box::new(move |_| {
        Ok(Arc::new(cloud.with_tagging(TaggingOptions::from_flags(&parsed)))
            as Arc<dyn CloudProvider>)
    });
    let shutdown = ccm_core::manager::CancellationToken::new();
    let stop = shutdown.clone();
    let manager = tokio::spawn(async move {
        ccm_core::manager::run_until("aws", options, factory, &ext, stop).await
    });

    let tags = ccm_testbed::wait_for("instance 0 tagged", Duration::from_secs(60), || async {
        let tags = instance_tags(&ec2, &ids[0]).await;
        want.iter().all(|(k, v)| tags.get(k) == Some(v)).then_some(tags)
    })
    .await;
    assert_eq!(tags.get("kubernetes.io/cluster/tg").map(String::as_str), Some("owned"), "{tags:?}");
    ccm_testbed::wait_for("node 0 labelled", Duration::from_secs(30), || async {
        let n = nodes.get(&names[0]).await.unwrap();
        (n.metadata.labels.unwrap_or_default().get(CHECKSUM_LABEL) == Some(&checksum)).then_some(())
    })
    .await;
    // Give the controller time to act on the other two Nodes (it would have by now).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let untouched = instance_tags(&ec2, &ids[1]).await;
    assert!(
        !untouched.contains_key("team"),
        "a Node labelled with the checksum is not re-tagged: {untouched:?}"
    );
    let n2 = nodes.get(&names[2]).await.unwrap();
    assert!(
        !n2.metadata.labels.unwrap_or_default().contains_key(CHECKSUM_LABEL),
        "no providerID, no label"
    );

    // Deleting the Node removes exactly the configured tags from its instance.
    nodes.delete(&names[0], &DeleteParams::default()).await.unwrap();
    let left = ccm_testbed::wait_for("instance 0 untagged", Duration::from_secs(60), || async {
        let tags = instance_tags(&ec2, &ids[0]).await;
        want.keys().all(|k| !tags.contains_key(k)).then_some(tags)
    })
    .await;
    assert_eq!(left.get("kubernetes.io/cluster/tg").map(String::as_str), Some("owned"), "{left:?}");

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(60), manager).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "manager did not stop cleanly: {result:?}");
    for name in &names[1..] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
}

#[tokio::test]
async fn the_tagging_controller_without_tags_stops_the_manager_naming_the_flag() {
    let moto = Moto::start().await.unwrap();
    let ext = ccm_provider_aws::extensions();
    let cp = ccm_testbed::ControlPlane::shared().await.unwrap();
    let argv = [
        "cloud-controller-manager-aws".to_string(),
        "--cloud-provider=aws".into(),
        format!("--kubeconfig={}", cp.admin_kubeconfig_path().display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
        "--controllers=tagging".into(),
        "--resources=instance".into(),
    ];
    let options = ext.validate(ccm_core::manager::parse_flags(&ext, argv).unwrap(), "aws").unwrap();
    let parsed = ext.parsed.clone();
    let (cloud, _) = moto.cloud("tg", "").await.unwrap();
    let factory: ccm_core::manager::CloudFactory = Box::new(move |_| {
        Ok(Arc::new(cloud.with_tagging(TaggingOptions::from_flags(&parsed)))
            as Arc<dyn CloudProvider>)
    });
    let run = ccm_core::manager::run_until(
        "aws",
        options,
        factory,
        &ext,
        ccm_core::manager::CancellationToken::new(),
    );
    let err = tokio::time::timeout(Duration::from_secs(60), run).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("--tags must not be empty"), "{err}");
}

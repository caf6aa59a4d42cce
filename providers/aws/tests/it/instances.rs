//! InstancesV2 against moto: metadata, existence, shutdown, and batching into few calls.

use ccm_core::cloud::CloudProvider;
use ccm_core::cloud::{InstanceStatus, ProviderError};

use crate::moto::{Moto, network, node, run_instances};

#[tokio::test]
async fn metadata_by_provider_id_and_by_private_dns_name() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "meta").await.unwrap();
    let inst = run_instances(&ec2, &net.subnets[1].0, "meta", 1, None).await.unwrap().remove(0);
    let id = inst.instance_id().unwrap().to_string();
    let dns = inst.private_dns_name().unwrap().to_string();
    let ip = inst.private_ip_address().unwrap().to_string();

    let (cloud, _) = moto.cloud("meta", "").await.unwrap();
    let iv2 = cloud.instances_v2().unwrap();
    for n in
        [node("by-id", Some(format!("aws:///us-east-1b/{id}"))), node(&dns, None), node(&id, None)]
    {
        let m = iv2.instance_metadata(&n).await.unwrap();
        assert_eq!(m.provider_id, format!("aws:///us-east-1b/{id}"));
        assert_eq!(m.instance_type, "m5.large");
        assert_eq!(m.zone, "us-east-1b");
        assert_eq!(m.region, "us-east-1");
        assert!(
            m.additional_labels.get("topology.k8s.aws/zone-id").is_some_and(|z| !z.is_empty()),
            "{m:?}"
        );
        let addrs: Vec<(String, String)> =
            m.node_addresses.iter().map(|a| (a.type_.clone(), a.address.clone())).collect();
        assert_eq!(addrs[0], ("InternalIP".to_string(), ip.clone()), "{addrs:?}");
        assert!(addrs.contains(&("InternalDNS".to_string(), dns.clone())), "{addrs:?}");
        assert!(addrs.contains(&("Hostname".to_string(), dns.clone())), "{addrs:?}");
    }

    // A name no instance has: not found (the node stays uninitialised), not an error.
    let err = iv2.instance_metadata(&node("ip-10-9-9-9.ec2.internal", None)).await.unwrap_err();
    assert!(matches!(err, ProviderError::InstanceNotFound), "{err:?}");
    // An instance of another cluster is not found by name.
    // (Even after the same instance was looked up, and cached, by its providerID.)
    let other =
        run_instances(&ec2, &net.subnets[0].0, "someone-else", 1, None).await.unwrap().remove(0);
    let other_pid = format!("aws:///us-east-1a/{}", other.instance_id().unwrap());
    assert!(iv2.instance_exists(&node("by-pid", Some(other_pid))).await.unwrap());
    let err =
        iv2.instance_metadata(&node(other.private_dns_name().unwrap(), None)).await.unwrap_err();
    assert!(matches!(err, ProviderError::InstanceNotFound), "{err:?}");
}

#[tokio::test]
async fn existence_and_shutdown_follow_the_instance_state() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "life").await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "life", 3, None).await.unwrap();
    let ids: Vec<String> = insts.iter().map(|i| i.instance_id().unwrap().to_string()).collect();
    ec2.stop_instances().instance_ids(&ids[1]).send().await.unwrap();
    ec2.terminate_instances().instance_ids(&ids[2]).send().await.unwrap();

    let (cloud, _) = moto.cloud("life", "").await.unwrap();
    let iv2 = cloud.instances_v2().unwrap();
    let nodes: Vec<_> = ids
        .iter()
        .map(|id| node(id, Some(format!("aws:///us-east-1a/{id}"))))
        .chain([node("gone", Some("aws:///us-east-1a/i-0000000000000000f".into()))])
        .collect();
    let status: Vec<InstanceStatus> =
        iv2.instance_status_batch(&nodes).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        status,
        vec![
            InstanceStatus::Running,
            InstanceStatus::Shutdown,
            InstanceStatus::NotFound,
            InstanceStatus::NotFound
        ]
    );
    assert!(iv2.instance_exists(&nodes[1]).await.unwrap());
    assert!(iv2.instance_shutdown(&nodes[1]).await.unwrap());
    assert!(!iv2.instance_exists(&nodes[2]).await.unwrap());
    // A providerID from another cloud is an error, never "gone".
    assert!(iv2.instance_exists(&node("x", Some("gce://p/z/x".into()))).await.is_err());
}

#[tokio::test]
async fn a_batch_of_nodes_costs_one_describe_instances_per_lookup_kind() {
    const N: usize = 40;
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "batch").await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "batch", N as i32, None).await.unwrap();
    assert_eq!(insts.len(), N);

    let (cloud, metrics) = moto.cloud("batch", "").await.unwrap();
    let iv2 = cloud.instances_v2().unwrap();
    // Half the nodes have a providerID, half are known only by their private DNS name.
    let nodes: Vec<_> = insts
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let id = inst.instance_id().unwrap();
            if i % 2 == 0 {
                node(id, Some(format!("aws:///us-east-1a/{id}")))
            } else {
                node(inst.private_dns_name().unwrap(), None)
            }
        })
        .collect();
    let before = metrics.requests("ec2", "DescribeInstances");
    let meta = iv2.instance_metadata_batch(&nodes).await;
    for (m, inst) in meta.iter().zip(&insts) {
        let m = m.as_ref().unwrap();
        assert!(m.provider_id.ends_with(inst.instance_id().unwrap()), "{m:?}");
    }
    let calls = metrics.requests("ec2", "DescribeInstances") - before;
    println!("{N} nodes (half by providerID, half by DNS name): {calls} DescribeInstances calls");
    assert_eq!(calls, 2, "one call by instance-id filter, one by private-dns-name filter");

    // Within the cache lifetime the same metadata batch costs nothing...
    let before = metrics.requests("ec2", "DescribeInstances");
    let meta = iv2.instance_metadata_batch(&nodes).await;
    assert!(meta.iter().all(Result::is_ok));
    assert_eq!(metrics.requests("ec2", "DescribeInstances") - before, 0);
    // ...but instance state is always asked for (the same two calls), so a stopped or
    // terminated instance is seen at the next lifecycle pass.
    let status = iv2.instance_status_batch(&nodes).await;
    assert!(status.iter().all(|s| matches!(s, Ok(InstanceStatus::Running))));
    assert_eq!(metrics.requests("ec2", "DescribeInstances") - before, 2);

    // A fresh provider, all by providerID: one call.
    let (cloud, metrics) = moto.cloud("batch", "").await.unwrap();
    let by_id: Vec<_> = insts
        .iter()
        .map(|i| node("n", Some(format!("aws:///us-east-1a/{}", i.instance_id().unwrap()))))
        .collect();
    let status = cloud.instances_v2().unwrap().instance_status_batch(&by_id).await;
    assert!(status.iter().all(|s| matches!(s, Ok(InstanceStatus::Running))));
    assert_eq!(metrics.requests("ec2", "DescribeInstances"), 1);

    // The counter is exported under its metric name.
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            r#"cloudprovider_aws_api_request_total{service="ec2",operation="DescribeInstances"} 1"#
        ),
        "{text}"
    );
}

/// Deletion safety: only a lookup by the providerID's instance ID may say "gone". Without a
/// providerID a node is looked up by name, and "not found by name" is an error (the lifecycle
/// controller keeps the Node), never `NotFound`.
#[tokio::test]
async fn not_found_by_name_is_an_error_never_gone() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "safe").await.unwrap();
    // Running, but without this cluster's tag (e.g. the tag was removed or never set).
    let untagged =
        run_instances(&ec2, &net.subnets[0].0, "another-cluster", 1, None).await.unwrap().remove(0);
    // Tagged and terminated, named by its instance ID (resource-based name).
    let terminated =
        run_instances(&ec2, &net.subnets[0].0, "safe", 1, None).await.unwrap().remove(0);
    let terminated_id = terminated.instance_id().unwrap().to_string();
    ec2.terminate_instances().instance_ids(&terminated_id).send().await.unwrap();

    let (cloud, _) = moto.cloud("safe", "").await.unwrap();
    let iv2 = cloud.instances_v2().unwrap();
    let nodes = vec![
        node(untagged.private_dns_name().unwrap(), None),
        node("ip-10-0-0-250.ec2.internal", None),
        node("i-0000000000000000f", None),
        node(&terminated_id, None),
        node("by-pid", Some("aws:///us-east-1a/i-0000000000000000f".into())),
    ];
    let status = iv2.instance_status_batch(&nodes).await;
    for (n, s) in nodes[..3].iter().zip(&status) {
        let name = n.metadata.name.as_deref().unwrap();
        let err = s.as_ref().expect_err(name);
        assert!(err.to_string().contains("no providerID"), "{name}: {err}");
    }
    // Positive answers about an instance looked up by ID: terminated, or no such instance
    // for the providerID's ID.
    assert!(matches!(status[3], Ok(InstanceStatus::NotFound)), "{:?}", status[3]);
    assert!(matches!(status[4], Ok(InstanceStatus::NotFound)), "{:?}", status[4]);
    // The single-node methods follow the batch.
    assert!(iv2.instance_exists(&nodes[0]).await.is_err());
    assert!(iv2.instance_exists(&nodes[1]).await.is_err());
    assert!(!iv2.instance_exists(&nodes[4]).await.unwrap());
    // Node initialisation: not found by name is "not yet" (retried), as before.
    let err = iv2.instance_metadata(&nodes[0]).await.unwrap_err();
    assert!(matches!(err, ProviderError::InstanceNotFound), "{err:?}");
}

/// Issue #29 (LOW): a providerID naming a zone or region other than the manager's is an error,
/// never looked up here: an instance ID absent from this region (or reused by another
/// instance here) says nothing about the Node's instance, so it is neither "gone" (deleted)
/// nor initialised with another instance's metadata.
#[tokio::test]
async fn a_provider_id_of_another_region_is_an_error_never_gone() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "regions").await.unwrap();
    let here = run_instances(&ec2, &net.subnets[0].0, "regions", 1, None).await.unwrap().remove(0);
    let here_id = here.instance_id().unwrap().to_string();

    let (cloud, _) = moto.cloud("regions", "").await.unwrap();
    let iv2 = cloud.instances_v2().unwrap();
    let nodes = vec![
        // Absent from us-east-1: looked up here, it would be "gone" and the Node deleted.
        node("absent", Some("aws:///eu-west-1a/i-0000000000000000f".into())),
        node("region-form", Some("aws://eu-west-1/i-0000000000000000f".into())),
        // The same ID as an instance here: not that instance.
        node("reused", Some(format!("aws:///us-west-2b/{here_id}"))),
        // This region's zones, Local Zones included, are looked up as before.
        node("local", Some(format!("aws:///us-east-1a/{here_id}"))),
        node("local-zone", Some("aws:///us-east-1-bos-1a/i-0000000000000000f".into())),
    ];
    let status = iv2.instance_status_batch(&nodes).await;
    for (n, s) in nodes[..3].iter().zip(&status) {
        let name = n.metadata.name.as_deref().unwrap();
        let err = s.as_ref().expect_err(name);
        let shown = err.to_string();
        assert!(shown.contains("not in this manager's region us-east-1"), "{name}: {shown}");
        assert!(iv2.instance_exists(n).await.is_err(), "{name}");
        let err = iv2.instance_metadata(n).await.unwrap_err();
        assert!(!matches!(err, ProviderError::InstanceNotFound), "{name}: {err:?}");
    }
    assert!(matches!(status[3], Ok(InstanceStatus::Running)), "{:?}", status[3]);
    assert!(matches!(status[4], Ok(InstanceStatus::NotFound)), "{:?}", status[4]);
}

/// Issue #21 (chaos suite, partial answers): a DescribeInstances page that does not list a
/// running instance (empty, or truncated) is not "gone": the ID is asked for by itself and
/// only EC2's `InvalidInstanceID.NotFound` is. Before the fix one empty page deleted every
/// NotReady Node of the cluster.
#[tokio::test]
async fn an_empty_instance_page_is_never_gone_only_invalid_instance_id_not_found_is() {
    use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
    use ccm_emulators::{Fault, FaultRule};
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "partial").await.unwrap();
    let inst = run_instances(&ec2, &net.subnets[0].0, "partial", 1, None).await.unwrap().remove(0);
    let id = inst.instance_id().unwrap().to_string();
    let proxy =
        FaultProxy::start(Url::parse(&moto.0.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    let cfg = ccm_provider_aws::CloudConfig::parse(&ccm_provider_aws::testing::cloud_config(
        &proxy.url(),
        "partial",
        "",
    ))
    .unwrap();
    let clients = ccm_provider_aws::AwsClients::from_sdk_config(
        &cfg,
        &ccm_provider_aws::testing::sdk().await,
        ccm_provider_aws::ApiMetrics::default(),
    )
    .await
    .unwrap();
    let cloud = ccm_provider_aws::Cloud::with_clients(
        cfg,
        std::sync::Arc::new(ccm_provider_aws::LazyClients::ready(clients)),
    );
    let iv2 = cloud.instances_v2().unwrap();
    let nodes = [
        node("running", Some(format!("aws:///us-east-1a/{id}"))),
        node("gone", Some("aws:///us-east-1a/i-0000000000000000f".into())),
    ];
    let empty = r#"<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r-empty</requestId><reservationSet/></DescribeInstancesResponse>"#;

    // Every DescribeInstances answers with an empty page: nothing is gone, both are errors.
    let rule = proxy
        .admin()
        .inject(FaultRule::new(
            "ec2:DescribeInstances",
            Fault::Status { status: 200, body: Some(empty.into()) },
        ))
        .await
        .unwrap();
    let status = iv2.instance_status_batch(&nodes).await;
    assert!(status.iter().all(Result::is_err), "{status:?}");
    assert!(iv2.instance_exists(&nodes[0]).await.is_err());

    // The filtered page alone is empty, the lookup by ID answers: the running instance is
    // running; the unknown ID is gone (InvalidInstanceID.NotFound from moto).
    proxy.admin().remove_fault(rule).await.unwrap();
    proxy
        .admin()
        .inject(
            FaultRule::new(
                "ec2:DescribeInstances",
                Fault::Status { status: 200, body: Some(empty.into()) },
            )
            .times(1),
        )
        .await
        .unwrap();
    let status: Vec<_> = iv2.instance_status_batch(&nodes).await;
    assert!(matches!(status[0], Ok(InstanceStatus::Running)), "{status:?}");
    assert!(matches!(status[1], Ok(InstanceStatus::NotFound)), "{status:?}");
}

//! Drop-in without a cloud config: the provider reads region, VPC and cluster ID from the
//! instance metadata service (the kit's IMDSv2 emulator, answering for a moto instance) and
//! the instance's tags in moto, as upstream does when its manifest passes no `--cloud-config`.

use ccm_core::cloud::CloudProvider;
use ccm_emulators::aws_imds::{AwsImds, ImdsInstance, TOKEN_HEADER, TTL_HEADER};
use ccm_provider_aws::metadata::Sources;
use ccm_provider_aws::{Cloud, testing};

use crate::moto::{Moto, network, node, run_instances};

/// The metadata of a moto instance.
fn imds_instance(i: &aws_sdk_ec2::types::Instance, vpc: &str) -> ImdsInstance {
    let eni = i.network_interfaces().first();
    ImdsInstance {
        instance_id: i.instance_id().unwrap().into(),
        region: testing::REGION.into(),
        availability_zone: i.placement().and_then(|p| p.availability_zone()).unwrap().into(),
        instance_type: "m5.large".into(),
        mac: eni.and_then(|e| e.mac_address()).unwrap_or("0e:00:00:00:00:01").into(),
        vpc_id: vpc.into(),
        subnet_id: i.subnet_id().unwrap_or_default().into(),
        local_ipv4: i.private_ip_address().unwrap_or_default().into(),
        local_hostname: i.private_dns_name().unwrap_or_default().into(),
    }
}

#[tokio::test]
async fn without_a_cloud_config_the_cluster_id_comes_from_the_instance_tags() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "dropin").await.unwrap();
    // run_instances tags the instances kubernetes.io/cluster/dropin=owned.
    let insts = run_instances(&ec2, &net.subnets[0].0, "dropin", 2, None).await.unwrap();
    let (server, imds) = AwsImds::start(imds_instance(&insts[0], &net.vpc)).await.unwrap();
    let sdk = testing::sdk().await.to_builder().endpoint_url(&moto.0.url).build();

    // Before: no cloud config meant no cluster ID, and the manager exits "no ClusterID".
    let cloud = Cloud::from_config_with_sources(
        None,
        Sources { imds_endpoint: Some(server.url()), sdk: Some(sdk) },
    )
    .await
    .unwrap();
    assert!(cloud.has_cluster_id());
    assert_eq!(cloud.config().cluster_id(), Some("dropin"));
    assert_eq!(cloud.config().global.vpc, net.vpc);
    assert_eq!(cloud.config().configured_region().as_deref(), Some(testing::REGION));
    // IMDSv2: a session token was fetched and every metadata read carried it.
    assert!(imds.tokens_issued() >= 1);
    assert_eq!(imds.rejected(), 0);
    let c = server.counters();
    eprintln!("imds counters: {c:?}");
    assert!(c.get("imds:GetToken") >= 1 && c.get("imds:GetMetadata") >= 4, "{c:?}");

    // The provider works on what it discovered: the other instance's Node initialises.
    let name = insts[1].private_dns_name().unwrap();
    let md = cloud.instances_v2().unwrap().instance_metadata(&node(name, None)).await.unwrap();
    assert_eq!(md.provider_id, format!("aws:///us-east-1a/{}", insts[1].instance_id().unwrap()));
}

#[tokio::test]
async fn an_instance_tagged_for_two_clusters_is_refused_and_no_metadata_leaves_it_untagged() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "two").await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "two", 1, None).await.unwrap();
    ec2.create_tags()
        .resources(insts[0].instance_id().unwrap())
        .tags(testing::tag("KubernetesCluster", "other"))
        .send()
        .await
        .unwrap();
    let (server, _imds) = AwsImds::start(imds_instance(&insts[0], &net.vpc)).await.unwrap();
    let sdk = testing::sdk().await.to_builder().endpoint_url(&moto.0.url).build();
    let err = Cloud::from_config_with_sources(
        None,
        Sources { imds_endpoint: Some(server.url()), sdk: Some(sdk.clone()) },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("other") && err.contains("two"), "{err}");

    // A config naming the cluster wins: no metadata is read at all.
    let text = "[Global]\nKubernetesClusterID = two\n";
    let before = server.counters().total;
    let cloud = Cloud::from_config_with_sources(
        Some(text.as_bytes()),
        Sources { imds_endpoint: Some(server.url()), sdk: Some(sdk.clone()) },
    )
    .await
    .unwrap();
    assert_eq!(cloud.config().cluster_id(), Some("two"));
    assert_eq!(server.counters().total, before);

    // No metadata service: no cluster ID (the manager then refuses to start, as before).
    drop(server);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let cloud =
        Cloud::from_config_with_sources(None, Sources { imds_endpoint: Some(url), sdk: Some(sdk) })
            .await
            .unwrap();
    assert!(!cloud.has_cluster_id());
}

/// The emulator is IMDSv2-only: a metadata read without a session token is refused with 401.
#[tokio::test]
async fn the_imds_emulator_requires_a_session_token() {
    let (server, imds) = AwsImds::start(ImdsInstance {
        instance_id: "i-0123456789abcdef0".into(),
        region: "us-east-1".into(),
        availability_zone: "us-east-1a".into(),
        mac: "0e:00:00:00:00:01".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", server.url());
    let r = http.get(url("/latest/meta-data/instance-id")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http.put(url("/latest/api/token")).send().await.unwrap();
    assert_eq!(r.status(), 400, "a token request needs a TTL");
    let token = http
        .put(url("/latest/api/token"))
        .header(TTL_HEADER, "60")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let r = http
        .get(url("/latest/meta-data/instance-id"))
        .header(TOKEN_HEADER, &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "i-0123456789abcdef0");
    let r = http
        .get(url("/latest/meta-data/placement/availability-zone"))
        .header(TOKEN_HEADER, "forged")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(imds.rejected(), 2);
}

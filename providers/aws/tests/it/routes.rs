//! Routes against moto: the cluster's route table, create/list/delete.

use ccm_core::cloud::{CloudProvider, Route};

use crate::moto::{Moto, network, run_instances, tag, tags_for};
use aws_sdk_ec2::types::ResourceType;

fn route(target: &str, cidr: &str) -> Route {
    Route {
        name: String::new(),
        target_node: target.into(),
        target_node_addresses: vec![],
        enable_node_addresses: false,
        destination_cidr: cidr.into(),
        blackhole: false,
    }
}

#[tokio::test]
async fn routes_are_created_listed_and_deleted_in_the_tagged_table() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "rt").await.unwrap();
    let rt = ec2
        .create_route_table()
        .vpc_id(&net.vpc)
        .tag_specifications(tags_for(
            ResourceType::RouteTable,
            vec![tag("kubernetes.io/cluster/rt", "owned")],
        ))
        .send()
        .await
        .unwrap();
    let rt_id = rt.route_table().unwrap().route_table_id().unwrap().to_string();
    let insts = run_instances(&ec2, &net.subnets[0].0, "rt", 2, None).await.unwrap();
    let names: Vec<String> =
        insts.iter().map(|i| i.private_dns_name().unwrap().to_string()).collect();

    let (cloud, _) = moto.cloud("rt", "").await.unwrap();
    let routes = cloud.routes().unwrap();
    assert!(routes.list_routes("rt").await.unwrap().is_empty());

    routes.create_route("rt", "uid-0", &route(&names[0], "100.64.0.0/24")).await.unwrap();
    routes.create_route("rt", "uid-1", &route(&names[1], "100.64.1.0/24")).await.unwrap();
    // Creating again is a no-op.
    routes.create_route("rt", "uid-1", &route(&names[1], "100.64.1.0/24")).await.unwrap();

    let mut listed = routes.list_routes("rt").await.unwrap();
    listed.sort_by(|a, b| a.destination_cidr.cmp(&b.destination_cidr));
    let got: Vec<(String, String, bool)> = listed
        .iter()
        .map(|r| (r.destination_cidr.clone(), r.target_node.clone(), r.blackhole))
        .collect();
    assert_eq!(
        got,
        vec![
            ("100.64.0.0/24".to_string(), names[0].clone(), false),
            ("100.64.1.0/24".to_string(), names[1].clone(), false),
        ]
    );

    // The instances now forward traffic that is not theirs.
    let d = ec2
        .describe_instances()
        .instance_ids(insts[0].instance_id().unwrap())
        .send()
        .await
        .unwrap();
    let inst = &d.reservations()[0].instances()[0];
    assert_eq!(inst.source_dest_check(), Some(false));

    // The routes went into the tagged table.
    let t = ec2.describe_route_tables().route_table_ids(&rt_id).send().await.unwrap();
    let cidrs: Vec<&str> =
        t.route_tables()[0].routes().iter().filter_map(|r| r.destination_cidr_block()).collect();
    assert!(cidrs.contains(&"100.64.0.0/24") && cidrs.contains(&"100.64.1.0/24"), "{cidrs:?}");

    routes.delete_route("rt", &listed[0]).await.unwrap();
    let left = routes.list_routes("rt").await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].destination_cidr, "100.64.1.0/24");

    // Without a tagged table (another cluster), the error says what to do.
    let (other, _) = moto.cloud("no-table", "").await.unwrap();
    let err = other.routes().unwrap().list_routes("no-table").await.unwrap_err();
    assert!(err.to_string().contains("RouteTableID"), "{err}");
    // RouteTableID in the config wins.
    let (by_id, _) = moto.cloud("no-table", &format!("RouteTableID = {rt_id}")).await.unwrap();
    assert_eq!(by_id.routes().unwrap().list_routes("no-table").await.unwrap().len(), 1);
}

/// One pass of the core route controller's rule (`core/src/controllers/route/plan.rs`) over
/// `nodes` (name, pod CIDR): a route is kept when its target is the node with that CIDR,
/// created when missing, and deleted when it is in the cluster CIDR but matches no node.
/// Returns (created, deleted).
async fn route_pass(
    routes: &dyn ccm_core::cloud::Routes,
    cluster: &str,
    nodes: &[(String, String)],
) -> (usize, usize) {
    let listed = routes.list_routes(cluster).await.unwrap();
    let matches =
        |r: &Route| nodes.iter().any(|(n, c)| *n == r.target_node && *c == r.destination_cidr);
    let mut deleted = 0;
    for r in listed.iter().filter(|r| r.destination_cidr.starts_with("100.64.")) {
        if r.blackhole || !matches(r) {
            routes.delete_route(cluster, r).await.unwrap();
            deleted += 1;
        }
    }
    let mut created = 0;
    for (name, cidr) in nodes {
        let kept = listed
            .iter()
            .any(|r| r.target_node == *name && r.destination_cidr == *cidr && !r.blackhole);
        if !kept {
            routes.create_route(cluster, "uid", &route(name, cidr)).await.unwrap();
            created += 1;
        }
    }
    (created, deleted)
}

/// Nodes named by instance ID or by a custom hostname (not the private DNS name): their
/// routes are reported with the Node's name, so the second pass neither deletes nor creates.
/// Before: the routes came back named by private DNS name, so the controller deleted and
/// re-created both every pass (and could not create the custom-hostname one at all).
#[tokio::test]
async fn routes_of_nodes_not_named_by_private_dns_are_kept_on_the_next_pass() {
    use k8s_openapi::api::core::v1::{Node, NodeSpec};
    use kube::api::{Api, ObjectMeta, PostParams};

    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let net = network(&ec2, "rtn").await.unwrap();
    ec2.create_route_table()
        .vpc_id(&net.vpc)
        .tag_specifications(tags_for(
            ResourceType::RouteTable,
            vec![tag("kubernetes.io/cluster/rtn", "owned")],
        ))
        .send()
        .await
        .unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "rtn", 2, None).await.unwrap();
    let ids: Vec<String> = insts.iter().map(|i| i.instance_id().unwrap().to_string()).collect();

    let cp = ccm_testbed::ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let custom = ccm_testbed::unique_name("worker-custom");
    let nodes =
        vec![(ids[0].clone(), "100.64.10.0/24".to_string()), (custom, "100.64.11.0/24".into())];
    for ((name, cidr), id) in nodes.iter().zip(&ids) {
        let node = Node {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///us-east-1a/{id}")),
                pod_cidr: Some(cidr.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        nodes_api.create(&PostParams::default(), &node).await.unwrap();
    }

    let (cloud, metrics) = moto.cloud("rtn", "").await.unwrap();
    cloud
        .initialize(ccm_core::cloud::ProviderInit::new(
            client,
            tokio_util::sync::CancellationToken::new(),
        ))
        .unwrap();
    let routes = cloud.routes().unwrap();

    let first = route_pass(routes.as_ref(), "rtn", &nodes).await;
    assert_eq!(first, (2, 0), "the first pass creates one route per node");
    let listed = routes.list_routes("rtn").await.unwrap();
    let mut got: Vec<(String, String)> =
        listed.iter().map(|r| (r.target_node.clone(), r.destination_cidr.clone())).collect();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, nodes, "routes are reported with their Nodes' names");

    let (creates, deletes) =
        (metrics.requests("ec2", "CreateRoute"), metrics.requests("ec2", "DeleteRoute"));
    let second = route_pass(routes.as_ref(), "rtn", &nodes).await;
    assert_eq!(second, (0, 0), "the second pass changes nothing");
    assert_eq!(metrics.requests("ec2", "CreateRoute"), creates);
    assert_eq!(metrics.requests("ec2", "DeleteRoute"), deletes);
    eprintln!("CreateRoute {creates}, DeleteRoute {deletes} after two passes");

    for (name, _) in &nodes {
        let _ = nodes_api.delete(name, &Default::default()).await;
    }
}

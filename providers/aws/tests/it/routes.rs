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

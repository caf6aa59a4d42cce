//! Network resources in another subscription and tenant (issue #33 item 4; upstream's
//! `networkResourceSubscriptionID`, `networkResourceTenantID` and auxiliary tokens): the
//! emulator keeps the cluster's network (virtual network, subnet, security group) in a second
//! subscription of a second AAD tenant and enforces ARM's cross-tenant rules (a call needs a
//! token of its subscription's tenant; a write linking another tenant's resource needs that
//! tenant's token in `x-ms-authorization-auxiliary`).

use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_emulators::azure::{AzureOptions, NetworkSubscription};
use ccm_provider_azure::AzureProvider;
use ccm_provider_azure::client::{ArmClient, ArmError, api_version};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::fixture::{self, CLUSTER, Fixture, RESOURCE_GROUP, SUBSCRIPTION};

/// The network subscription and its tenant.
const NET_SUBSCRIPTION: &str = "5e7a0c31-0000-0000-0000-0000000ne701";
const NET_TENANT: &str = "9d1c2b3a-0000-0000-0000-00000000te02";

fn options() -> AzureOptions {
    AzureOptions {
        lro: Duration::from_millis(50),
        network: Some(NetworkSubscription {
            subscription_id: NET_SUBSCRIPTION.into(),
            tenant_id: NET_TENANT.into(),
        }),
        ..AzureOptions::default()
    }
}

/// The emulator with the network elsewhere; the client configured with `net_sub` and
/// `net_tenant`.
async fn start(net_sub: Option<&str>, net_tenant: Option<&str>) -> Fixture {
    fixture::start_with(fixture::WORLD, options(), |c| {
        c.network_resource_subscription_id = net_sub.map(str::to_string);
        c.network_resource_tenant_id = net_tenant.map(str::to_string);
    })
    .await
}

fn nic_id(client: &ArmClient, vm: &str) -> String {
    client
        .resource_id(RESOURCE_GROUP, "Microsoft.Network/networkInterfaces", &format!("{vm}-nic"))
        .unwrap()
}

#[tokio::test]
async fn network_calls_go_to_the_network_subscription_and_compute_calls_stay() {
    let f = start(Some(NET_SUBSCRIPTION), Some(NET_TENANT)).await;
    let c = &f.client;
    assert_eq!(c.subscription_id(), SUBSCRIPTION);
    assert_eq!(c.network_subscription_id(), NET_SUBSCRIPTION);
    for ty in [
        "Microsoft.Network/loadBalancers",
        "Microsoft.Network/publicIPAddresses",
        "Microsoft.Network/networkSecurityGroups",
        "Microsoft.Network/virtualNetworks",
        "Microsoft.Network/routeTables",
    ] {
        let id = c.resource_id(RESOURCE_GROUP, ty, "x").unwrap();
        assert!(id.starts_with(&format!("/subscriptions/{NET_SUBSCRIPTION}/")), "{id}");
    }
    for ty in [
        "Microsoft.Compute/virtualMachines",
        "Microsoft.Compute/virtualMachineScaleSets",
        "Microsoft.Network/networkInterfaces",
        "Microsoft.Network/privateLinkServices",
    ] {
        let id = c.resource_id(RESOURCE_GROUP, ty, "x").unwrap();
        assert!(id.starts_with(&format!("/subscriptions/{SUBSCRIPTION}/")), "{id}");
    }
    // Another subscription than these two is still refused before sending.
    let other = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg";
    assert!(c.url(other, "v", &[]).is_err());

    // A NIC (compute subscription, home tenant) rewritten with its subnet in the network
    // tenant's subscription: accepted, with the auxiliary token.
    let id = nic_id(c, "vm-1");
    let nic: serde_json::Value =
        c.get("network.network_interfaces.get", &id, api_version::NETWORK, &[]).await.unwrap();
    c.put("network.network_interfaces.create_or_update", &id, api_version::NETWORK, &nic, None)
        .await
        .unwrap();
    // The virtual network is read from the network subscription.
    let vnet = c.resource_id(RESOURCE_GROUP, "Microsoft.Network/virtualNetworks", "vnet").unwrap();
    let v: serde_json::Value =
        c.get("network.virtual_networks.get", &vnet, api_version::NETWORK, &[]).await.unwrap();
    assert_eq!(v["name"], "vnet");
}

#[tokio::test]
async fn without_the_network_tenant_arm_refuses_the_cross_tenant_calls() {
    // The network subscription named, its tenant not: the home tenant's token reaches the
    // network subscription (ARM: 401 InvalidAuthenticationTokenTenant) and a NIC write
    // linking the network tenant's subnet has no auxiliary token (403
    // LinkedAuthorizationFailed).
    let f = start(Some(NET_SUBSCRIPTION), None).await;
    let c = &f.client;
    let vnet = c.resource_id(RESOURCE_GROUP, "Microsoft.Network/virtualNetworks", "vnet").unwrap();
    let e = c
        .get::<serde_json::Value>("network.virtual_networks.get", &vnet, api_version::NETWORK, &[])
        .await
        .unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(401), Some("InvalidAuthenticationTokenTenant")));
    let id = nic_id(c, "vm-1");
    let nic: serde_json::Value =
        c.get("network.network_interfaces.get", &id, api_version::NETWORK, &[]).await.unwrap();
    let e = c
        .put("network.network_interfaces.create_or_update", &id, api_version::NETWORK, &nic, None)
        .await
        .unwrap_err();
    assert!(matches!(&e, ArmError::Status { status: 403, .. }), "{e}");
    assert_eq!(e.code(), Some("LinkedAuthorizationFailed"), "{e}");
    assert!(!e.to_string().contains("Bearer"), "no token in errors: {e}");

    // Without the network subscription, the network is not found in the cluster's.
    let f = start(None, None).await;
    let vnet =
        f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/virtualNetworks", "vnet").unwrap();
    let got: Option<serde_json::Value> = f
        .client
        .get_opt("network.virtual_networks.get", &vnet, api_version::NETWORK, &[])
        .await
        .unwrap();
    assert!(got.is_none());
}

#[tokio::test]
async fn managed_identity_cannot_reach_another_network_tenant() {
    let f = start(None, None).await;
    let mut config = (*f.config).clone();
    config.aad_client_secret = None;
    config.use_managed_identity_extension = true;
    config.network_resource_subscription_id = Some(NET_SUBSCRIPTION.into());
    config.network_resource_tenant_id = Some(NET_TENANT.into());
    let e = ArmClient::new(&config, f.options.clone()).unwrap_err().to_string();
    assert!(e.contains("networkResourceTenantID"), "{e}");
    // The same tenant as tenantId is no other tenant: accepted, no auxiliary token.
    config.network_resource_tenant_id = Some(fixture::TENANT.into());
    ArmClient::new(&config, f.options.clone()).unwrap();
}

fn ingress_ip(s: &Service) -> Option<String> {
    s.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

fn provider_id(n: &Node) -> Option<&str> {
    n.spec.as_ref()?.provider_id.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_network_is_in_another_tenant_initialises_nodes_and_gets_an_address() {
    let f = start(Some(NET_SUBSCRIPTION), Some(NET_TENANT)).await;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();

    // The manager with the cloud-node and service controllers, on upstream's azure.json
    // keys.
    let azure_json = crate::support::azure_json(
        &f.server.url(),
        json!({
            "networkResourceSubscriptionID": NET_SUBSCRIPTION,
            "networkResourceTenantID": NET_TENANT,
        }),
    );
    let manager = crate::support::Manager::start(
        cp,
        azure_json,
        f.options.clone(),
        "cloud-node,service",
        &[],
    );

    // Two kubelets register (the VMs' computer names).
    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, ip) in [("vm-0", "10.240.0.4"), ("vm-1", "10.240.0.5")] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
        nodes.create(&PostParams::default(), &kubelet_node(name, ip, "True")).await.unwrap();
    }
    for name in ["vm-0", "vm-1"] {
        let n = wait_for(&format!("{name} initialised"), Duration::from_secs(60), || async {
            let n = nodes.get(name).await.ok()?;
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == ccm_core::names::TAINT_UNINITIALIZED);
            (!tainted && provider_id(&n).is_some()).then_some(n)
        })
        .await;
        assert_eq!(provider_id(&n), Some(fixture::vm_provider_id(name).as_str()));
    }

    // A LoadBalancer Service gets the address of a public IP in the network subscription.
    let ns = unique_name("net-tenant");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let ip = wait_for("the Service's address", Duration::from_secs(90), || async {
        ingress_ip(&services.get("web").await.ok()?)
    })
    .await;

    let net_lb = f.cloud.network_id("Microsoft.Network/loadBalancers", CLUSTER);
    let lb = f.cloud.resource(&net_lb).expect("the load balancer in the network subscription");
    assert!(f.cloud.resource(&f.cloud.id("Microsoft.Network/loadBalancers", CLUSTER)).is_none());
    let pips: Vec<serde_json::Value> = f.cloud.resources("Microsoft.Network/publicIPAddresses");
    let pip = pips
        .iter()
        .find(|p| p["properties"]["ipAddress"].as_str() == Some(ip.as_str()))
        .expect("the Service's public IP");
    let pip_id = pip["id"].as_str().unwrap();
    assert!(pip_id.starts_with(&format!("/subscriptions/{NET_SUBSCRIPTION}/")), "{pip_id}");
    // The nodes' NICs (compute subscription) joined the network subscription's pool.
    let pool = lb["properties"]["backendAddressPools"][0]["id"].as_str().unwrap().to_string();
    assert!(pool.starts_with(&format!("/subscriptions/{NET_SUBSCRIPTION}/")), "{pool}");
    let nic = f.cloud.resource(&f.cloud.id("Microsoft.Network/networkInterfaces", "vm-0-nic"));
    let nic = nic.expect("vm-0's NIC in the cluster's subscription");
    let joined =
        nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["id"].as_str().is_some_and(|i| i.eq_ignore_ascii_case(&pool)));
    assert!(joined, "{nic}");
    // Calls landed on both subscriptions (the emulator's counters).
    let (compute, network) = (
        f.cloud.calls_to_subscription(SUBSCRIPTION),
        f.cloud.calls_to_subscription(NET_SUBSCRIPTION),
    );
    assert!(compute > 0 && network > 0, "compute {compute}, network {network}");
    eprintln!("ARM calls: cluster subscription {compute}, network subscription {network}");

    services.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("the load balancer's Service frontend gone", Duration::from_secs(60), || async {
        let gone = f.cloud.resource(pip_id).is_none();
        gone.then_some(())
    })
    .await;
    manager.stop().await;
    for name in ["vm-0", "vm-1"] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}

#[tokio::test]
async fn additional_public_ips_are_looked_up_in_the_network_subscription() {
    // `serviceResourceGroups: "*"`: the addresses `azure-additional-public-ips` names are
    // looked up among every public IP of the subscription holding the network, not of the
    // compute subscription (where no public IP of this cluster lives).
    let f = fixture::start_with(fixture::WORLD, options(), |c| {
        c.network_resource_subscription_id = Some(NET_SUBSCRIPTION.into());
        c.network_resource_tenant_id = Some(NET_TENANT.into());
        c.service_resource_groups = Some("*".into());
        c.allow_additional_public_ips = true;
    })
    .await;
    let firewall = f.cloud.network_id("Microsoft.Network/publicIPAddresses", "firewall-ip");
    f.cloud
        .put_resource(
            &firewall,
            json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": "20.1.2.3", "publicIPAllocationMethod": "Static"}}),
        )
        .unwrap();
    let lbs = ccm_provider_azure::load_balancer::AzureLoadBalancer::new(
        f.client.clone(),
        f.config.clone(),
    );
    let s = crate::load_balancer::svc(
        crate::load_balancer::UID,
        "web",
        &[(443, "TCP")],
        &[("service.beta.kubernetes.io/azure-additional-public-ips", "20.1.2.3")],
    );
    let lists = |f: &Fixture| f.server.counters().get("network.public_ip_addresses.list_all");
    let before = (lists(&f), f.cloud.calls_to_subscription(NET_SUBSCRIPTION));
    let status = ccm_core::cloud::LoadBalancer::ensure_load_balancer(
        &lbs,
        CLUSTER,
        &s,
        &crate::load_balancer::nodes(),
    )
    .await
    .unwrap();
    assert!(
        crate::load_balancer::ips(&status).contains(&"20.1.2.3".parse().unwrap()),
        "the network subscription's public IP is reported: {status:?}"
    );
    assert!(lists(&f) > before.0, "the subscription-wide public IP listing ran");
    assert!(f.cloud.calls_to_subscription(NET_SUBSCRIPTION) > before.1);
}

#[tokio::test]
async fn a_certificate_login_reaches_the_network_tenants_subscription() {
    // `aadClientCertPath` and no secret, the network in another tenant: the same
    // certificate logs in to the network tenant (its token for the network subscription and
    // in `x-ms-authorization-auxiliary` for the NIC writes linking its subnet), as the secret
    // does. Before: refused at start ("needs aadClientId and aadClientSecret").
    let f = start(None, None).await;
    let dir = tempfile::tempdir().unwrap();
    let (pem, der, _) = crate::client_certificate::certificate("ccm-sp");
    assert!(f.cloud.register_client_certificate(ccm_emulators::azure::DEFAULT_CLIENT_ID, &der));
    let cert_path = crate::client_certificate::write(&dir, "sp.pem", pem.as_bytes());
    let azure_json = crate::support::azure_json(
        &f.server.url(),
        json!({
            "networkResourceSubscriptionID": NET_SUBSCRIPTION,
            "networkResourceTenantID": NET_TENANT,
            "aadClientCertPath": cert_path,
            "aadClientSecret": null,
        }),
    );
    // The emulator of `start` keeps the network in the network tenant's subscription.
    let provider = AzureProvider::new(Some(azure_json.as_bytes()), f.options.clone())
        .expect("a certificate-only config with another network tenant starts");
    let lbs = provider.load_balancer().unwrap();
    let s = crate::load_balancer::svc(crate::load_balancer::UID, "web", &[(80, "TCP")], &[]);
    let nodes = [fixture::node("vm-0", Some(&fixture::vm_provider_id("vm-0")))];
    let tokens = f.cloud.tokens_issued();
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes).await.unwrap();
    assert!(!crate::load_balancer::ips(&status).is_empty(), "{status:?}");
    assert!(f.cloud.tokens_issued() >= tokens + 2, "a token of each tenant");
    // The load balancer and public IP in the network subscription; vm-0's NIC (cluster
    // subscription) joined its pool: a write linking the network tenant's pool and subnet.
    let net_lb = f.cloud.network_id("Microsoft.Network/loadBalancers", CLUSTER);
    let lb = f.cloud.resource(&net_lb).expect("the load balancer in the network subscription");
    let pool = lb["properties"]["backendAddressPools"][0]["id"].as_str().unwrap().to_string();
    let nic = f.cloud.resource(&f.cloud.id("Microsoft.Network/networkInterfaces", "vm-0-nic"));
    let joined = nic.unwrap()["properties"]["ipConfigurations"][0]["properties"]
        ["loadBalancerBackendAddressPools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["id"].as_str().is_some_and(|i| i.eq_ignore_ascii_case(&pool)));
    assert!(joined, "vm-0 joined the network subscription's pool");
    assert!(f.cloud.calls_to_subscription(NET_SUBSCRIPTION) > 0);

    // A secret-less config without a certificate either: refused naming the key.
    let mut config = (*f.config).clone();
    config.aad_client_secret = None;
    config.network_resource_subscription_id = Some(NET_SUBSCRIPTION.into());
    config.network_resource_tenant_id = Some(NET_TENANT.into());
    let e = ArmClient::new(&config, f.options.clone()).unwrap_err().to_string();
    assert!(e.contains("aadClientSecret") || e.contains("aadClientCertPath"), "{e}");
}

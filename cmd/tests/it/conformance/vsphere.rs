//! The conformance harness for vSphere: vcsim's default inventory (a standalone host DC0_H0
//! and a cluster DC0_C0, two VMs each) with guest names and addresses, zone tags on the host
//! and the cluster and a region tag on the datacenter, behind the fault proxy
//! (`Protocol::VimSoap`, TLS terminated with a testbed-CA certificate). Upstream's vSphere
//! CCM has neither load balancers nor routes: those scenarios are "n/a".

use ccm_emulators::Admin;
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_testbed::vcsim::Vcsim;

use super::{Harness, Instance};
use crate::support::Binary;

/// The VMs in the order instances are handed out: zones alternate (host, cluster).
const VMS: [(&str, &str); 4] = [
    ("DC0_H0_VM0", "zone-a"),
    ("DC0_C0_RP0_VM0", "zone-b"),
    ("DC0_H0_VM1", "zone-a"),
    ("DC0_C0_RP0_VM1", "zone-b"),
];

pub struct Vsphere {
    sim: Vcsim,
    proxy: FaultProxy,
    instances: Vec<Instance>,
}

impl Vsphere {
    fn vm(&self, i: usize) -> &str {
        VMS[i].0
    }
}

impl Harness for Vsphere {
    const PROVIDER: &'static str = "vsphere";
    const BINARY: Binary = Binary {
        path: env!("CARGO_BIN_EXE_cloud-controller-manager-vsphere"),
        provider: "vsphere",
        clear_prefixes: &["VSPHERE_"],
        env: &[],
    };
    const LOAD_BALANCERS: bool = false;
    const ROUTES: bool = false;
    const INSTANCE_LOOKUPS: &'static [&'static str] =
        &["vim25:FindBy*", "vim25:FindAll*", "vim25:RetrieveProperties*"];

    async fn start(count: usize) -> Self {
        assert!(count <= VMS.len(), "vcsim's default inventory has {} VMs", VMS.len());
        let sim = Vcsim::start();
        sim.tag("k8s-region", "region-1", "DC0");
        sim.tag("k8s-zone", "zone-a", "DC0_H0");
        sim.tag("k8s-zone", "zone-b", "DC0_C0");
        let mut instances = Vec::new();
        for (i, (vm, zone)) in VMS.iter().enumerate().take(count) {
            let node = format!("node-{i}");
            let ip = format!("10.0.{}.{}", i % 2, 10 + i);
            sim.guest(vm, &node, &[("VM Network", &[ip.as_str()])]);
            let uuid = sim.vm(vm).uuid.clone();
            instances.push(Instance {
                addresses: vec![
                    ("Hostname".into(), node.clone()),
                    ("InternalIP".into(), ip.clone()),
                    ("ExternalIP".into(), ip.clone()),
                ],
                node,
                ip,
                provider_id: format!("vsphere://{uuid}"),
                id: uuid,
                zone: (*zone).into(),
                region: "region-1".into(),
                instance_type_prefix: "vsphere-vm.cpu-".into(),
            });
        }
        let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
        let proxy = FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap();
        Vsphere { sim, proxy, instances }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        format!(
            "global:\n  user: administrator@vsphere.local\n  password: \"vc-conformance-Pa55w0rd/never-logged\"\n  insecureFlag: true\n\
             vcenter:\n  vc1:\n    server: 127.0.0.1\n    port: {}\n\
             labels:\n  zone: k8s-zone\n  region: k8s-region\n",
            self.proxy.port()
        )
    }

    fn args(&self, _routes: bool) -> Vec<String> {
        Vec::new()
    }

    fn admin(&self) -> Admin {
        self.proxy.admin()
    }

    async fn power_off(&self, i: usize) {
        self.sim.power_off(self.vm(i));
    }

    async fn power_on(&self, i: usize) {
        self.sim.power_on(self.vm(i));
    }

    async fn delete(&self, i: usize) {
        self.sim.destroy(self.vm(i));
    }
}

super::scenarios!(Vsphere);
super::metrics::scenario!(Vsphere);

//! vSphere: vcsim (`ccm-vcsim -vms N`: govmomi's simulator, N VMs half on the standalone
//! host `DC0_H0`, half in the cluster `DC0_C0`) with each VM's guest host name set to its
//! Node's name and one address, zone tags on the host and the cluster and a region tag on
//! the datacenter, behind the fault proxy (`--protocol vim-soap`, TLS with its own CA; the
//! managers keep `insecureFlag`). Each Node reports its VM's BIOS UUID as `systemUUID`, as a
//! kubelet on a VM with `disk.EnableUUID` does. Our manager finds a batch's VMs in one
//! property-collector listing of every VM's `config.uuid` (1000 VMs a page, the page of the
//! call target); upstream searches each Node's UUID (`SearchIndex.FindByUuid`).

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use super::{Admin, Setup, World};

#[derive(serde::Deserialize)]
struct Hello {
    url: String,
    #[serde(rename = "caFile")]
    ca_file: String,
    vms: Vec<Vm>,
}

#[derive(serde::Deserialize)]
struct Vm {
    name: String,
    /// The VM's BIOS UUID (`config.uuid`).
    uuid: String,
}

/// The simulator process; it exits when its stdin (held here) closes.
struct Sim {
    _child: tokio::process::Child,
    _stdin: tokio::process::ChildStdin,
}

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let out =
        tokio::process::Command::new(ccm_testbed::tools::repo_root().join("ci/install-tools"))
            .arg("--print-vcsim")
            .output()
            .await
            .context("ci/install-tools --print-vcsim")?;
    let bin = String::from_utf8_lossy(&out.stdout).trim().to_string();
    anyhow::ensure!(
        std::path::Path::new(&bin).is_file(),
        "ccm-vcsim is not built at {bin}: run ci/install-tools"
    );
    let vms = s.nodes.max(4).to_string();
    let mut child = tokio::process::Command::new(&bin)
        .args(["-l", "127.0.0.1:0", "-vms", &vms])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(s.dir.join("vcsim.log"))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {bin}"))?;
    let mut stdin = child.stdin.take().context("vcsim stdin")?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("vcsim stdout")?).lines();
    let hello = lines.next_line().await?.context("vcsim exited before its greeting")?;
    let hello: Hello = serde_json::from_str(&hello).context("the vcsim greeting")?;
    anyhow::ensure!(
        hello.vms.len() >= s.nodes,
        "vcsim made {} VMs of {}",
        hello.vms.len(),
        s.nodes
    );
    let mut cmd = async |c: serde_json::Value| -> anyhow::Result<()> {
        stdin.write_all(format!("{c}\n").as_bytes()).await?;
        let answer = lines.next_line().await?.context("vcsim exited")?;
        anyhow::ensure!(answer.contains("\"ok\":true"), "vcsim {c}: {answer}");
        Ok(())
    };
    cmd(serde_json::json!({"op": "tag", "category": "k8s-region", "tag": "region-1", "object": "DC0"})).await?;
    cmd(serde_json::json!({"op": "tag", "category": "k8s-zone", "tag": "zone-a", "object": "DC0_H0"})).await?;
    cmd(serde_json::json!({"op": "tag", "category": "k8s-zone", "tag": "zone-b", "object": "DC0_C0"})).await?;
    let mut nodes = Vec::with_capacity(s.nodes);
    let mut system_uuids = std::collections::HashMap::with_capacity(s.nodes);
    for (i, vm) in hello.vms.iter().take(s.nodes).enumerate() {
        let node = format!("node-{i}");
        let ip = super::ip("10.0", 0, i);
        cmd(serde_json::json!({"op": "guest", "vm": vm.name, "hostName": node,
            "nics": [{"network": "VM Network", "ips": [ip]}]}))
        .await?;
        // As a kubelet reads it from the VM's SMBIOS (`disk.EnableUUID`, a documented
        // prerequisite): the VM's BIOS UUID, in the upper case dmidecode prints.
        system_uuids.insert(node.clone(), vm.uuid.to_uppercase());
        nodes.push((node, ip));
        if (i + 1) % 500 == 0 {
            crate::progress(format!("vcsim guests: {}/{}", i + 1, s.nodes));
        }
    }
    let port = hello
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .context("no port in the vcsim URL")?
        .to_string();
    let upstream = format!("https://127.0.0.1:{port}");
    let (proxy, lines) = super::emulator(
        s.emulator,
        &[
            "proxy",
            "--upstream",
            &upstream,
            "--protocol",
            "vim-soap",
            "--upstream-ca",
            &hello.ca_file,
        ],
        2,
        &s.dir.join("proxy.log"),
    )
    .await?;
    let url = lines[0].clone();
    let proxy_port = url.rsplit(':').next().context("no port in the proxy URL")?.to_string();
    let config = super::write(
        s.dir,
        "vsphere.conf",
        &format!(
            "global:\n  user: administrator@vsphere.local\n  password: \"bench-Pa55w0rd\"\n  insecureFlag: true\n\
             vcenter:\n  vc1:\n    server: 127.0.0.1\n    port: {proxy_port}\n\
             labels:\n  zone: k8s-zone\n  region: k8s-region\n"
        ),
    )?;
    Ok(World {
        nodes,
        admin: Admin { url, ca: lines.get(1).cloned() },
        provider: "vsphere",
        config,
        env: Vec::new(),
        args: Vec::new(),
        page: Some(1000),
        notes: vec![format!(
            "vcsim (govmomi simulator, {} VMs) behind the fault proxy; each Node reports its VM's BIOS UUID, which a batch finds in one listing of every VM's UUID (pages of 1000)",
            hello.vms.len()
        )],
        aws: None,
        spare: None,
        system_uuids,
        _keep: vec![Box::new(proxy), Box::new(Sim { _child: child, _stdin: stdin })],
    })
}

//! A vcsim fixture server per test (or per demo): `ccm-vcsim` (govmomi's vCenter simulator
//! with a scripting wrapper, built by `ci/install-tools`) on a free loopback port, scripted
//! over its stdin. The simulator exits when its stdin closes, so
//! it never outlives the test process, even after a panic or a SIGKILL; [`Vcsim`]'s `Drop`
//! also kills it.
//!
//! A fixture for tests and the demo: it panics on any failure, like a test assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use serde_json::{Value, json};

/// One VM of the default inventory.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Vm {
    /// Inventory name, e.g. `DC0_H0_VM0` (standalone host) or `DC0_C0_RP0_VM0` (cluster).
    pub name: String,
    /// BIOS UUID (what `vsphere://` providerIDs carry).
    pub uuid: String,
    /// Managed object reference, e.g. `vm-42`.
    pub moref: String,
    /// Inventory name of the host the VM runs on.
    pub host: String,
}

#[derive(serde::Deserialize)]
struct Hello {
    url: String,
    #[serde(rename = "caFile")]
    ca_file: String,
    vms: Vec<Vm>,
}

/// A running simulator; killed when dropped (and it exits by itself when its stdin closes).
pub struct Vcsim {
    child: Child,
    io: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    /// The loopback port of `https://127.0.0.1:<port>/sdk`.
    pub port: u16,
    /// PEM CA of the simulator's serving certificate.
    pub ca_file: String,
    /// The VMs of the default inventory.
    pub vms: Vec<Vm>,
}

impl std::fmt::Debug for Vcsim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vcsim").field("port", &self.port).finish_non_exhaustive()
    }
}

fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CCM_VCSIM") {
        return PathBuf::from(p);
    }
    let installer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/install-tools");
    let out = Command::new(&installer)
        .arg("--print-vcsim")
        .output()
        .expect("running ci/install-tools --print-vcsim");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "ccm-vcsim not built at {}: run ci/install-tools (or set CCM_VCSIM)",
        path.display()
    );
    path
}

impl Vcsim {
    /// Starts a simulator that accepts any user name and password.
    ///
    /// Panics if `ccm-vcsim` is not built (run `ci/install-tools` or set `CCM_VCSIM`).
    pub fn start() -> Vcsim {
        Self::start_with(&[])
    }

    /// With fixed credentials (by default any user name and password are accepted).
    pub fn start_with_login(user: &str, password: &str) -> Vcsim {
        Self::start_with(&["-username", user, "-password", password])
    }

    fn start_with(args: &[&str]) -> Vcsim {
        let mut child = Command::new(binary())
            .args(["-l", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting ccm-vcsim");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the vcsim greeting");
        if line.trim().is_empty() {
            // It exited before greeting (it binds port 0 itself, so no port race): say so at
            // once; its stderr (inherited) is just above in the test output.
            let status = child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            panic!("ccm-vcsim exited during start-up ({status}); its stderr is above");
        }
        let hello: Hello =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("vcsim greeting {line:?}: {e}"));
        // https://127.0.0.1:<port>/sdk
        let port = hello
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {}", hello.url));
        Vcsim {
            child,
            io: Mutex::new((stdin, stdout)),
            port,
            ca_file: hello.ca_file,
            vms: hello.vms,
        }
    }

    /// Sends one fixture command and panics if it fails.
    pub fn cmd(&self, cmd: Value) {
        let mut io = self.io.lock().unwrap();
        writeln!(io.0, "{cmd}").expect("writing to vcsim");
        io.0.flush().expect("flushing vcsim stdin");
        let mut line = String::new();
        io.1.read_line(&mut line).expect("reading the vcsim answer");
        let answer: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("vcsim answer {line:?}: {e}"));
        assert_eq!(answer["ok"], json!(true), "vcsim command {cmd} failed: {answer}");
    }

    /// The VM of the default inventory with this name.
    pub fn vm(&self, name: &str) -> &Vm {
        self.vms.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no VM {name}"))
    }

    /// Sets the guest host name and NICs (`(network, [ips])`) VMware Tools reports.
    pub fn guest(&self, vm: &str, host_name: &str, nics: &[(&str, &[&str])]) {
        let nics: Vec<Value> =
            nics.iter().map(|(n, ips)| json!({"network": n, "ips": ips})).collect();
        self.cmd(json!({"op": "guest", "vm": vm, "hostName": host_name, "nics": nics}));
    }

    /// Attaches tag `tag` of category `category` to a datacenter, cluster, host or VM.
    pub fn tag(&self, category: &str, tag: &str, object: &str) {
        self.cmd(json!({"op": "tag", "category": category, "tag": tag, "object": object}));
    }

    /// Powers a VM off.
    pub fn power_off(&self, vm: &str) {
        self.cmd(json!({"op": "power", "vm": vm, "state": "off"}));
    }

    /// Powers a VM on.
    pub fn power_on(&self, vm: &str) {
        self.cmd(json!({"op": "power", "vm": vm, "state": "on"}));
    }

    /// Destroys a VM (it is gone from the inventory).
    pub fn destroy(&self, vm: &str) {
        self.cmd(json!({"op": "destroy", "vm": vm}));
    }

    /// Terminates every SOAP session and revokes every REST session (session expiry).
    pub fn drop_sessions(&self) {
        self.cmd(json!({"op": "drop-sessions"}));
    }

    /// While paused every connection is closed unanswered (an unreachable vCenter).
    pub fn pause(&self) {
        self.cmd(json!({"op": "pause"}));
    }

    /// Ends a [`Vcsim::pause`].
    pub fn resume(&self) {
        self.cmd(json!({"op": "resume"}));
    }

    /// Sets the guest host name and NICs like [`Vcsim::guest`], each NIC with its
    /// `deviceConfigId` (`-1`: an interface that is not a vNIC, e.g. docker0 or a CNI bridge).
    pub fn guest_with_devices(&self, vm: &str, host_name: &str, nics: &[(&str, &[&str], i32)]) {
        let nics: Vec<Value> = nics
            .iter()
            .map(|(n, ips, id)| json!({"network": n, "ips": ips, "deviceConfigId": id}))
            .collect();
        self.cmd(json!({"op": "guest", "vm": vm, "hostName": host_name, "nics": nics}));
    }

    /// Sets one `config.extraConfig` entry of a VM (e.g. `guestinfo.metadata`).
    pub fn extra_config(&self, vm: &str, key: &str, value: &str) {
        self.cmd(json!({"op": "extra-config", "vm": vm, "key": key, "value": value}));
    }

    /// Attaches a tag to an object related to a VM: `"resourcePool"` (its resource pool)
    /// or `"folder"` (its parent folder).
    pub fn tag_of(&self, category: &str, tag: &str, vm: &str, of: &str) {
        self.cmd(json!({"op": "tag", "category": category, "tag": tag, "object": vm, "of": of}));
    }

    /// Creates an empty datacenter under the root folder.
    pub fn create_datacenter(&self, name: &str) {
        self.cmd(json!({"op": "datacenter", "name": name}));
    }

    /// Destroys an empty datacenter.
    pub fn destroy_datacenter(&self, name: &str) {
        self.cmd(json!({"op": "destroy-datacenter", "name": name}));
    }

    /// Moves a VM into another datacenter's VM folder. (The simulator's `SearchIndex`
    /// honours the datacenter argument of its finds, as vCenter does.)
    pub fn move_vm(&self, vm: &str, datacenter: &str) {
        self.cmd(json!({"op": "move", "vm": vm, "datacenter": datacenter}));
    }

    /// A `vcenter.<name>` YAML entry for this simulator.
    pub fn vcenter_yaml(&self, name: &str) -> String {
        format!("  {name}:\n    server: 127.0.0.1\n    port: {}\n", self.port)
    }
}

impl Drop for Vcsim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

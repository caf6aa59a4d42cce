//! The vim25 SOAP client: session login and re-login, `ServiceContent`, `SearchIndex`
//! lookups and `PropertyCollector` reads, with typed results and typed SOAP faults.
//!
//! Property reads use `RetrievePropertiesEx` with a page size ([`Vim25Client::with_page_size`])
//! and follow its `token` with `ContinueRetrievePropertiesEx` until every page is read, so a
//! large inventory is never cut at vCenter's page limit.
//!
//! ```text
//! call ──▶ ServiceContent (cached, no session) ──▶ session cookie (login once, shared)
//!      ──▶ POST /sdk ──▶ NotAuthenticated? ──▶ forget that session, log in, retry once
//! ```
//!
//! Every method sent here is idempotent ([`IDEMPOTENT`]: reads, searches, `Login`), so busy
//! answers (HTTP 429/503) and broken connections are retried with [`super::RETRY`] inside
//! the call's deadline; a fault (`InvalidLogin` above all) never is.
//!
//! Request bodies are written by hand (a handful of fixed shapes, every value escaped);
//! responses are read through [`super::xml`] into the typed structs below.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ccm_core::cloud_call::Retry;
use tokio::sync::{Mutex, OnceCell};

use super::xml::{self, Element, escape};
use super::{
    ClientError, Endpoint, FaultKind, MoRef, RETRY, SoapFault, busy, http_client, snippet,
    with_deadline,
};

const SESSION_COOKIE: &str = "vmware_soap_session";

/// At most this many continuation pages per read (a guard against a server that never
/// stops handing out tokens).
const MAX_PAGES: usize = 10_000;

/// Objects per `RetrievePropertiesEx` page unless [`Vim25Client::with_page_size`] says
/// otherwise.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// Objects per page of the BIOS UUID listing ([`Vim25Client::vm_uuids`]), in pages of the
/// client's size: one short property each, so ten times as many (1000 by default).
pub const UUID_PAGE_FACTOR: u32 = 10;

/// The methods that may be sent again after a busy answer or a broken connection: they
/// read, or (`Login`) open a session that a lost answer merely leaves to expire.
pub const IDEMPOTENT: &[&str] = &[
    "RetrieveServiceContent",
    "Login",
    "RetrieveProperties",
    "RetrievePropertiesEx",
    "FindByUuid",
    "FindByIp",
    "FindByDnsName",
    "FindAllByDnsName",
];

/// The parts of `ServiceContent` the CCM uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceContent {
    /// The root folder of the inventory.
    pub root_folder: MoRef,
    /// The property collector.
    pub property_collector: MoRef,
    /// The search index.
    pub search_index: MoRef,
    /// The session manager.
    pub session_manager: MoRef,
    /// `about.apiVersion`, used in the `SOAPAction` header.
    pub api_version: String,
    /// `about.instanceUuid`.
    pub instance_uuid: String,
}

/// A VM's power state (`runtime.powerState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    /// `poweredOn`.
    PoweredOn,
    /// `poweredOff`.
    PoweredOff,
    /// `suspended`.
    Suspended,
    /// Anything else (or unset).
    Unknown,
}

/// One guest NIC as VMware Tools reports it (`guest.net[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestNic {
    /// The port group or network name the NIC is connected to.
    pub network: String,
    /// `deviceConfigId`: the virtual device behind the NIC; `-1` for an interface that is
    /// not a vNIC (docker0, a CNI bridge, a VIP on a dummy link).
    pub device_config_id: Option<i32>,
    /// The NIC's IP addresses (without prefix lengths).
    pub ip_addresses: Vec<String>,
    /// The MAC address.
    pub mac_address: String,
}

/// What the CCM reads about a VM.
#[derive(Debug, Clone, PartialEq)]
pub struct VmInfo {
    /// The VM's reference.
    pub moref: MoRef,
    /// The inventory name.
    pub name: String,
    /// The BIOS UUID (`config.uuid`).
    pub uuid: String,
    /// `config.guestId`.
    pub guest_id: String,
    /// `summary.config.numCpu`.
    pub num_cpu: u32,
    /// `summary.config.memorySizeMB`.
    pub memory_mb: u64,
    /// `runtime.powerState`.
    pub power_state: PowerState,
    /// `runtime.host`.
    pub host: Option<MoRef>,
    /// `resourcePool`.
    pub resource_pool: Option<MoRef>,
    /// The `guestinfo.metadata*` entries of `config.extraConfig` (cloud-init's network
    /// config, whose static addresses are preferred).
    pub guestinfo: BTreeMap<String, String>,
    /// `guest.hostName`.
    pub guest_host_name: String,
    /// `guest.net`.
    pub nics: Vec<GuestNic>,
}

const VM_PROPERTIES: &[&str] = &[
    "name",
    "config.uuid",
    "config.guestId",
    "summary.config.numCpu",
    "summary.config.memorySizeMB",
    "runtime.powerState",
    "runtime.host",
    "resourcePool",
    "config.extraConfig",
    "guest.hostName",
    "guest.net",
];

/// A vim25 client for one vCenter.
pub struct Vim25Client {
    endpoint: Endpoint,
    sdk_url: String,
    http: reqwest::Client,
    content: OnceCell<ServiceContent>,
    session: Mutex<Option<String>>,
    page_size: u32,
}

impl std::fmt::Debug for Vim25Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vim25Client")
            .field("vcenter", &self.endpoint.name)
            .field("url", &self.sdk_url)
            .finish()
    }
}

impl Vim25Client {
    /// A client for this endpoint. Nothing is sent until the first call.
    pub fn new(endpoint: Endpoint) -> Result<Self, ClientError> {
        let http = http_client(&endpoint)?;
        let sdk_url = format!("{}/sdk", endpoint.base_url());
        Ok(Vim25Client {
            endpoint,
            sdk_url,
            http,
            content: OnceCell::new(),
            session: Mutex::new(None),
            page_size: DEFAULT_PAGE_SIZE,
        })
    }

    /// Objects per `RetrievePropertiesEx` page (at least 1); further pages are read with
    /// `ContinueRetrievePropertiesEx`.
    pub fn with_page_size(mut self, objects: u32) -> Self {
        self.page_size = objects.max(1);
        self
    }

    /// The vCenter's name in the config.
    pub fn vcenter(&self) -> &str {
        &self.endpoint.name
    }

    /// `ServiceInstance.RetrieveServiceContent` (cached after the first success).
    pub async fn service_content(&self) -> Result<&ServiceContent, ClientError> {
        self.content
            .get_or_try_init(|| async {
                let body = "<RetrieveServiceContent xmlns=\"urn:vim25\">\
                    <_this type=\"ServiceInstance\">ServiceInstance</_this></RetrieveServiceContent>";
                let (resp, _) = self.post("RetrieveServiceContent", "urn:vim25", body, None).await?;
                let rv = self.returnval(&resp, "RetrieveServiceContent")?;
                let moref = |name: &str| {
                    rv.child(name).map(element_moref).ok_or_else(|| {
                        self.decode_err("RetrieveServiceContent", format!("no {name} in ServiceContent"))
                    })
                };
                let about = rv.child("about");
                Ok(ServiceContent {
                    root_folder: moref("rootFolder")?,
                    property_collector: moref("propertyCollector")?,
                    search_index: moref("searchIndex")?,
                    session_manager: moref("sessionManager")?,
                    api_version: about.and_then(|a| a.child_text("apiVersion")).unwrap_or("6.5").to_string(),
                    instance_uuid: about.and_then(|a| a.child_text("instanceUuid")).unwrap_or_default().to_string(),
                })
            })
            .await
    }

    /// Logs in now (normally done lazily); fails on bad credentials or an unreachable vCenter.
    pub async fn login(&self) -> Result<(), ClientError> {
        let mut session = self.session.lock().await;
        *session = Some(self.new_session().await?);
        Ok(())
    }

    async fn new_session(&self) -> Result<String, ClientError> {
        let sc = self.service_content().await?;
        // Through the vCenter's login gate (throttle after a rejection, credential refresh).
        let mut attempt = self.endpoint.login.begin(&self.endpoint, "Login").await?;
        let mut creds = attempt.credentials().clone();
        loop {
            let body = format!(
                "<Login xmlns=\"urn:vim25\">{}<userName>{}</userName><password>{}</password></Login>",
                this(&sc.session_manager),
                escape(&creds.user),
                escape(creds.password.expose()),
            );
            let result =
                self.post("Login", &action(sc), &body, None).await.and_then(|(_, cookie)| {
                    cookie.ok_or_else(|| {
                        self.decode_err("Login", "no session cookie in the answer".into())
                    })
                });
            match result {
                Ok(cookie) => {
                    attempt.succeeded();
                    tracing::info!(vcenter = %self.endpoint.name, user = %creds.user, "logged in to vCenter");
                    return Ok(cookie);
                }
                Err(e) => creds = attempt.failed(e).await?,
            }
        }
    }

    /// `SessionManager.Logout` of the current session, if any (best effort: the session is
    /// forgotten whatever the answer). Returns whether a session was logged out.
    pub async fn logout(&self) -> Result<bool, ClientError> {
        let Some(cookie) = self.session.lock().await.take() else { return Ok(false) };
        let Some(sc) = self.content.get() else { return Ok(false) };
        let body = format!("<Logout xmlns=\"urn:vim25\">{}</Logout>", this(&sc.session_manager));
        self.post("Logout", &action(sc), &body, Some(&cookie)).await?;
        Ok(true)
    }

    async fn current_session(&self) -> Result<String, ClientError> {
        let mut session = self.session.lock().await;
        if let Some(cookie) = session.as_ref() {
            return Ok(cookie.clone());
        }
        let cookie = self.new_session().await?;
        *session = Some(cookie.clone());
        Ok(cookie)
    }

    async fn forget_session(&self, stale: &str) {
        let mut session = self.session.lock().await;
        if session.as_deref() == Some(stale) {
            *session = None;
        }
    }

    /// Sends one method call in the current session; logs in again once if the session is
    /// gone. Returns the `<MethodResponse>` element.
    async fn invoke(&self, call: &str, body: &str) -> Result<Element, ClientError> {
        let action = action(self.service_content().await?);
        let mut retried = false;
        loop {
            let cookie = self.current_session().await?;
            // PropertyCollector reports a lost session per object in `missingSet` rather
            // than as a fault; treat both the same.
            let result =
                self.post(call, &action, body, Some(&cookie)).await.and_then(|(resp, c)| {
                    match missing_set_fault(&resp) {
                        Some(fault) => Err(ClientError::Fault {
                            vcenter: self.endpoint.name.clone(),
                            call: call.to_string(),
                            fault,
                        }),
                        None => Ok((resp, c)),
                    }
                });
            match result {
                Err(ClientError::Fault { fault, .. })
                    if fault.kind == FaultKind::NotAuthenticated && !retried =>
                {
                    tracing::info!(vcenter = %self.endpoint.name, call, "vCenter session expired, logging in again");
                    self.forget_session(&cookie).await;
                    retried = true;
                }
                other => return other.map(|(resp, _)| resp),
            }
        }
    }

    async fn post(
        &self,
        call: &str,
        soap_action: &str,
        body: &str,
        cookie: Option<&str>,
    ) -> Result<(Element, Option<String>), ClientError> {
        let envelope = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
             <soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
             xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
             xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
             <soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
        );
        let request = || {
            let req = self
                .http
                .post(&self.sdk_url)
                .header("Content-Type", "text/xml; charset=utf-8")
                .header("SOAPAction", soap_action)
                .body(envelope.clone());
            match cookie {
                Some(cookie) => req.header("Cookie", format!("{SESSION_COOKIE}={cookie}")),
                None => req,
            }
        };
        let transport = |source| ClientError::Transport {
            vcenter: self.endpoint.name.clone(),
            call: call.to_string(),
            source,
        };
        let retry = if IDEMPOTENT.contains(&call) { RETRY } else { Retry::NONE };
        let (status, new_cookie, text) = with_deadline(&self.endpoint, call, retry, || async {
            let resp = request().send().await.map_err(transport)?;
            if let Some((status, retry_after)) = busy(&resp) {
                return Err(ClientError::Busy {
                    vcenter: self.endpoint.name.clone(),
                    call: call.to_string(),
                    status,
                    retry_after,
                });
            }
            let status = resp.status();
            let new_cookie = resp
                .headers()
                .get_all("set-cookie")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(|v| {
                    let pair = v.split(';').next()?.trim();
                    let (name, value) = pair.split_once('=')?;
                    (name == SESSION_COOKIE).then(|| value.to_string())
                });
            let text = resp.text().await.map_err(transport)?;
            Ok((status, new_cookie, text))
        })
        .await?;
        let doc = match xml::parse(&text) {
            Ok(doc) => doc,
            Err(e) if status.is_success() => return Err(self.decode_err(call, e)),
            Err(_) => {
                return Err(ClientError::Http {
                    vcenter: self.endpoint.name.clone(),
                    call: call.to_string(),
                    status: status.as_u16(),
                    body: snippet(&text),
                });
            }
        };
        let body = doc.child("Body").ok_or_else(|| self.decode_err(call, "no SOAP Body".into()))?;
        if let Some(fault) = body.child("Fault") {
            return Err(ClientError::Fault {
                vcenter: self.endpoint.name.clone(),
                call: call.to_string(),
                fault: parse_fault(fault),
            });
        }
        if !status.is_success() {
            return Err(ClientError::Http {
                vcenter: self.endpoint.name.clone(),
                call: call.to_string(),
                status: status.as_u16(),
                body: snippet(&text),
            });
        }
        let response = body
            .children
            .first()
            .cloned()
            .ok_or_else(|| self.decode_err(call, "empty SOAP Body".into()))?;
        Ok((response, new_cookie))
    }

    fn returnval<'a>(&self, resp: &'a Element, call: &str) -> Result<&'a Element, ClientError> {
        resp.child("returnval").ok_or_else(|| self.decode_err(call, "no returnval".into()))
    }

    fn decode_err(&self, call: &str, message: String) -> ClientError {
        ClientError::Decode { vcenter: self.endpoint.name.clone(), call: call.to_string(), message }
    }

    /// `SearchIndex.FindByUuid` for a VM by BIOS UUID, optionally within one datacenter.
    pub async fn find_vm_by_uuid(
        &self,
        datacenter: Option<&MoRef>,
        uuid: &str,
    ) -> Result<Option<MoRef>, ClientError> {
        let sc = self.service_content().await?;
        let body = format!(
            "<FindByUuid xmlns=\"urn:vim25\">{}{}<uuid>{}</uuid><vmSearch>true</vmSearch>\
             <instanceUuid>false</instanceUuid></FindByUuid>",
            this(&sc.search_index),
            datacenter_arg(datacenter),
            escape(uuid)
        );
        let resp = self.invoke("FindByUuid", &body).await?;
        Ok(resp.child("returnval").map(element_moref))
    }

    /// `SearchIndex.FindByIp` for a VM by a guest IP, optionally within one datacenter.
    pub async fn find_vm_by_ip(
        &self,
        datacenter: Option<&MoRef>,
        ip: &str,
    ) -> Result<Option<MoRef>, ClientError> {
        let sc = self.service_content().await?;
        let body = format!(
            "<FindByIp xmlns=\"urn:vim25\">{}{}<ip>{}</ip><vmSearch>true</vmSearch></FindByIp>",
            this(&sc.search_index),
            datacenter_arg(datacenter),
            escape(ip)
        );
        let resp = self.invoke("FindByIp", &body).await?;
        Ok(resp.child("returnval").map(element_moref))
    }

    /// `SearchIndex.FindAllByDnsName` for VMs by guest host name, optionally within one
    /// datacenter.
    pub async fn find_vms_by_dns_name(
        &self,
        datacenter: Option<&MoRef>,
        dns_name: &str,
    ) -> Result<Vec<MoRef>, ClientError> {
        let sc = self.service_content().await?;
        let body = format!(
            "<FindAllByDnsName xmlns=\"urn:vim25\">{}{}<dnsName>{}</dnsName><vmSearch>true</vmSearch>\
             </FindAllByDnsName>",
            this(&sc.search_index),
            datacenter_arg(datacenter),
            escape(dns_name)
        );
        let resp = self.invoke("FindAllByDnsName", &body).await?;
        Ok(resp.children_named("returnval").map(element_moref).collect())
    }

    /// Every datacenter in the inventory (name → reference), found by walking the folder
    /// tree from the root folder. An inventory without datacenters is an error: it cannot
    /// hold VMs, and an empty answer must never read as "no VM anywhere".
    pub async fn datacenters(&self) -> Result<BTreeMap<String, MoRef>, ClientError> {
        let sc = self.service_content().await?;
        // The folders' names are read too (and dropped) so that a lost session shows up as
        // a NotAuthenticated missingSet on the root folder instead of an empty result.
        let spec = format!(
            "<specSet>\
             <propSet><type>Datacenter</type><pathSet>name</pathSet></propSet>\
             <propSet><type>Folder</type><pathSet>name</pathSet></propSet>\
             <objectSet>{}<skip>false</skip>\
             <selectSet xsi:type=\"TraversalSpec\"><name>folders</name><type>Folder</type>\
             <path>childEntity</path><skip>false</skip><selectSet><name>folders</name></selectSet>\
             </selectSet></objectSet></specSet>",
            obj("obj", &sc.root_folder)
        );
        let objects = self.retrieve(&spec).await?;
        let mut out = BTreeMap::new();
        for content in &objects {
            let Some(moref) = content.child("obj").map(element_moref) else { continue };
            let props = prop_map(content);
            if let (Some(name), "Datacenter") = (props.get("name"), moref.kind.as_str()) {
                out.insert(name.text.clone(), moref);
            }
        }
        if out.is_empty() {
            return Err(
                self.decode_err("RetrievePropertiesEx", "the inventory has no datacenter".into())
            );
        }
        Ok(out)
    }

    /// `PropertyCollector.RetrieveProperties` of some paths of one object; `None` when the
    /// object no longer exists.
    pub async fn properties(
        &self,
        object: &MoRef,
        paths: &[&str],
    ) -> Result<Option<BTreeMap<String, Element>>, ClientError> {
        let mut path_set = String::new();
        for p in paths {
            let _ = write!(path_set, "<pathSet>{}</pathSet>", escape(p));
        }
        let spec = format!(
            "<specSet><propSet><type>{}</type>{path_set}</propSet>\
             <objectSet>{}<skip>false</skip></objectSet></specSet>",
            escape(&object.kind),
            obj("obj", object)
        );
        match self.retrieve(&spec).await {
            Ok(objects) => Ok(objects.first().map(prop_map)),
            Err(ClientError::Fault { fault, .. })
                if fault.kind == FaultKind::ManagedObjectNotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `PropertyCollector.RetrievePropertiesEx` of one `specSet` (XML), then
    /// `ContinueRetrievePropertiesEx` while the answer carries a `token`: every
    /// `ObjectContent` of every page.
    pub async fn retrieve(&self, spec_set: &str) -> Result<Vec<Element>, ClientError> {
        self.retrieve_pages(spec_set, self.page_size).await
    }

    /// [`Self::retrieve`] asking for `page_size` objects a page (vCenter may send fewer).
    async fn retrieve_pages(
        &self,
        spec_set: &str,
        page_size: u32,
    ) -> Result<Vec<Element>, ClientError> {
        let sc = self.service_content().await?;
        let body = format!(
            "<RetrievePropertiesEx xmlns=\"urn:vim25\">{}{spec_set}<options><maxObjects>{}</maxObjects>\
             </options></RetrievePropertiesEx>",
            this(&sc.property_collector),
            page_size
        );
        let resp = self.invoke("RetrievePropertiesEx", &body).await?;
        let mut objects = Vec::new();
        let mut page = resp.child("returnval").cloned();
        let mut pages = 0usize;
        while let Some(result) = page.take() {
            objects.extend(result.children_named("objects").cloned());
            let Some(token) = result.child_text("token").filter(|t| !t.is_empty()) else { break };
            pages += 1;
            if pages > MAX_PAGES {
                return Err(self.decode_err(
                    "ContinueRetrievePropertiesEx",
                    format!("more than {MAX_PAGES} pages of {page_size} objects"),
                ));
            }
            let body = format!(
                "<ContinueRetrievePropertiesEx xmlns=\"urn:vim25\">{}<token>{}</token>\
                 </ContinueRetrievePropertiesEx>",
                this(&sc.property_collector),
                escape(token)
            );
            let resp = self.invoke("ContinueRetrievePropertiesEx", &body).await?;
            page = resp.child("returnval").cloned();
        }
        Ok(objects)
    }

    /// The VM's name, UUID, sizing, power state, host and guest networking; `None` when it
    /// no longer exists.
    pub async fn vm_info(&self, vm: &MoRef) -> Result<Option<VmInfo>, ClientError> {
        let Some(props) = self.properties(vm, VM_PROPERTIES).await? else {
            return Ok(None);
        };
        Ok(Some(vm_info_from(vm, &props)))
    }

    /// [`Self::vm_info`] of several VMs in one `RetrievePropertiesEx` (paged like any
    /// retrieve): the VMs the answer lists, by reference. One VM that no longer exists fails
    /// the whole call with `ManagedObjectNotFound` (the caller reads them one by one then).
    pub async fn vm_infos(&self, vms: &[MoRef]) -> Result<Vec<VmInfo>, ClientError> {
        if vms.is_empty() {
            return Ok(Vec::new());
        }
        let mut spec = String::from("<specSet><propSet><type>VirtualMachine</type>");
        for p in VM_PROPERTIES {
            let _ = write!(spec, "<pathSet>{}</pathSet>", escape(p));
        }
        spec.push_str("</propSet>");
        for vm in vms {
            let _ = write!(spec, "<objectSet>{}<skip>false</skip></objectSet>", obj("obj", vm));
        }
        spec.push_str("</specSet>");
        let objects = self.retrieve(&spec).await?;
        Ok(objects
            .iter()
            .filter_map(|content| {
                let moref = content.child("obj").map(element_moref)?;
                Some(vm_info_from(&moref, &prop_map(content)))
            })
            .collect())
    }

    /// Every VM's BIOS UUID (`config.uuid`, as vCenter has it) under the datacenter's VM
    /// folder, its subfolders and vApps: one `RetrievePropertiesEx` and its pages, where a
    /// `SearchIndex.FindByUuid` per VM is one call each. The datacenter's own name is read too
    /// (and dropped) so that a lost session shows as a fault rather than an empty answer.
    pub async fn vm_uuids(&self, datacenter: &MoRef) -> Result<Vec<(String, MoRef)>, ClientError> {
        let spec = format!(
            "<specSet>\
             <propSet><type>VirtualMachine</type><pathSet>config.uuid</pathSet></propSet>\
             <propSet><type>Datacenter</type><pathSet>name</pathSet></propSet>\
             <objectSet>{}<skip>false</skip>\
             <selectSet xsi:type=\"TraversalSpec\"><name>vmFolder</name><type>Datacenter</type>\
             <path>vmFolder</path><skip>false</skip><selectSet><name>folders</name></selectSet>\
             </selectSet>\
             <selectSet xsi:type=\"TraversalSpec\"><name>folders</name><type>Folder</type>\
             <path>childEntity</path><skip>false</skip><selectSet><name>folders</name></selectSet>\
             <selectSet><name>vapps</name></selectSet></selectSet>\
             <selectSet xsi:type=\"TraversalSpec\"><name>vapps</name><type>VirtualApp</type>\
             <path>vm</path><skip>false</skip></selectSet>\
             </objectSet></specSet>",
            obj("obj", datacenter)
        );
        let objects =
            self.retrieve_pages(&spec, self.page_size.saturating_mul(UUID_PAGE_FACTOR)).await?;
        Ok(objects
            .iter()
            .filter_map(|content| {
                let moref = content.child("obj").map(element_moref)?;
                if moref.kind != "VirtualMachine" {
                    return None;
                }
                let uuid = prop_map(content).get("config.uuid").map(|e| e.text.clone())?;
                Some((uuid, moref)).filter(|(u, _)| !u.is_empty())
            })
            .collect())
    }

    /// The object's inventory parent (`parent`); `None` at the root or when it is gone.
    pub async fn parent(&self, object: &MoRef) -> Result<Option<MoRef>, ClientError> {
        let props = self.properties(object, &["parent"]).await?;
        Ok(props.and_then(|p| p.get("parent").map(element_moref)))
    }
}

/// A [`VmInfo`] from the properties of [`VM_PROPERTIES`] read for `vm`.
fn vm_info_from(vm: &MoRef, props: &BTreeMap<String, Element>) -> VmInfo {
    let text = |name: &str| props.get(name).map(|e| e.text.clone()).unwrap_or_default();
    let power_state = match text("runtime.powerState").as_str() {
        "poweredOn" => PowerState::PoweredOn,
        "poweredOff" => PowerState::PoweredOff,
        "suspended" => PowerState::Suspended,
        _ => PowerState::Unknown,
    };
    let nics = props
        .get("guest.net")
        .map(|val| val.children_named("GuestNicInfo").map(guest_nic).collect())
        .unwrap_or_default();
    let guestinfo = props
        .get("config.extraConfig")
        .map(|val| {
            val.children_named("OptionValue")
                .filter_map(|o| {
                    let key = o.child_text("key")?;
                    let value = o.child_text("value").unwrap_or_default();
                    key.starts_with("guestinfo.metadata")
                        .then(|| (key.to_string(), value.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    VmInfo {
        moref: vm.clone(),
        name: text("name"),
        uuid: text("config.uuid"),
        guest_id: text("config.guestId"),
        num_cpu: text("summary.config.numCpu").parse().unwrap_or(0),
        memory_mb: text("summary.config.memorySizeMB").parse().unwrap_or(0),
        power_state,
        host: props.get("runtime.host").map(element_moref),
        resource_pool: props.get("resourcePool").map(element_moref),
        guestinfo,
        guest_host_name: text("guest.hostName"),
        nics,
    }
}

fn action(sc: &ServiceContent) -> String {
    format!("urn:vim25/{}", sc.api_version)
}

fn obj(tag: &str, moref: &MoRef) -> String {
    format!("<{tag} type=\"{}\">{}</{tag}>", escape(&moref.kind), escape(&moref.value))
}

fn this(moref: &MoRef) -> String {
    obj("_this", moref)
}

fn datacenter_arg(datacenter: Option<&MoRef>) -> String {
    datacenter.map(|dc| obj("datacenter", dc)).unwrap_or_default()
}

fn element_moref(e: &Element) -> MoRef {
    MoRef::new(e.attr("type").unwrap_or_default(), e.text.clone())
}

fn prop_map(content: &Element) -> BTreeMap<String, Element> {
    content
        .children_named("propSet")
        .filter_map(|p| Some((p.child_text("name")?.to_string(), p.child("val")?.clone())))
        .collect()
}

fn guest_nic(e: &Element) -> GuestNic {
    // Prefer ipConfig (current API), fall back to the deprecated ipAddress list.
    let from_config: Vec<String> = e
        .child("ipConfig")
        .map(|c| {
            c.children_named("ipAddress")
                .filter_map(|a| a.child_text("ipAddress"))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let ip_addresses = if from_config.is_empty() {
        e.children_named("ipAddress").map(|a| a.text.clone()).collect()
    } else {
        from_config
    };
    GuestNic {
        network: e.child_text("network").unwrap_or_default().to_string(),
        device_config_id: e.child_text("deviceConfigId").and_then(|v| v.trim().parse().ok()),
        ip_addresses,
        mac_address: e.child_text("macAddress").unwrap_or_default().to_string(),
    }
}

/// The first fault in a PropertyCollector answer's `missingSet` entries.
fn missing_set_fault(resp: &Element) -> Option<SoapFault> {
    // RetrieveProperties: returnval = ObjectContent; RetrievePropertiesEx and its
    // continuation: returnval/objects = ObjectContent.
    resp.children_named("returnval")
        .flat_map(|rv| std::iter::once(rv).chain(rv.children_named("objects")))
        .flat_map(|content| content.children_named("missingSet"))
        .find_map(|missing| {
            let inner = missing.child("fault")?.child("fault")?;
            let name = inner.xsi_type().unwrap_or(inner.name.as_str()).to_string();
            let path = missing.child_text("path").unwrap_or_default();
            Some(SoapFault { kind: fault_kind(name), message: format!("property {path}") })
        })
}

fn fault_kind(name: String) -> FaultKind {
    match name.as_str() {
        "NotAuthenticated" => FaultKind::NotAuthenticated,
        "InvalidLogin" => FaultKind::InvalidLogin,
        "ManagedObjectNotFound" => FaultKind::ManagedObjectNotFound,
        _ => FaultKind::Other(if name.is_empty() { "unknown".into() } else { name }),
    }
}

/// Reads a `<Fault>` element: the fault type from `detail` (its `xsi:type` or element name).
pub(crate) fn parse_fault(fault: &Element) -> SoapFault {
    let message = fault.child_text("faultstring").unwrap_or_default().to_string();
    let name = fault
        .child("detail")
        .and_then(|d| d.children.first())
        .map(|d| {
            d.xsi_type()
                .map(str::to_string)
                .unwrap_or_else(|| d.name.trim_end_matches("Fault").to_string())
        })
        .unwrap_or_default();
    SoapFault { kind: fault_kind(name), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_typed_by_detail() {
        let doc = r#"<Envelope><Body><Fault><faultcode>ServerFaultCode</faultcode><faultstring></faultstring>
            <detail><NotAuthenticatedFault xmlns="urn:vim25" xsi:type="NotAuthenticated"><object type="SearchIndex">SearchIndex</object>
            </NotAuthenticatedFault></detail></Fault></Body></Envelope>"#;
        let root = xml::parse(doc).unwrap();
        let fault = parse_fault(root.find("Fault").unwrap());
        assert_eq!(fault.kind, FaultKind::NotAuthenticated);

        let doc = r#"<Fault><faultstring>Cannot complete login</faultstring><detail><InvalidLoginFault/></detail></Fault>"#;
        let fault = parse_fault(&xml::parse(doc).unwrap());
        assert_eq!(fault.kind, FaultKind::InvalidLogin);
        assert_eq!(fault.message, "Cannot complete login");

        let doc =
            r#"<Fault><faultstring>x</faultstring><detail><SystemErrorFault/></detail></Fault>"#;
        assert_eq!(
            parse_fault(&xml::parse(doc).unwrap()).kind,
            FaultKind::Other("SystemError".into())
        );
    }

    #[test]
    fn a_lost_session_in_missing_set_is_not_authenticated() {
        let doc = r#"<RetrievePropertiesResponse><returnval><obj type="Folder">group-d1</obj>
            <missingSet><path>name</path><fault><fault xsi:type="NotAuthenticated"><privilegeId>System.Read</privilegeId></fault>
            <localizedMessage></localizedMessage></fault></missingSet></returnval></RetrievePropertiesResponse>"#;
        let fault = missing_set_fault(&xml::parse(doc).unwrap()).unwrap();
        assert_eq!(fault.kind, FaultKind::NotAuthenticated);
        assert_eq!(fault.message, "property name");
        let ok = r#"<R><returnval><obj type="Folder">g</obj><propSet><name>name</name><val>x</val></propSet></returnval></R>"#;
        assert_eq!(missing_set_fault(&xml::parse(ok).unwrap()), None);
    }

    #[test]
    fn guest_nics_prefer_ip_config() {
        let doc = r#"<val><GuestNicInfo><network>VM Network</network><ipAddress>10.0.0.1</ipAddress>
            <macAddress>00:50:56:00:00:01</macAddress><ipConfig><ipAddress><ipAddress>10.0.0.1</ipAddress><prefixLength>24</prefixLength></ipAddress>
            <ipAddress><ipAddress>fd00::1</ipAddress><prefixLength>64</prefixLength></ipAddress></ipConfig></GuestNicInfo>
            <GuestNicInfo><network>other</network><ipAddress>192.168.1.2</ipAddress></GuestNicInfo></val>"#;
        let val = xml::parse(doc).unwrap();
        let nics: Vec<GuestNic> = val.children_named("GuestNicInfo").map(guest_nic).collect();
        assert_eq!(nics[0].ip_addresses, vec!["10.0.0.1", "fd00::1"]);
        assert_eq!(nics[0].network, "VM Network");
        assert_eq!(nics[1].ip_addresses, vec!["192.168.1.2"]);
    }
}

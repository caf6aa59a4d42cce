//! Barbican (the OpenStack key manager, API v1) for the OpenStack emulator: the certificate
//! containers and secrets a TLS-terminating Octavia listener names
//! (`default_tls_container_ref`), with their read ACLs.
//!
//! Served by [`crate::openstack::OpenStackCloud`] under `/key-manager` (catalog type
//! `key-manager`, name `barbican`, as DevStack registers it; gophercloud's `NewKeyManagerV1`
//! appends `v1/`):
//!
//! | call | operation | answer |
//! |---|---|---|
//! | `GET /key-manager` | `barbican.versions` | the version document (`v1`, `CURRENT`) |
//! | `GET /key-manager/v1/containers/{id}` | `barbican.containers.get` | the container: `container_ref`, `name`, `type`, `status`, `secret_refs`, `creator_id`, `consumers`, `created`/`updated` (`YYYY-MM-DDTHH:MM:SS`, no zone, as Barbican writes them) |
//! | `GET /key-manager/v1/secrets/{id}` | `barbican.secrets.get` | the secret's metadata (`secret_ref`, `secret_type`, `content_types`, …) |
//! | `GET /key-manager/v1/{containers,secrets}/{id}/acl` | `barbican.acls.get` | `{"read": {"project-access", "users", …}}` |
//! | `POST /key-manager/v1/secrets` | `barbican.secrets.create` | 201 `{"secret_ref"}` (metadata kept, the payload is not) |
//! | `POST /key-manager/v1/containers` | `barbican.containers.create` | 201 `{"container_ref"}`; a `secret_refs` entry naming no secret of the project is a 404 `Secret provided for '<name>' doesn't exist.` |
//! | `PUT /key-manager/v1/{containers,secrets}/{id}/acl` | `barbican.acls.update` | 200 `{"acl_ref"}`; only the creator or a project admin (else 403) |
//!
//! Rules as Barbican (v2025.1 default policy) applies them: an ID that is not a UUID, or no
//! such entity, is a 404 (`Not Found. Provided container id is invalid.`, `Secrets container
//! not found.`, `Not Found. Sorry but your secret is in another castle.`) whoever asks; an
//! entity the caller may not read is a 403 `Container retrieval attempt not allowed - please
//! review your user/project privileges` (`Secret retrieval …` for secrets). The caller may
//! read an entity of its own project when the ACL keeps `project-access` (the default), or it
//! created it, or it is an admin of that project; and any entity whose read ACL lists its
//! user ID. Errors are Barbican's `{"code", "title", "description"}`.
//!
//! Entities are added through the API or by tests ([`Barbican::add_certificate_container`],
//! [`Barbican::add_secret`]); the emulator's reset empties the store.

use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde_json::{Value, json};

/// Who asks: the token's project ID, user ID and whether it has the `admin` role.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// The token's project ID.
    pub project: &'a str,
    /// The token's user ID.
    pub user: &'a str,
    /// The token carries the `admin` role.
    pub admin: bool,
}

/// An entity's read ACL (Barbican's `read` operation; the only one it has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    /// Users of the entity's project may read it (Barbican's default `true`).
    pub project_access: bool,
    /// User IDs that may read it, from any project.
    pub users: Vec<String>,
}

impl Default for Acl {
    fn default() -> Self {
        Acl { project_access: true, users: Vec::new() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Secret,
    Container,
}

#[derive(Debug, Clone)]
struct Entity {
    kind: Kind,
    id: String,
    name: String,
    project: String,
    creator: String,
    acl: Acl,
    /// `secret_type` of a secret, `type` of a container.
    subtype: String,
    /// A container's secrets: (name, secret ID).
    secrets: Vec<(String, String)>,
    created: String,
}

/// Why a read was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 404: no such entity (or its ID is not a UUID).
    NotFound(String),
    /// 403: the caller may not read it.
    Forbidden(String),
}

/// The key manager's store.
#[derive(Debug, Default)]
pub struct Barbican {
    store: Mutex<Vec<Entity>>,
    seq: Mutex<u64>,
}

fn now() -> String {
    crate::kit::utc_datetime(crate::kit::unix_now())
}

/// Whether `s` is a UUID (8-4-4-4-12 hex digits), as Barbican checks IDs.
fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Barbican's error body.
pub fn error_body(status: StatusCode, description: &str) -> Value {
    json!({"code": status.as_u16(),
        "title": status.canonical_reason().unwrap_or("Error"),
        "description": description})
}

impl Barbican {
    fn lock(&self) -> MutexGuard<'_, Vec<Entity>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> String {
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        let n = *seq;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let a = (nanos as u64).rotate_left(17) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            n & 0xfff,
            (a ^ n.rotate_left(29)) & 0xffff_ffff_ffff
        )
    }

    /// Empties the store (the emulator's reset).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Stores a secret of `secret_type` (`certificate`, `private`, `opaque`, …) in `project`,
    /// created by user `creator` (an ID); returns its ID.
    pub fn add_secret(
        &self,
        project: &str,
        creator: &str,
        name: &str,
        secret_type: &str,
        acl: Acl,
    ) -> String {
        let id = self.next_id();
        self.lock().push(Entity {
            kind: Kind::Secret,
            id: id.clone(),
            name: name.into(),
            project: project.into(),
            creator: creator.into(),
            acl,
            subtype: secret_type.into(),
            secrets: Vec::new(),
            created: now(),
        });
        id
    }

    /// Stores a `certificate` container (with its `certificate` and `private_key` secrets,
    /// which keep Barbican's default ACL) in `project`; returns the container's ID.
    pub fn add_certificate_container(
        &self,
        project: &str,
        creator: &str,
        name: &str,
        acl: Acl,
    ) -> String {
        let cert = self.add_secret(
            project,
            creator,
            &format!("{name}-cert"),
            "certificate",
            Acl::default(),
        );
        let key =
            self.add_secret(project, creator, &format!("{name}-key"), "private", Acl::default());
        let id = self.next_id();
        self.lock().push(Entity {
            kind: Kind::Container,
            id: id.clone(),
            name: name.into(),
            project: project.into(),
            creator: creator.into(),
            acl,
            subtype: "certificate".into(),
            secrets: vec![("certificate".into(), cert), ("private_key".into(), key)],
            created: now(),
        });
        id
    }

    /// `<base>/key-manager/v1/containers/<id>`: the reference a listener names.
    pub fn container_ref(base: &str, id: &str) -> String {
        format!("{}/key-manager/v1/containers/{id}", base.trim_end_matches('/'))
    }

    /// `<base>/key-manager/v1/secrets/<id>`.
    pub fn secret_ref(base: &str, id: &str) -> String {
        format!("{}/key-manager/v1/secrets/{id}", base.trim_end_matches('/'))
    }

    fn find(&self, kind: Kind, id: &str, caller: &Caller<'_>) -> Result<Entity, Refusal> {
        let (invalid, missing, operation) = match kind {
            Kind::Container => (
                "Not Found. Provided container id is invalid.",
                "Secrets container not found.",
                "Container retrieval",
            ),
            Kind::Secret => (
                "Not Found. Provided secret id is invalid.",
                "Not Found. Sorry but your secret is in another castle.",
                "Secret retrieval",
            ),
        };
        if !is_uuid(id) {
            return Err(Refusal::NotFound(invalid.into()));
        }
        let e = self
            .lock()
            .iter()
            .find(|e| e.kind == kind && e.id == id)
            .cloned()
            .ok_or_else(|| Refusal::NotFound(missing.into()))?;
        let own_project = e.project == caller.project;
        let may = (own_project
            && (e.acl.project_access || e.creator == caller.user || caller.admin))
            || e.acl.users.iter().any(|u| u == caller.user);
        if !may {
            return Err(Refusal::Forbidden(format!(
                "{operation} attempt not allowed - please review your user/project privileges"
            )));
        }
        Ok(e)
    }

    /// Whether `caller` may read what `reference` (a container or secret URL) names: how
    /// Octavia checks a listener's `default_tls_container_ref` (with the user's token).
    pub fn check_ref(&self, reference: &str, caller: &Caller<'_>) -> Result<(), Refusal> {
        let mut segs = reference.trim_end_matches('/').rsplit('/');
        let id = segs.next().unwrap_or_default();
        let kind = match segs.next() {
            Some("containers") => Kind::Container,
            Some("secrets") => Kind::Secret,
            _ => return Err(Refusal::NotFound(format!("{reference} is not a Barbican reference"))),
        };
        self.find(kind, id, caller).map(|_| ())
    }

    fn render(&self, e: &Entity, base: &str) -> Value {
        let base = format!("{}/key-manager/v1", base.trim_end_matches('/'));
        match e.kind {
            Kind::Container => json!({
                "container_ref": format!("{base}/containers/{}", e.id),
                "name": e.name,
                "type": e.subtype,
                "status": "ACTIVE",
                "created": e.created,
                "updated": e.created,
                "creator_id": e.creator,
                "consumers": [],
                "secret_refs": e.secrets.iter().map(|(n, s)| json!({
                    "name": n, "secret_ref": format!("{base}/secrets/{s}")})).collect::<Vec<_>>(),
            }),
            Kind::Secret => json!({
                "secret_ref": format!("{base}/secrets/{}", e.id),
                "name": e.name,
                "secret_type": e.subtype,
                "status": "ACTIVE",
                "created": e.created,
                "updated": e.created,
                "creator_id": e.creator,
                "expiration": null,
                "algorithm": null,
                "bit_length": null,
                "mode": null,
                "content_types": {"default": "text/plain"},
            }),
        }
    }

    /// Answers a key-manager call: `segs` are the path segments (`key-manager`, `v1`, …),
    /// `base` the URL the caller used to reach this server.
    pub fn handle(
        &self,
        op: &str,
        segs: &[String],
        base: &str,
        caller: &Caller<'_>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        if op == "barbican.versions" {
            return (
                StatusCode::MULTIPLE_CHOICES,
                json!({"versions": {"values": [{"id": "v1", "status": "stable",
                    "links": [{"rel": "self", "href": format!("{base}/key-manager/v1/")}],
                    "media-types": [{"base": "application/json",
                        "type": "application/vnd.openstack.key-manager-v1+json"}]}]}}),
            );
        }
        if op.ends_with(".create") {
            return self.create(op, base, caller, body);
        }
        let kind = match segs.get(2).map(String::as_str) {
            Some("containers") => Kind::Container,
            Some("secrets") => Kind::Secret,
            _ => {
                return (
                    StatusCode::NOT_FOUND,
                    error_body(StatusCode::NOT_FOUND, "The resource could not be found."),
                );
            }
        };
        let id = segs.get(3).map(String::as_str).unwrap_or_default();
        let e = match self.find(kind, id, caller) {
            Ok(e) => e,
            Err(Refusal::NotFound(m)) => {
                return (StatusCode::NOT_FOUND, error_body(StatusCode::NOT_FOUND, &m));
            }
            Err(Refusal::Forbidden(m)) => {
                return (StatusCode::FORBIDDEN, error_body(StatusCode::FORBIDDEN, &m));
            }
        };
        match op {
            "barbican.acls.update" => {
                if e.project != caller.project || !(e.creator == caller.user || caller.admin) {
                    let what =
                        if kind == Kind::Container { "ContainerACL(s)" } else { "SecretACL(s)" };
                    return (
                        StatusCode::FORBIDDEN,
                        error_body(
                            StatusCode::FORBIDDEN,
                            &format!(
                                "{what} Update attempt not allowed - please review your user/project privileges"
                            ),
                        ),
                    );
                }
                let read = body.and_then(|b| b.get("read")).cloned().unwrap_or(Value::Null);
                let acl = Acl {
                    project_access: read
                        .get("project-access")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                    users: read
                        .get("users")
                        .and_then(Value::as_array)
                        .map(|u| u.iter().filter_map(Value::as_str).map(str::to_string).collect())
                        .unwrap_or_default(),
                };
                for x in self.lock().iter_mut().filter(|x| x.id == e.id) {
                    x.acl = acl.clone();
                }
                let r = self.render(&e, base);
                let href =
                    r["container_ref"].as_str().or(r["secret_ref"].as_str()).unwrap_or_default();
                (StatusCode::OK, json!({"acl_ref": format!("{href}/acl")}))
            }
            "barbican.acls.get" => {
                let mut read = json!({"project-access": e.acl.project_access});
                if !e.acl.users.is_empty() || !e.acl.project_access {
                    read["users"] = json!(e.acl.users);
                    read["created"] = json!(e.created);
                    read["updated"] = json!(e.created);
                }
                (StatusCode::OK, json!({"read": read}))
            }
            _ => (StatusCode::OK, self.render(&e, base)),
        }
    }

    /// `POST /v1/secrets` (metadata only: the payload is not kept) and `POST /v1/containers`
    /// (its `secret_refs` must name secrets of the caller's project, else 404 as Barbican).
    fn create(
        &self,
        op: &str,
        base: &str,
        caller: &Caller<'_>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let bad = |m: &str| (StatusCode::BAD_REQUEST, error_body(StatusCode::BAD_REQUEST, m));
        let Some(b) = body.filter(|b| b.is_object()) else {
            return bad(
                "Provided object does not match schema 'Secret': the body is not a JSON object",
            );
        };
        let name = b["name"].as_str().unwrap_or_default();
        if op == "barbican.secrets.create" {
            let ty = b["secret_type"].as_str().unwrap_or("opaque");
            let id = self.add_secret(caller.project, caller.user, name, ty, Acl::default());
            return (StatusCode::CREATED, json!({"secret_ref": Self::secret_ref(base, &id)}));
        }
        let ty = b["type"].as_str().unwrap_or("generic");
        if !matches!(ty, "generic" | "certificate" | "rsa") {
            return bad(&format!(
                "Provided object does not match schema 'Container': '{ty}' is not one of ['generic', 'rsa', 'certificate']"
            ));
        }
        let mut secrets = Vec::new();
        for r in b["secret_refs"].as_array().into_iter().flatten() {
            let sname = r["name"].as_str().unwrap_or_default().to_string();
            let sid = r["secret_ref"]
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let known = self
                .lock()
                .iter()
                .any(|e| e.kind == Kind::Secret && e.id == sid && e.project == caller.project);
            if !known {
                return (
                    StatusCode::NOT_FOUND,
                    error_body(
                        StatusCode::NOT_FOUND,
                        &format!("Secret provided for '{sname}' doesn't exist."),
                    ),
                );
            }
            secrets.push((sname, sid));
        }
        let id = self.next_id();
        self.lock().push(Entity {
            kind: Kind::Container,
            id: id.clone(),
            name: name.into(),
            project: caller.project.into(),
            creator: caller.user.into(),
            acl: Acl::default(),
            subtype: ty.into(),
            secrets,
            created: now(),
        });
        (StatusCode::CREATED, json!({"container_ref": Self::container_ref(base, &id)}))
    }

    /// The store as the admin API's state shows it.
    pub fn state(&self) -> Value {
        let store = self.lock();
        let list = |k: Kind| -> Vec<Value> {
            store
                .iter()
                .filter(|e| e.kind == k)
                .map(|e| {
                    json!({"id": e.id, "name": e.name, "project_id": e.project,
                    "type": e.subtype, "project_access": e.acl.project_access,
                    "acl_users": e.acl.users})
                })
                .collect()
        };
        json!({"containers": list(Kind::Container), "secrets": list(Kind::Secret)})
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn segs(path: &str) -> Vec<String> {
        path.trim_matches('/').split('/').map(str::to_string).collect()
    }

    #[test]
    fn containers_follow_barbicans_read_rules() {
        let b = Barbican::default();
        let open = b.add_certificate_container("p1", "u1", "web", Acl::default());
        let private = b.add_certificate_container(
            "p1",
            "u1",
            "private",
            Acl { project_access: false, users: vec!["u3".into()] },
        );
        let me = Caller { project: "p1", user: "u2", admin: false };
        let (s, v) = b.handle(
            "barbican.containers.get",
            &segs(&format!("key-manager/v1/containers/{open}")),
            "http://h",
            &me,
            None,
        );
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["type"], "certificate");
        assert_eq!(v["container_ref"], Barbican::container_ref("http://h", &open));
        assert_eq!(v["secret_refs"].as_array().unwrap().len(), 2);
        // Private: only the creator, an admin of the project and the ACL's users.
        let (s, v) = b.handle(
            "barbican.containers.get",
            &segs(&format!("key-manager/v1/containers/{private}")),
            "http://h",
            &me,
            None,
        );
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert_eq!(v["code"], 403);
        assert_eq!(
            v["description"],
            "Container retrieval attempt not allowed - please review your user/project privileges"
        );
        let other = Caller { project: "p2", user: "u3", admin: false };
        assert!(b.check_ref(&Barbican::container_ref("http://h", &private), &other).is_ok());
        assert!(matches!(
            b.check_ref(&Barbican::container_ref("http://h", &open), &other),
            Err(Refusal::Forbidden(_))
        ));
        let creator = Caller { project: "p1", user: "u1", admin: false };
        assert!(b.check_ref(&Barbican::container_ref("x", &private), &creator).is_ok());
        // Unknown and malformed IDs are 404s whoever asks.
        assert!(matches!(
            b.check_ref("http://h/key-manager/v1/containers/not-a-uuid", &me),
            Err(Refusal::NotFound(m)) if m.contains("invalid")
        ));
        let (s, v) = b.handle(
            "barbican.secrets.get",
            &segs("key-manager/v1/secrets/00000000-0000-4000-8000-000000000000"),
            "http://h",
            &me,
            None,
        );
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(v["title"], "Not Found");
        let (s, v) = b.handle(
            "barbican.acls.get",
            &segs(&format!("key-manager/v1/containers/{private}/acl")),
            "http://h",
            &creator,
            None,
        );
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["read"]["project-access"], false);
        assert_eq!(v["read"]["users"], json!(["u3"]));
        b.clear();
        assert!(b.check_ref(&Barbican::container_ref("x", &open), &creator).is_err());
    }
}

//! The CIS tagging REST client (`/rest/com/vmware/cis/...`, the paths vcsim serves):
//! session create, tags attached to an object, tag and category lookups.
//!
//! The session id travels in the `vmware-api-session-id` header. A 401 means the session is
//! gone: the client logs in again once and retries.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::{ClientError, Endpoint, MoRef, http_client, snippet};

const SESSION_HEADER: &str = "vmware-api-session-id";

/// A tag (`tagging/tag/id:<id>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Tag {
    /// The tag id (a URN).
    pub id: String,
    /// The tag name (the zone or region value).
    pub name: String,
    /// The id of the tag's category.
    pub category_id: String,
}

/// A tag category (`tagging/category/id:<id>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Category {
    /// The category id.
    pub id: String,
    /// The category name (what `labels.zone` / `labels.region` name).
    pub name: String,
}

#[derive(Deserialize)]
struct Value<T> {
    value: T,
}

/// A tagging client for one vCenter.
pub struct TaggingClient {
    endpoint: Endpoint,
    base: String,
    http: reqwest::Client,
    session: Mutex<Option<String>>,
}

impl std::fmt::Debug for TaggingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaggingClient").field("vcenter", &self.endpoint.name).finish()
    }
}

impl TaggingClient {
    /// A client for this endpoint. Nothing is sent until the first call.
    pub fn new(endpoint: Endpoint) -> Result<Self, ClientError> {
        let http = http_client(&endpoint)?;
        let base = format!("{}/rest/com/vmware/cis", endpoint.base_url());
        Ok(TaggingClient { endpoint, base, http, session: Mutex::new(None) })
    }

    async fn login(&self) -> Result<String, ClientError> {
        let call = "create tagging session";
        let resp = self
            .http
            .post(format!("{}/session", self.base))
            .basic_auth(&self.endpoint.user, Some(self.endpoint.password.expose()))
            .send()
            .await
            .map_err(|source| self.transport(call, source))?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(ClientError::Unauthorized {
                vcenter: self.endpoint.name.clone(),
                call: call.into(),
            });
        }
        let id: Value<String> = self.decode(call, resp).await?;
        Ok(id.value)
    }

    async fn session(&self) -> Result<String, ClientError> {
        let mut session = self.session.lock().await;
        if let Some(id) = session.as_ref() {
            return Ok(id.clone());
        }
        let id = self.login().await?;
        *session = Some(id.clone());
        Ok(id)
    }

    async fn forget(&self, stale: &str) {
        let mut session = self.session.lock().await;
        if session.as_deref() == Some(stale) {
            *session = None;
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        call: &str,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let mut retried = false;
        loop {
            let id = self.session().await?;
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .query(query)
                .header(SESSION_HEADER, &id);
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req.send().await.map_err(|source| self.transport(call, source))?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                if retried {
                    return Err(ClientError::Unauthorized {
                        vcenter: self.endpoint.name.clone(),
                        call: call.into(),
                    });
                }
                tracing::info!(vcenter = %self.endpoint.name, call, "tagging session expired, logging in again");
                self.forget(&id).await;
                retried = true;
                continue;
            }
            let value: Value<T> = self.decode(call, resp).await?;
            return Ok(value.value);
        }
    }

    /// Ids of the tags attached to an object (vCenter answers `null` for none).
    pub async fn attached_tags(&self, object: &MoRef) -> Result<Vec<String>, ClientError> {
        let body = serde_json::json!({ "object_id": { "id": object.value, "type": object.kind } });
        let ids: Option<Vec<String>> = self
            .call(
                &format!("list tags attached to {object}"),
                reqwest::Method::POST,
                "/tagging/tag-association",
                &[("~action", "list-attached-tags")],
                Some(&body),
            )
            .await?;
        Ok(ids.unwrap_or_default())
    }

    /// A tag by id.
    pub async fn tag(&self, id: &str) -> Result<Tag, ClientError> {
        self.call(
            &format!("get tag {id}"),
            reqwest::Method::GET,
            &format!("/tagging/tag/id:{id}"),
            &[],
            None,
        )
        .await
    }

    /// A category by id.
    pub async fn category(&self, id: &str) -> Result<Category, ClientError> {
        self.call(
            &format!("get tag category {id}"),
            reqwest::Method::GET,
            &format!("/tagging/category/id:{id}"),
            &[],
            None,
        )
        .await
    }

    /// Ids of every tag category.
    pub async fn category_ids(&self) -> Result<Vec<String>, ClientError> {
        let ids: Option<Vec<String>> = self
            .call("list tag categories", reqwest::Method::GET, "/tagging/category", &[], None)
            .await?;
        Ok(ids.unwrap_or_default())
    }

    fn transport(&self, call: &str, source: reqwest::Error) -> ClientError {
        ClientError::Transport {
            vcenter: self.endpoint.name.clone(),
            call: call.to_string(),
            source,
        }
    }

    async fn decode<T: DeserializeOwned>(
        &self,
        call: &str,
        resp: reqwest::Response,
    ) -> Result<T, ClientError> {
        let status = resp.status();
        let text = resp.text().await.map_err(|source| self.transport(call, source))?;
        if !status.is_success() {
            return Err(ClientError::Http {
                vcenter: self.endpoint.name.clone(),
                call: call.to_string(),
                status: status.as_u16(),
                body: snippet(&text),
            });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Decode {
            vcenter: self.endpoint.name.clone(),
            call: call.to_string(),
            message: format!("{e}: {}", snippet(&text)),
        })
    }
}

//! The CIS tagging REST client (`/rest/com/vmware/cis/...`, the paths vcsim serves):
//! session create, tags attached to an object, tag and category lookups.
//!
//! The session id travels in the `vmware-api-session-id` header. A 401 means the session is
//! gone: the client logs in again once and retries. Every call here is a read (or the
//! session create), so busy answers and broken connections are retried (see
//! [`super::RETRY`]); a refused login (401) never is.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::{ClientError, Endpoint, MoRef, RETRY, busy, http_client, snippet, with_deadline};

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
        let url = format!("{}/session", self.base);
        // Through the vCenter's login gate (throttle after a rejection, credential refresh).
        let mut attempt = self.endpoint.login.begin(&self.endpoint, call).await?;
        let mut creds = attempt.credentials().clone();
        loop {
            let (status, text) = self
                .exchange(call, || {
                    self.http.post(&url).basic_auth(&creds.user, Some(creds.password.expose()))
                })
                .await?;
            if status == reqwest::StatusCode::UNAUTHORIZED {
                let rejected = ClientError::Unauthorized {
                    vcenter: self.endpoint.name.clone(),
                    call: call.into(),
                };
                creds = attempt.failed(rejected).await?;
                continue;
            }
            attempt.succeeded();
            // The answer is the session token: never quoted in an error.
            let id: Value<String> = self.decode(call, status, &text, false)?;
            return Ok(id.value);
        }
    }

    /// Deletes the current tagging session, if any (best effort: it is forgotten whatever
    /// the answer). Returns whether a session was deleted.
    pub async fn logout(&self) -> Result<bool, ClientError> {
        let Some(id) = self.session.lock().await.take() else { return Ok(false) };
        let call = "delete tagging session";
        let url = format!("{}/session", self.base);
        self.exchange(call, || self.http.delete(&url).header(SESSION_HEADER, &id)).await?;
        Ok(true)
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
            let url = format!("{}{path}", self.base);
            let request = || {
                let req = self
                    .http
                    .request(method.clone(), &url)
                    .query(query)
                    .header(SESSION_HEADER, &id);
                match body {
                    Some(body) => req.json(body),
                    None => req,
                }
            };
            let (status, text) = self.exchange(call, request).await?;
            if status == reqwest::StatusCode::UNAUTHORIZED {
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
            let value: Value<T> = self.decode(call, status, &text, true)?;
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

    /// Sends the request (built afresh for each attempt) and reads the answer under the
    /// per-request deadline, retrying busy answers and broken connections.
    async fn exchange(
        &self,
        call: &str,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, String), ClientError> {
        with_deadline(&self.endpoint, call, RETRY, || async {
            let resp = request().send().await.map_err(|source| self.transport(call, source))?;
            if let Some((status, retry_after)) = busy(&resp) {
                return Err(ClientError::Busy {
                    vcenter: self.endpoint.name.clone(),
                    call: call.to_string(),
                    status,
                    retry_after,
                });
            }
            let status = resp.status();
            let text = resp.text().await.map_err(|source| self.transport(call, source))?;
            Ok((status, text))
        })
        .await
    }

    fn decode<T: DeserializeOwned>(
        &self,
        call: &str,
        status: reqwest::StatusCode,
        text: &str,
        quote_body: bool,
    ) -> Result<T, ClientError> {
        let body = |text: &str| if quote_body { snippet(text) } else { "<not shown>".into() };
        if !status.is_success() {
            return Err(ClientError::Http {
                vcenter: self.endpoint.name.clone(),
                call: call.to_string(),
                status: status.as_u16(),
                body: body(text),
            });
        }
        // serde_json's message names a position, never the text.
        serde_json::from_str(text).map_err(|e| ClientError::Decode {
            vcenter: self.endpoint.name.clone(),
            call: call.to_string(),
            message: if quote_body { format!("{e}: {}", snippet(text)) } else { e.to_string() },
        })
    }
}

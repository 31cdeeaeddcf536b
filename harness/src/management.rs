//! The RabbitMQ management HTTP API, as the tests and the bench use it: a
//! vhost of their own, the broker's view of queues and connections, and
//! faults an operator could cause (connections closed, policies set).

use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};

/// Why a management API call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address given is not a URL.
    #[error("not a URL: {0}")]
    Url(String),
    /// The API did not answer.
    #[error("management API {method} {path} (is the management plugin on?): {error}")]
    Unreachable {
        /// The method.
        method: Method,
        /// The path below `/api`.
        path: String,
        /// What the client said.
        error: reqwest::Error,
    },
    /// The API answered with an error status.
    #[error("management API {method} {path}: {status}{}", if body.is_empty() { String::new() } else { format!(" {body}") })]
    Status {
        /// The method.
        method: Method,
        /// The path below `/api`.
        path: String,
        /// What it answered.
        status: StatusCode,
        /// The body of the answer, which says why.
        body: String,
    },
    /// The answer was not the JSON expected.
    #[error("management API {method} {path}: {error}")]
    Body {
        /// The method.
        method: Method,
        /// The path below `/api`.
        path: String,
        /// What the client said.
        error: reqwest::Error,
    },
}

/// Percent-encodes a name for a management API path (`/` is the default vhost).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The management API: base URL (`…/api`) and credentials.
#[derive(Clone, Debug)]
pub struct Management {
    /// Client for every call, with the timeout given.
    http: reqwest::Client,
    /// `http://host:15672/api`, without credentials.
    base: String,
    /// User name.
    user: String,
    /// Password.
    password: String,
}

impl Management {
    /// Parses `http://user:pass@host:port/api` (credentials default to
    /// guest/guest); every call gives up after `timeout`.
    pub fn new(raw: &str, timeout: Duration) -> Result<Self, Error> {
        let mut url = reqwest::Url::parse(raw).map_err(|e| Error::Url(e.to_string()))?;
        let user = match url.username() {
            "" => "guest".to_string(),
            u => u.to_string(),
        };
        let password = url.password().unwrap_or("guest").to_string();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| Error::Url(e.to_string()))?;
        Ok(Self {
            http,
            base: url.as_str().trim_end_matches('/').to_string(),
            user,
            password,
        })
    }

    /// The base URL, `…/api`, without credentials.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// An authenticated request, for calls the methods below do not cover.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(&self.user, Some(&self.password))
    }

    /// Sends a call; `None` on 404, an error on any other failure.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Option<reqwest::Response>, Error> {
        let mut req = self.request(method.clone(), path);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|error| Error::Unreachable {
            method: method.clone(),
            path: path.to_string(),
            error,
        })?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(Error::Status {
                method,
                path: path.to_string(),
                status,
                body: resp.text().await.unwrap_or_default(),
            });
        }
        Ok(Some(resp))
    }

    /// Sends a call that must succeed (404 included as a failure).
    async fn must(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, Error> {
        self.call(method.clone(), path, body)
            .await?
            .ok_or_else(|| Error::Status {
                method,
                path: path.to_string(),
                status: StatusCode::NOT_FOUND,
                body: String::new(),
            })
    }

    /// GET a JSON document.
    pub async fn get(&self, path: &str) -> Result<Value, Error> {
        let resp = self.must(Method::GET, path, None).await?;
        resp.json().await.map_err(|error| Error::Body {
            method: Method::GET,
            path: path.to_string(),
            error,
        })
    }

    /// GET a JSON document; `None` when there is no such thing (404).
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>, Error> {
        let Some(resp) = self.call(Method::GET, path, None).await? else {
            return Ok(None);
        };
        resp.json().await.map(Some).map_err(|error| Error::Body {
            method: Method::GET,
            path: path.to_string(),
            error,
        })
    }

    /// PUT, with a JSON body or none.
    pub async fn put(&self, path: &str, body: Option<&Value>) -> Result<(), Error> {
        self.must(Method::PUT, path, body).await.map(drop)
    }

    /// POST a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(), Error> {
        self.must(Method::POST, path, Some(body)).await.map(drop)
    }

    /// DELETE something that must exist.
    pub async fn delete(&self, path: &str) -> Result<(), Error> {
        self.must(Method::DELETE, path, None).await.map(drop)
    }

    /// The broker's version (`3.10.8`, `4.0.5`).
    pub async fn broker_version(&self) -> Result<String, Error> {
        let overview = self.get("/overview").await?;
        Ok(overview["rabbitmq_version"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Whether the broker offers the `x-delayed-message` exchange type.
    pub async fn plugin_available(&self) -> Result<bool, Error> {
        let overview = self.get("/overview").await?;
        Ok(overview["exchange_types"]
            .as_array()
            .is_some_and(|types| types.iter().any(|t| t["name"] == "x-delayed-message")))
    }

    /// Creates a vhost and gives our user every right in it.
    pub async fn create_vhost(&self, name: &str) -> Result<(), Error> {
        self.put(&format!("/vhosts/{name}"), None).await?;
        self.grant(name).await
    }

    /// Gives our user every right in a vhost (again, after [`Management::revoke`]).
    pub async fn grant(&self, vhost: &str) -> Result<(), Error> {
        let rights = json!({"configure": ".*", "write": ".*", "read": ".*"});
        self.put(
            &format!("/permissions/{vhost}/{}", self.user),
            Some(&rights),
        )
        .await
    }

    /// Takes our user's rights in a vhost away: its new connections are refused.
    pub async fn revoke(&self, vhost: &str) -> Result<(), Error> {
        self.delete(&format!("/permissions/{vhost}/{}", self.user))
            .await
    }

    /// Deletes a vhost with everything in it.
    pub async fn delete_vhost(&self, name: &str) -> Result<(), Error> {
        self.delete(&format!("/vhosts/{name}")).await
    }

    /// Closes the vhost's open connections, as an operator would (a connection
    /// is listed once its first statistics are in), keeping to those whose
    /// client-given name starts with `named` when given. Returns the
    /// client-given names of those the broker closed.
    pub async fn close_connections(
        &self,
        vhost: &str,
        named: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let connections = self
            .get(&format!("/vhosts/{}/connections", url_encode(vhost)))
            .await?;
        let mut closed = Vec::new();
        for c in connections.as_array().into_iter().flatten() {
            let client_name = c["client_properties"]["connection_name"]
                .as_str()
                .unwrap_or_default();
            if named.is_some_and(|prefix| !client_name.starts_with(prefix)) {
                continue;
            }
            let path = format!(
                "/connections/{}",
                url_encode(c["name"].as_str().unwrap_or_default())
            );
            let resp = self
                .request(Method::DELETE, &path)
                .header("X-Reason", "test: connections closed")
                .send()
                .await;
            if resp.is_ok_and(|r| r.status().is_success()) {
                closed.push(client_name.to_string());
            }
        }
        Ok(closed)
    }

    /// Empties one queue.
    pub async fn purge_queue(&self, vhost: &str, queue: &str) -> Result<(), Error> {
        self.delete(&format!(
            "/queues/{}/{}/contents",
            url_encode(vhost),
            url_encode(queue)
        ))
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_encoded_for_paths() {
        assert_eq!(url_encode("/"), "%2F");
        assert_eq!(
            url_encode("order.timeouts.work-1_~"),
            "order.timeouts.work-1_~"
        );
        assert_eq!(url_encode("a b#c"), "a%20b%23c");
    }

    #[test]
    fn credentials_come_out_of_the_url_and_default_to_guest() {
        let api = Management::new(
            "http://ops:s3cret@127.0.0.1:15672/api/",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(api.base(), "http://127.0.0.1:15672/api");
        assert_eq!(
            (api.user.as_str(), api.password.as_str()),
            ("ops", "s3cret")
        );
        let api = Management::new("http://127.0.0.1:15672/api", Duration::from_secs(1)).unwrap();
        assert_eq!(
            (api.user.as_str(), api.password.as_str()),
            ("guest", "guest")
        );
        assert!(Management::new("not a url", Duration::from_secs(1)).is_err());
    }
}

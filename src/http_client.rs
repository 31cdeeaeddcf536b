//! A small JSON client over plain HTTP/1.1, for the two places the service
//! calls HTTP itself: the broker's management API (monitoring and `doctor`)
//! and `demo`, which drives its own API. It is built on the hyper the API is
//! served with, so the service carries no second HTTP stack; it has no TLS,
//! which is why `amqp.management_url` refuses `https://`.

use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
pub use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Why a request got no answer to read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an `http://` URL with a host, or a header that cannot be sent.
    #[error("bad request: {0}")]
    Request(String),
    /// No connection, or the connection failed before the answer was read.
    #[error("{0}")]
    Transport(String),
    /// No answer within the client's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer's body is not the JSON expected.
    #[error("the answer is not JSON: {0}")]
    Json(String),
}

/// An answer: its status and its body (JSON `null` when empty).
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body as JSON; `Value::Null` for an empty body.
    pub body: Value,
}

/// A client with a timeout for a whole exchange and an `Authorization`
/// header sent with every request.
#[derive(Debug, Clone)]
pub struct JsonClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    authorization: Option<HeaderValue>,
}

impl JsonClient {
    /// A client whose every request (connect, send, read the body) must end
    /// within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            inner: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
            authorization: None,
        }
    }

    /// Sends `Authorization: Bearer <token>` with every request.
    pub fn bearer(self, token: &str) -> Result<Self, Error> {
        self.authorize(&format!("Bearer {token}"))
    }

    /// Sends HTTP basic credentials with every request.
    pub fn basic(self, username: &str, password: &str) -> Result<Self, Error> {
        use base64::Engine as _;
        let pair =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        self.authorize(&format!("Basic {pair}"))
    }

    fn authorize(mut self, value: &str) -> Result<Self, Error> {
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| Error::Request("credentials that cannot be sent in a header".into()))?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    /// GET `url`.
    pub async fn get(&self, url: &str) -> Result<Answer, Error> {
        self.send(Method::GET, url, None).await
    }

    /// POST `body` (JSON) to `url`.
    pub async fn post(&self, url: &str, body: &Value) -> Result<Answer, Error> {
        self.send(Method::POST, url, Some(body)).await
    }

    /// PUT `body` (JSON) to `url`.
    pub async fn put(&self, url: &str, body: &Value) -> Result<Answer, Error> {
        self.send(Method::PUT, url, Some(body)).await
    }

    /// One exchange: the request, then the whole body, within the timeout.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Error> {
        let request = self.request(method, url, body)?;
        tokio::time::timeout(self.timeout, self.exchange(request))
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }

    fn request(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Request<Full<Bytes>>, Error> {
        if !url.starts_with("http://") {
            return Err(Error::Request("only http:// URLs are supported".into()));
        }
        // The API refuses a state-changing request that does not say JSON,
        // even one without a body: a web page could send that cross-site.
        let says_json = body.is_some() || !matches!(method, Method::GET | Method::HEAD);
        let mut request = Request::builder().method(method).uri(url);
        if says_json {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let bytes = body.map_or_else(Bytes::new, |body| Bytes::from(body.to_string()));
        // The URL is left out: it may carry what the caller keeps private.
        request
            .body(Full::new(bytes))
            .map_err(|e| Error::Request(e.to_string()))
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<Answer, Error> {
        let response = self
            .inner
            .request(request)
            .await
            .map_err(|e| Error::Transport(transport_detail(&e)))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?
            .to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|e| Error::Json(e.to_string()))?
        };
        Ok(Answer { status, body })
    }
}

/// The innermost cause of a failed exchange ("Connection refused"), which
/// says more than the client's own "client error (Connect)".
fn transport_detail(e: &hyper_util::client::legacy::Error) -> String {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_what_it_cannot_send() {
        let client = JsonClient::new(Duration::from_secs(1));
        let err = client.get("https://example.invalid/").await.unwrap_err();
        assert!(matches!(err, Error::Request(_)), "{err}");
        assert!(client.clone().bearer("a\nb").is_err());
    }

    #[tokio::test]
    async fn a_closed_port_is_a_transport_error_naming_the_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = JsonClient::new(Duration::from_secs(2));
        let err = client
            .get(&format!("http://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Transport(d) if d.to_lowercase().contains("refused")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn sends_credentials_and_reads_json() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/x", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let n = socket.read(&mut head).await.unwrap();
            let body = r#"{"ok":true}"#;
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head[..n]).to_string()
        });
        let client = JsonClient::new(Duration::from_secs(2))
            .basic("guest", "pass")
            .unwrap();
        let answer = client.get(&url).await.unwrap();
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.body, serde_json::json!({"ok": true}));
        let head = server.await.unwrap().to_lowercase();
        // base64("guest:pass")
        assert!(
            head.contains("authorization: basic z3vlc3q6cgfzcw=="),
            "{head}"
        );
    }
}

//! The catalog API as `meshcat` calls it: one HTTP client with the caller's bearer
//! token and deadline, URLs built from path segments (never by pasting names into
//! strings), and every failure turned into a [`CliError`] that knows its exit status.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Exit status: done.
pub const EXIT_OK: u8 = 0;
/// Exit status: a check, a diagnosis or a write failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status: bad usage, a bad file, or an API that cannot be reached.
pub const EXIT_USAGE: u8 = 2;

/// Largest answer read from the API; a catalog of 10,000 clusters is a few MiB.
pub const MAX_ANSWER: usize = 64 << 20;

/// Why a command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// A file given on the command line cannot be read or is not valid.
    #[error("{0}")]
    File(String),
    #[error("cannot reach the catalog API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The API answered with an error: its message and code, as it said them.
    #[error("{what}: {message} ({status} {code})")]
    Api {
        what: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{what}: the catalog API answered something unexpected: {reason}")]
    Body { what: String, reason: String },
    /// The work was done and something in it failed (a check, a write); what failed
    /// has been printed.
    #[error("{0}")]
    Failed(String),
    /// A diagnosis the API would not run (contract section 5's exit status 2).
    #[error("{0}")]
    NotRun(String),
    /// Standard output was closed (a pipe whose reader left): nothing more to say.
    #[error("standard output closed")]
    Closed,
}

impl CliError {
    /// Says the error on standard error, each of its lines after `meshcat: `, with
    /// the control characters of what it quotes (a server's message) escaped.
    pub fn report(&self) {
        use std::io::Write;
        let text = self.to_string();
        let mut err = anstream::stderr();
        for line in text.lines() {
            let _ = writeln!(err, "meshcat: {}", crate::text::clean(line));
        }
    }

    /// The exit status this error ends `meshcat` with (contract section 16).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_)
            | CliError::File(_)
            | CliError::Unreachable { .. }
            | CliError::Body { .. }
            | CliError::NotRun(_) => EXIT_USAGE,
            // A request the API refused as malformed is bad usage (a name with a
            // space, a value out of range); any other refusal is a failed operation.
            CliError::Api { status: 400, .. } => EXIT_USAGE,
            CliError::Api { .. } | CliError::Failed(_) => EXIT_FAILED,
            CliError::Closed => EXIT_OK,
        }
    }

    /// The HTTP status of an API refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            CliError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one aggregator's API.
#[derive(Debug, Clone)]
pub struct Api {
    base: url::Url,
    token: Option<String>,
    http: reqwest::Client,
}

/// A request's path segments and query pairs; segments are percent-encoded as
/// needed, so any name travels as itself.
#[derive(Debug, Clone, Default)]
pub struct Call<'a> {
    pub segments: Vec<&'a str>,
    pub query: Vec<(&'a str, String)>,
}

impl<'a> Call<'a> {
    pub fn new(segments: &[&'a str]) -> Self {
        Call {
            segments: segments.to_vec(),
            query: Vec::new(),
        }
    }

    /// Adds `name=value`.
    pub fn q(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.query.push((name, value.into()));
        self
    }

    /// Adds `name=value` when there is a value.
    pub fn q_opt(self, name: &'a str, value: Option<impl Into<String>>) -> Self {
        match value {
            Some(v) => self.q(name, v),
            None => self,
        }
    }
}

impl Api {
    /// A client of the API at `base` (`http://host:port`, possibly with a path
    /// prefix) sending `token`, each request held to `timeout`.
    pub fn new(
        base: &str,
        token: Option<String>,
        timeout: Option<Duration>,
    ) -> Result<Api, CliError> {
        let base = url::Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "--api {base:?} is not an http:// or https:// URL with a host"
                ))
            })?;
        let mut b = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        let http = b.build().map_err(|e| CliError::Unreachable {
            url: base.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Api { base, token, http })
    }

    /// The same client without a deadline on whole answers (for event streams).
    pub fn streaming(&self) -> Result<Api, CliError> {
        Api::new(self.base.as_str(), self.token.clone(), None)
    }

    /// The API's base URL as given.
    pub fn base(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// The URL of a call.
    pub fn url(&self, call: &Call<'_>) -> url::Url {
        let mut u = self.base.clone();
        if let Ok(mut segs) = u.path_segments_mut() {
            segs.pop_if_empty().extend(&call.segments);
        }
        if !call.query.is_empty() {
            u.query_pairs_mut()
                .extend_pairs(call.query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        u
    }

    /// Sends a request and answers the response when its status is a success.
    pub async fn send(
        &self,
        method: Method,
        call: &Call<'_>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<reqwest::Response, CliError> {
        let url = self.url(call);
        let what = format!("{method} {}", url.path());
        let mut req = self.http.request(method, url.clone());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| CliError::Unreachable {
            url: self.base().to_owned(),
            reason: error_chain(&e),
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = read_limited(resp).await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        Err(CliError::Api {
            what,
            status: status.as_u16(),
            code: v["code"].as_str().unwrap_or("no_code").to_owned(),
            message: v["error"].as_str().map_or_else(
                || {
                    status
                        .canonical_reason()
                        .unwrap_or("error without a message")
                        .to_owned()
                },
                str::to_owned,
            ),
        })
    }

    /// `GET` a JSON answer.
    pub async fn get(&self, call: &Call<'_>) -> Result<Value, CliError> {
        self.json(Method::GET, call, None).await
    }

    /// `GET` a JSON answer, with the value of its response header `header`.
    pub async fn get_with_header(
        &self,
        call: &Call<'_>,
        header: &str,
    ) -> Result<(Value, Option<String>), CliError> {
        let what = format!("GET {}", self.url(call).path());
        let resp = self.send(Method::GET, call, None, &[]).await?;
        let value = resp
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((json_body(what, resp).await?, value))
    }

    /// A request whose answer is JSON.
    pub async fn json(
        &self,
        method: Method,
        call: &Call<'_>,
        body: Option<&Value>,
    ) -> Result<Value, CliError> {
        let what = format!("{method} {}", self.url(call).path());
        let resp = self.send(method, call, body, &[]).await?;
        json_body(what, resp).await
    }

    /// A request whose answer is plain text (the sidecar log level).
    pub async fn text(&self, method: Method, call: &Call<'_>) -> Result<String, CliError> {
        let what = format!("{method} {}", self.url(call).path());
        let resp = self.send(method, call, None, &[]).await?;
        read_limited(resp)
            .await
            .map_err(|reason| CliError::Body { what, reason })
    }
}

/// Reads a successful answer of the request `what` as JSON.
async fn json_body(what: String, resp: reqwest::Response) -> Result<Value, CliError> {
    let text = read_limited(resp).await.map_err(|reason| CliError::Body {
        what: what.clone(),
        reason,
    })?;
    serde_json::from_str(&text).map_err(|e| CliError::Body {
        what,
        reason: format!("not JSON ({e})"),
    })
}

/// Reads an answer up to [`MAX_ANSWER`] bytes.
async fn read_limited(mut resp: reqwest::Response) -> Result<String, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| error_chain(&e))? {
        if out.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("the answer is over {} MiB", MAX_ANSWER >> 20));
        }
        out.extend_from_slice(&chunk);
    }
    String::from_utf8(out).map_err(|_| "the answer is not UTF-8".to_owned())
}

/// An error with its causes, which reqwest keeps apart ("error sending request"
/// alone does not say "connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

/// Whether an error is the API's "no such resource".
pub fn is_not_found(e: &CliError) -> bool {
    e.status() == Some(StatusCode::NOT_FOUND.as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_built_from_segments() {
        let api = Api::new("http://127.0.0.1:9080/prefix/", None, None).unwrap();
        let u = api.url(&Call::new(&["clusters", "a b/c", "drift"]).q("zoneName", "z&x"));
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:9080/prefix/clusters/a%20b%2Fc/drift?zoneName=z%26x"
        );
        let api = Api::new("http://h:1", None, None).unwrap();
        assert_eq!(api.url(&Call::new(&["zones"])).as_str(), "http://h:1/zones");
        assert!(Api::new("h:1", None, None).is_err());
        assert!(Api::new("ftp://h", None, None).is_err());
    }

    #[test]
    fn exit_codes_follow_the_contract() {
        let api = |status| CliError::Api {
            what: "x".into(),
            status,
            code: "c".into(),
            message: "m".into(),
        };
        assert_eq!(api(401).exit_code(), EXIT_FAILED);
        assert_eq!(api(404).exit_code(), EXIT_FAILED);
        assert_eq!(api(422).exit_code(), EXIT_FAILED);
        assert_eq!(api(400).exit_code(), EXIT_USAGE);
        assert_eq!(CliError::File("f".into()).exit_code(), EXIT_USAGE);
        assert_eq!(
            CliError::Unreachable {
                url: "u".into(),
                reason: "r".into()
            }
            .exit_code(),
            EXIT_USAGE
        );
    }
}

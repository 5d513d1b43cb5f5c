//! Shared by the `serve_*` tests: the real default model (loaded once per test binary),
//! app states over it, and small clients (in-process through `oneshot`, and raw HTTP/1.1
//! over a socket).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{Bundle, WeightFormat};
use mtplx_serve::{app, AppState, Settings};
use serde_json::Value;
use tower::ServiceExt;

/// The model the tests run: `MTPLX_TEST_MODEL`, else the store's default model. A missing
/// model fails the test (run `cargo run -p mtplx-serve` once to fetch it).
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    assert!(
        path.exists(),
        "test model {} is missing: set MTPLX_TEST_MODEL or fetch the default model with \
         `cargo run -p mtplx-serve`",
        path.display()
    );
    path
}

/// The model, loaded once per test binary.
pub fn bundle() -> Arc<Bundle> {
    static BUNDLE: OnceLock<Arc<Bundle>> = OnceLock::new();
    BUNDLE
        .get_or_init(|| {
            Arc::new(Bundle::load(&model_path(), WeightFormat::default()).expect("load test model"))
        })
        .clone()
}

/// Settings for tests: a small context window, no request log.
pub fn settings() -> Settings {
    Settings {
        context_window: Some(1024),
        ..Settings::default()
    }
}

pub fn state_with(settings: Settings) -> AppState {
    AppState::new(bundle(), settings).expect("start the engine")
}

pub fn state() -> AppState {
    state_with(settings())
}

/// A finished response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an SSE body, `[DONE]` left as a string.
    pub fn sse_data(&self) -> Vec<Value> {
        sse_data(&self.text())
    }

    /// The OpenAI error code (or `type` for errors without a code).
    pub fn error_code(&self) -> Value {
        self.json()["error"]["code"].clone()
    }
}

/// The request log's records (none if the file is not there yet).
pub fn log_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn sse_data(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_owned())))
        })
        .collect()
}

pub fn request(method: Method, path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

pub fn post_json(path: &str, body: &Value) -> Request<Full<Bytes>> {
    request(Method::POST, path, body.to_string())
}

pub fn get(path: &str) -> Request<Full<Bytes>> {
    request(Method::GET, path, Bytes::new())
}

/// Sends `req` through the app (no socket) and reads the whole response.
pub async fn call(state: &AppState, req: Request<Full<Bytes>>) -> Reply {
    let res = app(state.clone()).oneshot(req).await.expect("infallible");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// A greedy chat request for `messages` (role, content).
pub fn chat(messages: &[(&str, &str)], max_tokens: u32) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    serde_json::json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

/// A chat completion request naming `session` in the `x-mtplx-session-id` header.
pub fn with_session(body: &Value, session: &str) -> Request<Full<Bytes>> {
    let mut r = post_json("/v1/chat/completions", body);
    r.headers_mut()
        .insert("x-mtplx-session-id", session.parse().unwrap());
    r
}

/// The first choice's message text of a chat completion.
pub fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {v}"))
        .to_owned()
}

/// Prompt tokens a response says were restored, not computed.
pub fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// A greedy chat request for one user message.
pub fn greedy_chat(content: &str, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": DEFAULT_MODEL.id,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

/// Stops a server: its engine thread and SSD store go with the last handle. The store's
/// directory lock is the last thing released (after the writer drains), so that is what a
/// restart on the same directory waits for; the bank being gone is not enough.
pub async fn stop(state: AppState, ssd: &std::path::Path) {
    drop(state);
    eventually("the first server's SSD store to close", || {
        !mtplx_cold::storage::FsStorage::in_use(ssd).expect("probe the SSD directory lock")
    })
    .await;
}

/// Waits until `cond` holds; fails the test after a generous bound (a liveness check, not
/// a timing assertion).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "gave up waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub mod process;

pub mod socket {
    //! A raw HTTP/1.1 client: what goes over the wire, byte for byte.

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Starts the server on 127.0.0.1:0; returns its address. It stops when the test's
    /// runtime ends.
    pub async fn start(state: AppState) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(mtplx_serve::run(listener, state, std::future::pending()));
        addr
    }

    /// Writes a request with `Connection: close`.
    pub async fn send(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        s
    }

    /// Sends a request and reads the whole response (the server closes the connection).
    pub async fn fetch(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut s = send(addr, method, path, headers, body).await;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        parse(&raw)
    }

    /// Parses a full HTTP/1.1 response, chunked or not.
    pub fn parse(raw: &[u8]) -> Reply {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("end of headers");
        let head = std::str::from_utf8(&raw[..split]).unwrap();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let mut headers = HeaderMap::new();
        for l in lines {
            let (k, v) = l.split_once(": ").unwrap();
            headers.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut rest = &raw[split + 4..];
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|v| v == "chunked");
        let body = if chunked {
            let mut out = Vec::new();
            loop {
                let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
                let size =
                    usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap(), 16).unwrap();
                rest = &rest[nl + 2..];
                if size == 0 {
                    break;
                }
                out.extend_from_slice(&rest[..size]);
                rest = &rest[size + 2..];
            }
            out
        } else {
            rest.to_vec()
        };
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Bytes::from(body),
        }
    }
}

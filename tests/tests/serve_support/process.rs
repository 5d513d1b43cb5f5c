//! Real `mtplx-serve` processes, as an operator runs them: started with flags, driven over
//! a socket (streaming, as agent clients do), stopped with SIGTERM or SIGKILL.

use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::socket::{fetch, parse};
use super::{sse_data, Reply};

/// A liveness bound for anything a test waits on; not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(300);

/// A server process, killed (SIGKILL) when dropped if it is still running.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// A streamed chat answer as the client saw it.
#[derive(Debug)]
pub struct Streamed {
    pub text: String,
    /// The response body as received (an error's JSON, or the event stream).
    pub body: String,
    /// From sending the request to the first content delta.
    pub ttft: Duration,
    pub status: u16,
}

impl Server {
    /// Starts the server binary on a free port with `args` (the model and the port are
    /// given), `MTPLX_HOME` under `dir`; waits for the address it prints.
    pub fn start(dir: &Path, name: &str, args: &[OsString]) -> Server {
        Server::start_model(dir, name, &super::model_path(), args)
    }

    /// [`Server::start`] serving `model` (a GGUF file or a model folder).
    pub fn start_model(dir: &Path, name: &str, model: &Path, args: &[OsString]) -> Server {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Command::new(env!("CARGO_BIN_EXE_mtplx-serve-under-test"))
            .arg("--model")
            .arg(model)
            .args(["--port", "0"])
            .args(args)
            .env("MTPLX_HOME", dir.join("home"))
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .expect("start the server binary");
        let mut server = Server {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stdout: stdout.clone(),
            stderr,
        };
        let started = Instant::now();
        server.addr = loop {
            let out = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(addr) = out
                .split_once("on http://")
                .and_then(|(_, rest)| rest.split_whitespace().next())
            {
                break addr.parse().expect("the address the server printed");
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("{name} exited ({status}) before serving:\n{}", server.log());
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{name} did not start:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        server
    }

    /// What the server wrote to stderr (its log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// What the server wrote to stdout: its startup line.
    pub fn startup_line(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// POSTs `body` to `path` (no session header) and reads the whole response.
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        fetch(
            self.addr,
            "POST",
            path,
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        fetch(self.addr, "GET", path, &[], b"").await
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.json()
    }

    /// Entries in the SSD tier's manifest (committed, so durable).
    pub async fn ssd_entries(&self) -> u64 {
        self.get_json("/admin/cache/ssd").await["entries"]
            .as_u64()
            .unwrap_or(0)
    }

    /// A non-streamed chat completion under `session`; fails the test unless it is a 200.
    pub async fn chat(&self, body: &Value, session: &str) -> Reply {
        let r = fetch(
            self.addr,
            "POST",
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("x-mtplx-session-id", session),
            ],
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.log());
        r
    }

    /// A streamed chat completion under `session` (`stream: true` is added), read as a
    /// client reads it: the time to the first content delta, then the whole text.
    pub async fn stream_chat(&self, body: &Value, session: &str) -> Streamed {
        self.stream_chat_with(body, session, || {}).await
    }

    /// [`Server::stream_chat`], calling `at_first_content` once the first content delta
    /// has arrived.
    pub async fn stream_chat_with(
        &self,
        body: &Value,
        session: &str,
        at_first_content: impl FnOnce(),
    ) -> Streamed {
        let mut at_first_content = Some(at_first_content);
        let mut body = body.clone();
        body["stream"] = Value::Bool(true);
        let body = body.to_string();
        let start = Instant::now();
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\
             content-type: application/json\r\nx-mtplx-session-id: {session}\r\n\
             content-length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut ttft = None;
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if ttft.is_none() && has_content(&raw) {
                ttft = Some(start.elapsed());
                if let Some(f) = at_first_content.take() {
                    f();
                }
            }
        }
        let reply = parse(&raw);
        let text = sse_data(&reply.text())
            .iter()
            .filter_map(|d| {
                d["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        Streamed {
            text,
            body: reply.text(),
            ttft: ttft.unwrap_or_else(|| start.elapsed()),
            status: reply.status.as_u16(),
        }
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the server did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a raw (maybe chunked, maybe partial) SSE response holds a non-empty content
/// delta yet.
fn has_content(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    text.split("data: ").skip(1).any(|event| {
        let json = event.split("\n\n").next().unwrap_or_default();
        serde_json::from_str::<Value>(json.trim()).is_ok_and(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
    })
}

impl Server {
    /// Waits until the server has committed a spill to its SSD tier, then kills it with
    /// SIGKILL (no shutdown path runs).
    pub async fn kill_once_spilled(mut self) {
        eventually_async("a spill to be committed", || async {
            self.ssd_entries().await >= 1
        })
        .await;
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().unwrap();
    }
}

/// The newest line of the request log at `log`, once it has one.
pub async fn newest_log_line(log: &Path) -> Value {
    let mut lines = Vec::new();
    eventually_async("the request log line", || {
        lines = super::log_lines(log);
        std::future::ready(!lines.is_empty())
    })
    .await;
    lines.pop().unwrap()
}

/// Waits until `cond` holds; fails after [`PATIENCE`].
pub async fn eventually_async<F: std::future::Future<Output = bool>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < PATIENCE, "gave up waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--ssd-session-cache on` in `ssd` with no free-disk floor (a test machine's disk may be
/// fuller than the production floor allows), the request log at `log`, and `more`.
pub fn ssd_args(ssd: &Path, log: &Path, more: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["--ssd-session-cache", "on", "--ssd-session-cache-dir"]
        .iter()
        .map(OsString::from)
        .collect();
    args.push(ssd.into());
    args.extend(
        [
            "--ssd-session-cache-free-disk-floor",
            "0",
            "--request-log-jsonl",
        ]
        .iter()
        .map(OsString::from),
    );
    args.push(log.into());
    args.extend(more.iter().map(OsString::from));
    args
}

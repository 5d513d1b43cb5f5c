//! The request log: one JSON line per generation request, numbers and hashes only, never
//! prompt or completion text. Rotated at 64 MiB, keeping 4 old files.

mod rotate;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use rotate::{RotatingFile, Rotation};

use crate::job::Summary;

/// One line of the log. Every field is a number, a fixed label or a hash.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Unix seconds when the line was written.
    pub ts: f64,
    pub request_id: String,
    pub endpoint: &'static str,
    pub status: u16,
    /// The error code of a failed request (`context_length_exceeded`, ...).
    pub error_code: Option<&'static str>,
    /// blake3 of the prompt's token ids.
    pub prompt_hash: Option<String>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub new_prefill_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_s: Option<f64>,
    pub prompt_tps: Option<f64>,
    pub decode_tok_s: Option<f64>,
    pub finish_reason: Option<&'static str>,
    /// Where reused K/V came from: `ram`, `ssd` or `none`.
    pub cache_source: String,
    /// `cold` (nothing reused), `clone`, `ssd_clone`, `near_prefix_clone`, …
    pub session_restore_mode: String,
    /// Why nothing was reused (`new_session`, `prefix_divergence_at_token`, `ssd_*`, …).
    pub cache_miss_reason: Option<String>,
    /// Tokens restored from the SSD tier.
    pub ssd_cached_tokens: Option<u64>,
    /// Length of the stored entry that was served.
    pub entry_prefix_len: Option<u64>,
    /// `spill_queued` when the served RAM entry had been evicted and its write to the SSD
    /// tier had not committed yet.
    pub ram_entry_state: Option<String>,
    /// Where the prompt left the nearest stored conversation.
    pub prefix_divergence_token: Option<u64>,
    /// Candidates considered and not served, `mode:reason` joined by `,`.
    pub refused_candidates: Option<String>,
    /// Seconds spent finding and building the restored cache.
    pub restore_s: Option<f64>,
    /// An SSD restore's read: its path and where its time went.
    pub ssd_read: Option<SsdRead>,
    /// Where the session id came from (`header`, `user`, `prefix_match`, `anonymous`, …).
    pub session_source: Option<&'static str>,
    /// blake3 of the session id (ids are client text: never logged as such).
    pub session_hash: Option<String>,
    /// Whether the conversation was kept in the session bank afterwards.
    pub bank_committed: Option<bool>,
    /// For a 507: why, and when a retry could succeed.
    pub refusal_reason: Option<&'static str>,
    pub retry_when: Option<&'static str>,
    /// `mtp` (speculative) or `ar`.
    pub generation_mode: Option<&'static str>,
    /// The proposer that drafted (`lookup`, `mtp`), for speculative requests.
    pub proposer: Option<&'static str>,
    /// Draft tokens offered / accepted at depth 1, 2, …
    pub drafted_by_depth: Vec<u64>,
    pub accepted_by_depth: Vec<u64>,
    /// Forward passes that verified a draft.
    pub verify_calls: u64,
    /// Mean tokens per verify call (accepted drafts plus the model's own token).
    pub mean_acceptance_length: Option<f64>,
}

/// How the SSD tier read a restored entry's blocks, and where the time went (see
/// `mtplx_cold::RestoreTimings`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SsdRead {
    /// `staged` (into staging buffers, handed over row by row), `lent` (into host buffers a
    /// device cache lent, handed over whole), `streamed`
    /// (straight into the cache's rows) or `resident` (every block in memory).
    pub path: &'static str,
    pub bytes: u64,
    pub manifest_s: f64,
    /// The reader thread's time in reads.
    pub reading_s: f64,
    /// The calling thread's time hashing extents and handing their rows over.
    pub delivering_s: f64,
    /// Staged: of `delivering_s`, handing rows over (the checksum runs beside it).
    pub handing_over_s: f64,
    /// The calling thread's time waiting for the reader.
    pub awaiting_reads_s: f64,
    /// Lent: the hasher threads' time, summed over them.
    pub hashing_s: f64,
    pub io_stalled_s: f64,
}

impl From<&mtplx_bank::RestoreReport> for SsdRead {
    fn from(r: &mtplx_bank::RestoreReport) -> Self {
        let t = &r.timings;
        SsdRead {
            path: match r.read_path {
                mtplx_bank::ReadPath::Staged => "staged",
                mtplx_bank::ReadPath::Lent { .. } => "lent",
                mtplx_bank::ReadPath::Streamed => "streamed",
                mtplx_bank::ReadPath::Resident { .. } => "resident",
            },
            bytes: r.bytes_read,
            manifest_s: t.manifest.as_secs_f64(),
            reading_s: t.reading.as_secs_f64(),
            delivering_s: t.delivering.as_secs_f64(),
            handing_over_s: t.handing_over.as_secs_f64(),
            awaiting_reads_s: t.awaiting_reads.as_secs_f64(),
            hashing_s: t.hashing.as_secs_f64(),
            io_stalled_s: t.io_stalled.as_secs_f64(),
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Record {
    /// A request that ended in the engine (status 200, or 499 when the client left).
    pub fn finished(request_id: &str, endpoint: &'static str, s: &Summary) -> Self {
        let cancelled = s.finish == crate::job::Finish::Cancelled;
        let mut r = Record {
            status: if cancelled { 499 } else { 200 },
            prompt_hash: Some(s.prompt_hash.clone()),
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            new_prefill_tokens: s.new_prefill_tokens,
            completion_tokens: s.completion_tokens,
            ttft_s: s.ttft_s,
            prompt_tps: s.prompt_tps(),
            decode_tok_s: s.decode_tok_s(),
            finish_reason: Some(s.finish.label()),
            generation_mode: Some(s.mode.as_str()),
            session_source: s.session.as_ref().map(|(_, src)| *src),
            session_hash: s
                .session
                .as_ref()
                .map(|(id, _)| crate::session::session_hash(id)),
            proposer: s.spec.as_ref().map(|p| p.proposer),
            drafted_by_depth: s
                .spec
                .as_ref()
                .map_or_else(Vec::new, |p| p.stats.drafted_by_depth.clone()),
            accepted_by_depth: s
                .spec
                .as_ref()
                .map_or_else(Vec::new, |p| p.stats.accepted_by_depth.clone()),
            verify_calls: s.spec.as_ref().map_or(0, |p| p.stats.verify_calls),
            mean_acceptance_length: s
                .spec
                .as_ref()
                .filter(|p| p.stats.verify_calls > 0)
                .map(|p| p.stats.mean_acceptance_length()),
            ..Record::failed(request_id, endpoint, 200, None)
        };
        if let Some(c) = &s.cache {
            let e = &c.explanation;
            r.cache_source = e.source().as_str().to_owned();
            r.session_restore_mode = e.mode.to_string();
            r.cache_miss_reason = e.miss.as_ref().map(|m| m.name());
            r.restore_s = Some(c.restore_s);
            r.ssd_read = c.ssd.as_ref().map(SsdRead::from);
            r.bank_committed = Some(c.committed);
            for (key, value) in &e.log_fields() {
                let num = match value {
                    mtplx_bank::LogValue::Num(n) => Some(*n),
                    mtplx_bank::LogValue::Str(_) => None,
                };
                match (*key, value) {
                    ("ssd_cached_tokens", _) => r.ssd_cached_tokens = num,
                    ("entry_prefix_len", _) => r.entry_prefix_len = num,
                    ("ram_entry_state", mtplx_bank::LogValue::Str(v)) => {
                        r.ram_entry_state = Some(v.clone())
                    }
                    ("prefix_divergence_token", _) => r.prefix_divergence_token = num,
                    ("refused_candidates", mtplx_bank::LogValue::Str(v)) => {
                        r.refused_candidates = Some(v.clone())
                    }
                    _ => {}
                }
            }
        }
        r
    }

    /// A request refused or failed with `e`.
    pub fn from_error(request_id: &str, endpoint: &'static str, e: &crate::ApiError) -> Self {
        let mut r = Record::failed(request_id, endpoint, e.status.as_u16(), e.code);
        if let Some(&(reason, when)) = e.refusal.as_deref() {
            r.refusal_reason = Some(reason);
            r.retry_when = Some(when);
        }
        r
    }

    /// A request that failed before or in the engine.
    pub fn failed(
        request_id: &str,
        endpoint: &'static str,
        status: u16,
        error_code: Option<&'static str>,
    ) -> Self {
        Record {
            ts: now(),
            request_id: request_id.to_owned(),
            endpoint,
            status,
            error_code,
            prompt_hash: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            new_prefill_tokens: 0,
            completion_tokens: 0,
            ttft_s: None,
            prompt_tps: None,
            decode_tok_s: None,
            finish_reason: None,
            cache_source: "none".into(),
            session_restore_mode: "cold".into(),
            cache_miss_reason: None,
            ssd_cached_tokens: None,
            entry_prefix_len: None,
            ram_entry_state: None,
            prefix_divergence_token: None,
            refused_candidates: None,
            restore_s: None,
            ssd_read: None,
            session_source: None,
            session_hash: None,
            bank_committed: None,
            refusal_reason: None,
            retry_when: None,
            generation_mode: None,
            proposer: None,
            drafted_by_depth: Vec::new(),
            accepted_by_depth: Vec::new(),
            verify_calls: 0,
            mean_acceptance_length: None,
        }
    }
}

/// The log file, shared by the engine and the handlers.
#[derive(Debug)]
pub struct RequestLog {
    path: PathBuf,
    file: Mutex<RotatingFile>,
}

impl RequestLog {
    pub fn new(path: &Path, rotation: Rotation) -> Self {
        RequestLog {
            path: path.to_path_buf(),
            file: Mutex::new(RotatingFile::new(path, rotation)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record`. A failing disk is reported in the server's log, never to the
    /// client.
    pub fn append(&self, record: &Record) {
        let line = match serde_json::to_string(record) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("request log: {e}");
                return;
            }
        };
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f.write_line(&line) {
            tracing::warn!("request log {}: {e}", self.path.display());
        }
    }
}

/// Where the log goes by default: `$MTPLX_HOME/logs/request-log-<port>.jsonl`.
pub fn default_path(port: u16) -> PathBuf {
    mtplx_model::store::mtplx_home()
        .join("logs")
        .join(format!("request-log-{port}.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_one_json_object_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = RequestLog::new(&dir.path().join("r.jsonl"), Rotation::default());
        log.append(&Record::failed("a", "/v1/completions", 400, Some("x")));
        log.append(&Record::failed("b", "/v1/completions", 401, None));
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["status"], 400);
        assert_eq!(lines[1]["request_id"], "b");
        assert_eq!(lines[1]["session_restore_mode"], "cold");
    }
}

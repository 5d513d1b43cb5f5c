//! Server metrics, rendered in the Prometheus text format at `GET /metrics`.

mod family;
mod histogram;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use family::Family;
pub use histogram::Histogram;

use crate::job::Summary;

const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const RATE_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
];

/// The Prometheus type of a single-valued metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// Writes one unlabelled metric with its HELP and TYPE lines.
pub fn write_scalar(out: &mut String, kind: Kind, name: &str, help: &str, value: u64) {
    let kind = match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    };
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// Everything `/metrics` reports. Shared by the layers, the handlers and the engine.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    generations: Mutex<BTreeMap<&'static str, u64>>,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub prefill_tokens: AtomicU64,
    /// Decode steps the engine ran (one sampled token each).
    pub decode_steps: AtomicU64,
    /// Jobs waiting for the engine.
    pub queued: AtomicU64,
    pub ttft: Histogram,
    pub decode_rate: Histogram,
    pub prompt_rate: Histogram,
    /// Draft tokens verified, by depth.
    pub spec_drafted: Family,
    /// Draft tokens accepted, by depth.
    pub spec_accepted: Family,
    /// Generations by `generation_mode` as run.
    pub modes: Family,
    /// Generations by `session_restore_mode`.
    pub restores: Family,
    /// Generations that reused nothing, by `cache_miss_reason`.
    pub misses: Family,
    /// Prompt tokens restored instead of computed.
    pub cached_tokens: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            generations: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            decode_rate: Histogram::new(RATE_BUCKETS),
            prompt_rate: Histogram::new(RATE_BUCKETS),
            spec_drafted: Family::new(
                "mtplx_spec_drafted_tokens_total",
                "Draft tokens verified, by draft depth.",
                "depth",
            ),
            spec_accepted: Family::new(
                "mtplx_spec_accepted_tokens_total",
                "Draft tokens accepted, by draft depth.",
                "depth",
            ),
            modes: Family::new(
                "mtplx_generation_mode_total",
                "Generations by the mode that ran.",
                "mode",
            ),
            restores: Family::new(
                "mtplx_restores_total",
                "Generations by how their prompt's K/V was found.",
                "mode",
            ),
            misses: Family::new(
                "mtplx_cache_misses_total",
                "Generations that reused nothing, by reason.",
                "reason",
            ),
            cached_tokens: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts a response; `route` is a known route name or `other`.
    pub fn count_request(&self, route: &'static str, status: u16) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((route, status))
            .or_default() += 1;
    }

    /// Responses counted for `route` with `status`.
    pub fn requests(&self, route: &'static str, status: u16) -> u64 {
        let map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(route, status)).copied().unwrap_or(0)
    }

    /// Generations that ended with `label` (see [`crate::job::Finish::label`], or
    /// `error`).
    pub fn generations(&self, label: &str) -> u64 {
        let map = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        map.get(label).copied().unwrap_or(0)
    }

    pub fn count_generation(&self, label: &'static str) {
        *self
            .generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(label)
            .or_default() += 1;
    }

    /// Records a finished generation.
    pub fn record(&self, s: &Summary) {
        self.count_generation(s.finish.label());
        self.prompt_tokens
            .fetch_add(s.prompt_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(s.completion_tokens as u64, Ordering::Relaxed);
        self.prefill_tokens
            .fetch_add(s.new_prefill_tokens as u64, Ordering::Relaxed);
        if let Some(t) = s.ttft_s {
            self.ttft.observe(t);
        }
        if let Some(r) = s.decode_tok_s() {
            self.decode_rate.observe(r);
        }
        if let Some(r) = s.prompt_tps() {
            self.prompt_rate.observe(r);
        }
        self.modes.add(s.mode.as_str(), 1);
        self.cached_tokens
            .fetch_add(s.cached_tokens as u64, Ordering::Relaxed);
        if let Some(c) = &s.cache {
            self.restores.add(c.explanation.mode.as_str(), 1);
            if let Some(reason) = &c.explanation.miss {
                self.misses.add(reason.name(), 1);
            }
        }
        if let Some(spec) = &s.spec {
            let by_depth = spec
                .stats
                .drafted_by_depth
                .iter()
                .zip(&spec.stats.accepted_by_depth);
            for (d, (&drafted, &accepted)) in by_depth.enumerate() {
                self.spec_drafted.add((d + 1).to_string(), drafted);
                self.spec_accepted.add((d + 1).to_string(), accepted);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP mtplx_requests_total HTTP responses by route and status.\n");
        out.push_str("# TYPE mtplx_requests_total counter\n");
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mtplx_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP mtplx_generations_total Generations by how they ended.\n");
        out.push_str("# TYPE mtplx_generations_total counter\n");
        for (reason, n) in self
            .generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mtplx_generations_total{{finish_reason=\"{reason}\"}} {n}"
            );
        }
        let counters = [
            (
                "mtplx_prompt_tokens_total",
                "Prompt tokens received.",
                &self.prompt_tokens,
            ),
            (
                "mtplx_completion_tokens_total",
                "Tokens generated.",
                &self.completion_tokens,
            ),
            (
                "mtplx_prefill_tokens_total",
                "Prompt tokens run through the model.",
                &self.prefill_tokens,
            ),
            (
                "mtplx_decode_steps_total",
                "Decode steps run by the engine.",
                &self.decode_steps,
            ),
        ];
        for (name, help, v) in counters {
            write_scalar(
                &mut out,
                Kind::Counter,
                name,
                help,
                v.load(Ordering::Relaxed),
            );
        }
        write_scalar(
            &mut out,
            Kind::Gauge,
            "mtplx_queue_depth",
            "Jobs waiting for the engine.",
            self.queued.load(Ordering::Relaxed),
        );
        self.ttft
            .render(&mut out, "mtplx_ttft_seconds", "Time to first token.");
        self.decode_rate.render(
            &mut out,
            "mtplx_decode_tokens_per_second",
            "Decode rate per generation.",
        );
        self.prompt_rate.render(
            &mut out,
            "mtplx_prefill_tokens_per_second",
            "Prefill rate per generation.",
        );
        self.modes.render(&mut out);
        self.restores.render(&mut out);
        self.misses.render(&mut out);
        write_scalar(
            &mut out,
            Kind::Counter,
            "mtplx_cached_tokens_total",
            "Prompt tokens restored instead of computed.",
            self.cached_tokens.load(Ordering::Relaxed),
        );
        self.spec_drafted.render(&mut out);
        self.spec_accepted.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Finish;

    #[test]
    fn renders_counts_and_histograms() {
        let m = Metrics::default();
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 400);
        m.record(&Summary {
            finish: Finish::Length,
            prompt_tokens: 7,
            cached_tokens: 0,
            new_prefill_tokens: 7,
            completion_tokens: 3,
            ttft_s: Some(0.2),
            prefill_s: 0.1,
            decode_s: 0.5,
            prompt_hash: String::new(),
            mode: crate::job::GenerationMode::Mtp,
            spec: Some(crate::job::SpecSummary {
                proposer: "lookup",
                stats: mtplx_spec::SpecStats {
                    drafted_by_depth: vec![4, 2],
                    accepted_by_depth: vec![3, 1],
                    verify_calls: 4,
                    ..Default::default()
                },
            }),
            session: None,
            cache: Some(crate::job::CacheSummary {
                explanation: mtplx_bank::Explanation {
                    mode: mtplx_bank::RestoreMode::Clone,
                    ..mtplx_bank::Explanation::cold(10, None)
                },
                restore_s: 0.01,
                ssd: None,
                committed: true,
            }),
        });
        let text = m.render();
        assert!(text
            .contains("mtplx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"));
        assert!(text.contains("status=\"400\"} 1\n"));
        assert!(text.contains("mtplx_generations_total{finish_reason=\"length\"} 1\n"));
        assert!(text.contains("mtplx_prompt_tokens_total 7\n"));
        assert!(text.contains("mtplx_completion_tokens_total 3\n"));
        assert!(text.contains("mtplx_ttft_seconds_count 1\n"));
        assert!(text.contains("mtplx_decode_tokens_per_second_sum 4\n"));
        assert_eq!(m.generations("length"), 1);
        assert!(text.contains("mtplx_spec_accepted_tokens_total{depth=\"2\"} 1\n"));
        assert!(text.contains("mtplx_generation_mode_total{mode=\"mtp\"} 1\n"));
        assert!(text.contains("mtplx_restores_total{mode=\"clone\"} 1\n"));
    }
}

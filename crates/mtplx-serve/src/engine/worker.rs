//! The model owner: runs one job at a time on its own thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use mtplx_bank::{Commit, Explanation};
use mtplx_kv::KvCache;
use mtplx_model::mtp::MtpHead;
use mtplx_model::stop::StopMatcher;
use mtplx_model::{Bundle, LanguageModel, Want};
use mtplx_spec::TrunkRows;
use tokio::sync::mpsc;

use super::config::{EngineConfig, StopSignal};
use super::decode::{self, Decoding};
use super::error::EngineError;
use crate::cache::CacheTier;
use crate::job::{
    prompt_hash, CacheSummary, Event, Finish, GenerationMode, Job, RestoreOutcome, SpecSummary,
    Summary,
};
use crate::metrics::Metrics;
use crate::request_log::{Record, RequestLog};

/// Runs jobs on the engine thread; the bank behind `tier` keeps their caches after.
pub(super) struct Worker {
    pub bundle: Arc<Bundle>,
    pub config: EngineConfig,
    /// The loaded `config.speculation.head`.
    pub mtp_head: Option<Arc<MtpHead>>,
    pub tier: CacheTier,
    pub metrics: Arc<Metrics>,
    pub log: Option<Arc<RequestLog>>,
    /// Set when the server stops: generations end at their next step.
    pub stop: StopSignal,
}

impl Worker {
    pub fn new(
        bundle: Arc<Bundle>,
        config: EngineConfig,
        mtp_head: Option<Arc<MtpHead>>,
        tier: CacheTier,
        metrics: Arc<Metrics>,
        log: Option<Arc<RequestLog>>,
        stop: StopSignal,
    ) -> Self {
        Worker {
            bundle,
            config,
            mtp_head,
            tier,
            metrics,
            log,
            stop,
        }
    }

    /// Runs `job`, streaming its events to `tx`, then records it.
    pub fn run(&mut self, mut job: Job, tx: mpsc::Sender<Event>) {
        let restore = job.restore.take().unwrap_or_else(|| RestoreOutcome {
            cache: None,
            explanation: Explanation::cold(job.prompt.len(), None),
            restore_s: 0.0,
        });
        let mut cache = restore.cache.unwrap_or_else(|| {
            self.tier
                .factory()
                .new_cache(self.bundle.model.config().kv_shape())
        });
        let mut tokens = Vec::new();
        let result = self.generate(&job, cache.as_mut(), &mut tokens, &tx);
        let committed = self.commit(&job, cache.as_ref(), &tokens);
        let result = result.map(|mut summary| {
            summary.session = job
                .resolved
                .as_ref()
                .map(|r| (r.id.as_str().to_owned(), r.source.as_str()));
            summary.cache = Some(CacheSummary {
                explanation: restore.explanation,
                restore_s: restore.restore_s,
                committed,
            });
            summary
        });
        match result {
            // Stopped by a shutdown, not by its client: say so (what it had is committed).
            Ok(summary) if summary.finish == Finish::Cancelled && self.stop.is_stopped() => {
                self.metrics.count_generation("shutdown");
                if let Some(log) = &self.log {
                    log.append(&Record {
                        status: 503,
                        error_code: Some("server_shutting_down"),
                        ..Record::finished(&job.request_id, job.endpoint, &summary)
                    });
                }
                let _ = tx.blocking_send(Event::Failed(
                    "The server is shutting down: the generation was stopped (the \
                     conversation so far is kept); retry once it is back."
                        .into(),
                ));
            }
            Ok(summary) => {
                self.metrics.record(&summary);
                if let Some(log) = &self.log {
                    log.append(&Record::finished(&job.request_id, job.endpoint, &summary));
                }
                let _ = tx.blocking_send(Event::Done(Box::new(summary)));
            }
            Err(e) => {
                tracing::error!(request_id = %job.request_id, "generation failed: {e}");
                self.metrics.count_generation("error");
                if let Some(log) = &self.log {
                    log.append(&Record::failed(
                        &job.request_id,
                        job.endpoint,
                        500,
                        Some("model_error"),
                    ));
                }
                let _ = tx.blocking_send(Event::Failed(format!("generation failed: {e}")));
            }
        }
    }

    /// Commits what the cache holds (the prompt and the answer so far, cancelled or not) to
    /// the bank under the job's session. Returns whether it was kept.
    fn commit(&self, job: &Job, cache: &dyn KvCache, tokens: &[u32]) -> bool {
        let Some(resolved) = &job.resolved else {
            return false;
        };
        let held = cache.len();
        if held == 0 || tokens.len() < held {
            return false;
        }
        let commit = Commit {
            session: resolved.id.clone(),
            identity: self.tier.identity().clone(),
            tokens: tokens[..held].to_vec(),
            kv: cache.snapshot(),
            continuation: None,
            checkpoints: None,
        };
        match self.tier.bank().commit(commit) {
            Ok(report) => report.kept,
            Err(e) => {
                tracing::warn!(request_id = %job.request_id, "session commit failed: {e}");
                false
            }
        }
    }

    /// Generates into `cache` (which holds a prefix of the prompt, maybe empty), leaving in
    /// `tokens` every token whose K/V the cache may hold.
    fn generate(
        &mut self,
        job: &Job,
        cache: &mut dyn KvCache,
        tokens: &mut Vec<u32>,
        tx: &mpsc::Sender<Event>,
    ) -> Result<Summary, EngineError> {
        let Worker {
            bundle,
            config,
            metrics,
            mtp_head,
            stop,
            ..
        } = self;
        let (model, tokenizer) = (&bundle.model, &bundle.tokenizer);
        let prompt = &job.prompt;
        let chunk = config.prefill_chunk_tokens.max(1);
        let mut summary = Summary {
            finish: Finish::Cancelled,
            prompt_tokens: prompt.len(),
            cached_tokens: 0,
            new_prefill_tokens: 0,
            completion_tokens: 0,
            ttft_s: None,
            prefill_s: 0.0,
            decode_s: 0.0,
            prompt_hash: prompt_hash(prompt),
            mode: GenerationMode::Ar,
            spec: None,
            session: None,
            cache: None,
        };

        // The restored prefix (always short of the whole prompt: the last token is run to
        // get logits).
        let reused = cache.len().min(prompt.len() - 1);
        cache.truncate(reused);
        summary.cached_tokens = reused;
        *tokens = prompt.clone();

        // Prefill the rest but the last prompt token chunk by chunk, so a client that
        // leaves during a long prefill stops it within one chunk.
        let prefill_start = Instant::now();
        let mut proposer =
            decode::proposer(model, mtp_head.as_ref(), job.mode, &config.speculation);
        // An MTP head drafts from the trunk's hidden rows: it sees the prompt's as they are
        // computed (the restored prefix has none; the head's context starts after it).
        let hidden = proposer.as_ref().is_some_and(|p| p.wants_hidden());
        let want = if hidden { Want::Hidden } else { Want::Nothing };
        let mut pos = reused;
        for piece in prompt[reused..prompt.len() - 1].chunks(chunk) {
            if tx.is_closed() || stop.is_stopped() {
                summary.prefill_s = prefill_start.elapsed().as_secs_f64();
                return Ok(summary);
            }
            let out = model.forward(piece, cache, want)?;
            if let Some(p) = proposer.as_mut().filter(|_| hidden) {
                p.observe(&TrunkRows {
                    pos,
                    hidden: &out.hidden,
                    next: &prompt[pos + 1..pos + 1 + piece.len()],
                })?;
            }
            pos += piece.len();
            summary.new_prefill_tokens += piece.len();
        }
        let mut gen = Decoding::start(
            model,
            cache,
            prompt,
            job.sampler.clone(),
            chunk,
            proposer,
            &config.speculation,
        )?;
        summary.new_prefill_tokens += 1;
        if !matches!(gen, Decoding::Plain(_)) {
            summary.mode = GenerationMode::Mtp;
        }
        summary.prefill_s = prefill_start.elapsed().as_secs_f64();

        let mut decoder = tokenizer.stream_decoder(true);
        let mut stops = StopMatcher::new(job.stop.iter().cloned());
        // What was fed to the stop matcher and what it let through, to name the stop
        // string that ended the text.
        let (mut fed, mut emitted) = (String::new(), String::new());
        let mut first_token_at = None;
        let send = |text: String, emitted: &mut String| -> bool {
            if text.is_empty() {
                return true;
            }
            emitted.push_str(&text);
            tx.blocking_send(Event::Text(text)).is_ok()
        };
        let is_stop = |t: u32| !job.ignore_eos && tokenizer.is_stop(t);
        let finish = 'outer: loop {
            if summary.completion_tokens >= job.max_tokens {
                break Finish::Length;
            }
            let room = config
                .context_window
                .saturating_sub(prompt.len() + summary.completion_tokens);
            if room == 0 || !gen.has_room() {
                break Finish::ContextFull;
            }
            if tx.is_closed() || stop.is_stopped() {
                break Finish::Cancelled;
            }
            let tokens = gen.next(
                (job.max_tokens - summary.completion_tokens).min(room),
                &is_stop,
            )?;
            if tokens.is_empty() {
                break Finish::ContextFull;
            }
            metrics.decode_steps.fetch_add(1, Ordering::Relaxed);
            for token in tokens {
                summary.completion_tokens += 1;
                let now = Instant::now();
                if first_token_at.is_none() {
                    first_token_at = Some(now);
                    summary.ttft_s = Some(now.duration_since(job.received).as_secs_f64());
                }
                summary.decode_s = now
                    .duration_since(first_token_at.expect("set above"))
                    .as_secs_f64();
                if is_stop(token) {
                    break 'outer Finish::StopToken;
                }
                if let Some(piece) = decoder.push(token)? {
                    fed.push_str(&piece);
                    let out = stops.push(&piece);
                    if !send(out, &mut emitted) {
                        break 'outer Finish::Cancelled;
                    }
                    if stops.stopped() {
                        break 'outer Finish::StopSequence(matched_stop(&job.stop, &fed, &emitted));
                    }
                }
            }
        };
        summary.spec = gen.stats().map(|(proposer, stats)| SpecSummary {
            proposer,
            stats: stats.clone(),
        });
        tokens.clear();
        tokens.extend_from_slice(gen.tokens());
        summary.finish = match finish {
            Finish::Cancelled | Finish::StopSequence(_) => finish,
            _ => {
                let tail = decoder.finish();
                fed.push_str(&tail);
                let mut out = stops.push(&tail);
                if stops.stopped() {
                    send(out, &mut emitted);
                    Finish::StopSequence(matched_stop(&job.stop, &fed, &emitted))
                } else {
                    out.push_str(&stops.finish());
                    if send(out, &mut emitted) {
                        finish
                    } else {
                        Finish::Cancelled
                    }
                }
            }
        };
        Ok(summary)
    }
}

/// The stop string that starts where the emitted text ends.
fn matched_stop(stops: &[String], fed: &str, emitted: &str) -> String {
    let rest = fed.get(emitted.len()..).unwrap_or_default();
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .find(|s| rest.starts_with(s.as_str()))
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_stop_string_that_cut_the_text() {
        let stops = ["END".to_string(), "\n\n".to_string()];
        assert_eq!(matched_stop(&stops, "abc\n\nxEND", "abc"), "\n\n");
        assert_eq!(matched_stop(&stops, "abENDc", "ab"), "END");
    }
}

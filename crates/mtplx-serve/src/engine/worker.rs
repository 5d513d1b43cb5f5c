//! The model owner: runs one job at a time on its own thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use mtplx_kv::{CacheFactory, KvCache};
use mtplx_model::stop::StopMatcher;
use mtplx_model::{Bundle, LanguageModel, Want};
use tokio::sync::mpsc;

use super::decode::Decoding;
use super::error::EngineError;
use super::job::{prompt_hash, Event, Finish, GenerationMode, Job, SpecSummary, Summary};
use super::EngineConfig;
use crate::metrics::Metrics;
use crate::request_log::{Record, RequestLog};

/// Owns the model's KV cache; everything else is shared read-only.
pub(super) struct Worker {
    pub bundle: Arc<Bundle>,
    pub config: EngineConfig,
    pub metrics: Arc<Metrics>,
    pub log: Option<Arc<RequestLog>>,
    pub cache: Box<dyn KvCache>,
}

impl Worker {
    pub fn new(
        bundle: Arc<Bundle>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        log: Option<Arc<RequestLog>>,
    ) -> Self {
        let cache = CacheFactory::contiguous().new_cache(bundle.model.config().kv_shape());
        Worker {
            bundle,
            config,
            metrics,
            log,
            cache,
        }
    }

    /// Runs `job`, streaming its events to `tx`, then records it.
    pub fn run(&mut self, job: Job, tx: mpsc::Sender<Event>) {
        match self.generate(&job, &tx) {
            Ok(summary) => {
                self.metrics.record(&summary);
                if let Some(log) = &self.log {
                    log.append(&Record::finished(&job.request_id, job.endpoint, &summary));
                }
                let _ = tx.blocking_send(Event::Done(summary));
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

    fn generate(&mut self, job: &Job, tx: &mpsc::Sender<Event>) -> Result<Summary, EngineError> {
        let Worker {
            bundle,
            config,
            metrics,
            cache,
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
        };

        // Prefill all but the last prompt token chunk by chunk, so a client that leaves
        // during a long prefill stops it within one chunk.
        let prefill_start = Instant::now();
        cache.truncate(0);
        for piece in prompt[..prompt.len().saturating_sub(1)].chunks(chunk) {
            if tx.is_closed() {
                summary.prefill_s = prefill_start.elapsed().as_secs_f64();
                return Ok(summary);
            }
            model.forward(piece, cache.as_mut(), Want::Nothing)?;
            summary.new_prefill_tokens += piece.len();
        }
        let mut gen = Decoding::start(
            model,
            cache.as_mut(),
            prompt,
            job.sampler.clone(),
            chunk,
            job.mode,
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
            if tx.is_closed() {
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

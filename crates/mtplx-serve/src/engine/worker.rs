//! The model owner: runs one job at a time on its own thread: restore → drive → commit →
//! log.

use mtplx_model::tokenizer::SpecialText;
use std::sync::Arc;

use mtplx_bank::{Commit, Explanation};
use mtplx_kv::Sequence;
use mtplx_model::Bundle;
use mtplx_spec::{drive, End, Request};
use tokio::sync::mpsc;

use super::config::{EngineConfig, StopSignal};
use super::error::EngineError;
use super::speculation::{self, Head};
use super::text::TextOut;
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
    /// The loaded `config.speculation.head`, with the factory of its own cache.
    pub mtp_head: Option<Head>,
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
        mtp_head: Option<Head>,
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
            sequence: None,
            explanation: Explanation::cold(job.prompt.len(), None),
            restore_s: 0.0,
            ssd: None,
        });
        let mut seq = restore
            .sequence
            .unwrap_or_else(|| Sequence::new(self.tier.factory(), self.tier.shape()));
        let mut tokens = Vec::new();
        let result = self.generate(&job, &mut seq, &mut tokens, &tx);
        let committed = self.commit(&job, &mut seq, &tokens);
        let result = result.map(|mut summary| {
            summary.session = job
                .resolved
                .as_ref()
                .map(|r| (r.id.as_str().to_owned(), r.source.as_str()));
            summary.cache = Some(CacheSummary {
                explanation: restore.explanation,
                restore_s: restore.restore_s,
                ssd: restore.ssd,
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

    /// Commits what the sequence holds (the prompt and the answer so far, cancelled or not)
    /// to the bank under the job's session, with a hybrid model's checkpoints (one at its
    /// end, so the whole state comes back). Returns whether it was kept.
    fn commit(&self, job: &Job, seq: &mut Sequence, tokens: &[u32]) -> bool {
        let Some(resolved) = &job.resolved else {
            return false;
        };
        let held = seq.len();
        if held == 0 || tokens.len() < held {
            return false;
        }
        seq.checkpoint();
        let commit = Commit {
            session: resolved.id.clone(),
            identity: self.tier.identity().clone(),
            tokens: tokens[..held].to_vec(),
            kv: seq.kv().snapshot(),
            continuation: None,
            checkpoints: seq.checkpoints().map(<[_]>::to_vec),
        };
        match self.tier.bank().commit(commit) {
            Ok(report) => report.kept,
            Err(e) => {
                tracing::warn!(request_id = %job.request_id, "session commit failed: {e}");
                false
            }
        }
    }

    /// Generates into `seq` (which holds a prefix of the prompt, maybe empty), leaving in
    /// `tokens` every token the sequence may hold.
    fn generate(
        &mut self,
        job: &Job,
        seq: &mut Sequence,
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
        let (model, tokenizer) = (bundle.model.as_ref(), &bundle.tokenizer);
        let is_stop = |t: u32| !job.ignore_eos && tokenizer.is_stop(t);
        let request = Request {
            prompt: &job.prompt,
            sampler: job.sampler.clone(),
            max_tokens: job.max_tokens,
            context_window: config.context_window,
            chunk: config.prefill_chunk_tokens.max(1),
            is_stop: &is_stop,
        };
        let decode = speculation::decode(model, mtp_head.as_ref(), job.mode, &config.speculation);
        let mut text = TextOut::new(
            tokenizer.stream_decoder(SpecialText::Skip),
            &job.stop,
            tx,
            stop,
            metrics,
        );
        let mut report = drive(model, seq, &request, decode, &mut text)?;
        *tokens = std::mem::take(&mut report.tokens);
        let finish = match report.end {
            End::Cancelled => Finish::Cancelled,
            End::Observer => match text.take_ended() {
                Some(ended) => ended?,
                None => Finish::Cancelled,
            },
            End::StopToken => text.finish(Finish::StopToken),
            End::Length => text.finish(Finish::Length),
            End::ContextFull => text.finish(Finish::ContextFull),
        };
        Ok(Summary {
            finish,
            prompt_tokens: job.prompt.len(),
            cached_tokens: report.cached_tokens,
            new_prefill_tokens: report.new_prefill_tokens,
            completion_tokens: report.completion_tokens,
            ttft_s: report
                .first_token_at
                .map(|t| t.duration_since(job.received).as_secs_f64()),
            prefill_s: report.prefill_s,
            decode_s: report.decode_s(),
            prompt_hash: prompt_hash(&job.prompt),
            mode: if report.speculation.is_some() {
                GenerationMode::Mtp
            } else {
                GenerationMode::Ar
            },
            spec: report.speculation.map(|s| SpecSummary {
                proposer: s.proposer,
                stats: s.stats,
            }),
            session: None,
            cache: None,
        })
    }
}

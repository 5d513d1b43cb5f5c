//! A lookup's decision, and the restore that consumes it.

use std::sync::{Arc, Mutex};

use mtplx_cold::{
    ColdCandidate, ColdIndex, MissReason as ColdMiss, RestoreErrorKind, RestoreReport,
};
use mtplx_kv::{CacheFactory, KvCache, RecurrentState, Sequence, StateShape};

use crate::candidate::{Candidate, CandidateWatch, Handle};
use crate::convert::{continuation_from_tail, recurrent_from_cold};
use crate::entry::Entry;
use crate::explain::{Explanation, MissReason, RefusalReason, Refused, RestoreMode};
use crate::matching::Point;
use crate::sink::CacheSink;
use crate::stats::Stats;
use crate::{BankError, Continuation};

/// What a lookup decided: the one candidate it serves (if any) and why. It owns only that
/// candidate; every other one was dropped when the plan was made. [`Plan::restore`]
/// consumes it, so the served candidate is dropped as soon as its rows are in the new
/// cache, before the caller prefills anything.
pub struct Plan {
    pub(crate) chosen: Option<Arc<Candidate>>,
    pub(crate) explanation: Explanation,
    pub(crate) watch: CandidateWatch,
    pub(crate) cold: Option<Arc<dyn ColdIndex>>,
    pub(crate) stats: Arc<Mutex<Stats>>,
}

/// A restored sequence, ready for the suffix prefill.
pub struct Restored {
    /// Its K/V built by the caller's factory, in its layout, holding the first
    /// `explanation.cached_tokens` positions of the prompt; for a hybrid model with the
    /// recurrent state at that point (recorded as its first checkpoint).
    pub sequence: Sequence,
    /// Set exactly when the cache covers the whole prompt: the logits (and MTP state) to
    /// continue from, since no prompt token is left to prefill.
    pub continuation: Option<Continuation>,
    /// The lookup's account, updated if an SSD restore failed and fell back to cold.
    pub explanation: Explanation,
    /// What the SSD tier read, for an SSD restore.
    pub ssd_report: Option<RestoreReport>,
}

impl Restored {
    /// Prompt positions the sequence holds; prefill the prompt from here.
    pub fn prefix_len(&self) -> usize {
        self.sequence.len()
    }
}

impl Plan {
    /// The account of the lookup.
    pub fn explanation(&self) -> &Explanation {
        &self.explanation
    }

    /// How the restore will build the cache.
    pub fn mode(&self) -> RestoreMode {
        self.explanation.mode
    }

    /// Prompt tokens the restore will deliver.
    pub fn cached_tokens(&self) -> usize {
        self.explanation.cached_tokens
    }

    /// Weak references to every valid candidate the lookup found.
    pub fn watch(&self) -> CandidateWatch {
        self.watch.clone()
    }

    /// Builds the request's sequence of `shape` through `factory` (whatever the source: RAM
    /// and SSD restores alike; an empty one for a cold start). An SSD restore that fails (a
    /// blob gone or damaged) falls back to an empty sequence and names the miss
    /// (`ssd_restore_error:<kind>`, …); it is not an error.
    pub fn restore(
        self,
        factory: &CacheFactory,
        shape: &StateShape,
    ) -> Result<Restored, BankError> {
        let Plan {
            chosen,
            explanation,
            cold,
            stats,
            ..
        } = self;
        let restored = match chosen {
            None => Ok(cold_start(factory, shape, explanation)),
            Some(c) => {
                let c = Arc::try_unwrap(c)
                    .unwrap_or_else(|_| unreachable!("a plan owns its candidate"));
                match c.handle {
                    Handle::Ram(entry) => ram(entry, c.point, factory, shape, explanation),
                    Handle::Ssd(ref candidate) => {
                        let index = cold
                            .as_deref()
                            .expect("an SSD candidate comes from a cold tier");
                        Ok(ssd(
                            index,
                            candidate,
                            &c,
                            factory,
                            shape,
                            explanation,
                            &stats,
                        ))
                    }
                }
            }
        }?;
        crate::sync::lock(&stats).record(&restored.explanation);
        Ok(restored)
    }
}

fn cold_start(factory: &CacheFactory, shape: &StateShape, explanation: Explanation) -> Restored {
    Restored {
        sequence: Sequence::new(factory, shape),
        continuation: None,
        explanation,
        ssd_report: None,
    }
}

/// Restores a RAM entry to `point` (with its continuation when the point says so).
fn ram(
    entry: Arc<Entry>,
    point: Point,
    factory: &CacheFactory,
    shape: &StateShape,
    explanation: Explanation,
) -> Result<Restored, BankError> {
    let stored = entry.kv.shape();
    if stored != shape.kv {
        return Err(BankError::ShapeMismatch {
            asked: shape.kv,
            stored,
        });
    }
    let cache = factory.restore(&*entry.kv, point.at)?;
    let recurrent = entry
        .checkpoints
        .iter()
        .flatten()
        .find(|cp| cp.position == point.at)
        .map(|cp| cp.state.to_state());
    let sequence = Sequence::from_parts(shape, cache, recurrent)?;
    let continuation = point
        .continuation
        .then(|| entry.continuation.clone())
        .flatten();
    Ok(Restored {
        sequence,
        continuation,
        explanation,
        ssd_report: None,
    })
}

fn ssd(
    index: &dyn ColdIndex,
    candidate: &ColdCandidate,
    chosen: &Candidate,
    factory: &CacheFactory,
    shape: &StateShape,
    explanation: Explanation,
    stats: &Mutex<Stats>,
) -> Restored {
    let mut sink = CacheSink::new(factory, shape.kv);
    let read = read(index, candidate, chosen, &mut sink).and_then(|r| {
        // State of another shape than the model's (a foreign file under this identity) is
        // a miss, never wrong tokens.
        let sequence = Sequence::from_parts(shape, r.cache, r.recurrent)
            .map_err(|_| ColdMiss::RestoreError(RestoreErrorKind::Decode))?;
        Ok((sequence, r.continuation, r.report))
    });
    match read {
        Ok((sequence, continuation, report)) => Restored {
            sequence,
            continuation,
            explanation,
            ssd_report: Some(report),
        },
        Err(miss) => failed(factory, shape, explanation, chosen, miss, stats),
    }
}

struct Read {
    report: RestoreReport,
    cache: Box<dyn KvCache>,
    recurrent: Option<RecurrentState>,
    continuation: Option<Continuation>,
}

/// Streams the candidate into `sink` and checks that it delivered what the plan needs.
fn read(
    index: &dyn ColdIndex,
    candidate: &ColdCandidate,
    chosen: &Candidate,
    sink: &mut CacheSink<'_>,
) -> Result<Read, ColdMiss> {
    let decode = ColdMiss::RestoreError(RestoreErrorKind::Decode);
    let report = index
        .restore(candidate, sink)
        .map_err(|e| e.miss_reason())?;
    let cache = sink
        .cache
        .take()
        .filter(|c| c.len() == candidate.restore_point)
        .ok_or(ColdMiss::RestoreError(RestoreErrorKind::Sink))?;
    let recurrent = match (&candidate.checkpoints, sink.recurrent.take()) {
        (None, _) => None,
        (Some(_), Some(cp)) => Some(recurrent_from_cold(&cp).ok_or(decode)?),
        (Some(_), None) => return Err(decode),
    };
    let continuation = match chosen.point.continuation {
        true => Some(sink.tail.take().map(continuation_from_tail).ok_or(decode)?),
        false => None,
    };
    Ok(Read {
        report,
        cache,
        recurrent,
        continuation,
    })
}

/// The chosen SSD candidate could not be read: start cold and say why.
fn failed(
    factory: &CacheFactory,
    shape: &StateShape,
    mut explanation: Explanation,
    chosen: &Candidate,
    miss: ColdMiss,
    stats: &Mutex<Stats>,
) -> Restored {
    crate::sync::lock(stats).ssd_restore_failures += 1;
    explanation.refused.insert(
        0,
        Refused {
            mode: chosen.mode,
            covered: Some(chosen.covered),
            restore_point: Some(chosen.point.at),
            reason: RefusalReason::Ssd(miss),
        },
    );
    explanation.mode = RestoreMode::Cold;
    explanation.covered_tokens = 0;
    explanation.cached_tokens = 0;
    explanation.entry_tokens = None;
    explanation.continuation = false;
    explanation.spill_queued = false;
    explanation.miss = Some(MissReason::Ssd(miss));
    cold_start(factory, shape, explanation)
}

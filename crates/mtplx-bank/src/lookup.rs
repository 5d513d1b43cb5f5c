//! Gathering candidates from every source and choosing by coverage, from metadata only.

use std::sync::Arc;

use mtplx_cold::{ColdCandidate, ColdLookup, Identity, MissReason as ColdMiss};

use crate::candidate::{Candidate, CandidateWatch, Handle};
use crate::config::Matching;
use crate::entry::Entry;
use crate::explain::{Explanation, MissReason, RefusalReason, Refused, RestoreMode};
use crate::matching::{classify, common_prefix, restore_point, Kind, Shape};
use crate::SessionId;

/// A prompt to find a stored state for.
#[derive(Debug, Clone, Copy)]
pub struct LookupQuery<'a> {
    pub identity: &'a Identity,
    pub prompt: &'a [u32],
    /// The request's session, if known: it marks the session active, and names an
    /// `evicted` miss.
    pub session: Option<&'a SessionId>,
    /// The lowest restore point accepted for a hybrid state (0: any checkpoint).
    pub floor: usize,
}

/// A RAM entry a lookup may serve: resident, or evicted with its spill not yet committed.
pub(crate) struct RamEntry {
    pub(crate) entry: Arc<Entry>,
    pub(crate) spill_queued: bool,
}

/// The outcome of gathering: the winner, the account, and weak references to every valid
/// candidate. Every candidate other than the winner is dropped when this is built.
pub(crate) struct Gathered {
    pub(crate) chosen: Option<Arc<Candidate>>,
    pub(crate) explanation: Explanation,
    pub(crate) watch: CandidateWatch,
}

/// What the RAM scan saw besides candidates, for naming a miss.
#[derive(Default)]
struct Seen {
    /// Longest common prefix with an entry under the query's identity.
    same_lcp: usize,
    /// The best match under another identity: (covered, that identity).
    other: Option<(usize, Identity)>,
}

/// Chooses among `entries` (RAM) and the SSD tier's answer `cold` for `q`.
pub(crate) fn gather(
    entries: &[RamEntry],
    q: &LookupQuery<'_>,
    m: &Matching,
    cold: ColdLookup,
    session_evicted: bool,
) -> Gathered {
    let digest = q.identity.digest();
    let pl = q.prompt.len();
    let mut valid: Vec<Candidate> = Vec::new();
    let mut refused: Vec<Refused> = Vec::new();
    let mut seen = Seen::default();

    for RamEntry {
        entry: e,
        spill_queued,
    } in entries
    {
        let matched = classify(&e.tokens, q.prompt, m);
        if e.digest != digest {
            if let Some((_, covered)) = matched {
                if seen.other.as_ref().is_none_or(|o| covered > o.0) {
                    seen.other = Some((covered, e.identity.clone()));
                }
            }
            continue;
        }
        seen.same_lcp = seen.same_lcp.max(common_prefix(&e.tokens, q.prompt));
        let Some((kind, covered)) = matched else {
            continue;
        };
        let mode = match kind {
            Kind::Exact => RestoreMode::Clone,
            Kind::Near => RestoreMode::NearPrefixClone,
            Kind::Block => RestoreMode::BlockPrefixBoundaryClone,
        };
        let cps = e.checkpoint_positions();
        let shape = Shape {
            covered,
            prompt_len: pl,
            entry_len: e.tokens.len(),
            has_continuation: e.continuation.is_some(),
            checkpoints: cps.as_deref(),
        };
        match restore_point(shape, q.floor) {
            Ok(point) => valid.push(Candidate {
                mode,
                covered,
                point,
                entry_tokens: e.tokens.len(),
                spill_queued: *spill_queued,
                handle: Handle::Ram(e.clone()),
            }),
            Err(reason) => refused.push(Refused {
                mode,
                covered: Some(covered),
                restore_point: None,
                reason,
            }),
        }
    }

    let ssd = cold_candidates(&cold, q, m, &mut valid, &mut refused);

    // Rank; only the winner keeps its handle.
    valid.sort_by_key(|c| std::cmp::Reverse(c.rank()));
    let mut valid = valid.into_iter().map(Arc::new).collect::<Vec<_>>();
    let watch = CandidateWatch(valid.iter().map(Arc::downgrade).collect());
    let chosen = (!valid.is_empty()).then(|| valid.remove(0));
    for lost in valid {
        refused.push(Refused {
            mode: lost.mode,
            covered: Some(lost.covered),
            restore_point: Some(lost.point.at),
            reason: RefusalReason::LowerCoverage,
        });
    }

    let miss = chosen
        .is_none()
        .then(|| miss_reason(&refused, &seen, q.identity, session_evicted));
    let explanation = match &chosen {
        Some(c) => Explanation {
            mode: c.mode,
            prompt_tokens: pl,
            covered_tokens: c.covered,
            cached_tokens: c.point.at,
            entry_tokens: Some(c.entry_tokens),
            continuation: c.point.continuation,
            spill_queued: c.spill_queued,
            refused,
            miss,
            ssd,
        },
        None => Explanation {
            mode: RestoreMode::Cold,
            prompt_tokens: pl,
            covered_tokens: 0,
            cached_tokens: 0,
            entry_tokens: None,
            continuation: false,
            spill_queued: false,
            refused,
            miss,
            ssd,
        },
    };
    Gathered {
        chosen,
        explanation,
        watch,
    }
}

/// Whether an SSD miss says only that nothing matched (rather than that a match was
/// refused or broken).
pub(crate) fn is_quiet(m: ColdMiss) -> bool {
    matches!(
        m,
        ColdMiss::CacheOff | ColdMiss::EmptyLookup | ColdMiss::PrefixMiss
    )
}

/// Turns the SSD tier's answer into candidates and refusals; returns the tier's quiet miss
/// when it offered nothing at all.
fn cold_candidates(
    cold: &ColdLookup,
    q: &LookupQuery<'_>,
    m: &Matching,
    valid: &mut Vec<Candidate>,
    refused: &mut Vec<Refused>,
) -> Option<ColdMiss> {
    let lanes = [
        (&cold.exact, RestoreMode::SsdClone),
        (&cold.block, RestoreMode::SsdBlockPrefixBoundaryClone),
    ];
    for (answer, mode) in lanes {
        match answer {
            Ok(c) => match ssd_point(c, mode, q, m) {
                Ok(c) => valid.push(c),
                Err(reason) => refused.push(Refused {
                    mode,
                    covered: Some(c.covered),
                    restore_point: Some(c.restore_point),
                    reason,
                }),
            },
            Err(miss) if !is_quiet(*miss) => refused.push(Refused {
                mode,
                covered: None,
                restore_point: None,
                reason: RefusalReason::Ssd(*miss),
            }),
            Err(_) => {}
        }
    }
    cold.best().err().filter(|m| is_quiet(*m))
}

/// An SSD candidate with the bank's own restore point (which may back off from the
/// tier's by one token, or one checkpoint, to leave a token to prefill).
fn ssd_point(
    c: &ColdCandidate,
    mode: RestoreMode,
    q: &LookupQuery<'_>,
    m: &Matching,
) -> Result<Candidate, RefusalReason> {
    if mode == RestoreMode::SsdBlockPrefixBoundaryClone && c.covered < m.block_min_match {
        return Err(RefusalReason::BelowMinMatch);
    }
    let cps: Option<Vec<usize>> = c
        .checkpoints
        .as_ref()
        .map(|v| v.iter().map(|&p| p as usize).collect());
    let shape = Shape {
        covered: c.covered,
        prompt_len: q.prompt.len(),
        entry_len: c.entry_tokens,
        has_continuation: c.tail,
        checkpoints: cps.as_deref(),
    };
    let point = restore_point(shape, q.floor).map_err(|r| match r {
        RefusalReason::PrefixBoundaryBelowFloor => RefusalReason::Ssd(ColdMiss::BoundaryBelowFloor),
        other => other,
    })?;
    let mut cold = c.clone();
    cold.restore_point = point.at;
    cold.tail = c.tail && point.at == c.entry_tokens;
    Ok(Candidate {
        mode,
        covered: c.covered,
        point,
        entry_tokens: c.entry_tokens,
        spill_queued: false,
        handle: Handle::Ssd(cold),
    })
}

/// One reason for a miss, the most telling first: a hybrid refusal, a state under another
/// identity, a broken SSD entry, an evicted session, a diverged history, a new session.
fn miss_reason(
    refused: &[Refused],
    seen: &Seen,
    identity: &Identity,
    session_evicted: bool,
) -> MissReason {
    let hybrid = refused.iter().find_map(|r| match r.reason {
        RefusalReason::NoSnapshotCoverage => Some(MissReason::NoSnapshotCoverage),
        RefusalReason::PrefixBoundaryBelowFloor => Some(MissReason::PrefixBoundaryBelowFloor),
        RefusalReason::Ssd(ColdMiss::BoundaryBelowFloor) => {
            Some(MissReason::Ssd(ColdMiss::BoundaryBelowFloor))
        }
        _ => None,
    });
    if let Some(h) = hybrid {
        return h;
    }
    if let Some((covered, other)) = &seen.other {
        if *covered > seen.same_lcp {
            return if other.model != identity.model {
                MissReason::ModelMismatch
            } else if other.chat_template != identity.chat_template {
                MissReason::TemplateMismatch
            } else if other.kv_dtype != identity.kv_dtype {
                MissReason::KvFormatMismatch
            } else {
                MissReason::PolicyMismatch
            };
        }
    }
    let broken = refused.iter().find_map(|r| match r.reason {
        RefusalReason::Ssd(m) if !is_quiet(m) => Some(MissReason::Ssd(m)),
        _ => None,
    });
    if let Some(b) = broken {
        return b;
    }
    if session_evicted {
        return MissReason::Evicted;
    }
    if seen.same_lcp > 0 {
        return MissReason::PrefixDivergenceAtToken(seen.same_lcp);
    }
    MissReason::NewSession
}

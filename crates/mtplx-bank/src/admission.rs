//! Admission: does a request's peak memory fit, after shedding bank entries if need be?

use std::fmt;

use mtplx_kv::{KvDtype, KvShape};

/// A request's projected peak memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryEstimate {
    /// Model weights already resident.
    pub weights_bytes: u64,
    /// KV and buffers of the requests already running (the bank's own bytes excluded:
    /// the bank adds them).
    pub in_flight_bytes: u64,
    /// This request's KV for its prompt plus `max_tokens` ([`MemoryEstimate::kv_bytes_for`]).
    pub kv_bytes: u64,
    /// This request's peak prefill activations.
    pub activation_bytes: u64,
}

impl MemoryEstimate {
    /// KV bytes of `prompt_tokens + max_tokens` positions of a model of `shape` whose rows
    /// are stored as `dtype`.
    pub fn kv_bytes_for(
        shape: KvShape,
        dtype: KvDtype,
        prompt_tokens: usize,
        max_tokens: usize,
    ) -> u64 {
        (prompt_tokens as u64 + max_tokens as u64) * shape.bytes_per_token(dtype) as u64
    }

    /// What this request needs on top of the weights.
    pub fn request_bytes(&self) -> u64 {
        self.kv_bytes.saturating_add(self.activation_bytes)
    }

    /// Everything but the bank.
    pub fn without_bank(&self) -> u64 {
        self.weights_bytes
            .saturating_add(self.in_flight_bytes)
            .saturating_add(self.request_bytes())
    }
}

/// A request admitted, possibly after shedding bank entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Entries shed (spilled to the SSD tier when it is on).
    pub shed_entries: usize,
    /// Bank bytes freed by shedding.
    pub shed_bytes: u64,
    /// Bytes left under the limit at the projected peak.
    pub headroom: u64,
}

/// Why a request can't be admitted (the server answers HTTP 507).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// It would fit once the requests running now finish.
    MemoryRefusal,
    /// It can't fit even with nothing else running and an empty bank.
    TooLarge,
}

impl RefusalKind {
    /// `refusal_reason` in the 507 body and the request log.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalKind::MemoryRefusal => "memory_refusal",
            RefusalKind::TooLarge => "too_large",
        }
    }
}

/// When a refused request could succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryWhen {
    /// When the requests running now have finished.
    AfterActiveRequests,
    /// Never as it is: shorten the prompt or lower `max_tokens`.
    ReduceRequest,
    /// When the bank's entries on their way to the SSD tier are written (their rows are
    /// in memory until then).
    AfterSpills,
}

impl RetryWhen {
    /// `retry_when` in the 507 body and the request log.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryWhen::AfterActiveRequests => "after_active_requests",
            RetryWhen::ReduceRequest => "reduce_request",
            RetryWhen::AfterSpills => "after_spills",
        }
    }
}

/// A refused admission. Nothing was shed for it (the bank is as it was), except for
/// [`RetryWhen::AfterSpills`]: entries were shed to the SSD tier (not lost) and their
/// writes did not finish in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub refusal_reason: RefusalKind,
    pub retry_when: RetryWhen,
    /// Projected peak with an empty bank.
    pub needed_bytes: u64,
    pub limit_bytes: u64,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: the request needs {} B at its peak, over the {} B limit (retry: {})",
            self.refusal_reason.as_str(),
            self.needed_bytes,
            self.limit_bytes,
            self.retry_when.as_str()
        )
    }
}

/// What admission must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Fits as things are.
    Fits {
        headroom: u64,
    },
    /// Fits once the bank holds at most this many bytes.
    ShedTo(u64),
    Refuse(Refusal),
}

/// The refusal of a request that would fit once the bank's spills in flight are written.
pub(crate) fn spill_refusal(e: &MemoryEstimate, limit: u64) -> Refusal {
    Refusal {
        refusal_reason: RefusalKind::MemoryRefusal,
        retry_when: RetryWhen::AfterSpills,
        needed_bytes: e.without_bank(),
        limit_bytes: limit,
    }
}

/// Decides from the numbers alone; shedding is the bank's job.
pub(crate) fn decide(e: &MemoryEstimate, bank_bytes: u64, limit: u64) -> Decision {
    let base = e.without_bank();
    if base.saturating_add(bank_bytes) <= limit {
        return Decision::Fits {
            headroom: limit - base - bank_bytes,
        };
    }
    if base <= limit {
        return Decision::ShedTo(limit - base);
    }
    let alone = e.weights_bytes.saturating_add(e.request_bytes());
    let (refusal_reason, retry_when) = if alone <= limit {
        (RefusalKind::MemoryRefusal, RetryWhen::AfterActiveRequests)
    } else {
        (RefusalKind::TooLarge, RetryWhen::ReduceRequest)
    };
    Decision::Refuse(Refusal {
        refusal_reason,
        retry_when,
        needed_bytes: base,
        limit_bytes: limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(weights: u64, in_flight: u64, kv: u64) -> MemoryEstimate {
        MemoryEstimate {
            weights_bytes: weights,
            in_flight_bytes: in_flight,
            kv_bytes: kv,
            activation_bytes: 0,
        }
    }

    #[test]
    fn kv_bytes_count_prompt_and_max_tokens() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 3,
            head_dim: 4,
        };
        assert_eq!(
            MemoryEstimate::kv_bytes_for(shape, KvDtype::F32, 10, 6),
            16 * 2 * 2 * 12 * 4
        );
        for dtype in [KvDtype::F16, KvDtype::Bf16] {
            assert_eq!(
                MemoryEstimate::kv_bytes_for(shape, dtype, 10, 6),
                16 * 2 * 2 * 12 * 2
            );
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(
            decide(&est(10, 0, 10), 5, 30),
            Decision::Fits { headroom: 5 }
        );
        assert_eq!(decide(&est(10, 0, 10), 15, 30), Decision::ShedTo(10));
        let Decision::Refuse(r) = decide(&est(10, 20, 10), 0, 30) else {
            panic!("should refuse")
        };
        assert_eq!(r.refusal_reason.as_str(), "memory_refusal");
        assert_eq!(r.retry_when.as_str(), "after_active_requests");
        let Decision::Refuse(r) = decide(&est(10, 0, 30), 0, 30) else {
            panic!("should refuse")
        };
        assert_eq!(
            (r.refusal_reason, r.retry_when),
            (RefusalKind::TooLarge, RetryWhen::ReduceRequest)
        );
    }
}

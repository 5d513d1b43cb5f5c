//! What the engine sends back for a job: its [`Event`]s, how it ended ([`Finish`]) and its
//! counts and timings ([`Summary`]).

use mtplx_spec::SpecStats;

use tokio::sync::mpsc;

use super::request::GenerationMode;

/// What the engine answers a job with: its events, in order.
pub type EngineReply = mpsc::Receiver<Event>;

/// What speculation did for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecSummary {
    /// The proposer that drafted (`lookup`, `mtp`, ...).
    pub proposer: &'static str,
    pub stats: SpecStats,
}

/// What the engine streams back for a job, in order: `Text`* then `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text, safe to show (no partial stop strings, whole UTF-8 chars).
    Text(String),
    /// The generation ended normally.
    Done(Box<Summary>),
    /// The model failed; the message is for the client.
    Failed(String),
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// The model wrote an end-of-turn token.
    StopToken,
    /// One of the request's stop strings; the text stops before it.
    StopSequence(String),
    /// `max_tokens` reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// The client went away.
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_openai(&self) -> &'static str {
        match self {
            Finish::StopToken | Finish::StopSequence(_) | Finish::Cancelled => "stop",
            Finish::Length | Finish::ContextFull => "length",
        }
    }

    /// The request log's and the metrics' name for it.
    pub fn label(&self) -> &'static str {
        match self {
            Finish::StopToken => "stop",
            Finish::StopSequence(_) => "stop_sequence",
            Finish::Length => "length",
            Finish::ContextFull => "context_full",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// Counts and timings of a finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V was reused (0 until the session bank exists).
    pub cached_tokens: usize,
    /// Prompt tokens run through the model.
    pub new_prefill_tokens: usize,
    pub completion_tokens: usize,
    /// Seconds from arrival to the first sampled token.
    pub ttft_s: Option<f64>,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Seconds from the first to the last sampled token.
    pub decode_s: f64,
    /// blake3 of the prompt ids (little-endian u32), hex, first 16 bytes.
    pub prompt_hash: String,
    /// The mode that actually ran (`ar` when speculation is off server-wide).
    pub mode: GenerationMode,
    /// `None` for plain decoding.
    pub spec: Option<SpecSummary>,
    /// The session's id (hashed in the log) and where it came from.
    pub session: Option<(String, &'static str)>,
    /// What the cache path did (`None` when the job bypassed it).
    pub cache: Option<CacheSummary>,
}

/// The cache path's account of a job, for the request log and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSummary {
    /// The bank's account of the restore.
    pub explanation: mtplx_bank::Explanation,
    pub restore_s: f64,
    /// What the SSD tier read, for an SSD restore.
    pub ssd: Option<mtplx_bank::RestoreReport>,
    /// Whether the conversation was committed to the bank afterwards.
    pub committed: bool,
}

impl Summary {
    /// Prefill throughput.
    pub fn prompt_tps(&self) -> Option<f64> {
        (self.prefill_s > 0.0 && self.new_prefill_tokens > 0)
            .then(|| self.new_prefill_tokens as f64 / self.prefill_s)
    }

    /// Decode throughput over the tokens after the first.
    pub fn decode_tok_s(&self) -> Option<f64> {
        (self.decode_s > 0.0 && self.completion_tokens > 1)
            .then(|| (self.completion_tokens - 1) as f64 / self.decode_s)
    }
}

#[cfg(test)]
impl Summary {
    /// A summary for encoder and metrics tests.
    pub(crate) fn for_test(finish: Finish, completion_tokens: usize) -> Self {
        Summary {
            finish,
            prompt_tokens: 10,
            cached_tokens: 0,
            new_prefill_tokens: 10,
            completion_tokens,
            ttft_s: Some(0.1),
            prefill_s: 0.1,
            decode_s: 0.5,
            prompt_hash: String::new(),
            mode: GenerationMode::Ar,
            spec: None,
            session: None,
            cache: None,
        }
    }
}

/// The hash the request log records instead of the prompt.
pub fn prompt_hash(tokens: &[u32]) -> String {
    let mut h = blake3::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finalize().to_hex()[..32].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_need_time_and_tokens() {
        let s = Summary {
            finish: Finish::Length,
            prompt_tokens: 10,
            cached_tokens: 0,
            new_prefill_tokens: 10,
            completion_tokens: 5,
            ttft_s: Some(0.1),
            prefill_s: 0.5,
            decode_s: 2.0,
            prompt_hash: prompt_hash(&[1, 2]),
            mode: GenerationMode::Ar,
            spec: None,
            session: None,
            cache: None,
        };
        assert_eq!(s.prompt_tps(), Some(20.0));
        assert_eq!(s.decode_tok_s(), Some(2.0));
        let one = Summary {
            completion_tokens: 1,
            decode_s: 0.0,
            ..s
        };
        assert_eq!(one.decode_tok_s(), None);
    }

    #[test]
    fn prompt_hashes_depend_on_order() {
        assert_ne!(prompt_hash(&[1, 2]), prompt_hash(&[2, 1]));
        assert_eq!(prompt_hash(&[1, 2]).len(), 32);
    }
}

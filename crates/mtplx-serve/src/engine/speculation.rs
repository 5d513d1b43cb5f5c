//! How the engine speculates ([`Speculation`], set at start) and what that makes of one
//! job's decoding ([`decode`]): plain, or drafts verified by the model. Speculation only
//! changes how many tokens arrive per model step, never which (mtplx-spec verifies every
//! draft against the model).

use std::path::PathBuf;
use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::{MtpHead, MtpRunner, Vocab};
use mtplx_model::{Bundle, LanguageModel};
use mtplx_spec::{
    Decode, DepthPolicy, DraftSampling, LookupThenMtp, MtpProposer, PromptLookup, Proposer,
};

use crate::job::GenerationMode;

/// How the engine speculates when a request asks for `generation_mode: "mtp"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculation {
    /// Most draft tokens per verify step; 0 turns speculation off for every request.
    pub depth: usize,
    pub policy: PolicyKind,
    /// The MTP head drafting for the model (`--mtp-head`): with one, requests draft by
    /// prompt lookup when the context repeats itself and by the head otherwise; without,
    /// by prompt lookup alone.
    pub head: HeadSource,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            depth: 3,
            policy: PolicyKind::None,
            head: HeadSource::Checkpoint,
        }
    }
}

/// Where the MTP head comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadSource {
    /// None: prompt lookup alone (`--mtp-head none`).
    Off,
    /// The head the model's checkpoint carries (a hybrid checkpoint's `mtp.*`), if it
    /// carries one; prompt lookup alone if not.
    Checkpoint,
    /// A head file of its own (`--mtp-head PATH`, or the shipped one for the default model).
    File(PathBuf),
}

impl HeadSource {
    /// Loads the head for `bundle`'s model, on the CPU. A head that does not fit the model
    /// is an error, not a silent fallback.
    pub fn load(&self, bundle: &Bundle) -> Result<Option<Arc<dyn MtpRunner>>, String> {
        match self {
            HeadSource::Checkpoint => Ok(bundle.mtp_head.clone()),
            HeadSource::Off | HeadSource::File(_) => Ok(self
                .load_file(bundle.model.as_ref())?
                .map(|h| Arc::new(h) as Arc<dyn MtpRunner>)),
        }
    }

    /// The head file this source names, read for `trunk` (whose tied embedding becomes its
    /// output head) on the host, for a backend to run or upload; `None` for a source that
    /// names no file.
    pub fn load_file(&self, trunk: &dyn LanguageModel) -> Result<Option<MtpHead>, String> {
        match self {
            HeadSource::Off | HeadSource::Checkpoint => Ok(None),
            HeadSource::File(path) => MtpHead::load(path, trunk, Vocab::FromFile)
                .map(Some)
                .map_err(|e| format!("MTP head {}: {e}", path.display())),
        }
    }

    /// What drafts with it, for the startup line.
    pub fn describe(&self, bundle: &Bundle) -> String {
        match self {
            HeadSource::File(path) => format!("prompt lookup then MTP head {}", path.display()),
            HeadSource::Checkpoint if bundle.mtp_head.is_some() => {
                "prompt lookup then the checkpoint's MTP head".into()
            }
            HeadSource::Off | HeadSource::Checkpoint => "prompt lookup".into(),
        }
    }
}

/// A loaded MTP head and where its own one-layer cache is built: host caches for a head on
/// the CPU, the device's for a head beside a model on a device (each head attends over
/// caches where it runs).
#[derive(Clone)]
pub struct Head {
    pub runner: Arc<dyn MtpRunner>,
    pub caches: CacheFactory,
}

impl Head {
    /// A head on the CPU: its cache is contiguous host rows.
    pub fn on_cpu(runner: Arc<dyn MtpRunner>) -> Head {
        Head {
            runner,
            caches: CacheFactory::contiguous(),
        }
    }
}

/// How one generation decodes: plainly when it asks for `ar` or speculation is off, else
/// with the proposer the engine has (prompt lookup, then the MTP head if there is one).
pub(super) fn decode<'a>(
    model: &'a dyn LanguageModel,
    head: Option<&Head>,
    mode: GenerationMode,
    spec: &Speculation,
) -> Decode<'a> {
    if mode == GenerationMode::Ar || spec.depth == 0 {
        return Decode::Plain;
    }
    let proposer: Box<dyn Proposer + 'a> = match head {
        // Greedy drafts: at any temperature the model's own token is drawn as plain
        // decoding would draw it, so a seeded request gives the same tokens either way.
        Some(head) => Box::new(LookupThenMtp::new(MtpProposer::new(
            model,
            head.runner.clone(),
            &head.caches,
            DraftSampling::Greedy,
        ))),
        None => Box::new(PromptLookup::default()),
    };
    Decode::Speculative {
        proposer,
        policy: spec.policy.build(spec.depth),
    }
}

/// The adaptive depth policy (`--adaptive-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// Always draft `depth` tokens.
    #[default]
    None,
    Streak,
    ExpectedValue,
    Cost,
}

impl PolicyKind {
    fn build(self, depth: usize) -> DepthPolicy {
        match self {
            PolicyKind::None => DepthPolicy::fixed(depth),
            // Adaptive policies learn per draft source: prompt lookup's copies and the MTP
            // head's guesses differ in acceptance and in cost.
            PolicyKind::Streak => DepthPolicy::by_source(DepthPolicy::Streak { depth, max: depth }),
            PolicyKind::ExpectedValue => DepthPolicy::by_source(DepthPolicy::ExpectedValue(
                mtplx_spec::Acceptance::with_priors(depth),
            )),
            PolicyKind::Cost => DepthPolicy::by_source(DepthPolicy::cost(depth)),
        }
    }
}

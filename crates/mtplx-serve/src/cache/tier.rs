//! What the cache path shares: the RAM bank (with the SSD tier behind it), the identity
//! states are stored under, the engine's KV layout, the session locks and the memory
//! reserved by admitted requests.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mtplx_bank::{Bank, BankConfig, BankEvent, SpillOutcome};
use mtplx_cold::{
    ColdCandidate, ColdConfig, ColdIndex, ColdLookup, ColdQuery, ColdStore, Identity, KvSink,
    MissReason, Mtp, ReadError, RestoreReport, SpillEntry, SpillTicket, WriteError,
};
use mtplx_kv::{CacheFactory, KvShape, LayoutKind};
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::{Bundle, LanguageModel};

use crate::job::Reservation;
use crate::session::locks::SessionLocks;

/// `--ssd-session-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SsdMode {
    /// No SSD tier: evicted states are gone.
    Off,
    /// Evicted states spill to the SSD and returning conversations restore from it.
    #[default]
    On,
    /// Spill, but never restore (to warm a cache, or to compare).
    WriteOnly,
}

/// How the cache path is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct TierConfig {
    pub bank: BankConfig,
    /// The layout the engine decodes in; restores build into it.
    pub layout: LayoutKind,
    pub ssd: SsdMode,
    pub ssd_dir: PathBuf,
    /// `None`: the cold tier's default for this machine's RAM.
    pub ssd_max_bytes: Option<u64>,
    /// `None`: the cold tier's default (no writes below 10 GiB of free disk).
    pub ssd_free_disk_floor: Option<u64>,
    /// Prompt tokens per prefill pass (for the activation estimate).
    pub prefill_chunk_tokens: usize,
    /// Part of the identity: states computed under other weights are never reused.
    pub weights_label: String,
}

impl TierConfig {
    /// Defaults for this machine: bank budgets from its RAM, SSD on under
    /// `$MTPLX_HOME/session-bank`, paged KV.
    pub fn detect() -> TierConfig {
        let ram = mtplx_cold::physical_ram().unwrap_or(16 << 30);
        TierConfig {
            bank: BankConfig::for_machine(ram),
            layout: LayoutKind::Paged,
            ssd: SsdMode::On,
            ssd_dir: mtplx_model::store::mtplx_home().join("session-bank"),
            ssd_max_bytes: None,
            ssd_free_disk_floor: None,
            prefill_chunk_tokens: 512,
            weights_label: "default".into(),
        }
    }
}

/// The shared state of the cache path. Cheap to clone.
#[derive(Clone)]
pub struct CacheTier {
    inner: Arc<Inner>,
}

struct Inner {
    bank: Arc<Bank>,
    cold: Option<Arc<ColdStore>>,
    ssd: SsdMode,
    ssd_dir: PathBuf,
    identity: Identity,
    factory: CacheFactory,
    shape: KvShape,
    locks: SessionLocks,
    weights_bytes: u64,
    activation_bytes: u64,
    /// Bytes of the admitted requests not yet finished.
    reserved: Arc<AtomicU64>,
    /// Set when the server stops: no new job enters the cache path.
    closed: AtomicBool,
}

impl CacheTier {
    /// Opens the SSD tier (when on) and builds the bank for `bundle`.
    pub fn open(bundle: &Bundle, config: TierConfig) -> Result<CacheTier, String> {
        let model_config = bundle.model.config();
        let shape = model_config.kv_shape();
        let cold = match config.ssd {
            SsdMode::Off => None,
            SsdMode::On | SsdMode::WriteOnly => {
                let mut cc = ColdConfig::detect();
                if let Some(max) = config.ssd_max_bytes {
                    cc.cap_bytes = max;
                }
                if let Some(floor) = config.ssd_free_disk_floor {
                    cc.free_disk_floor = floor;
                }
                let store = ColdStore::open_dir(&config.ssd_dir, cc).map_err(|e| {
                    format!("SSD session cache at {}: {e}", config.ssd_dir.display())
                })?;
                Some(Arc::new(store))
            }
        };
        let mut bank = Bank::new(config.bank.clone()).with_observer(Arc::new(log_event));
        match (&cold, config.ssd) {
            (Some(c), SsdMode::On) => bank = bank.with_cold(c.clone()),
            (Some(c), SsdMode::WriteOnly) => bank = bank.with_cold(Arc::new(WriteOnly(c.clone()))),
            _ => {}
        }
        let bank = Arc::new(bank);
        if cold.is_some() {
            start_upkeep(Arc::downgrade(&bank));
        }
        let factory = match config.layout {
            LayoutKind::Contiguous => CacheFactory::contiguous(),
            LayoutKind::Paged => CacheFactory::paged(),
            LayoutKind::Segmented => CacheFactory::segmented(),
            LayoutKind::Device => {
                return Err(
                    "the server runs its model on the CPU; a device KV layout needs \
                     a device model backend"
                        .into(),
                )
            }
        };
        let chunk = config.prefill_chunk_tokens.max(1) as u64;
        let (h, i, v) = (
            model_config.hidden_size as u64,
            model_config.intermediate_size as u64,
            model_config.vocab_size as u64,
        );
        Ok(CacheTier {
            inner: Arc::new(Inner {
                bank,
                cold,
                ssd: config.ssd,
                ssd_dir: config.ssd_dir,
                identity: identity(bundle, &config.weights_label),
                factory,
                shape,
                locks: SessionLocks::default(),
                weights_bytes: bundle.model.weight_bytes() as u64,
                // Per chunk row: residual, norm, q/k/v/o, gate/up/act (f32), plus the
                // last row's logits.
                activation_bytes: chunk * (8 * h + 3 * i) * 4 + v * 4,
                reserved: Arc::new(AtomicU64::new(0)),
                closed: AtomicBool::new(false),
            }),
        })
    }

    pub fn bank(&self) -> &Arc<Bank> {
        &self.inner.bank
    }

    /// The SSD store, when the tier is on (or write-only).
    pub fn cold(&self) -> Option<&Arc<ColdStore>> {
        self.inner.cold.as_ref()
    }

    pub fn ssd_mode(&self) -> SsdMode {
        self.inner.ssd
    }

    pub fn ssd_dir(&self) -> &std::path::Path {
        &self.inner.ssd_dir
    }

    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    pub fn factory(&self) -> &CacheFactory {
        &self.inner.factory
    }

    pub fn shape(&self) -> KvShape {
        self.inner.shape
    }

    pub fn locks(&self) -> &SessionLocks {
        &self.inner.locks
    }

    pub fn weights_bytes(&self) -> u64 {
        self.inner.weights_bytes
    }

    pub fn activation_bytes(&self) -> u64 {
        self.inner.activation_bytes
    }

    /// Takes no new job from now on (a stopping server); jobs already past the session
    /// stage run on.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Bytes reserved by admitted, unfinished requests.
    pub fn reserved(&self) -> u64 {
        self.inner.reserved.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` until the returned guard drops.
    pub fn reserve(&self, bytes: u64) -> Reservation {
        Reservation::new(self.inner.reserved.clone(), bytes)
    }
}

impl std::fmt::Debug for CacheTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheTier")
            .field("layout", &self.inner.factory.layout())
            .field("ssd", &self.inner.ssd)
            .finish_non_exhaustive()
    }
}

/// The identity states are stored under: the model, the chat template's behaviour (a hash
/// of a probe conversation rendered by it), and the weights. `mtp` is always off: the
/// stored state is the trunk's K/V, which no head changes, and the head's own state is not
/// stored (measured not to pay; `models/mtp/README.md`), so a head starts its context at
/// the restored boundary.
fn identity(bundle: &Bundle, weights: &str) -> Identity {
    let template = bundle.template.as_ref().map_or_else(
        || "none".to_string(),
        |t| {
            let probe = ChatRequest {
                messages: vec![
                    ChatMessage::text(Role::System, "s"),
                    ChatMessage::text(Role::User, "u"),
                    ChatMessage::text(Role::Assistant, "a"),
                    ChatMessage::text(Role::User, "v"),
                ],
                tools: None,
                add_generation_prompt: true,
                template_kwargs: Default::default(),
            };
            let text = t.render(&probe).unwrap_or_default();
            blake3::hash(text.as_bytes()).to_hex()[..32].to_string()
        },
    );
    let c = bundle.model.config();
    Identity {
        model: format!(
            "{} layers={} hidden={} vocab={}",
            bundle.id, c.num_layers, c.hidden_size, c.vocab_size
        ),
        chat_template: template,
        mtp: Mtp::Off,
        policy: format!("weights={weights}"),
    }
}

/// How often the bank's upkeep ([`Bank::tick`]: finished writes, expiry, idle writes) runs.
const UPKEEP_EVERY: Duration = Duration::from_millis(250);

/// Runs the bank's upkeep on its own thread until the bank is dropped.
fn start_upkeep(bank: Weak<Bank>) {
    let spawned = std::thread::Builder::new()
        .name("mtplx-bank-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            match bank.upgrade() {
                Some(bank) => bank.tick(),
                None => return,
            }
        });
    if let Err(e) = spawned {
        tracing::error!("the session bank's upkeep thread did not start ({e}): idle conversations will be written to the SSD only when evicted or at a stop");
    }
}

/// The operator hears of every conversation the SSD tier could not take.
fn log_event(e: &BankEvent) {
    let BankEvent::SpillFailed {
        session,
        tokens,
        bytes,
        failure,
        outcome,
    } = e;
    let session = crate::session::session_hash(session.as_str());
    let (reason, detail) = (failure.reason, &failure.detail);
    match outcome {
        SpillOutcome::KeptInRam => tracing::warn!(
            session,
            tokens,
            bytes,
            reason,
            "the SSD tier could not take a conversation ({detail}); it stays in RAM and is \
             tried again"
        ),
        SpillOutcome::Dropped => tracing::error!(
            session,
            tokens,
            bytes,
            reason,
            "a conversation was dropped: memory had to be freed and the SSD tier could not \
             take it ({detail})"
        ),
    }
}

/// `--ssd-session-cache write-only`: spills go through, lookups miss.
struct WriteOnly(Arc<ColdStore>);

impl ColdIndex for WriteOnly {
    fn lookup(&self, _: &ColdQuery<'_>) -> ColdLookup {
        ColdLookup::miss(MissReason::CacheOff)
    }

    fn restore(
        &self,
        candidate: &ColdCandidate,
        sink: &mut dyn KvSink,
    ) -> Result<RestoreReport, ReadError> {
        self.0.restore(candidate, sink)
    }

    fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError> {
        self.0.spill(entry)
    }

    fn check_room(&self, entry: &SpillEntry) -> Result<(), WriteError> {
        self.0.check_room(entry)
    }
}

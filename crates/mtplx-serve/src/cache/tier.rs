//! What the cache path shares: the RAM bank (with the SSD tier behind it), the identity
//! states are stored under, the engine's KV layout, the session locks and the memory
//! reserved by admitted requests.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mtplx_bank::{
    Bank, BankConfig, BankEvent, ColdConfig, Identity, Mtp, SpillOutcome, SsdAccess, SsdError,
    SsdSetup,
};
use mtplx_kv::{CacheFactory, KvDtype, LayoutKind, StateShape};
use mtplx_model::Bundle;

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
    /// The element type K/V rows are stored in (`--kv-dtype`); part of the identity states
    /// are stored under.
    pub kv_dtype: KvDtype,
    pub ssd: SsdMode,
    pub ssd_dir: PathBuf,
    /// `None`: the cold tier's default for this machine's RAM.
    pub ssd_max_bytes: Option<u64>,
    /// `None`: the cold tier's default (no writes below 10 GiB of free disk).
    pub ssd_free_disk_floor: Option<u64>,
    /// Prompt tokens per prefill pass (for the activation estimate).
    pub prefill_chunk_tokens: usize,
    /// The lowest restore point a hybrid state is restored at (RAM or SSD): below it the
    /// candidate is refused from metadata (`prefix_boundary_below_floor`,
    /// `ssd_prefix_boundary_below_floor`) and the prompt is computed instead.
    pub min_prefix_tokens: usize,
}

/// The default [`TierConfig::min_prefix_tokens`].
pub const DEFAULT_MIN_PREFIX_TOKENS: usize = 512;

impl TierConfig {
    /// Defaults for this machine: bank budgets from its RAM, SSD on under
    /// `$MTPLX_HOME/session-bank`, paged KV.
    pub fn detect() -> TierConfig {
        let ram = mtplx_bank::physical_ram().unwrap_or(16 << 30);
        TierConfig {
            bank: BankConfig::for_machine(ram),
            layout: LayoutKind::Paged,
            kv_dtype: KvDtype::F16,
            ssd: SsdMode::On,
            ssd_dir: mtplx_model::store::mtplx_home().join("session-bank"),
            ssd_max_bytes: None,
            ssd_free_disk_floor: None,
            prefill_chunk_tokens: 512,
            min_prefix_tokens: DEFAULT_MIN_PREFIX_TOKENS,
        }
    }
}

/// Why the cache path could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    Ssd(#[from] SsdError),
    #[error(
        "the server runs its model on the CPU; a device KV layout needs a device model backend"
    )]
    DeviceLayout,
    #[error(
        "the model runs on a device, whose K/V live in its own caches (the Device layout); \
         the {0:?} layout is the CPU's"
    )]
    HostLayout(LayoutKind),
    #[error(transparent)]
    Kv(#[from] mtplx_kv::KvError),
}

/// The shared state of the cache path. Cheap to clone.
#[derive(Clone)]
pub struct CacheTier {
    inner: Arc<Inner>,
}

struct Inner {
    bank: Arc<Bank>,
    ssd: SsdMode,
    ssd_dir: PathBuf,
    identity: Identity,
    factory: CacheFactory,
    shape: StateShape,
    min_prefix_tokens: usize,
    locks: SessionLocks,
    weights_bytes: u64,
    activation_bytes: u64,
    /// Bytes of the admitted requests not yet finished.
    reserved: Arc<AtomicU64>,
    /// Set when the server stops: no new job enters the cache path.
    closed: AtomicBool,
}

impl CacheTier {
    /// Opens the SSD tier (when on) and builds the bank for `bundle`. `device` is the
    /// factory of the model's own caches when it runs on a device (`CudaModel`'s): the
    /// layout asked for is then [`LayoutKind::Device`], whose rows are of a type the device
    /// stores.
    pub fn open(
        bundle: &Bundle,
        config: TierConfig,
        device: Option<&CacheFactory>,
    ) -> Result<CacheTier, TierError> {
        let factory = match (config.layout, device) {
            (LayoutKind::Device, Some(caches)) => caches.clone(),
            (LayoutKind::Device, None) => return Err(TierError::DeviceLayout),
            (layout, Some(_)) => return Err(TierError::HostLayout(layout)),
            (LayoutKind::Contiguous, None) => CacheFactory::contiguous(),
            (LayoutKind::Paged, None) => CacheFactory::paged(),
            (LayoutKind::Segmented, None) => CacheFactory::segmented(),
        }
        .with_dtype(config.kv_dtype)?;
        // A quantized type needs heads of whole groups: refused at start, with the reason.
        factory.check_shape(bundle.model.state_shape().kv)?;
        let access = match config.ssd {
            SsdMode::Off => None,
            SsdMode::On => Some(SsdAccess::ReadWrite),
            SsdMode::WriteOnly => Some(SsdAccess::WriteOnly),
        };
        let ssd = access.map(|access| {
            let mut cold = ColdConfig::detect();
            if let Some(max) = config.ssd_max_bytes {
                cold.cap_bytes = max;
            }
            if let Some(floor) = config.ssd_free_disk_floor {
                cold.free_disk_floor = floor;
            }
            SsdSetup {
                dir: config.ssd_dir.clone(),
                config: cold,
                access,
            }
        });
        let bank = Bank::open(config.bank.clone(), ssd)?.with_observer(Arc::new(log_event));
        let bank = Arc::new(bank);
        if access.is_some() {
            start_upkeep(Arc::downgrade(&bank));
        }
        Ok(CacheTier {
            inner: Arc::new(Inner {
                bank,
                ssd: config.ssd,
                ssd_dir: config.ssd_dir,
                identity: identity(bundle, config.kv_dtype),
                factory,
                shape: bundle.model.state_shape(),
                min_prefix_tokens: config.min_prefix_tokens,
                locks: SessionLocks::default(),
                weights_bytes: bundle.model.weight_bytes() as u64,
                activation_bytes: bundle
                    .model
                    .prefill_activation_bytes(config.prefill_chunk_tokens),
                reserved: Arc::new(AtomicU64::new(0)),
                closed: AtomicBool::new(false),
            }),
        })
    }

    pub fn bank(&self) -> &Arc<Bank> {
        &self.inner.bank
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

    /// The model's per-sequence state: what restores build.
    pub fn shape(&self) -> &StateShape {
        &self.inner.shape
    }

    /// The floor of a hybrid restore ([`TierConfig::min_prefix_tokens`]).
    pub fn min_prefix_tokens(&self) -> usize {
        self.inner.min_prefix_tokens
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

/// The identity states are stored under: what the model says makes its states reusable
/// ([`Bundle::reuse_key`]: the model, the chat template's behaviour, the numerics). `mtp` is
/// always off: the stored state is the trunk's K/V, which no head changes, and the head's
/// own state is not stored (measured not to pay; `models/mtp/README.md`), so a head starts
/// its context at the restored boundary. `kv_dtype`: rows stored in one element type are
/// never offered to a server keeping another.
fn identity(bundle: &Bundle, kv_dtype: KvDtype) -> Identity {
    let key = bundle.reuse_key();
    Identity {
        model: key.model,
        chat_template: key.chat_template,
        mtp: Mtp::Off,
        policy: key.numerics,
        kv_dtype: mtplx_bank::cold_dtype(kv_dtype),
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use mtplx_kv::{DeviceCaches, KvCache, KvError, KvShape, MakeDeviceCache};
    use mtplx_model::WeightFormat;

    use super::*;

    /// A device backend's factory stand-in: its caches are host rows (of the types a CUDA
    /// device stores), which is all the tier needs to be set up.
    struct StandIn;

    impl MakeDeviceCache for StandIn {
        fn stores(&self, dtype: KvDtype) -> bool {
            matches!(dtype, KvDtype::F16 | KvDtype::F32)
        }

        fn new_cache(&self, shape: KvShape, dtype: KvDtype) -> Box<dyn KvCache> {
            let host = CacheFactory::contiguous().with_dtype(dtype).unwrap();
            host.new_cache(shape)
        }

        fn name(&self) -> String {
            "stand-in:0".into()
        }
    }

    fn config(layout: LayoutKind, kv_dtype: KvDtype) -> TierConfig {
        TierConfig {
            layout,
            kv_dtype,
            ssd: SsdMode::Off,
            ..TierConfig::detect()
        }
    }

    #[test]
    fn a_device_layout_is_the_device_models_own_caches_of_a_type_it_stores() {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
        let bundle = Bundle::load(&path, WeightFormat::Native).unwrap();
        let device = CacheFactory::device(DeviceCaches(Arc::new(StandIn)));
        let open = |layout, dtype, device| CacheTier::open(&bundle, config(layout, dtype), device);

        let tier = open(LayoutKind::Device, KvDtype::F32, Some(&device)).unwrap();
        assert_eq!(tier.factory(), &device);
        let tier = open(LayoutKind::Device, KvDtype::F16, Some(&device)).unwrap();
        assert_eq!(
            (tier.factory().layout(), tier.factory().dtype()),
            (LayoutKind::Device, KvDtype::F16)
        );
        // A server on the CPU has no device caches to give.
        let e = open(LayoutKind::Device, KvDtype::F32, None).unwrap_err();
        assert!(matches!(e, TierError::DeviceLayout), "{e}");
        // Nor a type the device does not store.
        let e = open(LayoutKind::Device, KvDtype::Q8, Some(&device)).unwrap_err();
        assert!(
            matches!(e, TierError::Kv(KvError::DeviceDtype(KvDtype::Q8))),
            "{e}"
        );
        // A model on a device runs on its own caches, never a host layout.
        let e = open(LayoutKind::Paged, KvDtype::F32, Some(&device)).unwrap_err();
        assert!(matches!(e, TierError::HostLayout(LayoutKind::Paged)), "{e}");
        let host = open(LayoutKind::Paged, KvDtype::F16, None).unwrap();
        assert_eq!(host.factory().layout(), LayoutKind::Paged);
    }
}

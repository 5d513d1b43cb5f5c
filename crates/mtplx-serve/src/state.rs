//! What every handler shares: the model's text side, the engine, metrics, the request log
//! and the limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtplx_bank::FlushReport;

use mtplx_model::Bundle;
use tokio::sync::Semaphore;

use crate::cache::{CacheTier, Pipeline, SsdMode, TierConfig};
use crate::device::Backend;
use crate::engine::{Engine, EngineConfig, Speculation};
use crate::metrics::Metrics;
use crate::request_log::{RequestLog, Rotation};

/// Server settings that are not about sockets (see [`crate::Config`] for the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Context window; `None` (or anything larger) means the model's own.
    pub context_window: Option<usize>,
    /// Generation requests in flight at once; more get a 503.
    pub max_active_requests: usize,
    pub prefill_chunk_tokens: usize,
    /// `None` turns the request log off.
    pub request_log: Option<PathBuf>,
    pub request_log_rotation: Rotation,
    /// When set, every route except `GET /health` needs it.
    pub api_key: Option<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Longest wait for a response to start.
    pub request_timeout: Duration,
    /// Drafting for requests in `mtp` mode (the default mode).
    pub speculation: Speculation,
    /// The session bank, the SSD tier and the KV layout.
    pub cache: TierConfig,
    /// Longest a stop takes ([`AppState::shutdown`]).
    pub shutdown_flush: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            context_window: None,
            max_active_requests: 8,
            prefill_chunk_tokens: 512,
            request_log: None,
            request_log_rotation: Rotation::default(),
            api_key: None,
            max_body_bytes: 16 << 20,
            request_timeout: Duration::from_secs(600),
            speculation: Speculation::default(),
            // A library user opts in to writing the disk; the server's flag defaults on.
            cache: TierConfig {
                ssd: SsdMode::Off,
                ..TierConfig::detect()
            },
            shutdown_flush: Duration::from_secs(10),
        }
    }
}

/// The application state, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    bundle: Arc<Bundle>,
    engine: Engine,
    tier: CacheTier,
    pipeline: Pipeline,
    metrics: Arc<Metrics>,
    log: Option<Arc<RequestLog>>,
    settings: Settings,
    context_window: usize,
    /// Where the model runs, in words ([`Backend::describe`]).
    device: String,
    started: u64,
    /// Generation slots, shared by every app built from this state.
    slots: Arc<Semaphore>,
}

impl AppState {
    /// Opens the cache tier and starts an engine for `bundle`, on the CPU.
    pub fn new(bundle: Arc<Bundle>, settings: Settings) -> std::io::Result<Self> {
        Self::with_backend(bundle, settings, Backend::Cpu)
    }

    /// [`AppState::new`] for a model that runs where `backend` says: on a device, the
    /// bundle's model is the device's (`CudaModel`), `settings.cache.layout` is
    /// [`mtplx_kv::LayoutKind::Device`] and the caches and MTP head come from `backend`.
    pub fn with_backend(
        bundle: Arc<Bundle>,
        settings: Settings,
        backend: Backend,
    ) -> std::io::Result<Self> {
        let tier = CacheTier::open(
            &bundle,
            TierConfig {
                prefill_chunk_tokens: settings.prefill_chunk_tokens.max(1),
                ..settings.cache.clone()
            },
            backend.device_caches(),
        )
        .map_err(std::io::Error::other)?;
        let model_ctx = bundle.model.dims().context_length;
        let context_window = settings
            .context_window
            .map_or(model_ctx, |c| c.clamp(2, model_ctx));
        let metrics = Arc::new(Metrics::default());
        let log = settings
            .request_log
            .as_ref()
            .map(|p| Arc::new(RequestLog::new(p, settings.request_log_rotation)));
        let engine = Engine::spawn(
            bundle.clone(),
            EngineConfig {
                context_window,
                prefill_chunk_tokens: settings.prefill_chunk_tokens.max(1),
                // Admission is the concurrency limit's job; the queue only needs room for
                // cancelled jobs the engine has not popped yet.
                queue_capacity: settings.max_active_requests.max(1) * 2 + 8,
                speculation: settings.speculation.clone(),
            },
            &backend,
            tier.clone(),
            metrics.clone(),
            log.clone(),
        )?;
        Ok(AppState {
            inner: Arc::new(Inner {
                bundle,
                pipeline: crate::cache::pipeline(&tier, engine.clone()),
                engine,
                tier,
                metrics,
                log,
                settings: settings.clone(),
                context_window,
                device: backend.describe(),
                started: crate::util::unix_now(),
                slots: Arc::new(Semaphore::new(settings.max_active_requests.max(1))),
            }),
        })
    }

    pub fn bundle(&self) -> &Bundle {
        &self.inner.bundle
    }

    /// The served model's name.
    pub fn model_id(&self) -> &str {
        &self.inner.bundle.id
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The cache path around the engine: what generation handlers submit to.
    pub fn pipeline(&self) -> Pipeline {
        self.inner.pipeline.clone()
    }

    /// The session bank and SSD tier.
    pub fn tier(&self) -> &CacheTier {
        &self.inner.tier
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn request_log(&self) -> Option<&RequestLog> {
        self.inner.log.as_deref()
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Where the model runs, in words: `cpu`, `cuda:0 (NVIDIA H200)`.
    pub fn device(&self) -> &str {
        &self.inner.device
    }

    /// The effective context window (the flag, capped by the model's).
    pub fn context_window(&self) -> usize {
        self.inner.context_window
    }

    /// The generation slots the concurrency limit takes from.
    pub fn slots(&self) -> &Arc<Semaphore> {
        &self.inner.slots
    }

    /// Generation requests in flight now.
    pub fn active_requests(&self) -> usize {
        self.inner.settings.max_active_requests.max(1) - self.inner.slots.available_permits()
    }

    /// Unix seconds when the server started.
    pub fn started(&self) -> u64 {
        self.inner.started
    }

    /// Stops within [`Settings::shutdown_flush`]: takes no new generation, lets the
    /// running ones finish for half the time and then stops them (each commits what it
    /// has, within a step), and writes every conversation the bank holds that is not on the SSD tier yet
    /// until the deadline. Returns what the flush wrote and what it could not.
    pub async fn shutdown(&self) -> FlushReport {
        let start = Instant::now();
        let deadline = self.inner.settings.shutdown_flush;
        let tier = self.tier().clone();
        tier.close();
        let idle = |until: Duration| {
            let tier = tier.clone();
            async move {
                while tier.locks().busy() > 0 && start.elapsed() < until {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                tier.locks().busy() == 0
            }
        };
        if !idle(deadline / 2).await {
            tracing::info!(
                sessions = tier.locks().busy(),
                "stopping the generations still running"
            );
            self.engine().stop();
            // A stopped generation ends within one step; the last quarter is the flush's.
            idle(deadline / 4 * 3).await;
        }
        let left = deadline.saturating_sub(start.elapsed());
        let bank = tier.bank().clone();
        tokio::task::spawn_blocking(move || bank.flush(left))
            .await
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model", &self.model_id())
            .field("device", &self.device())
            .field("context_window", &self.context_window())
            .field("settings", self.settings())
            .finish_non_exhaustive()
    }
}

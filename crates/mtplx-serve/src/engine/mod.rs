//! The engine: one thread that owns the model and runs generations one at a time, fed by a
//! bounded queue. Handlers talk to it through channels: a [`Job`] in, a stream of
//! [`Event`]s out. Dropping the event receiver cancels the job within one decode step (or
//! one prefill chunk).

mod config;
mod error;
mod speculation;
mod text;
mod worker;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mtplx_model::Bundle;
use tokio::sync::mpsc;

pub use crate::job::{
    prompt_hash, CacheSummary, EngineReply, Event, Finish, GenerationMode, Job, SpecSummary,
    Summary,
};
pub use config::{EngineConfig, StopSignal};
pub use error::EngineError;
pub use speculation::{Head, HeadSource, PolicyKind, Speculation};

use crate::cache::CacheTier;
use crate::device::Backend;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request_log::RequestLog;

/// Events buffered between the engine and a slow client; the engine waits beyond this, so
/// it is never more than this many pieces of text ahead of what the client read.
pub const EVENT_BUFFER: usize = 4;

/// A handle to the engine thread. Cheap to clone; the thread ends when the last handle is
/// dropped and its queue is empty.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<(Job, mpsc::Sender<Event>)>,
    metrics: Arc<Metrics>,
    stop: StopSignal,
}

impl Engine {
    /// Starts the engine thread: the one thread that runs the model (and, on a device,
    /// its caches and MTP head) from now on.
    pub fn spawn(
        bundle: Arc<Bundle>,
        config: EngineConfig,
        backend: &Backend,
        tier: CacheTier,
        metrics: Arc<Metrics>,
        log: Option<Arc<RequestLog>>,
    ) -> std::io::Result<Engine> {
        let (tx, mut rx) =
            mpsc::channel::<(Job, mpsc::Sender<Event>)>(config.queue_capacity.max(1));
        let mtp_head = match (config.speculation.depth, backend) {
            (0, _) => None,
            (_, Backend::Cpu) => config
                .speculation
                .head
                .load(&bundle)
                .map_err(std::io::Error::other)?
                .map(Head::on_cpu),
            // Uploaded when the model was: its cache is one of the model's own.
            (_, Backend::Device(m)) => m.head.clone().map(|runner| Head {
                runner,
                caches: m.caches.clone(),
            }),
        };
        let stop = StopSignal::default();
        let mut worker = worker::Worker::new(
            bundle,
            config,
            mtp_head,
            tier,
            metrics.clone(),
            log,
            stop.clone(),
        );
        std::thread::Builder::new()
            .name("mtplx-engine".into())
            .spawn(move || {
                while let Some((job, events)) = rx.blocking_recv() {
                    worker.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    // A panicking job fails alone (its client sees the stream end); the
                    // next job starts from an emptied cache.
                    let run =
                        std::panic::catch_unwind(AssertUnwindSafe(|| worker.run(job, events)));
                    if run.is_err() {
                        worker.metrics.count_generation("panic");
                        tracing::error!("a generation panicked; the engine carries on");
                    }
                }
            })?;
        Ok(Engine { tx, metrics, stop })
    }

    /// Cancels the running generation and every one after it (a stopping server).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// Queues `job`; its events arrive on the returned receiver. A full queue is a 503.
    pub fn submit(&self, job: Job) -> Result<mpsc::Receiver<Event>, ApiError> {
        let (events_tx, events_rx) = mpsc::channel(EVENT_BUFFER);
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send((job, events_tx)).map_err(|e| {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => {
                    ApiError::overloaded("The generation queue is full; retry shortly.", 1)
                }
                mpsc::error::TrySendError::Closed(_) => {
                    ApiError::internal("The engine has stopped.")
                }
            }
        })?;
        Ok(events_rx)
    }
}

/// The engine as the innermost service of the cache path ([`crate::cache::pipeline`]).
impl tower::Service<Job> for Engine {
    type Response = EngineReply;
    type Error = ApiError;
    type Future = std::future::Ready<Result<EngineReply, ApiError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ApiError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, job: Job) -> Self::Future {
        std::future::ready(self.submit(job))
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

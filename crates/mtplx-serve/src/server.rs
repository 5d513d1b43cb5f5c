//! Starting the server: load the model, bind, accept connections.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use mtplx_model::kernels::Activations;
use mtplx_model::store::{self, KnownModel, ModelStore, DEFAULT_MODEL};
use mtplx_model::{Bundle, ModelError, WeightFormat};
use tokio::net::TcpListener;

use crate::cache::SsdMode;
use crate::config::Config;
use crate::device::{Backend, Device, DeviceError};
use crate::state::AppState;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// What `--model` names: a file or folder, or a model the store knows.
#[derive(Debug, PartialEq)]
enum ModelArg<'a> {
    Path(&'a Path),
    Known(&'static KnownModel),
}

/// A path that exists is a path; otherwise a known model's id names it; otherwise it is a
/// path (whose load then says it is missing). No `--model`: the default model.
fn model_arg(model: Option<&Path>) -> ModelArg<'_> {
    match model {
        None => ModelArg::Known(&DEFAULT_MODEL),
        Some(p) if p.exists() => ModelArg::Path(p),
        Some(p) => match p.to_str().and_then(store::known) {
            Some(m) => ModelArg::Known(m),
            None => ModelArg::Path(p),
        },
    }
}

/// The model file to serve: `--model`'s path, else the store's copy of the known model it
/// names (or of the default), fetched if missing, with progress on stderr.
pub async fn model_path(config: &Config) -> Result<PathBuf, ServeError> {
    let known = match model_arg(config.model.as_deref()) {
        ModelArg::Path(p) => return Ok(p.to_path_buf()),
        ModelArg::Known(m) => m,
    };
    let path = tokio::task::spawn_blocking(move || {
        ModelStore::from_env().ensure(known, &mut |line| eprintln!("{line}"))
    })
    .await
    .map_err(|e| ServeError::Config(format!("model fetch panicked: {e}")))??;
    Ok(path)
}

/// Loads the model where `--device` says: on the CPU, the whole bundle; on a GPU, the
/// weights straight onto it ([`crate::gpu::load`]). Blocking work runs off the runtime.
pub async fn load(config: &Config, path: PathBuf) -> Result<(Bundle, Backend), ServeError> {
    let (device, format) = (config.device, config.weight_format());
    let speculation = config.settings().speculation;
    tokio::task::spawn_blocking(move || match device {
        Device::Cpu => {
            let format = match format {
                Some(f) => f,
                None => Bundle::default_format(&path)?,
            };
            Ok((Bundle::load(&path, format)?, Backend::Cpu))
        }
        Device::Cuda(ordinal) => {
            let activations = device_activations(format, &path)?;
            let (bundle, model) = crate::gpu::load(&path, ordinal, &speculation, activations)?;
            Ok((bundle, Backend::Device(model)))
        }
    })
    .await
    .map_err(|e| ServeError::Config(format!("model load panicked: {e}")))?
}

/// The activations a GPU model's products take: as the CPU would run the file, `--weights`
/// when given, else the file's default (8-bit for K-quant files), so a K-quant file gives
/// the same numbers on either.
fn device_activations(
    format: Option<WeightFormat>,
    path: &Path,
) -> Result<Activations, ServeError> {
    Ok(match format {
        Some(f) => f,
        None => Bundle::default_format(path)?,
    }
    .activations())
}

/// Loads the model, binds, prints the startup line and serves until SIGTERM or SIGINT;
/// then stops as [`AppState::shutdown`] says and logs what was written to the SSD tier.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    config.check().map_err(ServeError::Config)?;
    let path = model_path(&config).await?;
    let (bundle, backend) = load(&config, path.clone()).await?;
    let (weight_bytes, per_token) = (
        bundle.model.weight_bytes(),
        bundle.model.weight_bytes_per_token(),
    );
    let weights = bundle.model.numerics();
    let settings = config.settings();
    let state = AppState::with_backend(Arc::new(bundle), settings.clone(), backend)
        .map_err(io("engine thread"))?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(io(format!("bind {addr}")))?;
    let local = listener.local_addr().map_err(io("local address"))?;
    println!(
        "mtplx serving {} ({}) on http://{local} | device {} | context {} tokens | weights {:.1} MiB ({}), {:.1} MiB read a token | \
         kv {} {:?} | max active {} | speculation {} | memory limit {:.1} GiB, bank {:.1} GiB | SSD cache {} \
         | request log {} | key {}",
        state.model_id(),
        path.display(),
        state.device(),
        state.context_window(),
        weight_bytes as f64 / (1 << 20) as f64,
        weights,
        per_token as f64 / (1 << 20) as f64,
        state.tier().factory().dtype(),
        state.tier().factory().layout(),
        settings.max_active_requests,
        match settings.speculation.depth {
            0 => "off".to_string(),
            d => format!(
                "depth {d}, {}, {:?}",
                settings.speculation.head.describe(state.bundle()),
                settings.speculation.policy
            ),
        },
        settings.cache.bank.memory_limit_bytes as f64 / (1u64 << 30) as f64,
        settings.cache.bank.max_bytes as f64 / (1u64 << 30) as f64,
        match state.tier().ssd_mode() {
            SsdMode::Off => "off".to_string(),
            SsdMode::On | SsdMode::WriteOnly => state.tier().ssd_dir().display().to_string(),
        },
        settings
            .request_log
            .as_ref()
            .map_or_else(|| "off".to_string(), |p| p.display().to_string()),
        if settings.api_key.is_some() {
            "required"
        } else {
            "off"
        },
    );
    let signal = stop_signal().map_err(io("installing the SIGTERM handler"))?;
    run(listener, state.clone(), signal).await?;
    tracing::info!(
        "stopping: no new connections; the conversations in RAM go to the SSD tier within {:.1} s",
        state.settings().shutdown_flush.as_secs_f64()
    );
    let report = state.shutdown().await;
    log_flush(&state, &report);
    Ok(())
}

/// Resolves at the first SIGTERM (what systemd, Docker and Kubernetes send) or SIGINT.
fn stop_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// Says what a stop wrote and what it could not.
fn log_flush(state: &AppState, report: &mtplx_bank::FlushReport) {
    if state.tier().ssd_mode() == SsdMode::Off {
        let entries = state.tier().bank().stats().entries;
        tracing::warn!(
            entries,
            "stopped: the SSD session cache is off, so the conversations in RAM are not kept"
        );
        return;
    }
    for (session, tokens, failure) in &report.failed {
        tracing::warn!(
            session = crate::session::session_hash(session.as_str()),
            tokens,
            reason = failure.reason,
            "not written at the stop: {}",
            failure.detail
        );
    }
    tracing::info!(
        written = report.written,
        already_on_ssd = report.already_written,
        failed = report.failed.len(),
        still_writing = report.pending,
        "stopped: {} conversation(s) written to the SSD tier, {} already there, {} could not be \
         written, {} still being written at the deadline",
        report.written,
        report.already_written,
        report.failed.len(),
        report.pending
    );
}

/// Serves `state` on `listener` until `shutdown` completes. Connections already open keep
/// running on their own tasks.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let app = crate::app::<hyper::body::Incoming>(state);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new();
            if let Err(e) = conn.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_a_path_that_exists_else_a_known_model_else_a_path() {
        let dir = tempfile::tempdir().unwrap();
        // A file named like a known model's id is still that file.
        let file = dir.path().join("SmolLM2-135M-Instruct");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(model_arg(Some(&file)), ModelArg::Path(&file));
        assert_eq!(model_arg(None), ModelArg::Known(&DEFAULT_MODEL));
        let id = Path::new("qwen2.5-coder-0.5b-instruct-q4_k_m");
        assert_eq!(
            model_arg(Some(id)),
            ModelArg::Known(&store::QWEN_CODER_05B_Q4_K_M)
        );
        let missing = dir.path().join("missing.gguf");
        assert_eq!(model_arg(Some(&missing)), ModelArg::Path(&missing));
    }

    /// On a GPU the products take the activations the CPU would: `--weights` when given,
    /// else 8-bit for a K-quant file and `f32` for the default model's Q4_1.
    #[test]
    fn a_gpu_model_takes_the_activations_the_cpu_would() {
        use mtplx_model::shaped::{write_gguf, Quant, Shape};
        let Some(tok) = std::env::var_os("MTPLX_TEST_MODEL").map(PathBuf::from) else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let km = dir.path().join("tiny-q4_k_m.gguf");
        write_gguf(&km, Shape::TINY, Quant::Q4KM, 5, &tok).unwrap();
        let act = |format, path: &Path| device_activations(format, path).unwrap();
        assert_eq!(act(None, &km), Activations::Q8);
        assert_eq!(act(None, &tok), Activations::F32);
        assert_eq!(act(Some(WeightFormat::Native), &km), Activations::F32);
        assert_eq!(act(Some(WeightFormat::NativeQ8), &tok), Activations::Q8);
        assert!(device_activations(None, &dir.path().join("missing.gguf")).is_err());
    }

    #[tokio::test]
    async fn a_cuda_device_that_does_not_open_stops_the_start_with_one_line() {
        let model =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
        // No machine has device 999: without a driver, without a GPU or with eight.
        let model = model.to_str().unwrap();
        let config = <Config as clap::Parser>::try_parse_from([
            "mtplx-serve",
            "--model",
            model,
            "--device",
            "cuda:999",
            "--port",
            "0",
            "--ssd-session-cache",
            "off",
            "--request-log-jsonl",
            "off",
        ])
        .unwrap();
        let e = serve(config).await.unwrap_err();
        #[cfg(feature = "cuda")]
        assert!(
            matches!(e, ServeError::Device(DeviceError::Open { .. })),
            "{e:?}"
        );
        // Refused by the flags' check, before anything loads.
        #[cfg(not(feature = "cuda"))]
        assert!(matches!(e, ServeError::Config(_)), "{e:?}");
        let line = e.to_string();
        assert!(line.starts_with("--device cuda:999: "), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}

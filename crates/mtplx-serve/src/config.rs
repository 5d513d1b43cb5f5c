//! Command-line flags, each with an `MTPLX_*` environment equivalent, grouped as `--help`
//! shows them: the model and where it runs (`--device`), limits, speculation, the session
//! bank, the SSD tier.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};
use mtplx_bank::BankConfig;
use mtplx_kv::{KvDtype, LayoutKind};
use mtplx_model::WeightFormat;

use crate::cache::{SsdMode, TierConfig};
use crate::device::{Device, DeviceError};
use crate::engine::{HeadSource, PolicyKind, Speculation};
use crate::request_log::{self, Rotation};
use crate::state::Settings;

/// How weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Weights {
    /// Kept in the file's quantized blocks and run by mtplx's own batch-invariant kernels
    /// with `f32` activations (the default for files without K-quant tensors).
    Native,
    /// As `native`, with the activations of Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K products rounded
    /// to 8 bits per block, as llama.cpp's CPU backend does (the default for K-quant files:
    /// Q4_K_M and the like; on a Q4_1 file, such as the default model's, opt-in: faster, and
    /// other answers than the reference's).
    #[value(name = "native-q8")]
    NativeQ8,
    /// Dequantised to f32 at load.
    F32,
    /// Kept in the file's quantized blocks, run by candle's quantized matmul.
    Quantized,
}

impl From<Weights> for WeightFormat {
    fn from(w: Weights) -> Self {
        match w {
            Weights::Native => WeightFormat::Native,
            Weights::NativeQ8 => WeightFormat::NativeQ8,
            Weights::F32 => WeightFormat::F32,
            Weights::Quantized => WeightFormat::Quantized,
        }
    }
}

/// How the speculative depth adapts (`--adaptive-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AdaptivePolicy {
    /// Always draft `--depth` tokens.
    None,
    /// Grow after a fully accepted draft, shrink after a rejection.
    Streak,
    /// Maximise expected accepted tokens per step.
    #[value(name = "expected_value")]
    ExpectedValue,
    /// Maximise expected tokens per second of measured step time.
    Cost,
}

impl From<AdaptivePolicy> for PolicyKind {
    fn from(p: AdaptivePolicy) -> Self {
        match p {
            AdaptivePolicy::None => PolicyKind::None,
            AdaptivePolicy::Streak => PolicyKind::Streak,
            AdaptivePolicy::ExpectedValue => PolicyKind::ExpectedValue,
            AdaptivePolicy::Cost => PolicyKind::Cost,
        }
    }
}

/// `--ssd-session-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SsdFlag {
    Off,
    On,
    #[value(name = "write-only")]
    WriteOnly,
}

/// `--kv-layout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LayoutFlag {
    Contiguous,
    Paged,
    Segmented,
}

/// `--kv-quant`: K/V rows quantized in groups of 32 values, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvQuant {
    /// Rows stored in `--kv-dtype`'s float type.
    Off,
    /// 8-bit integers with an `f16` scale per 32 values (ggml's `q8_0`): 34 bytes per 32
    /// values, 53% of `f16`.
    Q8,
    /// 4-bit integers with an `f16` scale and offset per 32 values (ggml's `q4_1`): 20
    /// bytes per 32 values, 31% of `f16`.
    Q4,
}

/// A size in bytes: a number with an optional `K`/`M`/`G`/`T` suffix (powers of 1024,
/// `B`, `iB` and `b` accepted: `512M`, `8GiB`, `100GB`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (try 512M, 8G, 100GB)"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(format!("`{s}`: unknown size unit (use K, M, G or T)")),
    };
    Ok((n * mult as f64) as u64)
}

/// A number of seconds: finite and not negative.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (try 0, 2.5, 30)")),
    }
}

/// The MTP head trained for the default model (`models/mtp/README.md`).
pub const SHIPPED_MTP_HEAD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/mtp/smollm2-135m-mtp.safetensors"
);

/// `--device`: `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

/// A speculative depth: 1 or more (0 is `--no-mtp`).
pub fn parse_depth(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("`--depth` takes 1 or more; to turn speculation off, pass --no-mtp".into()),
        Ok(d) => Ok(d),
        Err(_) => Err(format!("`{s}` is not a depth (try 1, 3, 5)")),
    }
}

/// Serve a model over OpenAI- and Anthropic-compatible HTTP APIs.
#[derive(Debug, Clone, Parser)]
#[command(name = "mtplx-serve", version)]
pub struct Config {
    /// A GGUF file, a Hugging Face model folder, or the id of a model the store fetches on
    /// first use (`SmolLM2-135M-Instruct`, `Qwen2.5-Coder-0.5B-Instruct-Q4_K_M`) [default:
    /// SmolLM2-135M-Instruct].
    #[arg(long, env = "MTPLX_MODEL")]
    pub model: Option<PathBuf>,
    #[arg(long, env = "MTPLX_HOST", default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, env = "MTPLX_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Required when binding anything but loopback; clients send it as a Bearer token or
    /// `x-api-key`.
    #[arg(long, env = "MTPLX_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Context window in tokens [default: the model's].
    #[arg(long, env = "MTPLX_CONTEXT_WINDOW")]
    pub context_window: Option<usize>,
    /// How weights are held in memory [default: `native-q8` for a GGUF file with K-quant
    /// tensors, `native` otherwise]. CPU only: a device backend holds them its own way.
    #[arg(long, env = "MTPLX_WEIGHTS", value_enum)]
    pub weights: Option<Weights>,
    /// Where the model runs: `cpu` (mtplx's kernels), or an NVIDIA GPU, `cuda` (device 0)
    /// or `cuda:N`, which needs a build with `--features cuda` and serves dense models
    /// (Llama, Qwen2, Qwen3) with f16 or f32 K/V.
    #[arg(
        long,
        env = "MTPLX_DEVICE",
        default_value = "cpu",
        value_parser = parse_device
    )]
    pub device: Device,
    /// Prompt tokens per prefill forward pass.
    #[arg(long, env = "MTPLX_PREFILL_CHUNK_TOKENS", default_value_t = 512)]
    pub prefill_chunk_tokens: usize,
    /// The KV layout the engine decodes in (restores are built in it) [default: paged]. CPU
    /// only: a model on a device keeps its K/V in the device's own caches.
    #[arg(long, env = "MTPLX_KV_LAYOUT", value_enum)]
    pub kv_layout: Option<LayoutFlag>,
    /// The element type K/V rows are stored in, in RAM and on the SSD tier: `f16` halves
    /// what `f32` costs and keeps the reference's greedy tokens on the default model; each
    /// row is rounded once, when written. States stored under another type are not reused
    /// (`ssd_kv_format_mismatch`) [default: f16; a device stores f16 or f32].
    #[arg(long, env = "MTPLX_KV_DTYPE")]
    pub kv_dtype: Option<KvDtype>,
    /// Quantize K/V rows in groups of 32 values instead (`q8`, `q4`; also `--kv-dtype q8`):
    /// less RAM, SSD bytes and attention reads than `f16`, with the answers those rounded
    /// values give; every path (cold, RAM, SSD, speculative) still gives the same tokens.
    /// Needs heads of a multiple of 32 values. `off` keeps `--kv-dtype`.
    #[arg(
        long,
        env = "MTPLX_KV_QUANT",
        value_enum,
        default_value = "off",
        conflicts_with = "kv_dtype"
    )]
    pub kv_quant: KvQuant,
    /// Request log path, or `off` [default: $MTPLX_HOME/logs/request-log-PORT.jsonl].
    #[arg(long, env = "MTPLX_REQUEST_LOG_JSONL")]
    pub request_log_jsonl: Option<String>,
    /// Seconds a stop (SIGTERM, SIGINT) may take: the running generation is given half to
    /// finish, then cancelled; the conversations not yet on the SSD tier are written until
    /// the deadline.
    #[arg(
        long,
        env = "MTPLX_SHUTDOWN_FLUSH_S",
        default_value_t = 10.0,
        value_parser = parse_seconds
    )]
    pub shutdown_flush_s: f64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub speculation: SpeculationArgs,
    #[command(flatten)]
    pub bank: BankArgs,
    #[command(flatten)]
    pub ssd: SsdArgs,
}

/// What one request may take: slots, body, time, memory.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Generation requests in flight at once; more get a 503 with Retry-After.
    #[arg(long, env = "MTPLX_MAX_ACTIVE_REQUESTS", default_value_t = 8)]
    pub max_active_requests: usize,
    /// Largest request body in bytes.
    #[arg(long, env = "MTPLX_MAX_BODY_BYTES", default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a response may take to start.
    #[arg(long, env = "MTPLX_REQUEST_TIMEOUT", default_value_t = 600)]
    pub request_timeout: u64,
    /// Memory a request's projected peak may reach (weights, bank, running requests);
    /// above it the bank sheds entries, then the request gets HTTP 507 [default: 85% of
    /// RAM].
    #[arg(long, env = "MTPLX_MEMORY_LIMIT", value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
}

/// Speculative decoding: how deep, drafted by what, adapting how; `--no-mtp` turns it off.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Speculation")]
pub struct SpeculationArgs {
    /// Most draft tokens verified per forward pass in `mtp` mode (1 or more; `--no-mtp`
    /// turns speculation off).
    #[arg(long, env = "MTPLX_DEPTH", default_value_t = 3, value_parser = parse_depth)]
    pub depth: usize,
    /// Decode one token per forward pass for every request: no speculation.
    #[arg(long, env = "MTPLX_NO_MTP")]
    pub no_mtp: bool,
    /// The MTP head that drafts in `mtp` mode (a `.safetensors` file, or a Hugging Face
    /// folder whose shards hold `mtp.*`), or `none` for prompt lookup alone [default: the
    /// head shipped in this repository's models/mtp/ when the default model runs, else the
    /// model checkpoint's own `mtp.*` head if it has one].
    #[arg(long, env = "MTPLX_MTP_HEAD")]
    pub mtp_head: Option<String>,
    /// How the draft depth adapts: `cost` (the default) drafts the depth (0 to `--depth`)
    /// with the most tokens per measured second, so speculation that does not pay on this
    /// machine falls back to plain steps; `none` always drafts `--depth` tokens.
    #[arg(
        long,
        env = "MTPLX_ADAPTIVE_POLICY",
        value_enum,
        default_value = "cost"
    )]
    pub adaptive_policy: AdaptivePolicy,
}

/// The RAM session bank's budgets.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Session bank")]
pub struct BankArgs {
    /// Bytes the RAM session bank may hold [default: min(24G, RAM/4)].
    #[arg(long, env = "MTPLX_SESSION_BANK_MAX_BYTES", value_parser = parse_bytes)]
    pub session_bank_max_bytes: Option<u64>,
    /// Bytes one session may hold in the bank [default: min(8G, bank/3)].
    #[arg(long, env = "MTPLX_SESSION_BANK_MAX_SESSION_BYTES", value_parser = parse_bytes)]
    pub session_bank_max_session_bytes: Option<u64>,
    /// Entries the bank may hold [default: 24].
    #[arg(long, env = "MTPLX_SESSION_BANK_MAX_ENTRIES")]
    pub session_bank_max_entries: Option<usize>,
    /// Newest entries kept per session [default: 3].
    #[arg(long, env = "MTPLX_SESSION_BANK_ENTRIES_PER_SESSION")]
    pub session_bank_entries_per_session: Option<usize>,
    /// Seconds an idle entry stays in the bank [default: 3600].
    #[arg(long, env = "MTPLX_SESSION_BANK_TTL")]
    pub session_bank_ttl: Option<u64>,
}

/// The SSD tier the bank spills to and restores from.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "SSD tier")]
pub struct SsdArgs {
    /// Spill evicted conversations to an SSD tier and restore them from it.
    #[arg(
        long,
        env = "MTPLX_SSD_SESSION_CACHE",
        value_enum,
        default_value = "on"
    )]
    pub ssd_session_cache: SsdFlag,
    /// Where the SSD tier lives [default: $MTPLX_HOME/session-bank].
    #[arg(long, env = "MTPLX_SSD_SESSION_CACHE_DIR")]
    pub ssd_session_cache_dir: Option<PathBuf>,
    /// Largest size of the SSD tier [default: by RAM, 16G to 100G, at most a quarter of
    /// the free disk].
    #[arg(long, env = "MTPLX_SSD_SESSION_CACHE_MAX_SIZE", value_parser = parse_bytes)]
    pub ssd_session_cache_max_size: Option<u64>,
    /// Free disk below which the SSD tier starts no write [default: 10G].
    #[arg(
        long,
        env = "MTPLX_SSD_SESSION_CACHE_FREE_DISK_FLOOR",
        value_parser = parse_bytes
    )]
    pub ssd_session_cache_free_disk_floor: Option<u64>,
    /// Seconds a conversation is idle before it is written behind to the SSD tier, so a
    /// crash or a kill loses no conversation idle that long; 0 writes every turn.
    #[arg(
        long,
        env = "MTPLX_SSD_SESSION_CACHE_IDLE_WRITE_S",
        default_value_t = mtplx_bank::DEFAULT_IDLE_WRITE.as_secs_f64(),
        value_parser = parse_seconds
    )]
    pub ssd_session_cache_idle_write_s: f64,
    /// The fewest prompt tokens a hybrid model's stored state must cover at one of its
    /// checkpoints to be restored (RAM or SSD); below it the prompt is computed instead
    /// (`prefix_boundary_below_floor`, `ssd_prefix_boundary_below_floor`).
    #[arg(
        long,
        env = "MTPLX_SSD_SESSION_CACHE_MIN_PREFIX_TOKENS",
        default_value_t = crate::cache::DEFAULT_MIN_PREFIX_TOKENS
    )]
    pub ssd_session_cache_min_prefix_tokens: usize,
}

/// Whether `host` names the loopback interface.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Config {
    /// Refuses settings that must not run: a non-loopback bind without an API key.
    pub fn check(&self) -> Result<(), String> {
        let has_key = self.api_key.as_deref().is_some_and(|k| !k.is_empty());
        if !is_loopback(&self.host) && !has_key {
            return Err(format!(
                "refusing to bind {} without an API key: pass --api-key (or MTPLX_API_KEY), or \
                 bind 127.0.0.1",
                self.host
            ));
        }
        if self.limits.max_active_requests == 0 {
            return Err("--max-active-requests must be at least 1".into());
        }
        self.check_device()
    }

    /// Refuses what a model on a device can't do: a build without the device's backend,
    /// K/V stored as anything but `f16` or `f32`, a host KV layout, weights held another
    /// way.
    fn check_device(&self) -> Result<(), String> {
        let device = self.device;
        if device == Device::Cpu {
            return Ok(());
        }
        if !cfg!(feature = "cuda") {
            return Err(DeviceError::NotBuilt(device).to_string());
        }
        if let Some(dtype) = self
            .explicit_kv_dtype()
            .filter(|d| !matches!(d, KvDtype::F16 | KvDtype::F32))
        {
            return Err(format!(
                "--device {device}: device K/V caches store f16 or f32, not {dtype}; \
                 use --kv-dtype f16 (the default) or f32"
            ));
        }
        if self.kv_layout.is_some() {
            return Err(format!(
                "--device {device}: the model keeps its K/V in the device's own caches; \
                 --kv-layout is for the CPU, drop it"
            ));
        }
        if let Some(w) = self.weights.filter(|&w| w != Weights::Native) {
            return Err(format!(
                "--device {device}: the device backend holds the weights its own way; \
                 --weights {} is for the CPU, drop it",
                w.to_possible_value()
                    .map_or_else(String::new, |v| v.get_name().to_owned())
            ));
        }
        Ok(())
    }

    /// The K/V element type the flags name, if they name one (`--kv-quant q8|q4`, else
    /// `--kv-dtype`).
    fn explicit_kv_dtype(&self) -> Option<KvDtype> {
        match self.kv_quant {
            KvQuant::Off => self.kv_dtype,
            KvQuant::Q8 => Some(KvDtype::Q8),
            KvQuant::Q4 => Some(KvDtype::Q4),
        }
    }

    /// The K/V element type: the one the flags name, else `f16`, on the CPU as on a device.
    pub fn kv_dtype(&self) -> KvDtype {
        self.explicit_kv_dtype().unwrap_or(KvDtype::F16)
    }

    /// Where the request log goes, `None` when off.
    pub fn request_log_path(&self) -> Option<PathBuf> {
        match self.request_log_jsonl.as_deref() {
            Some("off" | "") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => Some(request_log::default_path(self.port)),
        }
    }

    /// The weight format `--weights` asks for; `None` leaves it to the file
    /// ([`mtplx_model::Bundle::default_format`]).
    pub fn weight_format(&self) -> Option<WeightFormat> {
        self.weights.map(Into::into)
    }

    pub fn settings(&self) -> Settings {
        Settings {
            context_window: self.context_window,
            max_active_requests: self.limits.max_active_requests,
            prefill_chunk_tokens: self.prefill_chunk_tokens,
            request_log: self.request_log_path(),
            request_log_rotation: Rotation::default(),
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            max_body_bytes: self.limits.max_body_bytes,
            request_timeout: Duration::from_secs(self.limits.request_timeout),
            speculation: Speculation {
                depth: self.speculation.depth(),
                policy: self.speculation.adaptive_policy.into(),
                head: self.mtp_head(),
            },
            cache: self.tier_config(),
            shutdown_flush: Duration::from_secs_f64(self.shutdown_flush_s),
        }
    }

    /// The MTP head `--mtp-head` names; without the flag, the shipped one for the default
    /// model and the checkpoint's own (if it has one) for any other.
    pub fn mtp_head(&self) -> HeadSource {
        match self.speculation.mtp_head.as_deref() {
            Some("none" | "off" | "") => HeadSource::Off,
            Some(path) => HeadSource::File(PathBuf::from(path)),
            None => {
                let default_model = self.model.as_ref().is_none_or(|m| {
                    m.file_name()
                        .is_some_and(|n| n == mtplx_model::store::DEFAULT_MODEL.file_name)
                });
                let shipped = PathBuf::from(SHIPPED_MTP_HEAD);
                match default_model && shipped.is_file() {
                    true => HeadSource::File(shipped),
                    false => HeadSource::Checkpoint,
                }
            }
        }
    }

    /// The cache tier these flags ask for.
    pub fn tier_config(&self) -> TierConfig {
        let mut t = TierConfig::detect();
        t.layout = match (self.device, self.kv_layout) {
            (Device::Cuda(_), _) => LayoutKind::Device,
            (Device::Cpu, None | Some(LayoutFlag::Paged)) => LayoutKind::Paged,
            (Device::Cpu, Some(LayoutFlag::Contiguous)) => LayoutKind::Contiguous,
            (Device::Cpu, Some(LayoutFlag::Segmented)) => LayoutKind::Segmented,
        };
        t.kv_dtype = self.kv_dtype();
        self.ssd.apply(&mut t);
        self.bank.apply(&mut t.bank);
        if let Some(v) = self.limits.memory_limit {
            t.bank.memory_limit_bytes = v;
        }
        t
    }
}

impl SpeculationArgs {
    /// The engine's depth: 0 (speculation off) under `--no-mtp`, else `--depth`.
    pub fn depth(&self) -> usize {
        if self.no_mtp {
            0
        } else {
            self.depth
        }
    }
}

impl BankArgs {
    /// Sets the budgets these flags name; the others keep the machine's defaults.
    fn apply(&self, b: &mut BankConfig) {
        if let Some(v) = self.session_bank_max_bytes {
            b.max_bytes = v;
            b.max_session_bytes = b.max_session_bytes.min(v);
        }
        if let Some(v) = self.session_bank_max_session_bytes {
            b.max_session_bytes = v;
        }
        if let Some(v) = self.session_bank_max_entries {
            b.max_entries = v;
        }
        if let Some(v) = self.session_bank_entries_per_session {
            b.max_entries_per_session = v;
        }
        if let Some(v) = self.session_bank_ttl {
            b.idle_ttl = Duration::from_secs(v);
        }
    }
}

impl SsdArgs {
    /// Sets the SSD tier these flags ask for, and when the bank writes behind to it.
    fn apply(&self, t: &mut TierConfig) {
        t.ssd = match self.ssd_session_cache {
            SsdFlag::Off => SsdMode::Off,
            SsdFlag::On => SsdMode::On,
            SsdFlag::WriteOnly => SsdMode::WriteOnly,
        };
        if let Some(dir) = &self.ssd_session_cache_dir {
            t.ssd_dir = dir.clone();
        }
        t.ssd_max_bytes = self.ssd_session_cache_max_size;
        t.ssd_free_disk_floor = self.ssd_session_cache_free_disk_floor;
        t.bank.idle_write = Some(Duration::from_secs_f64(self.ssd_session_cache_idle_write_s));
        t.min_prefix_tokens = self.ssd_session_cache_min_prefix_tokens;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The flags `args` as a server's command line would give them.
    pub(crate) fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("mtplx-serve").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn loopback_binds_need_no_key_and_others_do() {
        assert!(parse(&[]).check().is_ok());
        assert!(parse(&["--host", "::1"]).check().is_ok());
        assert!(parse(&["--host", "localhost"]).check().is_ok());
        let open = parse(&["--host", "0.0.0.0"]);
        assert!(open.check().unwrap_err().contains("--api-key"));
        assert!(parse(&["--host", "0.0.0.0", "--api-key", "k"])
            .check()
            .is_ok());
        assert!(parse(&["--host", "0.0.0.0", "--api-key", ""])
            .check()
            .is_err());
    }

    #[test]
    fn every_flag_has_an_mtplx_environment_variable() {
        use clap::CommandFactory;
        let cmd = Config::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no env var"));
            let want = format!("MTPLX_{}", id.to_uppercase());
            assert_eq!(env.to_str(), Some(want.as_str()), "--{id}");
        }
    }

    #[test]
    fn flags_become_settings() {
        let c = parse(&[
            "--port",
            "9001",
            "--context-window",
            "512",
            "--weights",
            "quantized",
            "--request-log-jsonl",
            "off",
            "--max-active-requests",
            "3",
        ]);
        assert_eq!(c.weight_format(), Some(WeightFormat::Quantized));
        assert_eq!(parse(&[]).weight_format(), None);
        assert_eq!(
            parse(&["--weights", "native"]).weight_format(),
            Some(WeightFormat::Native)
        );
        assert_eq!(
            parse(&["--weights", "native-q8"]).weight_format(),
            Some(WeightFormat::NativeQ8)
        );
        let s = c.settings();
        assert_eq!(s.context_window, Some(512));
        assert_eq!(s.max_active_requests, 3);
        assert_eq!(s.request_log, None);
        assert_eq!(s.speculation.depth, 3);
        assert_eq!(s.speculation.policy, PolicyKind::Cost);
        let c = parse(&["--depth", "2", "--adaptive-policy", "expected_value"]);
        assert_eq!(
            c.settings().speculation,
            Speculation {
                depth: 2,
                policy: PolicyKind::ExpectedValue,
                head: HeadSource::File(PathBuf::from(SHIPPED_MTP_HEAD)),
            }
        );
        assert_eq!(parse(&["--no-mtp"]).settings().speculation.depth, 0);
        assert_eq!(parse(&["--mtp-head", "none"]).mtp_head(), HeadSource::Off);
        assert_eq!(
            parse(&["--mtp-head", "/h.safetensors"]).mtp_head(),
            HeadSource::File(PathBuf::from("/h.safetensors"))
        );
        // Another model gets its checkpoint's own head (if any) unless one is named.
        assert_eq!(
            parse(&["--model", "/m/other.gguf"]).mtp_head(),
            HeadSource::Checkpoint
        );
        let t = parse(&[
            "--ssd-session-cache",
            "write-only",
            "--ssd-session-cache-dir",
            "/tmp/x",
            "--memory-limit",
            "2G",
            "--session-bank-max-bytes",
            "512M",
            "--session-bank-ttl",
            "60",
            "--kv-layout",
            "segmented",
            "--kv-dtype",
            "bf16",
            "--ssd-session-cache-free-disk-floor",
            "0",
        ])
        .tier_config();
        assert_eq!(t.kv_dtype, mtplx_kv::KvDtype::Bf16);
        assert_eq!(parse(&[]).tier_config().kv_dtype, mtplx_kv::KvDtype::F16);
        assert!(Config::try_parse_from(["mtplx-serve", "--kv-dtype", "f8"]).is_err());
        let quant = |q: &str| parse(&["--kv-quant", q]).tier_config().kv_dtype;
        assert_eq!(quant("q8"), mtplx_kv::KvDtype::Q8);
        assert_eq!(quant("q4"), mtplx_kv::KvDtype::Q4);
        assert_eq!(quant("off"), mtplx_kv::KvDtype::F16);
        assert_eq!(
            parse(&["--kv-dtype", "q8"]).tier_config().kv_dtype,
            mtplx_kv::KvDtype::Q8
        );
        // Both at once is ambiguous: refused.
        assert!(
            Config::try_parse_from(["mtplx-serve", "--kv-quant", "q4", "--kv-dtype", "f32"])
                .is_err()
        );
        assert_eq!(t.ssd, SsdMode::WriteOnly);
        assert_eq!(t.ssd_dir, PathBuf::from("/tmp/x"));
        assert_eq!(t.bank.memory_limit_bytes, 2 << 30);
        assert_eq!(t.bank.max_bytes, 512 << 20);
        assert!(t.bank.max_session_bytes <= 512 << 20);
        assert_eq!(t.bank.idle_ttl, Duration::from_secs(60));
        assert_eq!(t.layout, mtplx_kv::LayoutKind::Segmented);
        assert_eq!(t.ssd_free_disk_floor, Some(0));
        assert_eq!(parse(&[]).tier_config().ssd, SsdMode::On);
        assert_eq!(
            parse(&[]).tier_config().bank.idle_write,
            Some(mtplx_bank::DEFAULT_IDLE_WRITE)
        );
        let c = parse(&[
            "--ssd-session-cache-idle-write-s",
            "0",
            "--shutdown-flush-s",
            "2.5",
        ]);
        assert_eq!(c.tier_config().bank.idle_write, Some(Duration::ZERO));
        assert_eq!(c.settings().shutdown_flush, Duration::from_millis(2500));
        assert_eq!(
            parse(&[]).settings().shutdown_flush,
            Duration::from_secs(10)
        );
        for bad in ["-1", "soon", "inf"] {
            assert!(Config::try_parse_from(["mtplx-serve", "--shutdown-flush-s", bad]).is_err());
        }
        assert_eq!(parse(&[]).tier_config().ssd_free_disk_floor, None);
    }

    #[test]
    fn speculation_is_turned_off_one_way() {
        let e = Config::try_parse_from(["mtplx-serve", "--depth", "0"]).unwrap_err();
        assert!(e.to_string().contains("--no-mtp"), "{e}");
        assert_eq!(parse(&["--depth", "1"]).settings().speculation.depth, 1);
        let off = parse(&["--no-mtp", "--depth", "5"]).settings().speculation;
        assert_eq!(off.depth, 0);
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_bytes("100GB").unwrap(), 100 << 30);
        assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("512m").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
        assert_eq!(parse_bytes("42").unwrap(), 42);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5X").is_err());
        let d = parse(&["--port", "9001"]);
        let log = d.request_log_path().unwrap();
        assert!(
            log.ends_with("logs/request-log-9001.jsonl"),
            "{}",
            log.display()
        );
    }
}

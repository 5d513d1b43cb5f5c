//! Where the model runs (`--device cpu|cuda[:N]`): the flag's value ([`Device`]), what a
//! model on a device gives the cache tier and the engine beyond the bundle ([`Backend`],
//! [`DeviceModel`]), and why a device could not be used ([`DeviceError`]).
//!
//! A model on a device, its caches and its MTP head share the device's one stream: they are
//! used from one thread at a time, the engine's (see `ARCHITECTURE.md`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::MtpRunner;
use mtplx_model::ModelError;

/// `--device`: where the model's weights, K/V and forward passes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU, on mtplx's own kernels.
    #[default]
    Cpu,
    /// The NVIDIA GPU of this ordinal (`cuda` is `cuda:0`), on mtplx-model's CUDA backend.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`, in any case.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match name.strip_prefix("cuda:") {
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| {
                    format!("`{s}`: a CUDA device is numbered from 0 (cuda:0, cuda:1)")
                }),
                None => Err(format!("`{s}` is not a device (try cpu, cuda or cuda:1)")),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Where the model runs, and what running there gives the cache tier and the engine
/// beyond the bundle.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// The CPU: caches in the tier's host layout; the engine loads the MTP head itself.
    #[default]
    Cpu,
    /// A device: caches from the model's own factory, the MTP head already beside it.
    Device(DeviceModel),
}

impl Backend {
    /// The factory of a device model's caches; `None` on the CPU.
    pub fn device_caches(&self) -> Option<&CacheFactory> {
        match self {
            Backend::Cpu => None,
            Backend::Device(m) => Some(&m.caches),
        }
    }

    /// Where the model runs, in words: `cpu`, `cuda:0 (NVIDIA H200)`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => Device::Cpu.to_string(),
            Backend::Device(m) => m.name.clone(),
        }
    }
}

/// A model on a device, as the server uses it (the model itself is the bundle's).
#[derive(Clone)]
pub struct DeviceModel {
    /// The device, in words: `cuda:0 (NVIDIA H200)`.
    pub name: String,
    /// The factory of the model's own caches (`LayoutKind::Device`, `f16` or `f32` rows,
    /// as the tier's K/V type says): the engine decodes in them, restores are built in them, and the MTP head's one-layer
    /// cache is one of them.
    pub caches: CacheFactory,
    /// The MTP head, uploaded beside the model; `None` when speculation drafts by prompt
    /// lookup alone or is off.
    pub head: Option<Arc<dyn MtpRunner>>,
}

impl fmt::Debug for DeviceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceModel")
            .field("name", &self.name)
            .field("caches", &self.caches)
            .field("head", &self.head.is_some())
            .finish()
    }
}

/// Why the model could not be put on the device `--device` names. Each is one line that
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "--device {0}: this mtplx-serve was built without CUDA support; build it with \
         `cargo build --release -p mtplx-serve --features cuda`, or serve with --device cpu"
    )]
    NotBuilt(Device),
    #[error(
        "--device {device}: {} holds a hybrid (Qwen3-Next) model, which runs on the CPU only \
         for now; serve it with --device cpu",
        path.display()
    )]
    Hybrid { device: Device, path: PathBuf },
    #[error("--device {device}: the device could not be opened ({source})")]
    Open {
        device: Device,
        #[source]
        source: Box<ModelError>,
    },
    #[error("--device {device}: {} could not be loaded onto the device ({source})", path.display())]
    Load {
        device: Device,
        path: PathBuf,
        #[source]
        source: Box<ModelError>,
    },
    #[error("--device {device}: the MTP head could not be put on the device ({reason}); pass --mtp-head none to draft by prompt lookup alone")]
    Head { device: Device, reason: String },
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use mtplx_kv::{KvDtype, LayoutKind};

    use super::*;
    use crate::config::tests::parse;
    use crate::config::Config;

    #[test]
    fn devices_parse_and_print_back() {
        for (text, device) in [
            ("cpu", Device::Cpu),
            ("CPU", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:0", Device::Cuda(0)),
            ("cuda:1", Device::Cuda(1)),
            (" Cuda:12 ", Device::Cuda(12)),
        ] {
            assert_eq!(text.parse::<Device>(), Ok(device), "{text}");
            assert_eq!(device.to_string().parse::<Device>(), Ok(device));
        }
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        assert_eq!(Device::default(), Device::Cpu);
        for bad in [
            "", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda1", "metal", "cuda:0:1",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
        assert!("cuda:x".parse::<Device>().unwrap_err().contains("cuda:0"));
    }

    #[test]
    fn the_device_flag_names_the_cpu_or_a_cuda_device() {
        assert_eq!(parse(&[]).device, Device::Cpu);
        assert_eq!(parse(&["--device", "cpu"]).device, Device::Cpu);
        assert_eq!(parse(&["--device", "cuda"]).device, Device::Cuda(0));
        assert_eq!(parse(&["--device", "cuda:1"]).device, Device::Cuda(1));
        for bad in ["gpu", "cuda:", "cuda:one", "cuda:-1"] {
            let e = Config::try_parse_from(["mtplx-serve", "--device", bad]).unwrap_err();
            let e = e.to_string();
            assert!(e.contains("--device") && e.contains(bad), "{bad}: {e}");
        }
        // The CPU keeps its defaults.
        let cpu = parse(&["--device", "cpu"]);
        assert!(cpu.check().is_ok());
        assert_eq!(cpu.tier_config().kv_dtype, KvDtype::F16);
        assert_eq!(cpu.tier_config().layout, LayoutKind::Paged);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_refuses_a_cuda_device_and_says_how_to_build_one() {
        for device in ["cuda", "cuda:1"] {
            let e = parse(&["--device", device]).check().unwrap_err();
            assert!(e.contains("without CUDA support"), "{e}");
            assert!(
                e.contains("cargo build --release -p mtplx-serve --features cuda"),
                "{e}"
            );
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_cuda_device_keeps_f16_kv_in_its_own_caches_and_refuses_other_types() {
        let gpu = parse(&["--device", "cuda"]);
        assert_eq!(gpu.check(), Ok(()));
        let t = gpu.tier_config();
        assert_eq!((t.kv_dtype, t.layout), (KvDtype::F16, LayoutKind::Device));
        let wide = parse(&["--device", "cuda:1", "--kv-dtype", "f32"]);
        assert_eq!(wide.check(), Ok(()));
        assert_eq!(wide.tier_config().kv_dtype, KvDtype::F32);
        assert_eq!(
            parse(&[
                "--device",
                "cuda",
                "--kv-quant",
                "off",
                "--weights",
                "native"
            ])
            .check(),
            Ok(())
        );
        for refused in [
            &["--kv-dtype", "bf16"][..],
            &["--kv-quant", "q8"],
            &["--kv-dtype", "q4"],
        ] {
            let mut args = vec!["--device", "cuda"];
            args.extend(refused);
            let e = parse(&args).check().unwrap_err();
            assert!(e.contains("device K/V caches store f16 or f32"), "{e}");
            assert!(e.starts_with("--device cuda:0: "), "{e}");
        }
        for (flag, value) in [("--kv-layout", "paged"), ("--weights", "quantized")] {
            let e = parse(&["--device", "cuda", flag, value])
                .check()
                .unwrap_err();
            assert!(e.contains(&format!("{flag} ")) && e.contains("CPU"), "{e}");
        }
    }
}

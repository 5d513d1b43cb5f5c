//! Putting the model on an NVIDIA GPU (`--device cuda[:N]`, feature `cuda`): the weights
//! straight onto the device, the bundle's text side (tokenizer, chat template) beside them,
//! and the MTP head uploaded next to the model. Hybrid (Qwen3-Next) models are refused from
//! their metadata before the device is opened.

use std::path::Path;

use mtplx_model::kernels::Activations;
use mtplx_model::Bundle;

use crate::device::{DeviceError, DeviceModel};
use crate::engine::Speculation;

/// Opens CUDA device `ordinal` and names it (`cuda:0 (NVIDIA H200)`): whether this machine
/// can serve on it. Fails where the driver or the device is missing, or in a build without
/// the `cuda` feature.
pub fn open(ordinal: usize) -> Result<String, DeviceError> {
    imp::open(ordinal)
}

/// Loads the dense model at `path` onto CUDA device `ordinal`, with its text side, and
/// the MTP head `speculation` asks for, uploaded beside it (none when its depth is 0); the
/// model's products take `activations` (8-bit for Q4_K and Q6_K weights with
/// [`Activations::Q8`], as the CPU's `--weights native-q8`).
/// Blocking: reads the weights and uploads them. A hybrid model is refused before the
/// device is opened.
pub fn load(
    path: &Path,
    ordinal: usize,
    speculation: &Speculation,
    activations: Activations,
) -> Result<(Bundle, DeviceModel), DeviceError> {
    imp::load(path, ordinal, speculation, activations)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use std::path::Path;

    use mtplx_model::Bundle;

    use crate::device::{Device, DeviceError, DeviceModel};
    use crate::engine::Speculation;

    pub(super) fn open(ordinal: usize) -> Result<String, DeviceError> {
        Err(DeviceError::NotBuilt(Device::Cuda(ordinal)))
    }

    pub(super) fn load(
        _: &Path,
        ordinal: usize,
        _: &Speculation,
        _: mtplx_model::kernels::Activations,
    ) -> Result<(Bundle, DeviceModel), DeviceError> {
        Err(DeviceError::NotBuilt(Device::Cuda(ordinal)))
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use std::path::Path;
    use std::sync::Arc;

    use mtplx_model::cuda::{CudaDevice, CudaModel, CudaMtpHead};
    use mtplx_model::mtp::MtpRunner;
    use mtplx_model::Bundle;

    use crate::device::{Device, DeviceError, DeviceModel};
    use crate::engine::Speculation;

    pub(super) fn open(ordinal: usize) -> Result<String, DeviceError> {
        let (_, name) = open_device(ordinal)?;
        Ok(name)
    }

    /// Opens the device and names it (`cuda:0 (NVIDIA H200)`).
    fn open_device(ordinal: usize) -> Result<(Arc<CudaDevice>, String), DeviceError> {
        let device = Device::Cuda(ordinal);
        let dev = CudaDevice::open(ordinal).map_err(|e| DeviceError::Open {
            device,
            source: Box::new(e),
        })?;
        let name = format!("{device} ({})", dev.name());
        Ok((dev, name))
    }

    pub(super) fn load(
        path: &Path,
        ordinal: usize,
        speculation: &Speculation,
        activations: mtplx_model::kernels::Activations,
    ) -> Result<(Bundle, DeviceModel), DeviceError> {
        let device = Device::Cuda(ordinal);
        let load_error = |e| DeviceError::Load {
            device,
            path: path.to_path_buf(),
            source: Box::new(e),
        };
        // From the metadata alone, so the device is not opened for a model it can't run.
        if Bundle::is_hybrid(path).map_err(load_error)? {
            return Err(DeviceError::Hybrid {
                device,
                path: path.to_path_buf(),
            });
        }
        let (dev, name) = open_device(ordinal)?;
        let gpu = CudaModel::load_with(path, dev, activations).map_err(load_error)?;
        let head = match speculation.depth {
            0 => None,
            _ => {
                let head_error = |reason| DeviceError::Head { device, reason };
                // Read for the model on the device (its tied embedding is the head's output
                // rows), then uploaded beside it. A dense checkpoint carries no head.
                match speculation.head.load_file(&gpu).map_err(head_error)? {
                    Some(host) => Some(Arc::new(
                        CudaMtpHead::new(&host, &gpu).map_err(|e| head_error(e.to_string()))?,
                    ) as Arc<dyn MtpRunner>),
                    None => None,
                }
            }
        };
        let caches = gpu.cache_factory();
        let bundle = Bundle::load_text(path, Box::new(gpu)).map_err(load_error)?;
        let model = DeviceModel { name, caches, head };
        Ok((bundle, model))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn tiny_llama() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama")
    }

    #[test]
    fn a_hybrid_model_is_refused_before_the_device_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        // Only the family: no weights, no tokenizer; no device is needed to refuse it.
        std::fs::write(
            dir.path().join("config.json"),
            format!(
                r#"{{"model_type": "{}"}}"#,
                mtplx_model::hybrid::hf::MODEL_TYPE
            ),
        )
        .unwrap();
        let Err(e) = load(dir.path(), 0, &Speculation::default(), Activations::F32) else {
            panic!("a hybrid model was put on a GPU");
        };
        #[cfg(feature = "cuda")]
        assert!(matches!(e, DeviceError::Hybrid { .. }), "{e}");
        #[cfg(not(feature = "cuda"))]
        assert!(
            matches!(e, DeviceError::NotBuilt(crate::device::Device::Cuda(0))),
            "{e}"
        );
        let line = e.to_string();
        assert!(line.starts_with("--device cuda:0: "), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn a_device_that_does_not_open_is_an_error_not_a_panic() {
        // No machine has device 999: without a driver, without a GPU or with eight, the
        // open fails, and says so.
        let Err(e) = load(
            &tiny_llama(),
            999,
            &Speculation::default(),
            Activations::F32,
        ) else {
            panic!("device 999 opened");
        };
        #[cfg(feature = "cuda")]
        assert!(matches!(e, DeviceError::Open { .. }), "{e}");
        #[cfg(not(feature = "cuda"))]
        assert!(matches!(e, DeviceError::NotBuilt(_)), "{e}");
        assert!(e.to_string().starts_with("--device cuda:999: "), "{e}");
        assert!(open(999).is_err());
    }
}

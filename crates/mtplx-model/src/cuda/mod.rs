//! The CUDA backend (feature `cuda`): the Llama / Qwen2 graph with its weights, K/V and
//! every operation on an NVIDIA GPU.
//!
//! [`CudaModel`] implements [`LanguageModel`] over [`CudaKvCache`]s (built through
//! `CacheFactory::Device` with [`CudaCaches`]), so generation, speculative decoding and the
//! bank use it as they use the CPU model. Weights stay in their file's own blocks (GGUF
//! Q4_0 … Q6_K, F16, BF16, F32), dequantized inside the kernels as ggml does, so a token
//! reads each weight byte once; attention runs in parts of 256 cached positions merged in
//! order, so the context is the model's own. The kernels (`kernels.cu`, compiled at run
//! time by NVRTC, so building needs no CUDA) compute each row the same way whatever rows
//! share its launch, so a verify block's logits equal a decode step's bit for bit and
//! greedy speculation stays token-identical.
//!
//! The driver and NVRTC libraries are loaded when a device is opened: a binary built with
//! this feature runs on a machine without CUDA, where [`CudaDevice::open`] returns
//! [`ModelError::Device`].

#[cfg(test)]
mod attend_tests;
mod cache;
mod device;
mod fault;
mod fused;
mod graph;
mod lent;
mod matrix;
mod model;
mod mtp;
mod pass;
mod q8;
mod source;
#[cfg(test)]
mod speed;
mod staging;
mod switches;
#[cfg(test)]
mod tests;

pub use cache::{CudaCaches, CudaKvCache};
pub use device::CudaDevice;
pub use model::CudaModel;
pub use mtp::CudaMtpHead;
pub use source::compile;

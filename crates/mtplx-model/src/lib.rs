//! Model graphs, weights, tokenizer, chat templates and sampling for mtplx.
//!
//! Loads GGUF files and Hugging Face folders of the Llama, Qwen2 and Qwen3 families and runs
//! them on the CPU, and Qwen3-Next-style hybrid models ([`hybrid`]). A model runs on a
//! [`mtplx_kv::Sequence`] whose K/V is in the layout the caller chose (and which holds a
//! hybrid model's recurrent state and checkpoints). [`LanguageModel`] is the seam the rest
//! of mtplx uses, for dense and hybrid models alike; another backend implements it without
//! touching the callers.
//!
//! This crate must not know about HTTP, sessions, the bank or the SSD tier. Its only file I/O
//! is reading model files, and the [`store`] that fetches the default model.
//!
//! ```no_run
//! use mtplx_kv::CacheFactory;
//! use mtplx_model::{generate_greedy, LanguageModel, Model, WeightFormat};
//!
//! # fn main() -> Result<(), mtplx_model::ModelError> {
//! let model = Model::load("model.gguf".as_ref(), WeightFormat::F32)?;
//! let mut seq = model.new_sequence(&CacheFactory::contiguous());
//! let tokens = generate_greedy(&model, &mut seq, &[1, 2, 3], 8, &[2], 512)?;
//! # let _ = tokens; Ok(()) }
//! ```

mod bundle;
pub mod chat;
mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod generate;
pub mod hybrid;
pub mod kernels;
mod model;
pub mod mtp;
pub mod ops;
pub mod sampling;
pub mod shaped;
pub mod source;
pub mod stop;
pub mod store;
pub mod tokenizer;
mod weights;

pub use bundle::{model_id, Bundle, ReuseKey};
pub use config::{Architecture, Dims, ModelConfig, RopeStyle};
pub use error::{BackendError, ModelError, Result};
pub use generate::{generate_greedy, prefill, FinishReason, Generator};
pub use model::{ForwardOutput, LanguageModel, Model, Want};
pub use weights::{FileData, FilePart, Linear, RawWeight, WeightFormat};

//! A model with everything needed to serve it: weights, tokenizer, chat template, identity.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chat::{ChatMessage, ChatRequest, ChatTemplate, Role};
use crate::error::{ModelError, Result};
use crate::hybrid::{self, HybridModel};
use crate::model::{LanguageModel, Model};
use crate::mtp::MtpRunner;
use crate::source::{GgufSource, HfSource};
use crate::tokenizer::Tokenizer;
use crate::weights::WeightFormat;

/// A loaded model and its text side.
pub struct Bundle {
    /// The name clients use (`/v1/models`, the `model` field).
    pub id: String,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// A dense or a hybrid model, behind the one seam.
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    /// The model's own chat template, when it has one.
    pub template: Option<ChatTemplate>,
    /// The MTP head the checkpoint itself carries (a hybrid checkpoint's `mtp.*`); a dense
    /// model's head is a file of its own ([`crate::mtp::MtpHead::load`]).
    pub mtp_head: Option<Arc<dyn MtpRunner>>,
}

impl Bundle {
    /// Loads a GGUF file or a Hugging Face folder (dense, or a Qwen3-Next hybrid one: a
    /// folder whose `model_type` is `qwen3_next`, a GGUF file whose `general.architecture`
    /// is `qwen35` or `qwen3next`, its tokenizer then from the file's metadata) with its
    /// tokenizer and chat template. A hybrid model always runs on mtplx's kernels
    /// ([`WeightFormat::Native`]); another `format` is refused for it.
    pub fn load(path: &Path, format: WeightFormat) -> Result<Self> {
        let mut mtp_head = None;
        let mut hybrid = |model: HybridModel| -> Box<dyn LanguageModel> {
            mtp_head = model.mtp_head().map(|h| h as Arc<dyn MtpRunner>);
            Box::new(model)
        };
        let (model, tokenizer): (Box<dyn LanguageModel>, _) = if path.is_dir() {
            let tokenizer = folder_tokenizer(path)?;
            if is_hybrid_folder(path)? {
                native_only(path, format)?;
                (hybrid(HybridModel::load(path)?), tokenizer)
            } else {
                let mut src = HfSource::open(path)?;
                let config = src.config()?;
                (
                    Box::new(Model::from_source(&mut src, config, format)?),
                    tokenizer,
                )
            }
        } else {
            let mut src = GgufSource::open(path)?;
            let tokenizer = Tokenizer::from_gguf(src.content())?;
            if hybrid::gguf::architecture(src.content()).is_some() {
                native_only(path, format)?;
                let (config, weights) = hybrid::gguf::read(&mut src)?;
                (hybrid(HybridModel::new(config, &weights)?), tokenizer)
            } else {
                let config = src.config()?;
                let model = Model::from_source(&mut src, config, format)?;
                (Box::new(model), tokenizer)
            }
        };
        assemble(path, model, tokenizer, mtp_head)
    }

    /// `path`'s text side (tokenizer, chat template) beside `model`, which was loaded
    /// another way (a device backend reads the weights onto its device itself): no weight
    /// is read here. A hybrid checkpoint's own MTP head is not loaded (`mtp_head` is
    /// `None`).
    pub fn load_text(path: &Path, model: Box<dyn LanguageModel>) -> Result<Self> {
        let tokenizer = if path.is_dir() {
            folder_tokenizer(path)?
        } else {
            Tokenizer::from_gguf(GgufSource::open(path)?.content())?
        };
        assemble(path, model, tokenizer, None)
    }

    /// The weight format a server gives `path` unless told otherwise: for a dense GGUF
    /// file, [`WeightFormat::for_gguf`] of its `general.file_type` (8-bit activations for
    /// K-quant files); [`WeightFormat::Native`] for a folder or a hybrid model (which runs on
    /// `f32` activations only).
    pub fn default_format(path: &Path) -> Result<WeightFormat> {
        if path.is_dir() {
            return Ok(WeightFormat::Native);
        }
        let src = GgufSource::open(path)?;
        let content = src.content();
        if hybrid::gguf::architecture(content).is_some() {
            return Ok(WeightFormat::Native);
        }
        let file_type = match content.metadata.get("general.file_type") {
            Some(v) => v.to_u32().ok(),
            None => None,
        };
        Ok(WeightFormat::for_gguf(file_type))
    }

    /// Whether `path` holds a hybrid (Qwen3-Next) model, from its metadata alone (a
    /// folder's `config.json` `model_type`, a GGUF file's `general.architecture`): no
    /// weight is read.
    pub fn is_hybrid(path: &Path) -> Result<bool> {
        if path.is_dir() {
            is_hybrid_folder(path)
        } else {
            Ok(hybrid::gguf::architecture(GgufSource::open(path)?.content()).is_some())
        }
    }
}

/// A Hugging Face folder's `tokenizer.json` (with its `tokenizer_config.json` if present).
fn folder_tokenizer(path: &Path) -> Result<Tokenizer> {
    let cfg = path.join("tokenizer_config.json");
    Ok(Tokenizer::from_file(
        &path.join("tokenizer.json"),
        cfg.exists().then_some(cfg.as_path()),
    )?)
}

/// The bundle of `model` and its text side, once the tokenizer is known to fit the model.
fn assemble(
    path: &Path,
    model: Box<dyn LanguageModel>,
    tokenizer: Tokenizer,
    mtp_head: Option<Arc<dyn MtpRunner>>,
) -> Result<Bundle> {
    let vocab = model.dims().vocab_size;
    if tokenizer.vocab_size() > vocab {
        return Err(ModelError::BadConfig {
            path: path.to_path_buf(),
            reason: format!(
                "the tokenizer has {} tokens but the model only {vocab}",
                tokenizer.vocab_size(),
            ),
        });
    }
    let template = match tokenizer.chat_template() {
        Some(src) => Some(ChatTemplate::new(
            src,
            &tokenizer.bos_token().unwrap_or_default(),
            &tokenizer.eos_token().unwrap_or_default(),
        )?),
        None => None,
    };
    Ok(Bundle {
        id: model_id(path),
        path: path.to_path_buf(),
        model,
        tokenizer,
        template,
        mtp_head,
    })
}

/// What makes a state this model computed reusable: a state stored under another key is
/// never reused. The three parts are plain text, for whatever store keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReuseKey {
    /// The model and its geometry.
    pub model: String,
    /// The chat template's behaviour: a hash of a probe conversation rendered by it
    /// (`none` without a template), so a template that renders the same shares states.
    pub chat_template: String,
    /// How the numbers are computed: the weight format (each runs its own kernels, so its
    /// own bits; the layouts and the prefill chunking change no bit).
    pub numerics: String,
}

impl Bundle {
    /// The key states computed by this bundle are stored under.
    pub fn reuse_key(&self) -> ReuseKey {
        let chat_template = self.template.as_ref().map_or_else(
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
        ReuseKey {
            model: format!("{} {}", self.id, self.model.geometry()),
            chat_template,
            numerics: self.model.numerics(),
        }
    }
}

/// A hybrid model runs on mtplx's kernels only: another weight format is refused.
fn native_only(path: &Path, format: WeightFormat) -> Result<()> {
    if format == WeightFormat::Native {
        return Ok(());
    }
    Err(ModelError::BadConfig {
        path: path.to_path_buf(),
        reason: format!(
            "a hybrid model runs on mtplx's kernels only (weights `native`), not {format:?}"
        ),
    })
}

/// Whether the Hugging Face folder `dir` holds a hybrid (Qwen3-Next) model, by its
/// `config.json`'s `model_type`.
fn is_hybrid_folder(dir: &Path) -> Result<bool> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::BadConfig {
        path: path.clone(),
        reason: format!("cannot read it: {e}"),
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::BadConfig {
            path: path.clone(),
            reason: format!("not JSON: {e}"),
        })?;
    Ok(value.get("model_type").and_then(|v| v.as_str()) == Some(hybrid::hf::MODEL_TYPE))
}

/// A model's public name: the file stem without a quantization suffix, or the folder name.
pub fn model_id(path: &Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    let name = name.map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned());
    match name.rsplit_once('.') {
        Some((stem, quant)) if quant.starts_with(['Q', 'q', 'F', 'f', 'B', 'b']) => {
            stem.to_string()
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_drop_the_quant_suffix() {
        assert_eq!(
            model_id(Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct"
        );
        assert_eq!(model_id(Path::new("/m/plain.gguf")), "plain");
    }

    fn tiny(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny")
            .join(name)
    }

    #[test]
    fn the_text_side_loads_beside_a_model_loaded_another_way() {
        let path = tiny("llama");
        let full = Bundle::load(&path, WeightFormat::Native).unwrap();
        let model = Model::load(&path, WeightFormat::Native).unwrap();
        let text = Bundle::load_text(&path, Box::new(model)).unwrap();
        assert_eq!(text.id, full.id);
        assert_eq!(text.reuse_key(), full.reuse_key());
        let probe = "Hello, world";
        assert_eq!(
            text.tokenizer
                .encode(probe, crate::tokenizer::Special::Parse)
                .unwrap(),
            full.tokenizer
                .encode(probe, crate::tokenizer::Special::Parse)
                .unwrap()
        );
        assert!(text.mtp_head.is_none());
    }

    /// A decode step's weight bytes (a bandwidth bound's numerator) leave out an embedding
    /// table of its own (one row of it is read) and count a tied one, which is the head.
    #[test]
    fn a_token_reads_the_head_but_not_an_untied_embedding_table() {
        let tied = Model::load(&tiny("llama"), WeightFormat::Native).unwrap();
        assert!(tied.config().tie_embeddings);
        assert_eq!(tied.weight_bytes_per_token(), tied.weight_bytes());
        let untied = Model::load(&tiny("qwen2"), WeightFormat::Native).unwrap();
        let c = untied.config();
        assert!(!c.tie_embeddings);
        let table = c.vocab_size * c.hidden_size * 4;
        assert_eq!(
            untied.weight_bytes() - untied.weight_bytes_per_token(),
            table
        );
    }

    #[test]
    fn hybrid_models_are_told_from_their_metadata() {
        assert!(!Bundle::is_hybrid(&tiny("llama")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        // No weights, no tokenizer: the family is read from `config.json` alone.
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"model_type": "{}"}}"#, hybrid::hf::MODEL_TYPE),
        )
        .unwrap();
        assert!(Bundle::is_hybrid(dir.path()).unwrap());
        assert!(Bundle::is_hybrid(&dir.path().join("missing.gguf")).is_err());
    }
}

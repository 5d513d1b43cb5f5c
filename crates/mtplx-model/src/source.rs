//! Reading tensors out of checkpoints: GGUF files and Hugging Face folders.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::RawWeight;

/// Where each of a layer's tensors lives in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    Embed,
    FinalNorm,
    LmHead,
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    FfnNorm,
    Gate,
    Up,
    Down,
}

/// A checkpoint the graph can take tensors from.
pub trait WeightSource {
    /// The file or folder, for error messages.
    fn path(&self) -> &Path;
    /// The name of `role` (in `layer`) in this checkpoint's convention.
    fn name(&self, role: TensorRole, layer: usize) -> String;
    /// The tensor called `name`, or `None` when the checkpoint has no such tensor.
    fn get(&mut self, name: &str) -> Result<Option<RawWeight>>;
}

/// A GGUF file: metadata parsed, tensors read on demand.
pub struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    reader: BufReader<File>,
}

impl GgufSource {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = gguf_file::Content::read(&mut reader).map_err(|e| ModelError::BadGguf {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(GgufSource {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    pub fn content(&self) -> &gguf_file::Content {
        &self.content
    }

    pub fn config(&self) -> Result<ModelConfig> {
        ModelConfig::from_gguf(&self.path, &self.content.metadata)
    }
}

impl WeightSource for GgufSource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self, role: TensorRole, layer: usize) -> String {
        use TensorRole::*;
        let suffix = match role {
            Embed => return "token_embd.weight".into(),
            FinalNorm => return "output_norm.weight".into(),
            LmHead => return "output.weight".into(),
            AttnNorm => "attn_norm.weight",
            Q => "attn_q.weight",
            K => "attn_k.weight",
            V => "attn_v.weight",
            O => "attn_output.weight",
            QBias => "attn_q.bias",
            KBias => "attn_k.bias",
            VBias => "attn_v.bias",
            QNorm => "attn_q_norm.weight",
            KNorm => "attn_k_norm.weight",
            FfnNorm => "ffn_norm.weight",
            Gate => "ffn_gate.weight",
            Up => "ffn_up.weight",
            Down => "ffn_down.weight",
        };
        format!("blk.{layer}.{suffix}")
    }

    fn get(&mut self, name: &str) -> Result<Option<RawWeight>> {
        if !self.content.tensor_infos.contains_key(name) {
            return Ok(None);
        }
        let q = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::BadTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Some(RawWeight::Quant(q)))
    }
}

/// A Hugging Face folder: `config.json` and memory-mapped `*.safetensors` shards.
pub struct HfSource {
    dir: PathBuf,
    shards: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `shards`.
    index: HashMap<String, usize>,
}

impl HfSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ModelError::Io { path, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::NotAModel {
                path: dir.to_path_buf(),
                reason: "no *.safetensors files".into(),
            });
        }
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(io(&path))?;
            // SAFETY: the map is read-only; checkpoints are not modified while loaded.
            let mmap = unsafe { Mmap::map(&file) }.map_err(io(&path))?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::BadSafetensors {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), shards.len());
            }
            shards.push((path, mmap));
        }
        Ok(HfSource {
            dir: dir.to_path_buf(),
            shards,
            index,
        })
    }

    pub fn config(&self) -> Result<ModelConfig> {
        let path = self.dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        ModelConfig::from_hf_json(&path, &text)
    }
}

impl WeightSource for HfSource {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn name(&self, role: TensorRole, layer: usize) -> String {
        use TensorRole::*;
        let suffix = match role {
            Embed => return "model.embed_tokens.weight".into(),
            FinalNorm => return "model.norm.weight".into(),
            LmHead => return "lm_head.weight".into(),
            AttnNorm => "input_layernorm.weight",
            Q => "self_attn.q_proj.weight",
            K => "self_attn.k_proj.weight",
            V => "self_attn.v_proj.weight",
            O => "self_attn.o_proj.weight",
            QBias => "self_attn.q_proj.bias",
            KBias => "self_attn.k_proj.bias",
            VBias => "self_attn.v_proj.bias",
            QNorm => "self_attn.q_norm.weight",
            KNorm => "self_attn.k_norm.weight",
            FfnNorm => "post_attention_layernorm.weight",
            Gate => "mlp.gate_proj.weight",
            Up => "mlp.up_proj.weight",
            Down => "mlp.down_proj.weight",
        };
        format!("model.layers.{layer}.{suffix}")
    }

    fn get(&mut self, name: &str) -> Result<Option<RawWeight>> {
        let Some(&shard) = self.index.get(name) else {
            return Ok(None);
        };
        let (path, mmap) = &self.shards[shard];
        let bad = |reason: String| ModelError::BadTensor {
            path: path.clone(),
            tensor: name.to_string(),
            reason,
        };
        let st = SafeTensors::deserialize(mmap).map_err(|e| bad(e.to_string()))?;
        let view = st.tensor(name).map_err(|e| bad(e.to_string()))?;
        dense_from_view(path, name, &view).map(Some)
    }
}

/// A safetensors tensor (`F32`, `F16` or `BF16`) as a dense `f32` weight; `path` and `name`
/// only name it in the error.
pub(crate) fn dense_from_view(
    path: &Path,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<RawWeight> {
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(ModelError::UnsupportedDType {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(RawWeight::Dense(Tensor::from_vec(
        values,
        view.shape(),
        &Device::Cpu,
    )?))
}

//! Hybrid checkpoints as GGUF files, under llama.cpp's names: architecture `qwen35` (what
//! llama.cpp's converter writes for a dense-MLP gated-delta-net model; its `qwen3next`
//! refuses a model without experts) and, for reading, `qwen3next` with dense MLPs. The
//! metadata keys, tensor names and conversions, with their sources, are in
//! `docs/hybrid-checkpoints.md` §4.
//!
//! What differs from [`HybridWeights`] (reading converts, writing converts back):
//! - The gated delta net's `in_proj_qkvz` is split into `attn_qkv` (`[q | k | v]`) and
//!   `attn_gate` (z), and `in_proj_ba` into `ssm_beta` and `ssm_alpha` (`qwen35`) or kept
//!   grouped per key head as `ssm_ba` (`qwen3next`, the Hugging Face layout).
//! - `ssm_a` holds `-exp(A_log)`, the decay rate itself. Reading takes the `f32` whose `exp`
//!   is that rate, so the model computes the same rate, bit for bit; `A_log`'s own bits are
//!   not always recoverable (`exp` maps several `f32`s to one), and a file written elsewhere
//!   may hold a rate no `f32` `exp` gives, which is then matched to within an ulp.
//! - `attn_q` is interleaved per head (`[q_h, gate_h]`, as Hugging Face's `q_proj`).
//! - Norms are stored as the multiplier (Hugging Face's zero-centred weight plus one), which
//!   is what [`HybridWeights`] holds: no conversion.
//! - **V-head order (`qwen35`).** When `linear_num_key_heads != linear_num_value_heads`,
//!   llama.cpp's current `qwen35` converter reorders the value heads from grouped to tiled:
//!   GGUF head `j·nk + g` holds head `g·r + j` of the checkpoint (key head `g`, `r = nv /
//!   nk`), in the V rows of `attn_qkv` and the V channels of `ssm_conv1d`, the rows of
//!   `attn_gate`, `ssm_beta` and `ssm_alpha`, `ssm_a`, `ssm_dt.bias` and the columns of
//!   `ssm_out`. This module writes and reads that tiled order. An older converter wrote
//!   the grouped order with no metadata to tell them apart, so a `qwen35` file from it would
//!   load with its value heads scrambled (the converter-version dependence is
//!   **UNVERIFIED** against real files; see the doc). `qwen3next` files are never reordered.
//!
//! llama.cpp uses `ssm.state_size` as both the key and the value head width, so a config
//! with `linear_key_head_dim != linear_value_head_dim` is refused, as are layer types that
//! `full_attention_interval` cannot express, attention value heads of another width than
//! the key heads, routed experts (named by their tensor), attention biases and the legacy
//! fused `ssm_in`.
//!
//! **The MTP head** ([`HybridWeights::mtp`]) is llama.cpp's `nextn` block, as its `qwen35`
//! converter (`_Qwen35MtpMixin`) writes it: `{arch}.nextn_predict_layers` is 1,
//! `{arch}.block_count` counts it (`num_layers + 1`), and block `blk.{num_layers}` holds
//! the head's decoder layer under a full-attention block's names (`attn_norm`, `attn_q`
//! interleaved as the trunk's, `attn_k`, `attn_v`, `attn_output`, `attn_q_norm`,
//! `attn_k_norm`, `post_attention_norm`, `ffn_gate`/`ffn_up`/`ffn_down`) with
//! `nextn.eh_proj` (`mtp.fc`, `[H, 2H]`, input `[embedding ⊕ hidden]`), `nextn.enorm`
//! (`pre_fc_norm_embedding`), `nextn.hnorm` (`pre_fc_norm_hidden`) and
//! `nextn.shared_head_norm` (`mtp.norm`), every norm as the multiplier like the trunk's.
//! - Reading takes the first `nextn` block only (Qwen3.5 publishes one; llama.cpp's graph
//!   runs one); a missing or misshapen tensor of it is an error that names it. A block's
//!   own `nextn.embed_tokens` / `nextn.shared_head_head` are not read: the head uses the
//!   trunk's embedding and output head (the same tensors in Qwen3.5).
//! - Writing adds the block under `qwen35` only. llama.cpp's `qwen3next` converter drops
//!   the MTP tensors, so a `qwen3next` file is written without them; one that declares
//!   `nextn` blocks anyway is read as a `qwen35` one is.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};
use crate::hybrid::config::{HybridConfig, LayerKind};
use crate::hybrid::hf::{permute, tensor, RowMaps};
use crate::hybrid::weights::{
    AttentionWeights, GdnWeights, HybridWeights, LayerWeights, MixerWeights, MlpWeights, MtpWeights,
};
use crate::source::{GgufSource, WeightSource};
use crate::tokenizer::Tokenizer;

/// The llama.cpp architectures of a hybrid GGUF file (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qwen35`: split `ssm_beta`/`ssm_alpha`, tiled V heads. What [`save`] writes.
    Qwen35,
    /// `qwen3next`: grouped `ssm_ba`, grouped V heads. llama.cpp itself loads only its
    /// mixture-of-experts form; mtplx reads (and, for tests, writes) the dense one.
    Qwen3Next,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen35 => "qwen35",
            Arch::Qwen3Next => "qwen3next",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "qwen35" => Some(Arch::Qwen35),
            "qwen3next" => Some(Arch::Qwen3Next),
            _ => None,
        }
    }
}

/// The hybrid architecture a GGUF file's metadata names, if it names one.
pub fn architecture(content: &gguf_file::Content) -> Option<Arch> {
    match content.metadata.get("general.architecture") {
        Some(Value::String(name)) => Arch::parse(name),
        _ => None,
    }
}

/// Reads a hybrid GGUF file: its configuration and every weight, in this crate's layout.
pub fn load(path: &Path) -> Result<(HybridConfig, HybridWeights)> {
    read(&mut GgufSource::open(path)?)
}

/// [`load`] from a file already opened (the tokenizer can then come from the same
/// metadata).
pub fn read(src: &mut GgufSource) -> Result<(HybridConfig, HybridWeights)> {
    let path = src.path().to_path_buf();
    let content = src.content();
    let arch_name = match content.metadata.get("general.architecture") {
        Some(Value::String(name)) => name.clone(),
        _ => String::new(),
    };
    let arch = Arch::parse(&arch_name).ok_or_else(|| ModelError::BadConfig {
        path: path.clone(),
        reason: format!(
            "general.architecture `{arch_name}` is not a hybrid one (`qwen35`, `qwen3next`)"
        ),
    })?;
    refuse_unsupported_tensors(&path, content)?;
    let c = config(&path, content, arch)?;
    let weights = weights(src, &c, arch)?;
    Ok((c, weights))
}

/// Tensors that name something the model does not compute, refused by name.
fn refuse_unsupported_tensors(path: &Path, content: &gguf_file::Content) -> Result<()> {
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let reason = if name.contains("ffn_gate_inp") || name.contains("_exps") {
            "routed experts are not supported yet, only dense MLPs"
        } else if name.contains("_shexp") {
            "shared experts are not supported yet, only dense MLPs"
        } else if name.ends_with(".ssm_in.weight") {
            "the legacy fused `ssm_in` is not supported (convert with a newer llama.cpp)"
        } else if name.ends_with(".bias") && !name.ends_with(".ssm_dt.bias") {
            "biases are not supported"
        } else {
            continue;
        };
        return Err(ModelError::BadTensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason: reason.into(),
        });
    }
    Ok(())
}

/// A metadata integer of any width.
fn uint(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

/// The configuration from `{arch}.*` metadata (and the tensors' presence).
fn config(path: &Path, content: &gguf_file::Content, arch: Arch) -> Result<HybridConfig> {
    let md = &content.metadata;
    let bad = |reason: String| ModelError::BadConfig {
        path: path.to_path_buf(),
        reason,
    };
    let key = |k: &str| format!("{}.{k}", arch.name());
    let opt = |k: &str| -> Result<Option<usize>> {
        md.get(&key(k))
            .map(|v| {
                uint(v)
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(format!("`{}` is not a whole number", key(k))))
            })
            .transpose()
    };
    let need = |k: &str| opt(k)?.ok_or_else(|| bad(format!("missing `{}`", key(k))));
    let float = |k: &str| -> Result<Option<f32>> {
        md.get(&key(k))
            .map(|v| match *v {
                Value::F32(x) => Ok(x),
                Value::F64(x) => Ok(x as f32),
                _ => Err(bad(format!("`{}` is not a number", key(k)))),
            })
            .transpose()
    };

    let experts = opt("expert_count")?.unwrap_or(0);
    if experts > 0 {
        return Err(bad(format!(
            "`{}` is {experts} (`blk.0.ffn_gate_inp.weight`): routed experts are not \
             supported yet, only dense MLPs",
            key("expert_count")
        )));
    }
    let mtp = opt("nextn_predict_layers")?.unwrap_or(0);
    let blocks = need("block_count")?;
    let num_layers = blocks
        .checked_sub(mtp)
        .ok_or_else(|| bad(format!("{mtp} prediction layers of {blocks} blocks")))?;
    let layer_types = match md.get(&key("attention.recurrent_layers")) {
        None => None,
        Some(Value::Array(list)) => {
            let kinds = list
                .iter()
                .map(|v| match *v {
                    Value::Bool(b) => Some(b),
                    ref v => uint(v).map(|x| x != 0),
                })
                .map(|r| {
                    r.map(|recurrent| match recurrent {
                        true => LayerKind::GatedDeltaNet,
                        false => LayerKind::FullAttention,
                    })
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    bad(format!(
                        "`{}` is not a list of flags",
                        key("attention.recurrent_layers")
                    ))
                })?;
            Some(kinds.into_iter().take(num_layers).collect())
        }
        Some(_) => {
            return Err(bad(format!(
                "`{}` is not a list",
                key("attention.recurrent_layers")
            )))
        }
    };
    let head_dim = need("attention.key_length")?;
    if let Some(v) = opt("attention.value_length")? {
        if v != head_dim {
            return Err(bad(format!(
                "attention value heads of {v} and key heads of {head_dim}: only equal widths \
                 are supported"
            )));
        }
    }
    let (nk, nv) = (need("ssm.group_count")?, need("ssm.time_step_rank")?);
    let (dk, inner) = (need("ssm.state_size")?, need("ssm.inner_size")?);
    if nv == 0 || inner != nv * dk {
        return Err(bad(format!(
            "`{}` {inner} is not `{}` {nv} × `{}` {dk}: llama.cpp assumes value heads as \
             wide as the key heads",
            key("ssm.inner_size"),
            key("ssm.time_step_rank"),
            key("ssm.state_size"),
        )));
    }
    let vocab_size = match opt("vocab_size")? {
        Some(v) => v,
        None => match (
            md.get("tokenizer.ggml.tokens"),
            content.tensor_infos.get("token_embd.weight"),
        ) {
            (Some(Value::Array(tokens)), _) => tokens.len(),
            (_, Some(t)) => t.shape.dims()[0],
            _ => {
                return Err(bad(
                    "no vocabulary size, tokens or `token_embd.weight`".into()
                ))
            }
        },
    };
    let rot = opt("rope.dimension_count")?.unwrap_or(head_dim);
    let mut c = HybridConfig {
        vocab_size,
        hidden_size: need("embedding_length")?,
        intermediate_size: need("feed_forward_length")?,
        num_layers,
        full_attention_interval: opt("full_attention_interval")?.unwrap_or(4),
        layer_types,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
            bad(format!(
                "missing `{}`",
                key("attention.layer_norm_rms_epsilon")
            ))
        })?,
        context_length: need("context_length")?,
        rope_theta: float("rope.freq_base")?.unwrap_or(10_000.0),
        partial_rotary_factor: rot as f32 / head_dim.max(1) as f32,
        num_attention_heads: need("attention.head_count")?,
        num_key_value_heads: need("attention.head_count_kv")?,
        head_dim,
        linear_num_key_heads: nk,
        linear_num_value_heads: nv,
        linear_key_head_dim: dk,
        linear_value_head_dim: dk,
        linear_conv_kernel_dim: need("ssm.conv_kernel")?,
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
    };
    if c.layer_types
        .as_ref()
        .is_some_and(|t| t.len() != num_layers)
    {
        return Err(bad(format!(
            "`{}` does not list every layer",
            key("attention.recurrent_layers")
        )));
    }
    // The factor whose rounding gives back the rotated width exactly.
    while c.rotary_dim() < (rot.min(head_dim) & !1) {
        c.partial_rotary_factor = c.partial_rotary_factor.next_up();
    }
    if rot != c.rotary_dim() {
        return Err(bad(format!(
            "`{}` {rot}: only an even width up to the head's {head_dim} is supported",
            key("rope.dimension_count")
        )));
    }
    c.check().map_err(bad)?;
    Ok(c)
}

/// For each GGUF value head, the [`HybridWeights`] head it holds.
fn v_heads(c: &HybridConfig, arch: Arch) -> Vec<usize> {
    let (nk, nv) = (c.linear_num_key_heads, c.linear_num_value_heads);
    let r = nv / nk.max(1);
    (0..nv)
        .map(|n| match arch {
            Arch::Qwen35 => (n % nk) * r + n / nk,
            Arch::Qwen3Next => n,
        })
        .collect()
}

/// A head map widened to rows of `width` each, after `base` rows that stay put.
fn rows(heads: &[usize], width: usize, base: usize) -> Vec<usize> {
    (0..base)
        .chain(
            heads
                .iter()
                .flat_map(|&h| (0..width).map(move |i| base + h * width + i)),
        )
        .collect()
}

/// Columns of a `[rows, cols]` matrix moved as [`permute`] moves rows.
fn permute_cols(data: &[f32], cols: usize, map: &[usize], inverse: bool) -> Vec<f32> {
    data.chunks(cols)
        .flat_map(|row| permute(row, 1, map, inverse))
        .collect()
}

/// The `f32` whose `exp` is `rate`, or the nearest to one (see the module docs).
fn a_log_of(rate: f32) -> f32 {
    let start = (rate as f64).ln() as f32;
    let miss = |a: f32| (a.exp() - rate).abs();
    let (mut best, mut down, mut up) = (start, start, start);
    for _ in 0..8 {
        down = down.next_down();
        up = up.next_up();
        for a in [down, up] {
            if miss(a) < miss(best) {
                best = a;
            }
        }
    }
    best
}

fn weights(src: &mut GgufSource, c: &HybridConfig, arch: Arch) -> Result<HybridWeights> {
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let embed = tensor(src, "token_embd.weight", &[vocab, h])?;
    let layers = (0..c.num_layers)
        .map(|l| read_layer(src, c, arch, l, c.layer_kind(l)))
        .collect::<Result<Vec<_>>>()?;
    let final_norm = tensor(src, "output_norm.weight", &[h])?;
    let lm_head = if c.tie_word_embeddings {
        embed.clone()
    } else {
        tensor(src, "output.weight", &[vocab, h])?
    };
    let mtp = read_mtp(src, c, arch)?;
    Ok(HybridWeights {
        embed,
        layers,
        final_norm,
        lm_head,
        mtp,
    })
}

/// The number of `nextn` (multi-token-prediction) blocks the file declares
/// (`{arch}.nextn_predict_layers`, absent: none).
fn nextn_layers(src: &GgufSource, arch: Arch) -> Result<usize> {
    let key = format!("{}.nextn_predict_layers", arch.name());
    match src.content().metadata.get(&key) {
        None => Ok(0),
        Some(v) => uint(v)
            .map(|x| x as usize)
            .ok_or_else(|| ModelError::BadConfig {
                path: src.path().to_path_buf(),
                reason: format!("`{key}` is not a whole number"),
            }),
    }
}

/// The MTP head from block `blk.{num_layers}` (llama.cpp's `nextn` block, see the module
/// docs), when the file declares one; only the first of several.
fn read_mtp(src: &mut GgufSource, c: &HybridConfig, arch: Arch) -> Result<Option<MtpWeights>> {
    if nextn_layers(src, arch)? == 0 {
        return Ok(None);
    }
    let (n, h) = (c.num_layers, c.hidden_size);
    let mut t = |name: &str, shape: &[usize]| tensor(src, &format!("blk.{n}.{name}"), shape);
    let fc = t("nextn.eh_proj.weight", &[h, 2 * h])?;
    let pre_fc_norm_embedding = t("nextn.enorm.weight", &[h])?;
    let pre_fc_norm_hidden = t("nextn.hnorm.weight", &[h])?;
    let norm = t("nextn.shared_head_norm.weight", &[h])?;
    Ok(Some(MtpWeights {
        pre_fc_norm_embedding,
        pre_fc_norm_hidden,
        fc,
        layer: read_layer(src, c, arch, n, LayerKind::FullAttention)?,
        norm,
    }))
}

/// Block `blk.{l}` as a decoder layer of `kind`.
fn read_layer(
    src: &mut GgufSource,
    c: &HybridConfig,
    arch: Arch,
    l: usize,
    kind: LayerKind,
) -> Result<LayerWeights> {
    let path = src.path().to_path_buf();
    let maps = RowMaps::new(c);
    let heads = v_heads(c, arch);
    let (h, inter) = (c.hidden_size, c.intermediate_size);
    let (kd, vd, nv, dv) = (
        c.linear_key_dim(),
        c.linear_value_dim(),
        c.linear_num_value_heads,
        c.linear_value_head_dim,
    );
    let mut t = |name: &str, shape: &[usize]| tensor(src, &format!("blk.{l}.{name}"), shape);
    let input_norm = t("attn_norm.weight", &[h])?;
    let mixer = match kind {
        LayerKind::GatedDeltaNet => {
            let (conv, kernel) = (c.linear_conv_dim(), c.linear_conv_kernel_dim);
            let qkv = t("attn_qkv.weight", &[2 * kd + vd, h])?;
            let z = t("attn_gate.weight", &[vd, h])?;
            let mut in_proj_qkvz = permute(&qkv, h, &rows(&heads, dv, 2 * kd), false);
            in_proj_qkvz.extend(permute(&z, h, &rows(&heads, dv, 0), false));
            let in_proj_ba = match arch {
                Arch::Qwen35 => {
                    let mut ba = permute(&t("ssm_beta.weight", &[nv, h])?, h, &heads, false);
                    ba.extend(permute(&t("ssm_alpha.weight", &[nv, h])?, h, &heads, false));
                    ba
                }
                Arch::Qwen3Next => permute(&t("ssm_ba.weight", &[2 * nv, h])?, h, &maps.ba, false),
            };
            let ssm_a = t("ssm_a", &[nv])?;
            if let Some(x) = ssm_a.iter().find(|x| !(x.is_finite() && **x < 0.0)) {
                return Err(ModelError::BadTensor {
                    path,
                    tensor: format!("blk.{l}.ssm_a"),
                    reason: format!("holds {x}: `-exp(A_log)` is negative"),
                });
            }
            let a_log: Vec<f32> = ssm_a.iter().map(|&s| a_log_of(-s)).collect();
            MixerWeights::GatedDeltaNet(GdnWeights {
                in_proj_qkvz,
                in_proj_ba,
                conv1d: permute(
                    &t("ssm_conv1d.weight", &[conv, kernel])?,
                    kernel,
                    &rows(&heads, dv, 2 * kd),
                    false,
                ),
                dt_bias: permute(&t("ssm_dt.bias", &[nv])?, 1, &heads, false),
                a_log: permute(&a_log, 1, &heads, false),
                norm: t("ssm_norm.weight", &[dv])?,
                out_proj: permute_cols(
                    &t("ssm_out.weight", &[h, vd])?,
                    vd,
                    &rows(&heads, dv, 0),
                    false,
                ),
            })
        }
        LayerKind::FullAttention => {
            let (q, kv, hd) = (
                c.num_attention_heads * c.head_dim,
                c.num_key_value_heads * c.head_dim,
                c.head_dim,
            );
            MixerWeights::FullAttention(AttentionWeights {
                q_proj: permute(&t("attn_q.weight", &[2 * q, h])?, h, &maps.q, false),
                k_proj: t("attn_k.weight", &[kv, h])?,
                v_proj: t("attn_v.weight", &[kv, h])?,
                o_proj: t("attn_output.weight", &[h, q])?,
                q_norm: t("attn_q_norm.weight", &[hd])?,
                k_norm: t("attn_k_norm.weight", &[hd])?,
            })
        }
    };
    Ok(LayerWeights {
        input_norm,
        mixer,
        post_attention_norm: t("post_attention_norm.weight", &[h])?,
        mlp: MlpWeights {
            gate: t("ffn_gate.weight", &[inter, h])?,
            up: t("ffn_up.weight", &[inter, h])?,
            down: t("ffn_down.weight", &[h, inter])?,
        },
    })
}

/// Why llama.cpp's `arch` cannot express `c`, if it cannot.
fn inexpressible(c: &HybridConfig) -> Option<String> {
    if c.linear_key_head_dim != c.linear_value_head_dim {
        return Some(format!(
            "`linear_key_head_dim` {} and `linear_value_head_dim` {} differ: llama.cpp's \
             `ssm.state_size` is both",
            c.linear_key_head_dim, c.linear_value_head_dim
        ));
    }
    let by_interval = HybridConfig {
        layer_types: None,
        ..c.clone()
    };
    if (0..c.num_layers).any(|l| c.layer_kind(l) != by_interval.layer_kind(l)) {
        return Some(format!(
            "`layer_types` is not every {}th layer full attention: llama.cpp's \
             converter writes only `full_attention_interval`",
            c.full_attention_interval
        ));
    }
    c.check().err()
}

/// Whether [`tensors`] writes `w`'s MTP head under `arch`: for `qwen35` only (llama.cpp's
/// `qwen3next` converter drops it).
fn writes_mtp(w: &HybridWeights, arch: Arch) -> bool {
    arch == Arch::Qwen35 && w.mtp.is_some()
}

/// The `{arch}.*` and `general.*` metadata of `c` (the tokenizer's is separate), counting
/// `w`'s MTP head as one more block when it is written (see [`tensors`]).
pub fn metadata(c: &HybridConfig, w: &HybridWeights, arch: Arch) -> Result<Vec<(String, Value)>> {
    if let Some(reason) = inexpressible(c) {
        return Err(ModelError::Hybrid { reason });
    }
    let a = arch.name();
    let nextn = usize::from(writes_mtp(w, arch));
    let u = |k: &str, v: usize| (format!("{a}.{k}"), Value::U32(v as u32));
    let mut md = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String("mtplx hybrid".into())),
        ("general.file_type".into(), Value::U32(0)),
        u("vocab_size", c.vocab_size),
        u("context_length", c.context_length),
        u("embedding_length", c.hidden_size),
        u("block_count", c.num_layers + nextn),
        u("feed_forward_length", c.intermediate_size),
        u("attention.head_count", c.num_attention_heads),
        u("attention.head_count_kv", c.num_key_value_heads),
        u("attention.key_length", c.head_dim),
        u("attention.value_length", c.head_dim),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_norm_eps),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(c.rope_theta)),
        u("rope.dimension_count", c.rotary_dim()),
        u("ssm.conv_kernel", c.linear_conv_kernel_dim),
        u("ssm.state_size", c.linear_key_head_dim),
        u("ssm.group_count", c.linear_num_key_heads),
        u("ssm.time_step_rank", c.linear_num_value_heads),
        u("ssm.inner_size", c.linear_value_dim()),
        u("full_attention_interval", c.full_attention_interval),
    ];
    if nextn > 0 {
        md.push(u("nextn_predict_layers", nextn));
    }
    if arch == Arch::Qwen3Next {
        md.push(u("expert_count", 0));
    }
    Ok(md)
}

/// The tensors of `w` under llama.cpp's names: (name, PyTorch-order shape, values); the
/// file holds each shape reversed (ggml's `ne`). Under `qwen35`, `w`'s MTP head is block
/// `blk.{num_layers}` (see the module docs).
pub fn tensors(
    c: &HybridConfig,
    w: &HybridWeights,
    arch: Arch,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let h = c.hidden_size;
    let mut out = vec![(
        "token_embd.weight".to_string(),
        vec![c.vocab_size, h],
        w.embed.clone(),
    )];
    for (l, lw) in w.layers.iter().enumerate() {
        put_layer(&mut out, c, arch, l, lw);
    }
    out.push(("output_norm.weight".into(), vec![h], w.final_norm.clone()));
    if !c.tie_word_embeddings {
        out.push((
            "output.weight".into(),
            vec![c.vocab_size, h],
            w.lm_head.clone(),
        ));
    }
    if let Some(m) = w.mtp.as_ref().filter(|_| writes_mtp(w, arch)) {
        let n = c.num_layers;
        put_layer(&mut out, c, arch, n, &m.layer);
        let mut put = |name: &str, shape: Vec<usize>, data: &[f32]| {
            out.push((format!("blk.{n}.nextn.{name}"), shape, data.to_vec()))
        };
        put("eh_proj.weight", vec![h, 2 * h], &m.fc);
        put("enorm.weight", vec![h], &m.pre_fc_norm_embedding);
        put("hnorm.weight", vec![h], &m.pre_fc_norm_hidden);
        put("shared_head_norm.weight", vec![h], &m.norm);
    }
    out
}

/// The tensors of decoder layer `lw` as block `blk.{l}`.
fn put_layer(
    out: &mut Vec<(String, Vec<usize>, Vec<f32>)>,
    c: &HybridConfig,
    arch: Arch,
    l: usize,
    lw: &LayerWeights,
) {
    let maps = RowMaps::new(c);
    let heads = v_heads(c, arch);
    let h = c.hidden_size;
    let (kd, vd, nv, dv) = (
        c.linear_key_dim(),
        c.linear_value_dim(),
        c.linear_num_value_heads,
        c.linear_value_head_dim,
    );
    let mut put = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
        out.push((format!("blk.{l}.{name}"), shape, data))
    };
    put("attn_norm.weight", vec![h], lw.input_norm.clone());
    match &lw.mixer {
        MixerWeights::GatedDeltaNet(g) => {
            let (qkv, z) = g.in_proj_qkvz.split_at((2 * kd + vd) * h);
            put(
                "attn_qkv.weight",
                vec![2 * kd + vd, h],
                permute(qkv, h, &rows(&heads, dv, 2 * kd), true),
            );
            put(
                "attn_gate.weight",
                vec![vd, h],
                permute(z, h, &rows(&heads, dv, 0), true),
            );
            match arch {
                Arch::Qwen35 => {
                    let (b, a) = g.in_proj_ba.split_at(nv * h);
                    put("ssm_beta.weight", vec![nv, h], permute(b, h, &heads, true));
                    put("ssm_alpha.weight", vec![nv, h], permute(a, h, &heads, true));
                }
                Arch::Qwen3Next => put(
                    "ssm_ba.weight",
                    vec![2 * nv, h],
                    permute(&g.in_proj_ba, h, &maps.ba, true),
                ),
            }
            let (conv, kernel) = (c.linear_conv_dim(), c.linear_conv_kernel_dim);
            put(
                "ssm_conv1d.weight",
                vec![conv, kernel],
                permute(&g.conv1d, kernel, &rows(&heads, dv, 2 * kd), true),
            );
            put(
                "ssm_dt.bias",
                vec![nv],
                permute(&g.dt_bias, 1, &heads, true),
            );
            let ssm_a: Vec<f32> = g.a_log.iter().map(|a| -a.exp()).collect();
            put("ssm_a", vec![nv], permute(&ssm_a, 1, &heads, true));
            put("ssm_norm.weight", vec![dv], g.norm.clone());
            put(
                "ssm_out.weight",
                vec![h, vd],
                permute_cols(&g.out_proj, vd, &rows(&heads, dv, 0), true),
            );
        }
        MixerWeights::FullAttention(a) => {
            let (q, kv, hd) = (
                c.num_attention_heads * c.head_dim,
                c.num_key_value_heads * c.head_dim,
                c.head_dim,
            );
            put(
                "attn_q.weight",
                vec![2 * q, h],
                permute(&a.q_proj, h, &maps.q, true),
            );
            put("attn_k.weight", vec![kv, h], a.k_proj.clone());
            put("attn_v.weight", vec![kv, h], a.v_proj.clone());
            put("attn_output.weight", vec![h, q], a.o_proj.clone());
            put("attn_q_norm.weight", vec![hd], a.q_norm.clone());
            put("attn_k_norm.weight", vec![hd], a.k_norm.clone());
        }
    }
    put(
        "post_attention_norm.weight",
        vec![h],
        lw.post_attention_norm.clone(),
    );
    let i = c.intermediate_size;
    put("ffn_gate.weight", vec![i, h], lw.mlp.gate.clone());
    put("ffn_up.weight", vec![i, h], lw.mlp.up.clone());
    put("ffn_down.weight", vec![h, i], lw.mlp.down.clone());
}

/// Writes a GGUF file of `metadata` and `f32` `tensors` (PyTorch-order shapes).
pub fn write_file(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<()> {
    let q = tensors
        .iter()
        .map(|(name, shape, data)| {
            let t = Tensor::from_slice(data, shape.as_slice(), &Device::Cpu)?;
            Ok((name.as_str(), QTensor::quantize(&t, GgmlDType::F32)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (*k, v)).collect();
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    gguf_file::write(&mut file, &md, &t)?;
    std::io::Write::flush(&mut file).map_err(io)
}

/// Writes `weights` as a `qwen35` GGUF file (`f32` tensors; the MTP head, when it has one,
/// as the `nextn` block) with, when given, the tokenizer's metadata
/// ([`Tokenizer::to_gguf_metadata`]).
pub fn save(
    path: &Path,
    c: &HybridConfig,
    w: &HybridWeights,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    save_as(path, c, w, tokenizer, Arch::Qwen35)
}

/// [`save`] under either architecture (`qwen3next` files are for testing the reader:
/// llama.cpp refuses one without experts; they carry no MTP head, as llama.cpp's
/// `qwen3next` converter writes none).
pub fn save_as(
    path: &Path,
    c: &HybridConfig,
    w: &HybridWeights,
    tokenizer: Option<&Tokenizer>,
    arch: Arch,
) -> Result<()> {
    let mut md = metadata(c, w, arch)?;
    if let Some(tokenizer) = tokenizer {
        md.extend(tokenizer.to_gguf_metadata()?);
    }
    write_file(path, &md, &tensors(c, w, arch))
}

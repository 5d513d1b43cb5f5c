//! Qwen3-Next checkpoints as Hugging Face folders: `config.json` with the published keys
//! and safetensors under the published tensor names (transformers'
//! `models/qwen3_next/modeling_qwen3_next.py`; the names, shapes and layouts, with their
//! sources, are in `docs/hybrid-checkpoints.md`).
//!
//! A published checkpoint lays some weights out differently from [`HybridWeights`], and
//! reading converts them (writing converts back, exactly):
//! - `linear_attn.in_proj_qkvz` is grouped per key head, `[q_g, k_g, v_g, z_g]` for each
//!   key head `g` (its `r = v_heads / k_heads` value heads' v and z rows together); ours is
//!   `[q | k | v | z]`.
//! - `linear_attn.in_proj_ba` is grouped per key head, `[b_g, a_g]` (`r` rows each); ours
//!   is `[b | a]`.
//! - `self_attn.q_proj` is interleaved per head, `[q_h, gate_h]`; ours is `[q | gate]`.
//! - `input_layernorm`, `post_attention_layernorm`, `model.norm`, `q_norm` and `k_norm`
//!   are zero-centred (the layer multiplies by `1 + w`); ours store `w`. The gated norm
//!   (`linear_attn.norm`) is not.
//! - `conv1d.weight` is `[C, 1, kernel]`; ours `[C, kernel]` (the same values).
//!
//! Dense MLPs only: a checkpoint with routed experts is refused with an error naming the
//! router tensor, as are attention biases, a non-SiLU activation and RoPE scaling.

use std::path::Path;

use serde_json::{json, Value};

use crate::error::{ModelError, Result};
use crate::hybrid::config::{HybridConfig, LayerKind};
use crate::hybrid::weights::{
    AttentionWeights, GdnWeights, HybridWeights, LayerWeights, MixerWeights, MlpWeights, MtpWeights,
};
use crate::source::{HfSource, WeightSource};

/// `model_type` of a Qwen3-Next checkpoint.
pub const MODEL_TYPE: &str = "qwen3_next";

/// The layer type names of `config.json`'s `layer_types`.
const LINEAR: &str = "linear_attention";
const FULL: &str = "full_attention";

/// Reads a Qwen3-Next `config.json` (`path` names it in errors).
pub fn config_from_json(path: &Path, text: &str) -> Result<HybridConfig> {
    let bad = |reason: String| ModelError::BadConfig {
        path: path.to_path_buf(),
        reason,
    };
    let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let get = |key: &str| v.get(key).filter(|x| !x.is_null());
    let usize_of = |key: &str| -> Result<Option<usize>> {
        get(key)
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(format!("`{key}` is not a whole number: {x}")))
            })
            .transpose()
    };
    let need = |key: &str| usize_of(key)?.ok_or_else(|| bad(format!("missing `{key}`")));
    let float = |key: &str, default: f64| -> Result<f32> {
        match get(key) {
            None => Ok(default as f32),
            Some(x) => x
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| bad(format!("`{key}` is not a number: {x}"))),
        }
    };

    let model_type = get("model_type").and_then(Value::as_str).unwrap_or("");
    if model_type != MODEL_TYPE {
        return Err(bad(format!(
            "model_type `{model_type}` is not `{MODEL_TYPE}`"
        )));
    }
    let num_layers = need("num_hidden_layers")?;
    let hidden_size = need("hidden_size")?;
    let num_attention_heads = need("num_attention_heads")?;
    let interval = usize_of("full_attention_interval")?.unwrap_or(4);
    let layer_types = match get("layer_types") {
        None => None,
        Some(list) => {
            let list = list
                .as_array()
                .ok_or_else(|| bad("`layer_types` is not a list".into()))?;
            let kinds = list
                .iter()
                .enumerate()
                .map(|(l, t)| match t.as_str() {
                    Some(LINEAR) => Ok(LayerKind::GatedDeltaNet),
                    Some(FULL) => Ok(LayerKind::FullAttention),
                    _ => Err(bad(format!(
                        "layer {l} has type {t}, not `{LINEAR}` or `{FULL}`"
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            if kinds.len() != num_layers {
                return Err(bad(format!(
                    "`layer_types` names {} layers, `num_hidden_layers` is {num_layers}",
                    kinds.len()
                )));
            }
            Some(kinds)
        }
    };
    let c = HybridConfig {
        vocab_size: need("vocab_size")?,
        hidden_size,
        intermediate_size: need("intermediate_size")?,
        num_layers,
        full_attention_interval: interval,
        layer_types,
        rms_norm_eps: float("rms_norm_eps", 1e-6)?,
        context_length: need("max_position_embeddings")?,
        rope_theta: float("rope_theta", 10_000.0)?,
        partial_rotary_factor: float("partial_rotary_factor", 0.25)?,
        num_attention_heads,
        num_key_value_heads: need("num_key_value_heads")?,
        head_dim: usize_of("head_dim")?.unwrap_or(hidden_size / num_attention_heads.max(1)),
        linear_num_key_heads: need("linear_num_key_heads")?,
        linear_num_value_heads: need("linear_num_value_heads")?,
        linear_key_head_dim: need("linear_key_head_dim")?,
        linear_value_head_dim: need("linear_value_head_dim")?,
        linear_conv_kernel_dim: usize_of("linear_conv_kernel_dim")?.unwrap_or(4),
        tie_word_embeddings: get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };

    // What the model does not compute (yet): refused by name, never run wrongly.
    let experts = usize_of("num_experts")?.unwrap_or(0);
    if experts > 0 {
        let mlp_only: Vec<u64> = get("mlp_only_layers")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let step = usize_of("decoder_sparse_step")?.unwrap_or(1).max(1);
        if let Some(l) = (0..num_layers)
            .find(|&l| !mlp_only.contains(&(l as u64)) && (l + 1).is_multiple_of(step))
        {
            return Err(bad(format!(
                "layer {l} is a mixture of {experts} experts (`model.layers.{l}.mlp.gate.weight`): \
                 routed experts are not supported yet, only dense MLPs"
            )));
        }
    }
    if get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            "`attention_bias`: attention biases are not supported".into()
        ));
    }
    if let Some(act) = get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(bad(format!(
                "`hidden_act` `{act}`: only `silu` is supported"
            )));
        }
    }
    if get("rope_scaling").is_some() {
        return Err(bad("`rope_scaling` is not supported".into()));
    }
    c.check().map_err(bad)?;
    Ok(c)
}

/// The `config.json` of `c` (the keys transformers' `Qwen3NextConfig` reads; `layer_types`
/// and `full_attention_interval` both, as llama.cpp's converter reads only the latter).
pub fn config_to_json(c: &HybridConfig) -> Value {
    let types: Vec<&str> = (0..c.num_layers)
        .map(|l| match c.layer_kind(l) {
            LayerKind::GatedDeltaNet => LINEAR,
            LayerKind::FullAttention => FULL,
        })
        .collect();
    json!({
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "layer_types": types,
        "full_attention_interval": c.full_attention_interval,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.context_length,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "partial_rotary_factor": c.partial_rotary_factor,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "attention_bias": false,
        "hidden_act": "silu",
        "linear_num_key_heads": c.linear_num_key_heads,
        "linear_num_value_heads": c.linear_num_value_heads,
        "linear_key_head_dim": c.linear_key_head_dim,
        "linear_value_head_dim": c.linear_value_head_dim,
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "num_experts": 0,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": "float32",
    })
}

/// Where each published row of the three regrouped matrices goes in ours.
pub(super) struct RowMaps {
    /// `in_proj_qkvz`: published row → our row.
    qkvz: Vec<usize>,
    /// `in_proj_ba` (also llama.cpp's `qwen3next` `ssm_ba`).
    pub(super) ba: Vec<usize>,
    /// `q_proj` (also llama.cpp's `attn_q`).
    pub(super) q: Vec<usize>,
}

impl RowMaps {
    pub(super) fn new(c: &HybridConfig) -> Self {
        let (nk, dk, dv) = (
            c.linear_num_key_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        );
        let r = c.linear_num_value_heads / nk.max(1);
        let (kd, vd) = (c.linear_key_dim(), c.linear_value_dim());
        let group = 2 * dk + 2 * r * dv;
        let qkvz = (0..nk * group)
            .map(|row| {
                let (g, o) = (row / group, row % group);
                if o < dk {
                    g * dk + o
                } else if o < 2 * dk {
                    kd + g * dk + (o - dk)
                } else if o < 2 * dk + r * dv {
                    2 * kd + g * r * dv + (o - 2 * dk)
                } else {
                    2 * kd + vd + g * r * dv + (o - 2 * dk - r * dv)
                }
            })
            .collect();
        let nv = c.linear_num_value_heads;
        let ba = (0..2 * nv)
            .map(|row| {
                let (g, o) = (row / (2 * r), row % (2 * r));
                if o < r {
                    g * r + o
                } else {
                    nv + g * r + (o - r)
                }
            })
            .collect();
        let (nh, hd) = (c.num_attention_heads, c.head_dim);
        let q = (0..2 * nh * hd)
            .map(|row| {
                let (h, o) = (row / (2 * hd), row % (2 * hd));
                if o < hd {
                    h * hd + o
                } else {
                    nh * hd + h * hd + (o - hd)
                }
            })
            .collect();
        RowMaps { qkvz, ba, q }
    }
}

/// Rows of a `[rows, cols]` matrix moved from published order to ours (`map[published] =
/// ours`), or back with `inverse`.
pub(super) fn permute(data: &[f32], cols: usize, map: &[usize], inverse: bool) -> Vec<f32> {
    let mut out = vec![0f32; data.len()];
    for (published, &ours) in map.iter().enumerate() {
        let (from, to) = if inverse {
            (ours, published)
        } else {
            (published, ours)
        };
        out[to * cols..(to + 1) * cols].copy_from_slice(&data[from * cols..(from + 1) * cols]);
    }
    out
}

/// `1 + w` (a zero-centred norm read) or `w - 1` (written). Exact for weights in
/// `[0.5, 2]`, where `w - 1` is representable (Sterbenz).
fn shift(w: &[f32], by: f32) -> Vec<f32> {
    w.iter().map(|x| x + by).collect()
}

/// One tensor of a checkpoint (a folder or a GGUF file), checked against its expected
/// (PyTorch-order) shape: missing or misshapen is an error that names it.
pub(crate) fn tensor(src: &mut dyn WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let path = src.path().to_path_buf();
    let raw = src.get(name)?.ok_or_else(|| ModelError::MissingTensor {
        path: path.clone(),
        tensor: name.to_string(),
    })?;
    let dims = raw.dims();
    if dims != shape {
        return Err(ModelError::TensorShape {
            path,
            tensor: name.to_string(),
            got: dims,
            expected: shape.to_vec(),
        });
    }
    raw.to_vec()
}

/// Reads a Qwen3-Next folder: its configuration and every weight, in this crate's layout.
pub fn load(dir: &Path) -> Result<(HybridConfig, HybridWeights)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    let c = config_from_json(&path, &text)?;
    let mut src = HfSource::open(dir)?;
    let maps = RowMaps::new(&c);
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let embed = tensor(&mut src, "model.embed_tokens.weight", &[vocab, h])?;
    let layers = (0..c.num_layers)
        .map(|l| {
            read_layer(
                &mut src,
                &c,
                &maps,
                &format!("model.layers.{l}"),
                c.layer_kind(l),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let final_norm = shift(&tensor(&mut src, "model.norm.weight", &[h])?, 1.0);
    let lm_head = if c.tie_word_embeddings {
        embed.clone()
    } else {
        tensor(&mut src, "lm_head.weight", &[vocab, h])?
    };
    let mtp = read_mtp(&mut src, &c, &maps)?;
    let weights = HybridWeights {
        embed,
        layers,
        final_norm,
        lm_head,
        mtp,
    };
    Ok((c, weights))
}

/// The MTP head's tensors (`mtp.*`), when the checkpoint has them (`mtp.fc.weight`): its
/// first layer only (Qwen3-Next and Qwen3.5 publish one; vLLM cycles through more).
fn read_mtp(src: &mut HfSource, c: &HybridConfig, maps: &RowMaps) -> Result<Option<MtpWeights>> {
    if src.get(MTP_FC)?.is_none() {
        return Ok(None);
    }
    let h = c.hidden_size;
    let mut norm = |name: &str| tensor(src, &format!("mtp.{name}"), &[h]).map(|w| shift(&w, 1.0));
    let pre_fc_norm_embedding = norm("pre_fc_norm_embedding.weight")?;
    let pre_fc_norm_hidden = norm("pre_fc_norm_hidden.weight")?;
    let mtp_norm = norm("norm.weight")?;
    Ok(Some(MtpWeights {
        pre_fc_norm_embedding,
        pre_fc_norm_hidden,
        fc: tensor(src, MTP_FC, &[h, 2 * h])?,
        layer: read_layer(src, c, maps, MTP_LAYER, LayerKind::FullAttention)?,
        norm: mtp_norm,
    }))
}

/// `mtp.fc.weight`, whose presence says the checkpoint has an MTP head.
const MTP_FC: &str = "mtp.fc.weight";
/// The prefix of the MTP head's decoder layer.
const MTP_LAYER: &str = "mtp.layers.0";

/// One decoder layer under `p` (`model.layers.3`, `mtp.layers.0`).
fn read_layer(
    src: &mut HfSource,
    c: &HybridConfig,
    maps: &RowMaps,
    p: &str,
    kind: LayerKind,
) -> Result<LayerWeights> {
    let (h, inter) = (c.hidden_size, c.intermediate_size);
    let mut t = |name: &str, shape: &[usize]| tensor(src, &format!("{p}.{name}"), shape);
    let input_norm = shift(&t("input_layernorm.weight", &[h])?, 1.0);
    let mixer = match kind {
        LayerKind::GatedDeltaNet => {
            let (kd, vd, nv) = (
                c.linear_key_dim(),
                c.linear_value_dim(),
                c.linear_num_value_heads,
            );
            let (conv, kernel) = (c.linear_conv_dim(), c.linear_conv_kernel_dim);
            let qkvz = t("linear_attn.in_proj_qkvz.weight", &[2 * kd + 2 * vd, h])?;
            let ba = t("linear_attn.in_proj_ba.weight", &[2 * nv, h])?;
            MixerWeights::GatedDeltaNet(GdnWeights {
                in_proj_qkvz: permute(&qkvz, h, &maps.qkvz, false),
                in_proj_ba: permute(&ba, h, &maps.ba, false),
                conv1d: t("linear_attn.conv1d.weight", &[conv, 1, kernel])?,
                dt_bias: t("linear_attn.dt_bias", &[nv])?,
                a_log: t("linear_attn.A_log", &[nv])?,
                norm: t("linear_attn.norm.weight", &[c.linear_value_head_dim])?,
                out_proj: t("linear_attn.out_proj.weight", &[h, vd])?,
            })
        }
        LayerKind::FullAttention => {
            let (q, kv, hd) = (
                c.num_attention_heads * c.head_dim,
                c.num_key_value_heads * c.head_dim,
                c.head_dim,
            );
            let q_proj = t("self_attn.q_proj.weight", &[2 * q, h])?;
            MixerWeights::FullAttention(AttentionWeights {
                q_proj: permute(&q_proj, h, &maps.q, false),
                k_proj: t("self_attn.k_proj.weight", &[kv, h])?,
                v_proj: t("self_attn.v_proj.weight", &[kv, h])?,
                o_proj: t("self_attn.o_proj.weight", &[h, q])?,
                q_norm: shift(&t("self_attn.q_norm.weight", &[hd])?, 1.0),
                k_norm: shift(&t("self_attn.k_norm.weight", &[hd])?, 1.0),
            })
        }
    };
    let post_attention_norm = shift(&t("post_attention_layernorm.weight", &[h])?, 1.0);
    let mlp = MlpWeights {
        gate: t("mlp.gate_proj.weight", &[inter, h])?,
        up: t("mlp.up_proj.weight", &[inter, h])?,
        down: t("mlp.down_proj.weight", &[h, inter])?,
    };
    Ok(LayerWeights {
        input_norm,
        mixer,
        post_attention_norm,
        mlp,
    })
}

/// The published tensors of `weights`: (name, shape, values), in the checkpoint's layout.
pub fn tensors(c: &HybridConfig, w: &HybridWeights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let maps = RowMaps::new(c);
    let h = c.hidden_size;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, h],
        w.embed.clone(),
    )];
    for (l, lw) in w.layers.iter().enumerate() {
        put_layer(&mut out, c, &maps, &format!("model.layers.{l}"), lw);
    }
    out.push((
        "model.norm.weight".into(),
        vec![h],
        shift(&w.final_norm, -1.0),
    ));
    if !c.tie_word_embeddings {
        out.push((
            "lm_head.weight".into(),
            vec![c.vocab_size, h],
            w.lm_head.clone(),
        ));
    }
    if let Some(m) = &w.mtp {
        let mut put = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
            out.push((format!("mtp.{name}"), shape, data))
        };
        let norm = |w: &[f32]| shift(w, -1.0);
        put(
            "pre_fc_norm_embedding.weight",
            vec![h],
            norm(&m.pre_fc_norm_embedding),
        );
        put(
            "pre_fc_norm_hidden.weight",
            vec![h],
            norm(&m.pre_fc_norm_hidden),
        );
        put("fc.weight", vec![h, 2 * h], m.fc.clone());
        put("norm.weight", vec![h], norm(&m.norm));
        put_layer(&mut out, c, &maps, MTP_LAYER, &m.layer);
    }
    out
}

/// The published tensors of one decoder layer, under `p`.
fn put_layer(
    out: &mut Vec<(String, Vec<usize>, Vec<f32>)>,
    c: &HybridConfig,
    maps: &RowMaps,
    p: &str,
    lw: &LayerWeights,
) {
    let h = c.hidden_size;
    let mut put = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
        out.push((format!("{p}.{name}"), shape, data))
    };
    put(
        "input_layernorm.weight",
        vec![h],
        shift(&lw.input_norm, -1.0),
    );
    match &lw.mixer {
        MixerWeights::GatedDeltaNet(g) => {
            let (kd, vd, nv) = (
                c.linear_key_dim(),
                c.linear_value_dim(),
                c.linear_num_value_heads,
            );
            put(
                "linear_attn.in_proj_qkvz.weight",
                vec![2 * kd + 2 * vd, h],
                permute(&g.in_proj_qkvz, h, &maps.qkvz, true),
            );
            put(
                "linear_attn.in_proj_ba.weight",
                vec![2 * nv, h],
                permute(&g.in_proj_ba, h, &maps.ba, true),
            );
            let (conv, kernel) = (c.linear_conv_dim(), c.linear_conv_kernel_dim);
            put(
                "linear_attn.conv1d.weight",
                vec![conv, 1, kernel],
                g.conv1d.clone(),
            );
            put("linear_attn.dt_bias", vec![nv], g.dt_bias.clone());
            put("linear_attn.A_log", vec![nv], g.a_log.clone());
            put(
                "linear_attn.norm.weight",
                vec![c.linear_value_head_dim],
                g.norm.clone(),
            );
            put(
                "linear_attn.out_proj.weight",
                vec![h, vd],
                g.out_proj.clone(),
            );
        }
        MixerWeights::FullAttention(a) => {
            let (q, kv, hd) = (
                c.num_attention_heads * c.head_dim,
                c.num_key_value_heads * c.head_dim,
                c.head_dim,
            );
            put(
                "self_attn.q_proj.weight",
                vec![2 * q, h],
                permute(&a.q_proj, h, &maps.q, true),
            );
            put("self_attn.k_proj.weight", vec![kv, h], a.k_proj.clone());
            put("self_attn.v_proj.weight", vec![kv, h], a.v_proj.clone());
            put("self_attn.o_proj.weight", vec![h, q], a.o_proj.clone());
            put("self_attn.q_norm.weight", vec![hd], shift(&a.q_norm, -1.0));
            put("self_attn.k_norm.weight", vec![hd], shift(&a.k_norm, -1.0));
        }
    }
    put(
        "post_attention_layernorm.weight",
        vec![h],
        shift(&lw.post_attention_norm, -1.0),
    );
    let i = c.intermediate_size;
    put("mlp.gate_proj.weight", vec![i, h], lw.mlp.gate.clone());
    put("mlp.up_proj.weight", vec![i, h], lw.mlp.up.clone());
    put("mlp.down_proj.weight", vec![h, i], lw.mlp.down.clone());
}

/// Writes `weights` as a Qwen3-Next folder: `config.json` and `model.safetensors` (`f32`).
pub fn save(dir: &Path, c: &HybridConfig, w: &HybridWeights) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config = dir.join("config.json");
    let text = serde_json::to_string_pretty(&config_to_json(c)).expect("a JSON value prints");
    std::fs::write(&config, text + "\n").map_err(io(&config))?;
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = tensors(c, w)
        .into_iter()
        .map(|(name, shape, data)| {
            let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let path = dir.join("model.safetensors");
    let bad = |reason: String| ModelError::BadSafetensors {
        path: path.clone(),
        reason,
    };
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| bad(e.to_string()))
}

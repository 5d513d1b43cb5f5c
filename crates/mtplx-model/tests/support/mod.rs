//! Tiny synthetic GGUF models written with candle's GGUF writer.
#![allow(dead_code)]

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// A Llama-shaped model whose rows are multiples of 256 so every quant type fits.
pub struct TinySpec {
    pub arch: &'static str,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub layers: usize,
    pub vocab: usize,
}

pub const TINY: TinySpec = TinySpec {
    arch: "llama",
    hidden: 256,
    ffn: 256,
    heads: 4,
    kv_heads: 2,
    layers: 2,
    vocab: 300,
};

/// Deterministic pseudo-random values in [-scale, scale].
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Every tensor of the tiny model as (name, shape, values).
pub fn tensors(spec: &TinySpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let hd = spec.hidden / spec.heads;
    let mut out = Vec::new();
    let mut seed = 1;
    let mut add = |name: String, shape: Vec<usize>, scale: f32, ones: bool| {
        seed += 1;
        let n = shape.iter().product();
        let v = if ones {
            values(n, seed, 0.1).iter().map(|x| 1.0 + x).collect()
        } else {
            values(n, seed, scale)
        };
        out.push((name, shape, v));
    };
    add(
        "token_embd.weight".into(),
        vec![spec.vocab, spec.hidden],
        1.0,
        false,
    );
    for l in 0..spec.layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        add(p("attn_norm.weight"), vec![spec.hidden], 0.0, true);
        add(
            p("attn_q.weight"),
            vec![spec.heads * hd, spec.hidden],
            0.12,
            false,
        );
        add(
            p("attn_k.weight"),
            vec![spec.kv_heads * hd, spec.hidden],
            0.12,
            false,
        );
        add(
            p("attn_v.weight"),
            vec![spec.kv_heads * hd, spec.hidden],
            0.12,
            false,
        );
        add(
            p("attn_output.weight"),
            vec![spec.hidden, spec.heads * hd],
            0.06,
            false,
        );
        add(p("ffn_norm.weight"), vec![spec.hidden], 0.0, true);
        add(
            p("ffn_gate.weight"),
            vec![spec.ffn, spec.hidden],
            0.1,
            false,
        );
        add(p("ffn_up.weight"), vec![spec.ffn, spec.hidden], 0.1, false);
        add(
            p("ffn_down.weight"),
            vec![spec.hidden, spec.ffn],
            0.06,
            false,
        );
    }
    add("output_norm.weight".into(), vec![spec.hidden], 0.0, true);
    out
}

pub fn metadata(spec: &TinySpec) -> Vec<(String, Value)> {
    let a = spec.arch;
    vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(spec.layers as u32)),
        (format!("{a}.context_length"), Value::U32(256)),
        (
            format!("{a}.embedding_length"),
            Value::U32(spec.hidden as u32),
        ),
        (
            format!("{a}.feed_forward_length"),
            Value::U32(spec.ffn as u32),
        ),
        (
            format!("{a}.attention.head_count"),
            Value::U32(spec.heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(spec.kv_heads as u32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        (format!("{a}.vocab_size"), Value::U32(spec.vocab as u32)),
    ]
}

/// Writes the tiny model with 2-D weights in `dtype` (norms stay F32), after `edit` had a
/// chance to change metadata and tensors.
pub fn write(
    path: &Path,
    dtype: GgmlDType,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<usize>, Vec<f32>)>),
) {
    let mut md = metadata(&TINY);
    let mut ts = tensors(&TINY);
    edit(&mut md, &mut ts);
    let q: Vec<(String, QTensor)> = ts
        .into_iter()
        .map(|(name, shape, v)| {
            let t = Tensor::from_vec(v, shape.as_slice(), &Device::Cpu).unwrap();
            let dt = if shape.len() == 2 {
                dtype
            } else {
                GgmlDType::F32
            };
            (name, QTensor::quantize(&t, dt).unwrap())
        })
        .collect();
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
}

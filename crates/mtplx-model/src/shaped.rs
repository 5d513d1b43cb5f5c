//! A GGUF file with a published model's shape and seeded random weights, quantized as
//! llama.cpp quantizes that shape (what `cargo xtask make-shaped` writes, for speed
//! benchmarks: a speed figure needs a model's bytes and shapes, not its weights, and no
//! package ships an 8B file). The shapes: [`Shape::LLAMA3_8B`] (vocabulary 128,256, hidden
//! 4,096, 32 layers, 32 query heads over 8 KV heads of 128, feed-forward 14,336),
//! [`Shape::SMOLLM2_135M`] (the default model's, so its speed can be measured where its
//! file can't be taken) and [`Shape::TINY`] (for tests). The quantizations ([`Quant`]):
//!
//! - `Q4_0`: every matrix Q4_0 but the output, which is Q6_K (llama.cpp's `Q4_0` file type
//!   does the same);
//! - `Q4_K_M`: llama.cpp's rule: Q4_K everywhere, Q6_K for the output and for `attn_v` and
//!   `ffn_down` in the layers its `use_more_bits` picks (the first and last eighth, and
//!   every third in between);
//! - `Q4_1`: every matrix Q4_1, the embedding Q8_0 (the default model's file: its output is
//!   the embedding, so a shape with `tied` has no `output.weight`).
//!
//! The blocks are written straight from a seeded stream ([`crate::sampling::Rng`]): the
//! quantized values random, the scales fixed so the weights come out at roughly ±0.02. So
//! an 8B file takes seconds, not the minutes quantizing random floats would. Norms are ones. The tokenizer and chat
//! template are a GGUF file's, its token list padded with `<|reserved_N|>` control tokens
//! to the shape's vocabulary.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::Device;

use crate::error::{ModelError, Result};
use crate::sampling::Rng;
use crate::source::GgufSource;

/// A llama-architecture model's geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub vocab: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: usize,
    pub rope_theta: f32,
    /// The output projection is the embedding table (no `output.weight`).
    pub tied: bool,
}

impl Shape {
    /// Llama-3-8B's.
    pub const LLAMA3_8B: Shape = Shape {
        vocab: 128_256,
        hidden: 4096,
        ffn: 14_336,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        context: 8192,
        rope_theta: 500_000.0,
        tied: false,
    };
    /// SmolLM2-135M's (the default model), with its tied embedding.
    pub const SMOLLM2_135M: Shape = Shape {
        vocab: 49_152,
        hidden: 576,
        ffn: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        context: 8192,
        rope_theta: 100_000.0,
        tied: true,
    };
    /// The default model's vocabulary and 64 more (so the padding is exercised), nine
    /// layers (so Q4_K_M's rule picks some), small matrices.
    pub const TINY: Shape = Shape {
        vocab: 49_152 + 64,
        hidden: 256,
        ffn: 512,
        layers: 9,
        heads: 4,
        kv_heads: 2,
        context: 2048,
        rope_theta: 10_000.0,
        tied: false,
    };

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// llama.cpp's `use_more_bits`: the layers `Q4_K_M` gives 6-bit `attn_v` and `ffn_down`.
pub fn more_bits(layer: usize, layers: usize) -> bool {
    let eighth = layers / 8;
    layer < eighth || layer >= 7 * layers / 8 || (layer - eighth) % 3 == 2
}

/// The quantization of each matrix, by name and layer; `file_type` is llama.cpp's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quant {
    Q4_0,
    Q4KM,
    Q4_1,
}

impl Quant {
    fn file_type(self) -> u32 {
        match self {
            Quant::Q4_0 => 2,
            Quant::Q4_1 => 3,
            Quant::Q4KM => 15,
        }
    }

    /// `kind`: the tensor's name without its `blk.N.` prefix; `layer` its layer.
    pub fn dtype(self, kind: &str, layer: usize, layers: usize) -> GgmlDType {
        let six = kind == "output.weight"
            || (self == Quant::Q4KM
                && matches!(kind, "attn_v.weight" | "ffn_down.weight")
                && more_bits(layer, layers));
        match self {
            Quant::Q4_1 if kind == "token_embd.weight" => GgmlDType::Q8_0,
            Quant::Q4_1 => GgmlDType::Q4_1,
            _ if six => GgmlDType::Q6K,
            Quant::Q4_0 => GgmlDType::Q4_0,
            Quant::Q4KM => GgmlDType::Q4K,
        }
    }
}

/// `out` filled from the stream of `rng`, eight bytes to a draw.
fn fill(rng: &mut Rng, out: &mut [u8]) {
    for chunk in out.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
    }
}

/// `rows × cols` weights of `dtype` as ggml lays its blocks out: random quantized values,
/// scales set so the weights are roughly ±0.02 and centred.
fn random_blocks(dtype: GgmlDType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols / dtype.block_size();
    let size = dtype.type_size();
    let mut out = vec![0u8; n * size];
    fill(rng, &mut out);
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    for block in out.chunks_mut(size) {
        match dtype {
            // d, then 16 bytes of 4-bit values (w = d·(q − 8)).
            GgmlDType::Q4_0 => block[..2].copy_from_slice(&f16(0.004)),
            // d, m, then 16 bytes of 4-bit values (w = d·q + m; m = −7.5·d centres them).
            GgmlDType::Q4_1 => {
                block[..2].copy_from_slice(&f16(0.004));
                block[2..4].copy_from_slice(&f16(-0.03));
            }
            // d, then 32 signed bytes (w = d·q).
            GgmlDType::Q8_0 => block[..2].copy_from_slice(&f16(1.5e-4)),
            // d, dmin, 12 bytes of 6-bit scales and mins, 128 of 4-bit values
            // (w = d·sc·q − dmin·m; dmin = 7.5·d centres them).
            GgmlDType::Q4K => {
                block[..2].copy_from_slice(&f16(1e-4));
                block[2..4].copy_from_slice(&f16(7.5e-4));
            }
            // 128 + 64 bytes of 6-bit values, 16 signed scales, then d (w = d·s·(q − 32)).
            GgmlDType::Q6K => block[208..].copy_from_slice(&f16(2e-5)),
            _ => unreachable!("only the formats above are written"),
        }
    }
    out
}

/// Whether every token of `gguf` from id `vocab` on is a `<|reserved_N|>` padding token
/// (one a shaped file added).
fn reserved_past(gguf: &GgufSource, vocab: usize) -> bool {
    match gguf.content().metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) => tokens
            .iter()
            .enumerate()
            .skip(vocab)
            .all(|(i, t)| matches!(t, Value::String(t) if *t == format!("<|reserved_{i}|>"))),
        _ => false,
    }
}

/// The source file's `tokenizer.*` metadata, its token list padded to `vocab` ids (or
/// trimmed to them where the ids past `vocab` are padding a shaped file added).
fn tokenizer_metadata(source: &Path, vocab: usize) -> Result<Vec<(String, Value)>> {
    let gguf = GgufSource::open(source)?;
    let mut out: Vec<(String, Value)> = gguf
        .content()
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let trimmable = reserved_past(&gguf, vocab);
    for (key, value) in &mut out {
        let Value::Array(items) = value else { continue };
        let have = items.len();
        let pad = |i: usize| match key.as_str() {
            "tokenizer.ggml.tokens" => Some(Value::String(format!("<|reserved_{i}|>"))),
            // llama.cpp's CONTROL.
            "tokenizer.ggml.token_type" => Some(Value::I32(3)),
            "tokenizer.ggml.scores" => Some(Value::F32(0.0)),
            _ => None,
        };
        if pad(0).is_none() {
            continue;
        }
        // A shaped file's own padding past `vocab` goes (the tokenizer of a file with a
        // larger vocabulary, e.g. the `tiny` shape's, for a smaller shape); a real token
        // past it is an error.
        if have > vocab {
            if !trimmable {
                return Err(ModelError::BadGguf {
                    path: source.to_path_buf(),
                    reason: format!("{key}: {have} entries, more than the shape's {vocab}"),
                });
            }
            items.truncate(vocab);
        }
        items.extend((have.min(vocab)..vocab).filter_map(pad));
    }
    Ok(out)
}

/// Writes `shape` in `quant` with weights drawn from `seed` at `out` (its folder created if
/// missing), with the tokenizer and chat template of the GGUF file `tokenizer`. The same
/// arguments write the same bytes.
pub fn write_gguf(
    out: &Path,
    shape: Shape,
    quant: Quant,
    seed: u64,
    tokenizer: &Path,
) -> Result<()> {
    let s = shape;
    let a = "llama";
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!(
                "mtplx shaped {} layers x {} {quant:?} seed {seed}",
                s.layers, s.hidden
            )),
        ),
        ("general.file_type".into(), Value::U32(quant.file_type())),
        (format!("{a}.vocab_size"), Value::U32(s.vocab as u32)),
        (format!("{a}.context_length"), Value::U32(s.context as u32)),
        (format!("{a}.embedding_length"), Value::U32(s.hidden as u32)),
        (format!("{a}.block_count"), Value::U32(s.layers as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(s.ffn as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(s.heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(s.kv_heads as u32),
        ),
        (
            format!("{a}.rope.dimension_count"),
            Value::U32(s.head_dim() as u32),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(s.rope_theta)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
    ];
    md.extend(tokenizer_metadata(tokenizer, s.vocab)?);

    let mut rng = Rng::new(seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut matrix = |name: String, kind: &str, layer: usize, rows: usize, cols: usize| {
        let dtype = quant.dtype(kind, layer, s.layers);
        let bytes = random_blocks(dtype, rows, cols, &mut rng);
        // ggml's order: the row length first.
        let t = qtensor_from_ggml(dtype, &bytes, vec![rows, cols], &Device::Cpu)?;
        tensors.push((name, t));
        Ok::<_, ModelError>(())
    };
    let (h, kv) = (s.hidden, s.kv_heads * s.head_dim());
    matrix(
        "token_embd.weight".into(),
        "token_embd.weight",
        0,
        s.vocab,
        h,
    )?;
    for l in 0..s.layers {
        for (kind, rows, cols) in [
            ("attn_q.weight", h, h),
            ("attn_k.weight", kv, h),
            ("attn_v.weight", kv, h),
            ("attn_output.weight", h, h),
            ("ffn_gate.weight", s.ffn, h),
            ("ffn_up.weight", s.ffn, h),
            ("ffn_down.weight", h, s.ffn),
        ] {
            matrix(format!("blk.{l}.{kind}"), kind, l, rows, cols)?;
        }
    }
    if !s.tied {
        matrix("output.weight".into(), "output.weight", 0, s.vocab, h)?;
    }
    let ones = |n: usize| {
        let t = candle_core::Tensor::ones(n, candle_core::DType::F32, &Device::Cpu)?;
        Ok::<_, ModelError>(QTensor::quantize(&t, GgmlDType::F32)?)
    };
    for l in 0..s.layers {
        tensors.push((format!("blk.{l}.attn_norm.weight"), ones(h)?));
        tensors.push((format!("blk.{l}.ffn_norm.weight"), ones(h)?));
    }
    tensors.push(("output_norm.weight".into(), ones(h)?));

    let io = |source| ModelError::Io {
        path: out.to_path_buf(),
        source,
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(out).map_err(io)?);
    gguf_file::write(&mut file, &md_refs, &t_refs)?;
    std::io::Write::flush(&mut file).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_picks_llama_cpps_layers() {
        // llama.cpp's use_more_bits for 32 layers: 0-3, 28-31, and 6, 9, ..., 27.
        let six: Vec<usize> = (0..32).filter(|&l| more_bits(l, 32)).collect();
        assert_eq!(
            six,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let q = Quant::Q4KM;
        assert_eq!(q.dtype("attn_v.weight", 6, 32), GgmlDType::Q6K);
        assert_eq!(q.dtype("attn_v.weight", 7, 32), GgmlDType::Q4K);
        assert_eq!(q.dtype("attn_q.weight", 0, 32), GgmlDType::Q4K);
        assert_eq!(q.dtype("output.weight", 0, 32), GgmlDType::Q6K);
        assert_eq!(Quant::Q4_0.dtype("ffn_down.weight", 0, 32), GgmlDType::Q4_0);
        assert_eq!(Quant::Q4_0.dtype("output.weight", 0, 32), GgmlDType::Q6K);
    }

    /// The SmolLM2-135M shape in `Q4_1` is the default model's file as far as speed goes:
    /// its geometry, its tensor types, and no `output.weight` (the tied embedding).
    #[test]
    fn the_smollm2_shape_is_the_default_files() {
        let Some(model) = std::env::var_os("MTPLX_TEST_MODEL") else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let gguf = GgufSource::open(Path::new(&model)).unwrap();
        let content = gguf.content();
        let u = |k: &str| match content.metadata.get(&format!("llama.{k}")) {
            Some(Value::U32(v)) => *v as usize,
            other => panic!("{k}: {other:?}"),
        };
        let s = Shape::SMOLLM2_135M;
        assert_eq!(
            (
                u("embedding_length"),
                u("feed_forward_length"),
                u("block_count")
            ),
            (s.hidden, s.ffn, s.layers)
        );
        assert_eq!(
            (u("attention.head_count"), u("attention.head_count_kv")),
            (s.heads, s.kv_heads)
        );
        assert_eq!((u("vocab_size"), u("context_length")), (s.vocab, s.context));
        assert!(
            matches!(content.metadata.get("llama.rope.freq_base"), Some(Value::F32(t)) if *t == s.rope_theta)
        );
        assert!(s.tied && !content.tensor_infos.contains_key("output.weight"));
        for (name, info) in &content.tensor_infos {
            let kind = name.split_once("blk.").map_or(name.as_str(), |(_, rest)| {
                rest.split_once('.').map_or(rest, |(_, kind)| kind)
            });
            if info.ggml_dtype != GgmlDType::F32 {
                assert_eq!(
                    info.ggml_dtype,
                    Quant::Q4_1.dtype(kind, 0, s.layers),
                    "{name}"
                );
            }
        }
    }

    /// A shaped file's tokenizer serves a shape of a smaller vocabulary (its padding
    /// dropped: the GPU bench packs the `tiny` file's tokenizer for every shape), but a
    /// real token past the vocabulary is an error.
    #[test]
    fn a_shaped_files_padding_is_trimmed_but_real_tokens_are_not() {
        let Some(model) = std::env::var_os("MTPLX_TEST_MODEL") else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let tiny = dir.path().join("tiny.gguf");
        write_gguf(&tiny, Shape::TINY, Quant::Q4_0, 3, Path::new(&model)).unwrap();
        let md = tokenizer_metadata(&tiny, 49_152).unwrap();
        let real = tokenizer_metadata(Path::new(&model), 49_152).unwrap();
        assert_eq!(md.len(), real.len());
        for ((k, v), (rk, rv)) in md.iter().zip(&real) {
            assert_eq!(k, rk);
            assert_eq!(format!("{v:?}"), format!("{rv:?}"), "{k}");
        }
        let err = tokenizer_metadata(Path::new(&model), 49_000).unwrap_err();
        assert!(
            err.to_string().contains("more than the shape's 49000"),
            "{err}"
        );
    }

    /// A tied shape in `Q4_1` writes no `output.weight`, the types asked for, and a file
    /// the loader runs.
    #[test]
    fn a_tied_q4_1_file_loads_and_generates() {
        let Some(model) = std::env::var_os("MTPLX_TEST_MODEL") else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tied.gguf");
        let s = Shape {
            tied: true,
            ..Shape::TINY
        };
        write_gguf(&file, s, Quant::Q4_1, 3, Path::new(&model)).unwrap();
        let gguf = GgufSource::open(&file).unwrap();
        let content = gguf.content();
        assert!(!content.tensor_infos.contains_key("output.weight"));
        let ty = |name: &str| content.tensor_infos[name].ggml_dtype;
        assert_eq!(ty("token_embd.weight"), GgmlDType::Q8_0);
        assert_eq!(ty("blk.4.ffn_down.weight"), GgmlDType::Q4_1);
        drop(gguf);
        let b = crate::Bundle::load(&file, crate::WeightFormat::Native).unwrap();
        let mut seq = b.model.new_sequence(&mtplx_kv::CacheFactory::paged());
        let out = crate::generate_greedy(&*b.model, &mut seq, &[1, 2, 3], 4, &[], 64).unwrap();
        assert_eq!(out.len(), 4);
    }

    /// A tiny file of each quantization has the tensor types asked for, the vocabulary
    /// padded, and llama.cpp's file type.
    #[test]
    fn tiny_files_have_the_types_asked_for() {
        // The tokenizer comes from the default model, which `cargo xtask test` provides.
        let Some(model) = std::env::var_os("MTPLX_TEST_MODEL") else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let s = Shape::TINY;
        for q in [Quant::Q4_0, Quant::Q4KM] {
            let file = dir.path().join("tiny.gguf");
            write_gguf(&file, s, q, 3, Path::new(&model)).unwrap();
            let gguf = GgufSource::open(&file).unwrap();
            let content = gguf.content();
            let ty = |name: &str| content.tensor_infos[name].ggml_dtype;
            for l in 0..s.layers {
                for kind in ["attn_q.weight", "attn_v.weight", "ffn_down.weight"] {
                    assert_eq!(ty(&format!("blk.{l}.{kind}")), q.dtype(kind, l, s.layers));
                }
            }
            assert_eq!(ty("output.weight"), GgmlDType::Q6K);
            assert_eq!(ty("output_norm.weight"), GgmlDType::F32);
            let six: Vec<usize> = (0..s.layers)
                .filter(|&l| ty(&format!("blk.{l}.ffn_down.weight")) == GgmlDType::Q6K)
                .collect();
            match q {
                Quant::Q4_0 => assert!(six.is_empty()),
                // Nine layers: the first, the last two, and 3 and 6.
                Quant::Q4KM => assert_eq!(six, [0, 3, 6, 7, 8]),
                Quant::Q4_1 => unreachable!("not among the quantizations above"),
            }
            let md = &content.metadata;
            let Some(Value::Array(tokens)) = md.get("tokenizer.ggml.tokens") else {
                panic!("no token list")
            };
            assert_eq!(tokens.len(), s.vocab);
            assert!(matches!(&tokens[s.vocab - 1], Value::String(t) if t == "<|reserved_49215|>"));
            assert!(
                matches!(md.get("general.file_type"), Some(Value::U32(t)) if *t == q.file_type())
            );
        }
    }
}

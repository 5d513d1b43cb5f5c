//! Hybrid GGUF files (`mtplx_model::hybrid::gguf`, llama.cpp's `qwen35` names): what is
//! written reads back to the same model as the Hugging Face folder of the same weights
//! (every weight bit for bit but `A_log`, whose decay rate is; the MTP head too; the same
//! logits and the same MTP drafts bit for bit), the file holds llama.cpp's layout (read
//! here without the loader: tiled value heads, `-exp(A_log)`, interleaved `attn_q`, the
//! MTP head as the `nextn` block `blk.{num_layers}`), and a file that is truncated,
//! incomplete, misshapen, of experts or of another architecture is an error that names
//! what is wrong. The float64 reference check of a GGUF-loaded model is in
//! `tests/hybrid_reference.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::hybrid::gguf::{self, Arch};
use mtplx_model::hybrid::LayerKind;
use mtplx_model::hybrid::{hf, synthetic, HybridConfig, HybridModel, HybridWeights, MixerWeights};
use mtplx_model::mtp::MtpRunner;
use mtplx_model::sampling::argmax;
use mtplx_model::source::GgufSource;
use mtplx_model::tokenizer::{Special, Tokenizer};
use mtplx_model::{Bundle, LanguageModel, ModelError, Want, WeightFormat};

fn logits(model: &dyn mtplx_model::LanguageModel, ids: &[u32]) -> Vec<f32> {
    let mut seq = Sequence::new(&CacheFactory::contiguous(), &model.state_shape());
    model.forward(ids, &mut seq, Want::All).unwrap().logits
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % vocab as u64) as u32)
        .collect()
}

/// `w` with each `A_log` replaced by its decay rate `exp(A_log)`: what the model computes
/// with, and what a GGUF file keeps.
fn rates(w: &HybridWeights) -> HybridWeights {
    let mut w = w.clone();
    for l in &mut w.layers {
        if let MixerWeights::GatedDeltaNet(g) = &mut l.mixer {
            g.a_log = g.a_log.iter().map(|a| a.exp()).collect();
        }
    }
    w
}

fn saved(config: &HybridConfig, seed: u64, arch: Arch) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.gguf");
    let w = HybridWeights::random(config, seed);
    gguf::save_as(&file, config, &w, None, arch).unwrap();
    (dir, file)
}

#[test]
fn a_saved_file_loads_back_to_the_same_model_as_the_folder() {
    // tiny has 2 key heads and 4 value heads, so the tiled reorder is exercised.
    for (config, arch) in [
        (HybridConfig::tiny(), Arch::Qwen35),
        (synthetic::config(), Arch::Qwen35),
        (HybridConfig::tiny(), Arch::Qwen3Next),
    ] {
        let weights = HybridWeights::random(&config, 5);
        let (dir, file) = saved(&config, 5, arch);
        let (c, w) = gguf::load(&file).unwrap();
        assert_eq!(c, config, "{arch:?}");
        assert!(weights.mtp.is_some(), "seeded weights carry an MTP head");
        // `qwen35` carries the MTP head as its `nextn` block; `qwen3next` drops it, as
        // llama.cpp's converter does.
        let want = match arch {
            Arch::Qwen35 => weights.clone(),
            Arch::Qwen3Next => HybridWeights {
                mtp: None,
                ..weights.clone()
            },
        };
        assert_eq!(
            rates(&w),
            rates(&want),
            "{arch:?}: every weight, the MTP head's too, bit for bit"
        );
        let folder = dir.path().join("hf");
        hf::save(&folder, &config, &weights).unwrap();
        let ids = tokens(40, config.vocab_size);
        let from_gguf = HybridModel::load(&file).unwrap();
        let from_folder = HybridModel::load(&folder).unwrap();
        assert_eq!(
            logits(&from_gguf, &ids),
            logits(&from_folder, &ids),
            "{arch:?}: the same logits, bit for bit"
        );
    }
}

#[test]
fn a_tied_head_is_left_out_and_read_back() {
    let config = HybridConfig {
        tie_word_embeddings: true,
        ..HybridConfig::tiny()
    };
    let mut w = HybridWeights::random(&config, 2);
    w.lm_head = w.embed.clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.gguf");
    gguf::save(&file, &config, &w, None).unwrap();
    let content = read_content(&file);
    assert!(!content.tensor_infos.contains_key("output.weight"));
    let (c, back) = gguf::load(&file).unwrap();
    assert!(c.tie_word_embeddings);
    assert_eq!(back.lm_head, w.embed);
}

fn read_content(path: &Path) -> gguf_file::Content {
    let mut f = std::fs::File::open(path).unwrap();
    gguf_file::Content::read(&mut f).unwrap()
}

/// Every tensor of the file as (PyTorch-order shape, f32 values), read with candle alone.
fn raw_tensors(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let content = read_content(path);
    let mut f = std::fs::File::open(path).unwrap();
    content
        .tensor_infos
        .keys()
        .map(|name| {
            let q = content
                .tensor(&mut f, name, &candle_core::Device::Cpu)
                .unwrap();
            let t = q.dequantize(&candle_core::Device::Cpu).unwrap();
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (name.clone(), (t.dims().to_vec(), v))
        })
        .collect()
}

#[test]
fn the_file_holds_llama_cpp_qwen35_layout() {
    // Written from docs/hybrid-checkpoints.md §4, not from the loader: GGUF value head
    // `j·nk + g` holds head `g·r + j`; `attn_q` is `[q_h, gate_h]` per head.
    let c = HybridConfig::tiny();
    let w = HybridWeights::random(&c, 9);
    let (_dir, file) = saved(&c, 9, Arch::Qwen35);
    let t = raw_tensors(&file);
    let md = read_content(&file).metadata;
    let int = |k: &str| md[&format!("qwen35.{k}")].to_u32().unwrap() as usize;
    assert_eq!(md["general.architecture"].to_string().unwrap(), "qwen35");
    assert_eq!(int("ssm.group_count"), 2);
    assert_eq!(int("ssm.time_step_rank"), 4);
    assert_eq!(int("ssm.state_size"), 16);
    assert_eq!(int("ssm.inner_size"), 64);
    assert_eq!(int("ssm.conv_kernel"), 4);
    assert_eq!(int("full_attention_interval"), 4);
    assert_eq!(int("rope.dimension_count"), 8);
    let (nk, nv, dk, dv, h) = (2, 4, 16, 16, c.hidden_size);
    let r = nv / nk;
    let (kd, vd) = (nk * dk, nv * dv);
    let ours = |n: usize| (n % nk) * r + n / nk;
    let MixerWeights::GatedDeltaNet(g) = &w.layers[0].mixer else {
        panic!("layer 0 is a gated delta net")
    };
    let row = |m: &[f32], i: usize, cols: usize| m[i * cols..(i + 1) * cols].to_vec();
    let (shape, qkv) = &t["blk.0.attn_qkv.weight"];
    assert_eq!(shape, &[2 * kd + vd, h]);
    let (_, z) = &t["blk.0.attn_gate.weight"];
    let (_, beta) = &t["blk.0.ssm_beta.weight"];
    let (_, alpha) = &t["blk.0.ssm_alpha.weight"];
    let (_, conv) = &t["blk.0.ssm_conv1d.weight"];
    let (_, out) = &t["blk.0.ssm_out.weight"];
    for i in 0..2 * kd {
        assert_eq!(row(qkv, i, h), row(&g.in_proj_qkvz, i, h), "q/k row {i}");
        assert_eq!(row(conv, i, 4), row(&g.conv1d, i, 4), "q/k channel {i}");
    }
    for n in 0..nv {
        let o = ours(n);
        assert_eq!(t["blk.0.ssm_a"].1[n], -g.a_log[o].exp(), "ssm_a {n}");
        assert_eq!(t["blk.0.ssm_dt.bias"].1[n], g.dt_bias[o], "dt {n}");
        assert_eq!(row(beta, n, h), row(&g.in_proj_ba, o, h), "beta {n}");
        assert_eq!(row(alpha, n, h), row(&g.in_proj_ba, nv + o, h), "alpha {n}");
        for e in 0..dv {
            let (gg, oo) = (n * dv + e, o * dv + e);
            assert_eq!(
                row(qkv, 2 * kd + gg, h),
                row(&g.in_proj_qkvz, 2 * kd + oo, h)
            );
            assert_eq!(row(z, gg, h), row(&g.in_proj_qkvz, 2 * kd + vd + oo, h));
            assert_eq!(row(conv, 2 * kd + gg, 4), row(&g.conv1d, 2 * kd + oo, 4));
            for x in 0..h {
                assert_eq!(out[x * vd + gg], g.out_proj[x * vd + oo]);
            }
        }
    }
    assert_eq!(
        t["blk.0.ssm_norm.weight"].1, g.norm,
        "no +1 on the gated norm"
    );
    assert_eq!(t["blk.0.attn_norm.weight"].1, w.layers[0].input_norm);
    let MixerWeights::FullAttention(a) = &w.layers[3].mixer else {
        panic!("layer 3 is attention")
    };
    let (nh, hd) = (c.num_attention_heads, c.head_dim);
    let (_, q) = &t["blk.3.attn_q.weight"];
    for head in 0..nh {
        for i in 0..hd {
            let query = row(&a.q_proj, head * hd + i, h);
            let gate = row(&a.q_proj, nh * hd + head * hd + i, h);
            assert_eq!(row(q, head * 2 * hd + i, h), query);
            assert_eq!(row(q, head * 2 * hd + hd + i, h), gate);
        }
    }
    assert_eq!(t["blk.3.attn_q_norm.weight"].1, a.q_norm);
    assert_eq!(t["output_norm.weight"].1, w.final_norm);
    assert_eq!(t["token_embd.weight"].0, [c.vocab_size, h]);
}

#[test]
fn the_file_holds_the_mtp_head_as_llama_cpp_nextn_block() {
    // Written from docs/hybrid-checkpoints.md §4 (llama.cpp's `_Qwen35MtpMixin`), not from
    // the loader: `mtp.layers.0.*` is block `blk.{num_layers}` under a full-attention
    // block's names, with `nextn.eh_proj` (`mtp.fc`), `nextn.enorm`, `nextn.hnorm` and
    // `nextn.shared_head_norm`; norms as the multiplier; `block_count` counts the block.
    let c = HybridConfig::tiny();
    let w = HybridWeights::random(&c, 11);
    let m = w.mtp.as_ref().unwrap();
    let (_dir, file) = saved(&c, 11, Arch::Qwen35);
    let md = read_content(&file).metadata;
    let int = |k: &str| md[&format!("qwen35.{k}")].to_u32().unwrap() as usize;
    let n = c.num_layers;
    assert_eq!(int("block_count"), n + 1);
    assert_eq!(int("nextn_predict_layers"), 1);
    let t = raw_tensors(&file);
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let (nh, hd) = (c.num_attention_heads, c.head_dim);
    let kv = c.num_key_value_heads * hd;
    let MixerWeights::FullAttention(a) = &m.layer.mixer else {
        panic!("the MTP layer is attention")
    };
    let mut q = Vec::new();
    for head in 0..nh {
        q.extend_from_slice(&a.q_proj[head * hd * h..(head + 1) * hd * h]);
        q.extend_from_slice(&a.q_proj[(nh + head) * hd * h..(nh + head + 1) * hd * h]);
    }
    let want: Vec<(&str, Vec<usize>, &[f32])> = vec![
        ("attn_norm.weight", vec![h], &m.layer.input_norm),
        ("attn_q.weight", vec![2 * nh * hd, h], &q),
        ("attn_k.weight", vec![kv, h], &a.k_proj),
        ("attn_v.weight", vec![kv, h], &a.v_proj),
        ("attn_output.weight", vec![h, nh * hd], &a.o_proj),
        ("attn_q_norm.weight", vec![hd], &a.q_norm),
        ("attn_k_norm.weight", vec![hd], &a.k_norm),
        (
            "post_attention_norm.weight",
            vec![h],
            &m.layer.post_attention_norm,
        ),
        ("ffn_gate.weight", vec![i, h], &m.layer.mlp.gate),
        ("ffn_up.weight", vec![i, h], &m.layer.mlp.up),
        ("ffn_down.weight", vec![h, i], &m.layer.mlp.down),
        ("nextn.eh_proj.weight", vec![h, 2 * h], &m.fc),
        ("nextn.enorm.weight", vec![h], &m.pre_fc_norm_embedding),
        ("nextn.hnorm.weight", vec![h], &m.pre_fc_norm_hidden),
        ("nextn.shared_head_norm.weight", vec![h], &m.norm),
    ];
    let prefix = format!("blk.{n}.");
    let mut names: Vec<&str> = t.keys().filter_map(|k| k.strip_prefix(&prefix)).collect();
    names.sort();
    let mut expected: Vec<&str> = want.iter().map(|(name, ..)| *name).collect();
    expected.sort();
    assert_eq!(names, expected, "the nextn block's tensors, and no others");
    for (name, shape, data) in &want {
        let (got_shape, got) = &t[&format!("{prefix}{name}")];
        assert_eq!(got_shape, shape, "{name}");
        assert_eq!(got.as_slice(), *data, "{name}");
    }
    assert!(t.keys().all(|k| !k.starts_with(&format!("blk.{}.", n + 1))));

    // `qwen3next`: llama.cpp's converter drops the MTP tensors, and so does the writer.
    let (_dir, file) = saved(&c, 11, Arch::Qwen3Next);
    let md = read_content(&file).metadata;
    assert_eq!(md["qwen3next.block_count"].to_u32().unwrap() as usize, n);
    assert!(!md.contains_key("qwen3next.nextn_predict_layers"));
    assert!(raw_tensors(&file).keys().all(|k| !k.starts_with(&prefix)));
}

#[test]
fn only_the_first_nextn_block_is_read() {
    // A file declaring two `nextn` blocks: the trunk keeps its layers, the head is the
    // first block's, the second is ignored.
    let c = HybridConfig::tiny();
    let w = HybridWeights::random(&c, 4);
    let n = c.num_layers;
    let mut md = gguf::metadata(&c, &w, Arch::Qwen35).unwrap();
    for (k, v) in md.iter_mut() {
        match k.as_str() {
            "qwen35.block_count" => *v = Value::U32(n as u32 + 2),
            "qwen35.nextn_predict_layers" => *v = Value::U32(2),
            _ => {}
        }
    }
    let mut ts = gguf::tensors(&c, &w, Arch::Qwen35);
    let second: Vec<_> = ts
        .iter()
        .filter_map(|(name, shape, data)| {
            let rest = name.strip_prefix(&format!("blk.{n}."))?;
            Some((
                format!("blk.{}.{rest}", n + 1),
                shape.clone(),
                vec![0.5; data.len()],
            ))
        })
        .collect();
    ts.extend(second);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.gguf");
    gguf::write_file(&file, &md, &ts).unwrap();
    let (back_c, back) = gguf::load(&file).unwrap();
    assert_eq!(back_c, c);
    assert_eq!(rates(&back), rates(&w));
}

#[test]
fn a_missing_or_misshapen_nextn_tensor_is_named() {
    let n = HybridConfig::tiny().num_layers;
    for name in [
        "nextn.eh_proj.weight",
        "nextn.enorm.weight",
        "nextn.hnorm.weight",
        "nextn.shared_head_norm.weight",
        "attn_q.weight",
        "ffn_down.weight",
    ] {
        let name = format!("blk.{n}.{name}");
        let err = edited(|_, ts| ts.retain(|(t, ..)| *t != name));
        assert!(
            matches!(&err, ModelError::MissingTensor { tensor, .. } if *tensor == name),
            "{name}: {err}"
        );
    }
    let name = format!("blk.{n}.nextn.eh_proj.weight");
    let err = edited(|_, ts| {
        let t = ts.iter_mut().find(|(t, ..)| *t == name).unwrap();
        t.1 = vec![t.1[1], t.1[0]];
    });
    assert!(
        matches!(&err, ModelError::TensorShape { tensor, .. } if *tensor == name),
        "{err}"
    );
}

#[test]
fn a_gguf_files_mtp_head_drafts_what_the_folders_does() {
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 5);
    let (dir, file) = saved(&config, 5, Arch::Qwen35);
    let folder = dir.path().join("hf");
    hf::save(&folder, &config, &weights).unwrap();
    let from_gguf = HybridModel::load(&file).unwrap();
    let from_folder = HybridModel::load(&folder).unwrap();
    // The prompt's trunk rows, the head over them, then three greedy draft steps each
    // fed the previous step's row and token.
    let drafts = |model: &HybridModel| {
        let head = model.mtp_head().expect("the file's MTP head");
        let ids = tokens(24, config.vocab_size);
        let n = ids.len();
        let mut seq = Sequence::new(&CacheFactory::contiguous(), &model.state_shape());
        let out = model.forward(&ids, &mut seq, Want::All).unwrap();
        let mut next = ids[1..].to_vec();
        next.push(argmax(out.logits_row(n - 1)) as u32);
        let mut hidden = out.hidden.clone();
        head.prepare_trunk_rows(&mut hidden);
        let mut cache = CacheFactory::contiguous().new_cache(head.kv_shape());
        let (mut x, mut logits) = head
            .last_row(model, &hidden, &next, cache.as_mut(), 0)
            .unwrap();
        let mut steps = vec![(x.clone(), logits.clone())];
        for i in 0..3 {
            let t = argmax(&logits) as u32;
            (x, logits) = head
                .last_row(model, &x, &[t], cache.as_mut(), n + i)
                .unwrap();
            steps.push((x.clone(), logits.clone()));
        }
        steps
    };
    assert_eq!(
        drafts(&from_gguf),
        drafts(&from_folder),
        "the same rows and scores, bit for bit"
    );
    // By `full_attention_interval` a block of that index would be a gated delta net: the
    // `nextn` block is read as attention all the same.
    let by_interval = HybridConfig {
        layer_types: None,
        ..config.clone()
    };
    assert_eq!(
        by_interval.layer_kind(config.num_layers),
        LayerKind::GatedDeltaNet
    );
}

/// The file's metadata and tensors, `edit`ed, written to a new file; its load error.
fn edited(
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<usize>, Vec<f32>)>),
) -> ModelError {
    let c = HybridConfig::tiny();
    let w = HybridWeights::random(&c, 4);
    let mut md = gguf::metadata(&c, &w, Arch::Qwen35).unwrap();
    let mut ts = gguf::tensors(&c, &w, Arch::Qwen35);
    edit(&mut md, &mut ts);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.gguf");
    gguf::write_file(&file, &md, &ts).unwrap();
    gguf::load(&file).unwrap_err()
}

#[test]
fn a_missing_tensor_is_named() {
    let err = edited(|_, ts| ts.retain(|(n, ..)| n != "blk.1.ssm_alpha.weight"));
    assert!(
        matches!(&err, ModelError::MissingTensor { tensor, .. } if tensor == "blk.1.ssm_alpha.weight"),
        "{err}"
    );
}

#[test]
fn a_misshapen_tensor_is_named() {
    let err = edited(|_, ts| {
        let t = ts
            .iter_mut()
            .find(|(n, ..)| n == "blk.0.ssm_conv1d.weight")
            .unwrap();
        t.1 = vec![t.1[1], t.1[0]];
    });
    assert!(
        matches!(&err, ModelError::TensorShape { tensor, .. } if tensor == "blk.0.ssm_conv1d.weight"),
        "{err}"
    );
}

#[test]
fn experts_are_refused_by_name() {
    let err = edited(|_, ts| {
        ts.push((
            "blk.2.ffn_gate_inp.weight".into(),
            vec![8, 64],
            vec![0.0; 512],
        ))
    });
    assert!(
        matches!(&err, ModelError::BadTensor { tensor, .. } if tensor == "blk.2.ffn_gate_inp.weight"),
        "{err}"
    );
    let err = edited(|_, ts| {
        ts.push((
            "blk.0.ffn_up_exps.weight".into(),
            vec![2, 8, 64],
            vec![0.0; 1024],
        ))
    });
    assert!(
        err.to_string().contains("blk.0.ffn_up_exps.weight"),
        "{err}"
    );
    let err = edited(|md, _| {
        for (k, v) in md.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("qwen3next".into());
            }
        }
        let keys: Vec<_> = md
            .iter()
            .map(|(k, v)| (k.replace("qwen35.", "qwen3next."), v.clone()))
            .collect();
        *md = keys;
        md.push(("qwen3next.expert_count".into(), Value::U32(512)));
    });
    assert!(err.to_string().contains("ffn_gate_inp"), "{err}");
}

#[test]
fn another_architecture_and_missing_metadata_are_named() {
    let err = edited(|md, _| md[0].1 = Value::String("llama".into()));
    assert!(
        err.to_string().contains("`llama` is not a hybrid one"),
        "{err}"
    );
    let err = edited(|md, _| md.retain(|(k, _)| k != "qwen35.ssm.state_size"));
    assert!(err.to_string().contains("qwen35.ssm.state_size"), "{err}");
    let err = edited(|md, _| {
        for (k, v) in md.iter_mut() {
            if k == "qwen35.ssm.inner_size" {
                *v = Value::U32(96);
            }
        }
    });
    assert!(err.to_string().contains("qwen35.ssm.inner_size"), "{err}");
}

#[test]
fn a_truncated_file_is_an_error_not_a_panic() {
    let (_dir, file) = saved(&HybridConfig::tiny(), 1, Arch::Qwen35);
    let bytes = std::fs::read(&file).unwrap();
    for len in [0, 10, 300, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&file, &bytes[..len]).unwrap();
        let err = gguf::load(&file).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                ModelError::BadGguf { .. } | ModelError::BadTensor { .. }
            ),
            "{len} bytes: {text}"
        );
        assert!(text.contains("model.gguf"), "{text}");
    }
}

#[test]
fn a_config_llama_cpp_cannot_express_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.gguf");
    let c = HybridConfig {
        linear_value_head_dim: 32,
        ..HybridConfig::tiny()
    };
    let err = gguf::save(&file, &c, &HybridWeights::random(&c, 1), None).unwrap_err();
    assert!(err.to_string().contains("linear_value_head_dim"), "{err}");
    use mtplx_model::hybrid::LayerKind::{FullAttention as A, GatedDeltaNet as G};
    let c = HybridConfig {
        layer_types: Some(vec![G, A, G, G, G, G, G, A]),
        ..HybridConfig::tiny()
    };
    let err = gguf::save(&file, &c, &HybridWeights::random(&c, 1), None).unwrap_err();
    assert!(err.to_string().contains("full_attention_interval"), "{err}");
}

/// The default model's tokenizer, when the tests have it (`cargo xtask test` sets this).
fn default_tokenizer() -> Option<Tokenizer> {
    let path = std::env::var_os("MTPLX_TEST_MODEL")?;
    Some(Tokenizer::from_gguf(GgufSource::open(Path::new(&path)).unwrap().content()).unwrap())
}

#[test]
fn a_bundle_loads_a_hybrid_gguf_with_its_tokenizer() {
    let config = synthetic::config();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hybrid.gguf");
    let tokenizer = default_tokenizer();
    if tokenizer.is_none() {
        eprintln!("MTPLX_TEST_MODEL unset: writing a tokenizer is not checked");
    }
    synthetic::write_gguf(&file, &config, 7, tokenizer.as_ref()).unwrap();
    let folder = dir.path().join("hf");
    synthetic::write(&folder, &config, 7, None).unwrap();
    let ids = tokens(30, config.vocab_size);
    let Some(want) = tokenizer else {
        // No tokenizer in the file: a bundle cannot load it, the model can.
        assert!(Bundle::load(&file, WeightFormat::Native).is_err());
        let model = HybridModel::load(&file).unwrap();
        assert_eq!(
            logits(&model, &ids),
            logits(&HybridModel::load(&folder).unwrap(), &ids)
        );
        return;
    };
    let bundle = Bundle::load(&file, WeightFormat::Native).unwrap();
    assert_eq!(bundle.id, "hybrid");
    assert_eq!(bundle.model.dims().vocab_size, config.vocab_size);
    let text = "<|im_start|>user\nHello, world! 1234 ünïcödé<|im_end|>";
    for special in [Special::Parse, Special::AsText] {
        assert_eq!(
            bundle.tokenizer.encode(text, special).unwrap(),
            want.encode(text, special).unwrap()
        );
    }
    assert_eq!(bundle.tokenizer.stop_ids(), want.stop_ids());
    assert_eq!(bundle.tokenizer.bos_id(), want.bos_id());
    assert_eq!(bundle.tokenizer.chat_template(), want.chat_template());
    assert!(bundle.template.is_some());
    let folder_model = HybridModel::load(&folder).unwrap();
    assert_eq!(
        logits(bundle.model.as_ref(), &ids),
        logits(&folder_model, &ids)
    );
    // A hybrid model runs on mtplx's kernels only.
    let err = Bundle::load(&file, WeightFormat::F32).err().unwrap();
    assert!(err.to_string().contains("native"), "{err}");
}

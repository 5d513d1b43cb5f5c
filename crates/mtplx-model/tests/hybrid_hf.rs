//! Qwen3-Next folders (`mtplx_model::hybrid::hf`): what is written reads back to the same
//! weights and the same logits, and a checkpoint that is incomplete, misshapen, truncated
//! or of a kind the model does not compute is an error that names what is wrong.

use mtplx_kv::Sequence;
use mtplx_model::LanguageModel as _;
use std::path::Path;

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{hf, HybridConfig, HybridModel, HybridWeights};
use mtplx_model::{ModelError, Want};
use serde_json::Value;

fn saved(config: &HybridConfig, seed: u64) -> (tempfile::TempDir, HybridWeights) {
    let weights = HybridWeights::random(config, seed);
    let dir = tempfile::tempdir().unwrap();
    hf::save(dir.path(), config, &weights).unwrap();
    (dir, weights)
}

fn logits(model: &HybridModel, config: &HybridConfig, ids: &[u32]) -> Vec<f32> {
    let mut cache = Sequence::new(&CacheFactory::contiguous(), &config.state_shape());
    model.forward(ids, &mut cache, Want::All).unwrap().logits
}

/// Rewrites the folder's `config.json` through `edit`.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// Writes `model.safetensors`: (name, shape, little-endian bytes of `dtype`).
fn write_tensors(dir: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)], dtype: safetensors::Dtype) {
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// Rewrites `model.safetensors` with `name` left out, or given `shape` (same values).
fn rewrite_tensors(
    dir: &Path,
    config: &HybridConfig,
    w: &HybridWeights,
    name: &str,
    shape: Option<Vec<usize>>,
) {
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = hf::tensors(config, w)
        .into_iter()
        .filter(|(n, ..)| n != name || shape.is_some())
        .map(|(n, s, d)| {
            let s = if n == name { shape.clone().unwrap() } else { s };
            (n, s, d.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    write_tensors(dir, &tensors, safetensors::Dtype::F32);
}

#[test]
fn a_saved_checkpoint_loads_back_to_the_same_weights_and_logits() {
    let config = HybridConfig::tiny();
    let (dir, weights) = saved(&config, 5);
    let (loaded_config, loaded) = hf::load(dir.path()).unwrap();
    assert_eq!(loaded, weights, "every weight, bit for bit");
    for l in 0..config.num_layers {
        assert_eq!(
            loaded_config.layer_kind(l),
            config.layer_kind(l),
            "layer {l}"
        );
    }
    assert_eq!(loaded_config.rotary_dim(), config.rotary_dim());
    assert_eq!(loaded_config.context_length, config.context_length);

    let ids: Vec<u32> = (0..40).map(|i| (i * 31 + 7) % 256).collect();
    let want = logits(
        &HybridModel::new(config.clone(), &weights).unwrap(),
        &config,
        &ids,
    );
    let got = logits(&HybridModel::load(dir.path()).unwrap(), &config, &ids);
    assert_eq!(got, want);

    // The published layout, not ours: the first key head's group of `in_proj_qkvz` starts
    // with its q rows, then its k rows (ours has all q rows first).
    let published = hf::tensors(&config, &weights);
    let (_, _, qkvz) = published
        .iter()
        .find(|(n, ..)| n == "model.layers.0.linear_attn.in_proj_qkvz.weight")
        .unwrap();
    let ours = match &weights.layers[0].mixer {
        mtplx_model::hybrid::MixerWeights::GatedDeltaNet(g) => &g.in_proj_qkvz,
        _ => unreachable!("layer 0 is a gated delta net"),
    };
    let (h, dk) = (config.hidden_size, config.linear_key_head_dim);
    let k_rows_of_head_0 = config.linear_key_dim() * h;
    assert_eq!(
        qkvz[dk * h..2 * dk * h],
        ours[k_rows_of_head_0..k_rows_of_head_0 + dk * h]
    );
    assert_ne!(qkvz[..], ours[..]);
}

#[test]
fn tied_embeddings_need_no_output_head() {
    let config = HybridConfig {
        tie_word_embeddings: true,
        ..HybridConfig::tiny()
    };
    let mut weights = HybridWeights::random(&config, 9);
    weights.lm_head = weights.embed.clone();
    let dir = tempfile::tempdir().unwrap();
    hf::save(dir.path(), &config, &weights).unwrap();
    assert!(!hf::tensors(&config, &weights)
        .iter()
        .any(|(n, ..)| n == "lm_head.weight"));
    let (_, loaded) = hf::load(dir.path()).unwrap();
    assert_eq!(loaded.lm_head, weights.embed);
}

#[test]
fn a_missing_or_misshapen_tensor_is_named() {
    let config = HybridConfig::tiny();
    let (dir, weights) = saved(&config, 3);
    let name = "model.layers.3.self_attn.q_norm.weight";
    rewrite_tensors(dir.path(), &config, &weights, name, None);
    match HybridModel::load(dir.path()) {
        Err(ModelError::MissingTensor { tensor, .. }) => assert_eq!(tensor, name),
        other => panic!("expected a missing tensor, got {:?}", other.err()),
    }
    let name = "model.layers.1.linear_attn.in_proj_ba.weight";
    let bad_shape = vec![config.linear_num_value_heads, 2 * config.hidden_size];
    rewrite_tensors(dir.path(), &config, &weights, name, Some(bad_shape.clone()));
    match HybridModel::load(dir.path()) {
        Err(ModelError::TensorShape { tensor, got, .. }) => {
            assert_eq!(tensor, name);
            assert_eq!(got, bad_shape);
        }
        other => panic!("expected a shape error, got {:?}", other.err()),
    }
}

#[test]
fn the_mtp_head_loads_under_the_published_names_and_only_when_present() {
    let config = HybridConfig::tiny();
    let (dir, weights) = saved(&config, 7);
    let names: Vec<String> = hf::tensors(&config, &weights)
        .into_iter()
        .map(|(n, ..)| n)
        .filter(|n| n.starts_with("mtp."))
        .collect();
    for name in [
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.input_layernorm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.self_attn.q_norm.weight",
        "mtp.layers.0.post_attention_layernorm.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    assert!(HybridModel::load(dir.path()).unwrap().mtp_head().is_some());

    // A head tensor missing or misshapen is named, like the trunk's.
    let name = "mtp.layers.0.self_attn.k_proj.weight";
    rewrite_tensors(dir.path(), &config, &weights, name, None);
    match HybridModel::load(dir.path()) {
        Err(ModelError::MissingTensor { tensor, .. }) => assert_eq!(tensor, name),
        other => panic!("expected a missing tensor, got {:?}", other.err()),
    }
    let name = "mtp.fc.weight";
    let h = config.hidden_size;
    rewrite_tensors(dir.path(), &config, &weights, name, Some(vec![2 * h, h]));
    match HybridModel::load(dir.path()) {
        Err(ModelError::TensorShape { tensor, .. }) => assert_eq!(tensor, name),
        other => panic!("expected a shape error, got {:?}", other.err()),
    }

    // Without `mtp.*` the trunk loads alone, with the same logits.
    let trunk = HybridWeights {
        mtp: None,
        ..weights.clone()
    };
    hf::save(dir.path(), &config, &trunk).unwrap();
    let alone = HybridModel::load(dir.path()).unwrap();
    assert!(alone.mtp_head().is_none());
    let ids: Vec<u32> = (0..30).map(|i| (i * 17 + 3) % 256).collect();
    assert_eq!(
        logits(&alone, &config, &ids),
        logits(
            &HybridModel::new(config.clone(), &weights).unwrap(),
            &config,
            &ids
        )
    );
}

#[test]
fn a_truncated_file_is_an_error_not_a_panic() {
    let config = HybridConfig::tiny();
    let (dir, _) = saved(&config, 4);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for keep in [0, 7, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let e = HybridModel::load(dir.path())
            .err()
            .expect("a truncated file loads");
        assert!(
            matches!(
                e,
                ModelError::BadSafetensors { .. } | ModelError::BadTensor { .. }
            ),
            "{keep} bytes: {e}"
        );
    }
}

#[test]
fn what_the_model_does_not_compute_is_refused_by_name() {
    let config = HybridConfig::tiny();
    let (dir, _) = saved(&config, 6);
    let refused = |edit: &dyn Fn(&mut Value), needle: &str| {
        let d = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.path().join(f), d.path().join(f)).unwrap();
        }
        edit_config(d.path(), |v| edit(v));
        match HybridModel::load(d.path()) {
            Err(e @ ModelError::BadConfig { .. }) => {
                assert!(e.to_string().contains(needle), "{e} does not name {needle}")
            }
            other => panic!(
                "expected a config error naming {needle}, got {:?}",
                other.err()
            ),
        }
    };
    refused(
        &|v| v["num_experts"] = 8.into(),
        "model.layers.0.mlp.gate.weight",
    );
    refused(&|v| v["layer_types"][2] = "mamba".into(), "\"mamba\"");
    refused(&|v| v["model_type"] = "llama".into(), "llama");
    refused(&|v| v["attention_bias"] = true.into(), "attention_bias");
    refused(&|v| v["hidden_act"] = "gelu".into(), "gelu");
    refused(
        &|v| v["rope_scaling"] = serde_json::json!({"type": "yarn"}),
        "rope_scaling",
    );
    refused(
        &|v| {
            v.as_object_mut().unwrap().remove("hidden_size");
        },
        "hidden_size",
    );
    refused(&|v| v["linear_num_value_heads"] = 3.into(), "multiple");
    // Experts only in layers listed as MLP-only: a dense model after all.
    let d = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(dir.path().join(f), d.path().join(f)).unwrap();
    }
    edit_config(d.path(), |v| {
        v["num_experts"] = 8.into();
        v["mlp_only_layers"] = (0..8).collect::<Vec<u64>>().into();
    });
    HybridModel::load(d.path()).unwrap();
}

#[test]
fn a_bf16_checkpoint_loads_as_its_bf16_values() {
    // Published checkpoints are bf16: every tensor stored so, the loader widens it.
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 8);
    let dir = tempfile::tempdir().unwrap();
    hf::save(dir.path(), &config, &weights).unwrap();
    let bf16 = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect()
    };
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = hf::tensors(&config, &weights)
        .into_iter()
        .map(|(n, s, d)| {
            let bytes = d
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect();
            (n, s, bytes)
        })
        .collect();
    write_tensors(dir.path(), &tensors, safetensors::Dtype::BF16);
    let (_, loaded) = hf::load(dir.path()).unwrap();
    // The published values rounded to bf16, then converted back to this crate's layout:
    // the same as this crate's rounded directly, except the zero-centred norms, rounded
    // as `w - 1`.
    let first = &loaded.layers[0];
    match (&first.mixer, &weights.layers[0].mixer) {
        (
            mtplx_model::hybrid::MixerWeights::GatedDeltaNet(got),
            mtplx_model::hybrid::MixerWeights::GatedDeltaNet(want),
        ) => {
            assert_eq!(got.in_proj_qkvz, bf16(&want.in_proj_qkvz));
            assert_eq!(got.a_log, bf16(&want.a_log));
        }
        _ => unreachable!("layer 0 is a gated delta net"),
    }
    let norm: Vec<f32> = weights.layers[0]
        .input_norm
        .iter()
        .map(|&w| 1.0 + half::bf16::from_f32(w - 1.0).to_f32())
        .collect();
    assert_eq!(first.input_norm, norm);
    assert_eq!(loaded.embed, bf16(&weights.embed));
    HybridModel::new(config, &loaded).unwrap();
}

//! Broken model files give typed errors that name the file (and the tensor), never a panic.

mod support;

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use mtplx_model::{Model, ModelError, WeightFormat};

fn load(path: &Path) -> ModelError {
    match Model::load(path, WeightFormat::F32) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

#[test]
fn wrong_magic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    std::fs::write(&p, b"NOPE this is not a gguf file at all").unwrap();
    let e = load(&p);
    assert!(matches!(e, ModelError::BadGguf { .. }), "{e}");
    assert!(e.to_string().contains("x.gguf"), "{e}");
}

#[test]
fn missing_file() {
    let e = load(Path::new("/definitely/not/here.gguf"));
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
}

#[test]
fn truncated_file_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.gguf");
    support::write(&p, GgmlDType::Q8_0, |_, _| {});
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len * 2 / 3).unwrap();
    let e = load(&p);
    match &e {
        ModelError::BadTensor { path, tensor, .. } => {
            assert_eq!(path, &p);
            assert!(
                tensor.starts_with("blk.") || tensor.starts_with("output"),
                "{e}"
            );
        }
        other => panic!("expected BadTensor, got {other}"),
    }
}

#[test]
fn unsupported_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.gguf");
    support::write(&p, GgmlDType::F32, |md, _| {
        md[0].1 = Value::String("mamba".into());
    });
    let e = load(&p);
    assert!(
        matches!(&e, ModelError::UnsupportedArchitecture { arch, .. } if arch == "mamba"),
        "{e}"
    );
}

#[test]
fn unsupported_tensor_type() {
    // Patch the first tensor's type id in the header to one no GGUF reader knows.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.gguf");
    support::write(&p, GgmlDType::F32, |_, _| {});
    let mut bytes = std::fs::read(&p).unwrap();
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    // n_dims (u32), 2 dims (u64 each), then the type (u32).
    let ty = at + 4 + 16;
    bytes[ty..ty + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&p, bytes).unwrap();
    let e = load(&p);
    assert!(matches!(e, ModelError::BadGguf { .. }), "{e}");
    assert!(e.to_string().contains("99"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    support::write(&p, GgmlDType::F32, |_, ts| {
        ts.retain(|(n, _, _)| n != "blk.1.ffn_up.weight");
    });
    let e = load(&p);
    assert!(
        matches!(&e, ModelError::MissingTensor { tensor, .. } if tensor == "blk.1.ffn_up.weight"),
        "{e}"
    );
}

#[test]
fn wrong_tensor_shape_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.gguf");
    support::write(&p, GgmlDType::F32, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|(n, _, _)| n == "blk.0.attn_k.weight")
            .unwrap();
        t.1 = vec![256, 256];
        t.2 = vec![0.0; 256 * 256];
    });
    let e = load(&p);
    assert!(
        matches!(&e, ModelError::TensorShape { tensor, .. } if tensor == "blk.0.attn_k.weight"),
        "{e}"
    );
}

#[test]
fn bad_config_values() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.gguf");
    support::write(&p, GgmlDType::F32, |md, _| {
        let kv = md
            .iter_mut()
            .find(|(k, _)| k == "llama.attention.head_count_kv")
            .unwrap();
        kv.1 = Value::U32(3);
    });
    assert!(matches!(load(&p), ModelError::BadConfig { .. }));
    let p = dir.path().join("c2.gguf");
    support::write(&p, GgmlDType::F32, |md, _| {
        md.retain(|(k, _)| k != "llama.embedding_length");
    });
    let e = load(&p);
    assert!(matches!(e, ModelError::BadConfig { .. }), "{e}");
    assert!(e.to_string().contains("embedding_length"), "{e}");
}

#[test]
fn broken_hf_folders() {
    let dir = tempfile::tempdir().unwrap();
    // No safetensors at all.
    let e = load(dir.path());
    assert!(matches!(e, ModelError::NotAModel { .. }), "{e}");
    // Corrupt safetensors.
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\x08\0\0\0\0\0\0\0{bad json",
    )
    .unwrap();
    let e = load(dir.path());
    assert!(matches!(e, ModelError::BadSafetensors { .. }), "{e}");
    // A good tiny model with a broken config.json.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
    let dir = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("config.json"), b"{\"model_type\": 7}").unwrap();
    let e = load(dir.path());
    assert!(matches!(e, ModelError::BadConfig { .. }), "{e}");
}

#[test]
fn out_of_range_tokens_are_an_error() {
    use mtplx_kv::CacheFactory;
    use mtplx_model::{LanguageModel, Want};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.gguf");
    support::write(&p, GgmlDType::F32, |_, _| {});
    let model = Model::load(&p, WeightFormat::F32).unwrap();
    let mut cache = model.new_sequence(&CacheFactory::contiguous());
    let e = model
        .forward(&[5, 300], &mut cache, Want::Last)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::TokenOutOfRange { id: 300, .. }),
        "{e}"
    );
    let e = model.forward(&[], &mut cache, Want::Last).unwrap_err();
    assert!(matches!(e, ModelError::EmptyInput), "{e}");
    assert_eq!(
        cache.len(),
        0,
        "a failed forward leaves the cache as it was"
    );
}

//! The default model against the independent float64 numpy reference
//! (tools/reference/make_fixtures.py): chat template rendering, tokenization, greedy
//! continuations token for token, and first-step logits, on the exact f32 path; the native
//! (kernel) path against the f32 path.

use mtplx_model::tokenizer::Special;
use std::path::PathBuf;

use mtplx_kv::{CacheFactory, KvDtype, Sequence};
use mtplx_model::chat::{ChatMessage, ChatRequest};
use mtplx_model::sampling::argmax;
use mtplx_model::{prefill, Bundle, Want, WeightFormat};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    kind: String,
    messages: Option<Vec<ChatMessage>>,
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    first_step: FirstStep,
}

#[derive(Deserialize)]
struct FirstStep {
    argmax: u32,
    top20: Vec<(u32, f32)>,
    probe_logits: Vec<f32>,
}

#[derive(Deserialize)]
struct GoldenFile {
    probe_ids: Vec<u32>,
    #[serde(flatten)]
    golden: Golden,
}

/// Max |logit − reference|. The reference's own f32 rerun differs from float64 by up to
/// 6.7e-5; our f32 GEMM sums in another order.
const LOGIT_TOLERANCE: f32 = 2e-3;

pub fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

fn load(format: WeightFormat) -> Bundle {
    let path = model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `cargo xtask fetch-model`",
        path.display()
    );
    Bundle::load(&path, format).unwrap()
}

/// The greedy continuation from a prefilled `cache` whose last logits are `logits`: its
/// argmax, then one decode step at a time until `n` tokens or a stop token.
fn greedy(b: &Bundle, cache: &mut Sequence, logits: &[f32], n: usize) -> Vec<u32> {
    let mut next = argmax(logits);
    let mut got = vec![next];
    while got.len() < n && !b.tokenizer.is_stop(next) {
        let out = b.model.forward(&[next], cache, Want::Last).unwrap();
        next = argmax(out.last_logits());
        got.push(next);
    }
    got
}

fn golden() -> GoldenFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn f32_path_matches_the_reference_token_for_token() {
    let b = load(WeightFormat::F32);
    let g = golden();
    assert!(g.golden.cases.len() >= 6);
    let mut worst = 0f32;
    for (i, case) in g.golden.cases.iter().enumerate() {
        if case.kind == "chat" {
            let req = ChatRequest {
                messages: case.messages.clone().unwrap(),
                add_generation_prompt: true,
                ..Default::default()
            };
            let rendered = b.template.as_ref().unwrap().render(&req).unwrap();
            assert_eq!(rendered, case.prompt, "{}: template", case.name);
        }
        let ids = b.tokenizer.encode(&case.prompt, Special::Parse).unwrap();
        assert_eq!(ids, case.prompt_ids, "{}: tokens", case.name);

        // Vary the prefill chunk between cases: chunking must not change the tokens.
        let chunk = [512, 7, 64, 1][i % 4];
        let chunk = if ids.len() > 512 { 512 } else { chunk };
        let mut cache = b.model.new_sequence(&CacheFactory::contiguous());
        let out = prefill(&*b.model, &ids, &mut cache, chunk).unwrap();
        let logits = out.last_logits();
        assert_eq!(argmax(logits), case.first_step.argmax, "{}", case.name);
        let probes = g.probe_ids.iter().zip(&case.first_step.probe_logits);
        for (&id, &want) in case
            .first_step
            .top20
            .iter()
            .map(|(i, v)| (i, v))
            .chain(probes)
        {
            let err = (logits[id as usize] - want).abs();
            worst = worst.max(err);
            assert!(
                err < LOGIT_TOLERANCE,
                "{}: logit {id}: {} vs {want}",
                case.name,
                logits[id as usize]
            );
        }
        // Greedy continuation from that state, one decode step at a time.
        let got = greedy(&b, &mut cache, logits, case.generated_ids.len());
        assert_eq!(
            got, case.generated_ids,
            "{}: greedy continuation (chunk {chunk})",
            case.name
        );
    }
    eprintln!("worst first-step logit error against the float64 reference: {worst:e}");
}

/// Max |logit(native) − logit(f32)|: the same weights (the kernels dequantize exactly as
/// candle does) and `f32` activations, summed in another order (measured: 7.8e-5).
const NATIVE_TOLERANCE: f32 = 1e-3;

/// The default path: weights kept in the file's blocks and run by mtplx's kernels. Its
/// first-step logits stay within [`NATIVE_TOLERANCE`] of the f32 path's, and its greedy
/// continuations are the reference's, token for token, on every golden prompt.
#[test]
fn native_path_matches_the_f32_path_and_the_reference_tokens() {
    let f = load(WeightFormat::F32);
    let b = load(WeightFormat::Native);
    assert_eq!(WeightFormat::default(), WeightFormat::Native);
    assert!(b.model.is_batch_invariant() && !f.model.is_batch_invariant());
    assert!(b.model.weight_bytes() < f.model.weight_bytes() / 4);
    let g = golden();
    let mut worst = 0f32;
    for case in &g.golden.cases {
        let mut cache = b.model.new_sequence(&CacheFactory::contiguous());
        let out = prefill(&*b.model, &case.prompt_ids, &mut cache, 512).unwrap();
        let logits = out.last_logits();
        if case.prompt_ids.len() < 512 {
            let mut fc = f.model.new_sequence(&CacheFactory::contiguous());
            let want = prefill(&*f.model, &case.prompt_ids, &mut fc, 512).unwrap();
            for (a, w) in logits.iter().zip(want.last_logits()) {
                worst = worst.max((a - w).abs());
            }
        }
        let got = greedy(&b, &mut cache, logits, case.generated_ids.len());
        assert_eq!(
            got, case.generated_ids,
            "{}: greedy continuation",
            case.name
        );
    }
    eprintln!("native path: worst first-step logit difference from f32 {worst:e}");
    assert!(worst < NATIVE_TOLERANCE, "native logits differ by {worst}");
}

/// Max |logit(f16 K/V) − logit(f32 K/V)| on the native path: each K and V value rounded once
/// to 11 significant bits (measured: 1.7e-2; bf16's 8 bits: 0.42).
const HALF_KV_TOLERANCE: f32 = 0.1;

/// The server's default K/V storage, f16, and bf16: the reference's greedy tokens on every
/// golden prompt (the goldens are unchanged); f16's first-step logits close to the f32-K/V
/// path's.
#[test]
fn sixteen_bit_kv_keeps_the_reference_tokens() {
    let b = load(WeightFormat::Native);
    let g = golden();
    for (dtype, tolerance) in [(KvDtype::F16, HALF_KV_TOLERANCE), (KvDtype::Bf16, 1.0)] {
        let factory = CacheFactory::contiguous().with_dtype(dtype).unwrap();
        let mut worst = 0f32;
        for case in &g.golden.cases {
            let mut cache = b.model.new_sequence(&factory);
            let out = prefill(&*b.model, &case.prompt_ids, &mut cache, 512).unwrap();
            let logits = out.last_logits().to_vec();
            if case.prompt_ids.len() < 512 {
                let mut wide = b.model.new_sequence(&CacheFactory::contiguous());
                let want = prefill(&*b.model, &case.prompt_ids, &mut wide, 512).unwrap();
                for (a, w) in logits.iter().zip(want.last_logits()) {
                    worst = worst.max((a - w).abs());
                }
            }
            let got = greedy(&b, &mut cache, &logits, case.generated_ids.len());
            assert_eq!(got, case.generated_ids, "{dtype}: {}", case.name);
        }
        eprintln!("{dtype} K/V: worst first-step logit difference from f32 K/V {worst:e}");
        assert!(worst < tolerance, "{dtype}: logits moved by {worst}");
    }
}

/// K/V quantized in groups of 32 (`--kv-quant q8|q4`) is lossy, so it is held to what was
/// measured (printed; 2026-12-04): q8's first-step logits within 0.48 of the f32-K/V path's,
/// the reference's first token on all 10 golden prompts and its whole greedy continuation
/// on 7; q4 (4 bits a value, for this model's 64-value heads) moves logits by up to 6.3 and
/// keeps the first token on 8 and the whole continuation on 2.
#[test]
fn quantized_kv_stays_close_to_the_reference() {
    let b = load(WeightFormat::Native);
    let g = golden();
    // (type, logit bound, first tokens kept, whole continuations kept) of the 10 prompts.
    for (dtype, bound, firsts, wholes) in [(KvDtype::Q8, 1.0, 10, 6), (KvDtype::Q4, 10.0, 7, 1)] {
        let factory = CacheFactory::contiguous().with_dtype(dtype).unwrap();
        let (mut worst, mut whole, mut first) = (0f32, 0, 0);
        for case in &g.golden.cases {
            let mut cache = b.model.new_sequence(&factory);
            let out = prefill(&*b.model, &case.prompt_ids, &mut cache, 512).unwrap();
            let logits = out.last_logits().to_vec();
            let mut wide = b.model.new_sequence(&CacheFactory::contiguous());
            let want = prefill(&*b.model, &case.prompt_ids, &mut wide, 512).unwrap();
            for (a, w) in logits.iter().zip(want.last_logits()) {
                worst = worst.max((a - w).abs());
            }
            let got = greedy(&b, &mut cache, &logits, case.generated_ids.len());
            first += usize::from(got[0] == case.generated_ids[0]);
            whole += usize::from(got == case.generated_ids);
        }
        let n = g.golden.cases.len();
        eprintln!(
            "{dtype} K/V: worst first-step logit difference from f32 K/V {worst:e}; first \
             token {first}/{n}, whole continuation {whole}/{n}"
        );
        assert_eq!(n, 10, "the golden prompts");
        assert!(worst < bound, "{dtype}: logits moved by {worst}");
        assert!(
            first >= firsts && whole >= wholes,
            "{dtype}: {first}, {whole} kept"
        );
    }
}

/// candle's quantized matmul rounds activations to 8 bits, which moves this model's logits
/// by up to ~1.4 (llama.cpp's Q4_1 path does the same and flips the France answer, whose
/// top-2 margin is 0.08). So the quantized path is held to a looser bound: close logits,
/// and its first token among the reference's top five.
#[test]
fn quantized_path_stays_close_to_the_reference() {
    let b = load(WeightFormat::Quantized);
    let g = golden();
    let mut worst = 0f32;
    for case in g.golden.cases.iter().filter(|c| c.prompt_ids.len() < 512) {
        let mut cache = b.model.new_sequence(&CacheFactory::contiguous());
        let out = b
            .model
            .forward(&case.prompt_ids, &mut cache, Want::Last)
            .unwrap();
        let logits = out.last_logits();
        let top5: Vec<u32> = case.first_step.top20.iter().take(5).map(|p| p.0).collect();
        assert!(
            top5.contains(&argmax(logits)),
            "{}: {} not in {top5:?}",
            case.name,
            argmax(logits)
        );
        for &(id, want) in &case.first_step.top20 {
            worst = worst.max((logits[id as usize] - want).abs());
        }
    }
    eprintln!("quantized path: worst top-20 logit error {worst}");
    assert!(worst < 2.5, "quantized logits drift by {worst}");
}

/// `--weights native-q8` on the default file: its Q4_1 products round the activations to 8
/// bits per block as llama.cpp's do (`Activations::Q8`), which moves logits as candle's
/// quantized path does (above), so it is opt-in for this file ([`WeightFormat::for_gguf`]
/// keeps Q4_1 files on `f32` activations and the reference's tokens). Held to what was
/// measured (printed; 2026-12-08): first-step logits within 1.2 of the reference's top 20
/// (1.9 from the `f32` activations' logits), its first token among the reference's top five
/// on every prompt, and the reference's whole greedy continuation on 5 of the 10.
#[test]
fn eight_bit_activations_stay_close_to_the_reference() {
    assert_eq!(
        WeightFormat::for_gguf(Some(3)),
        WeightFormat::Native,
        "Q4_1 keeps f32"
    );
    let b = load(WeightFormat::NativeQ8);
    let native = load(WeightFormat::Native);
    // The products run on 8-bit activations: other logits than the default path's.
    assert!(b.model.is_batch_invariant());
    let g = golden();
    let (mut worst, mut whole, mut moved) = (0f32, 0, 0f32);
    for case in &g.golden.cases {
        let mut cache = b.model.new_sequence(&CacheFactory::contiguous());
        let out = prefill(&*b.model, &case.prompt_ids, &mut cache, 512).unwrap();
        let logits = out.last_logits().to_vec();
        let top5: Vec<u32> = case.first_step.top20.iter().take(5).map(|p| p.0).collect();
        assert!(top5.contains(&argmax(&logits)), "{}: {top5:?}", case.name);
        for &(id, want) in &case.first_step.top20 {
            worst = worst.max((logits[id as usize] - want).abs());
        }
        let mut nc = native.model.new_sequence(&CacheFactory::contiguous());
        let n = prefill(&*native.model, &case.prompt_ids, &mut nc, 512).unwrap();
        for (a, w) in logits.iter().zip(n.last_logits()) {
            moved = moved.max((a - w).abs());
        }
        let got = greedy(&b, &mut cache, &logits, case.generated_ids.len());
        whole += usize::from(got == case.generated_ids);
    }
    let n = g.golden.cases.len();
    eprintln!(
        "native-q8 on Q4_1: worst top-20 logit error {worst}, largest move from the f32 \
         activations' logits {moved}, whole continuation {whole}/{n}"
    );
    assert!(moved > 0.0, "the 8-bit products ran (other logits)");
    assert!(worst < 1.5, "logits drift by {worst}");
    assert!(whole >= 5, "{whole} whole continuations kept");
}

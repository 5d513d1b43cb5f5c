//! The CUDA backend against the float64 reference and against itself.
//!
//! These tests need an NVIDIA GPU. Without one (CI) each test says it was skipped and
//! passes, unless `MTPLX_CUDA_TESTS=1` is set, which makes a missing device a failure: the
//! device runs set it.
#![cfg(feature = "cuda")]

mod tiny_fixture;

use std::path::PathBuf;
use std::sync::OnceLock;

use mtplx_kv::{CacheFactory, KvDtype, LayoutKind, Sequence};
use mtplx_model::cuda::{CudaDevice, CudaModel};
use mtplx_model::sampling::argmax;
use mtplx_model::{prefill, Bundle, LanguageModel, ModelError, Want, WeightFormat};
use serde::Deserialize;

#[derive(Deserialize)]
struct GoldenFile {
    probe_ids: Vec<u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
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

/// Max |logit − float64 reference|, as for the CPU's f32 path.
const LOGIT_TOLERANCE: f32 = 2e-3;
/// Max |logit(CUDA) − logit(CPU native)|: the same f32 weights and activations, summed in
/// another order.
const CPU_TOLERANCE: f32 = 1e-3;
/// The same two tolerances with K/V stored in f16 on both sides: each value rounded once to
/// 11 significant bits, from f32 values that differ in their last bits (as the CPU's f16
/// goldens allow against the reference).
const HALF_KV_TOLERANCE: f32 = 0.1;

/// The device's cache factories: K/V in `f32`, then in `f16` (the server's default), with
/// the tolerances of each against the reference and the CPU.
fn factories(gpu: &CudaModel) -> [(KvDtype, CacheFactory, f32, f32); 2] {
    let f = |dtype| gpu.cache_factory().with_dtype(dtype).unwrap();
    [
        (
            KvDtype::F32,
            f(KvDtype::F32),
            LOGIT_TOLERANCE,
            CPU_TOLERANCE,
        ),
        (
            KvDtype::F16,
            f(KvDtype::F16),
            HALF_KV_TOLERANCE,
            HALF_KV_TOLERANCE,
        ),
    ]
}

fn golden() -> GoldenFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

/// The CPU bundle and its model on the GPU, or `None` (skipped) without a device. The
/// tests share one model, whose stream one thread at a time may use: each test holds
/// [`one_at_a_time`] while it runs.
fn models() -> Option<&'static (Bundle, CudaModel)> {
    static MODELS: OnceLock<Option<(Bundle, CudaModel)>> = OnceLock::new();
    MODELS
        .get_or_init(|| {
            let dev = match CudaDevice::open(0) {
                Ok(d) => d,
                Err(e) if std::env::var_os("MTPLX_CUDA_TESTS").is_some() => {
                    panic!("MTPLX_CUDA_TESTS is set but there is no usable device: {e}")
                }
                Err(e) => {
                    eprintln!("skipped, no CUDA device: {e}");
                    return None;
                }
            };
            eprintln!("device: {dev:?}");
            let b = Bundle::load(&model_path(), WeightFormat::Native).expect("default model");
            // The weights in the file's own blocks (Q4_1, Q8_0), as the server loads them.
            let gpu = CudaModel::load(&b.path, dev).expect("upload the model");
            Some((b, gpu))
        })
        .as_ref()
}

/// The kernels compile for Hopper wherever the NVRTC library loads (no device needed: CI
/// can check them with `LD_LIBRARY_PATH` pointing at the `nvidia-cuda-nvrtc` wheel's).
#[test]
fn the_kernels_compile() {
    match mtplx_model::cuda::compile("compute_90") {
        Ok(ptx) => {
            for kernel in [
                "embed",
                "rms_norm",
                "matvec_4",
                "matvec_8",
                "qkv_post",
                "attend",
                "qkv_post_h",
                "attend_h",
                "silu_mul",
                "matvec1_4",
                "matvec1n_4",
                "matvec1s_4",
            ] {
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "{kernel} missing"
                );
            }
        }
        Err(e) if e.to_string().contains("not installed") => {
            assert!(
                std::env::var_os("MTPLX_CUDA_TESTS").is_none(),
                "MTPLX_CUDA_TESTS is set but NVRTC is missing"
            );
            eprintln!("skipped, no NVRTC: {e}");
        }
        Err(e) => panic!("{e}"),
    }
}

/// Serialises the tests that use the shared model (see [`CudaModel`]'s threading rule).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn opening_a_device_fails_cleanly_or_works() {
    // On a machine without CUDA this is an error, not a panic; with one, a device.
    match CudaDevice::open(0) {
        Ok(d) => assert!(!d.name().is_empty()),
        Err(e) => assert!(matches!(e, ModelError::Device(_)), "{e}"),
    }
}

#[test]
fn the_cuda_model_gives_the_reference_tokens_and_logits() {
    let _one = one_at_a_time();
    let Some((b, gpu)) = models() else { return };
    for (dtype, factory, ref_tolerance, cpu_tolerance) in factories(gpu) {
        reference_tokens_and_logits(b, gpu, dtype, &factory, ref_tolerance, cpu_tolerance);
    }
}

fn reference_tokens_and_logits(
    b: &Bundle,
    gpu: &CudaModel,
    dtype: KvDtype,
    factory: &CacheFactory,
    ref_tolerance: f32,
    cpu_tolerance: f32,
) {
    let g = golden();
    assert_eq!(factory.layout(), LayoutKind::Device);
    let host_factory = CacheFactory::contiguous().with_dtype(dtype).unwrap();
    let (mut worst_ref, mut worst_cpu) = (0f32, 0f32);
    let start = std::time::Instant::now();
    for (i, case) in g.cases.iter().enumerate() {
        let chunk = [512, 7, 64, 1][i % 4];
        // Progress, so that a run that stalls says where (one device run stopped at its
        // time limit inside this test; the others took about 10 s).
        eprintln!(
            "[{:.1} s] {dtype} K/V: {} ({} tokens, chunk {chunk})",
            start.elapsed().as_secs_f64(),
            case.name,
            case.prompt_ids.len()
        );
        let mut cache = gpu.new_sequence(factory);
        assert_eq!(cache.kv().dtype(), dtype);
        let out = prefill(gpu, &case.prompt_ids, &mut cache, chunk).unwrap();
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
            worst_ref = worst_ref.max(err);
            assert!(err < ref_tolerance, "{}: logit {id}: {err}", case.name);
        }
        let mut host = b.model.new_sequence(&host_factory);
        let cpu = prefill(&*b.model, &case.prompt_ids, &mut host, 512).unwrap();
        for (a, w) in logits.iter().zip(cpu.last_logits()) {
            worst_cpu = worst_cpu.max((a - w).abs());
        }
        let mut next = argmax(logits);
        let mut got = vec![next];
        while got.len() < case.generated_ids.len() && !b.tokenizer.is_stop(next) {
            let out = gpu.forward(&[next], &mut cache, Want::Last).unwrap();
            next = argmax(out.last_logits());
            got.push(next);
        }
        assert_eq!(
            got, case.generated_ids,
            "{}: greedy (chunk {chunk}, {dtype} K/V)",
            case.name
        );
    }
    eprintln!(
        "CUDA, {dtype} K/V: worst logit error {worst_ref:e} against the reference, \
         {worst_cpu:e} against the CPU"
    );
    assert!(
        worst_cpu < cpu_tolerance,
        "CUDA and CPU logits differ by {worst_cpu} ({dtype} K/V)"
    );
}

/// The f16 rows the model writes on the device are its f32 rows rounded as the CPU's f16
/// caches round (to nearest, ties to even): layer 0's K and V, whose inputs do not depend
/// on the stored type, for a whole prompt.
#[test]
fn device_f16_rows_are_the_f32_rows_rounded_as_the_cpu_rounds_them() {
    let _one = one_at_a_time();
    let Some((_, gpu)) = models() else { return };
    let [(_, wide, ..), (_, narrow, ..)] = factories(gpu);
    let prompt = golden().cases[1].prompt_ids.clone();
    let mut a = gpu.new_sequence(&wide);
    let mut h = gpu.new_sequence(&narrow);
    prefill(gpu, &prompt, &mut a, 64).unwrap();
    prefill(gpu, &prompt, &mut h, 64).unwrap();
    let n = prompt.len();
    let row = gpu.state_shape().kv.row_len();
    let (mut k, mut v) = (vec![0f32; n * row], vec![0f32; n * row]);
    a.kv().read_rows(0, 0..n, &mut k, &mut v).unwrap();
    let bytes = KvDtype::F16.bytes(n * row);
    let (mut kh, mut vh) = (vec![0u8; bytes], vec![0u8; bytes]);
    h.kv().read_raw(0, 0..n, &mut kh, &mut vh).unwrap();
    assert_eq!(kh, KvDtype::F16.encode(&k), "K");
    assert_eq!(vh, KvDtype::F16.encode(&v), "V");
    // And the snapshot the bank keeps is a host copy of the same bytes, half the size.
    let snap = h.kv().snapshot();
    assert_eq!((snap.dtype(), snap.len()), (KvDtype::F16, n));
    let (mut ks, mut vs) = (vec![0u8; bytes], vec![0u8; bytes]);
    snap.read_raw(0, 0..n, &mut ks, &mut vs).unwrap();
    assert_eq!((ks, vs), (kh, vh));
    assert_eq!(2 * snap.logical_bytes(), a.kv().snapshot().logical_bytes());
}

/// A row's logits and hidden state are the same bits in a verify block, a decode step and
/// any prefill chunk: what makes greedy speculation on the GPU equal plain decoding.
#[test]
fn a_row_is_the_same_bits_in_any_block() {
    let _one = one_at_a_time();
    let Some((_, gpu)) = models() else { return };
    for (_, factory, ..) in factories(gpu) {
        same_bits_in_any_block(gpu, &factory);
    }
}

fn same_bits_in_any_block(gpu: &CudaModel, factory: &CacheFactory) {
    let shape = gpu.state_shape();
    let prompt: Vec<u32> = golden().cases[0].prompt_ids.clone();
    let block = [28u32, 3405, 282, 4649, 314, 7042];
    let mut a = Sequence::new(factory, &shape);
    prefill(gpu, &prompt, &mut a, 512).unwrap();
    let mut b = a.fork();
    let all = gpu.forward(&block, &mut a, Want::All).unwrap();
    for (r, &t) in block.iter().enumerate() {
        let one = gpu.forward(&[t], &mut b, Want::Last).unwrap();
        assert_eq!(one.last_logits(), all.logits_row(r), "row {r}: logits");
        assert_eq!(
            one.hidden[..],
            all.hidden[r * one.hidden.len()..(r + 1) * one.hidden.len()]
        );
    }
    // Chunked prefills of the same tokens.
    let mut whole = prompt.clone();
    whole.extend_from_slice(&block);
    let mut last = None;
    for chunk in [1, 3, 8, 9, 512] {
        let mut c = Sequence::new(factory, &shape);
        let out = prefill(gpu, &whole, &mut c, chunk).unwrap();
        if let Some(prev) = &last {
            assert_eq!(out.last_logits(), prev, "chunk {chunk}");
        }
        last = Some(out.last_logits().to_vec());
    }
    assert_eq!(last.as_deref(), Some(all.last_logits()));
}

/// Device caches snapshot to the host, restore from any layout, fork and roll back, and
/// decoding from each continues with the same bits.
#[test]
fn device_caches_snapshot_restore_fork_and_truncate() {
    let _one = one_at_a_time();
    let Some((_, gpu)) = models() else { return };
    for (dtype, factory, ..) in factories(gpu) {
        snapshot_restore_fork_and_truncate(gpu, dtype, &factory);
    }
}

fn snapshot_restore_fork_and_truncate(gpu: &CudaModel, dtype: KvDtype, factory: &CacheFactory) {
    let shape = gpu.state_shape();
    let prompt = golden().cases[1].prompt_ids.clone();
    // A cache that never held a row forks too.
    assert_eq!(Sequence::new(factory, &shape).fork().len(), 0);
    let mut cache = Sequence::new(factory, &shape);
    prefill(gpu, &prompt, &mut cache, 64).unwrap();
    let n = cache.len();
    assert_eq!(n, prompt.len());
    let snap = cache.kv().snapshot();
    assert_eq!(
        (snap.layout(), snap.dtype()),
        (LayoutKind::Contiguous, dtype),
        "snapshots are host copies of the stored values"
    );
    assert_eq!(snap.len(), n);
    let row = shape.kv.row_len();
    for layer in [0, shape.kv.layers - 1] {
        let (mut k1, mut v1) = (vec![0f32; n * row], vec![0f32; n * row]);
        let (mut k2, mut v2) = (vec![0f32; n * row], vec![0f32; n * row]);
        cache.kv().read_rows(layer, 0..n, &mut k1, &mut v1).unwrap();
        snap.read_rows(layer, 0..n, &mut k2, &mut v2).unwrap();
        assert_eq!((k1, v1), (k2, v2));
    }
    let next = [42u32];
    let want = gpu.forward(&next, &mut cache.fork(), Want::Last).unwrap();
    // From the host snapshot, through a paged cache of the same type, back to the device.
    let paged = CacheFactory::paged().with_dtype(dtype).unwrap();
    let paged = paged.restore(&*snap, n).unwrap();
    let mut back = Sequence::from(factory.restore(&*paged, n).unwrap());
    assert_eq!(back.kv().layout(), LayoutKind::Device);
    let got = gpu.forward(&next, &mut back, Want::Last).unwrap();
    assert_eq!(got.last_logits(), want.last_logits(), "restored");
    // Rollback: a speculative block truncated away leaves the cache as it was.
    gpu.forward(&[7, 8, 9], &mut cache, Want::All).unwrap();
    assert_eq!(cache.rewind(n).unwrap(), n);
    let got = gpu.forward(&next, &mut cache, Want::Last).unwrap();
    assert_eq!(got.last_logits(), want.last_logits(), "after rollback");
    // A partial restore runs the dropped positions again and lands on the same bits.
    let mut short = Sequence::from(factory.restore(&*snap, n - 5).unwrap());
    let again = gpu
        .forward(&prompt[n - 5..], &mut short, Want::Last)
        .unwrap();
    let mut full = Sequence::from(factory.restore(&*snap, n).unwrap());
    let a = gpu.forward(&next, &mut short, Want::Last).unwrap();
    let b = gpu.forward(&next, &mut full, Want::Last).unwrap();
    assert_eq!(a.last_logits(), b.last_logits());
    assert_eq!(a.last_logits(), want.last_logits());
    assert_eq!(again.rows, 1);
}

#[test]
fn a_host_cache_is_refused_with_a_reason() {
    let _one = one_at_a_time();
    let Some((b, gpu)) = models() else { return };
    let mut host = b.model.new_sequence(&CacheFactory::contiguous());
    let err = gpu.forward(&[1, 2], &mut host, Want::Last).unwrap_err();
    assert!(matches!(err, ModelError::Device(_)), "{err}");
    assert_eq!(host.len(), 0);
    // So is a device cache of another geometry (the head's one layer): the kernels would
    // write through addresses it does not have.
    let head_shape = mtplx_kv::KvShape {
        layers: 1,
        ..b.model.state_shape().kv
    };
    let mut small = Sequence::from(gpu.cache_factory().new_cache(head_shape));
    let err = gpu.forward(&[1, 2], &mut small, Want::Last).unwrap_err();
    assert!(
        matches!(err, ModelError::Kv(mtplx_kv::KvError::ShapeMismatch { .. })),
        "{err}"
    );
    assert_eq!(small.len(), 0);
    // Out-of-range tokens are refused before anything runs.
    let mut cache = b.model.new_sequence(&gpu.cache_factory());
    let err = gpu
        .forward(&[u32::MAX], &mut cache, Want::Last)
        .unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    assert_eq!(cache.len(), 0);
}

#[test]
fn embed_and_head_match_the_cpu_model() {
    let _one = one_at_a_time();
    let Some((b, gpu)) = models() else { return };
    let ids = [1u32, 500, 49151];
    assert_eq!(gpu.embed(&ids).unwrap(), b.model.embed(&ids).unwrap());
    let hidden = b.model.embed(&ids).unwrap();
    let (g, c) = (gpu.head(&hidden).unwrap(), b.model.head(&hidden).unwrap());
    let worst = g
        .iter()
        .zip(&c)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < CPU_TOLERANCE, "{worst}");
}

/// The MTP head on the GPU scores what the CPU head scores (up to `f32` summation order),
/// for the prompt's rows at once, for draft steps one row at a time, and for a cache that
/// starts mid-sequence.
#[test]
fn the_gpu_mtp_head_matches_the_cpu_head() {
    use mtplx_model::cuda::CudaMtpHead;
    use mtplx_model::mtp::{MtpHead, MtpRunner, Vocab};
    let _one = one_at_a_time();
    let Some((b, gpu)) = models() else { return };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/mtp/smollm2-135m-mtp.safetensors");
    let cpu_head = MtpHead::load(&path, &*b.model, Vocab::FromFile).unwrap();
    let gpu_head = CudaMtpHead::new(&cpu_head, gpu).unwrap();
    assert_eq!(MtpRunner::kv_shape(&gpu_head), cpu_head.kv_shape());
    let prompt = golden().cases[0].prompt_ids.clone();
    let mut trunk_cache = b.model.new_sequence(&CacheFactory::contiguous());
    let rows = b
        .model
        .forward(&prompt, &mut trunk_cache, Want::Hidden)
        .unwrap();
    let h = b.model.dims().hidden_size;
    let close = |a: &[f32], b: &[f32], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 2e-3, "{what}: differ by {worst}");
    };
    let n = prompt.len() - 1;
    for start in [0, n / 2] {
        let mut cc = CacheFactory::contiguous().new_cache(cpu_head.kv_shape());
        let mut gc = gpu.cache_factory().new_cache(cpu_head.kv_shape());
        let hidden = &rows.hidden[start * h..n * h];
        let next = &prompt[start + 1..];
        let (cx, cl) = cpu_head
            .last_row(gpu, hidden, next, cc.as_mut(), start)
            .unwrap();
        let (gx, gl) = gpu_head
            .last_row(gpu, hidden, next, gc.as_mut(), start)
            .unwrap();
        close(&cx, &gx, "prompt rows: output");
        close(&cl, &gl, "prompt rows: scores");
        assert_eq!(argmax(&cl), argmax(&gl), "start {start}");
        assert_eq!(gc.len(), n - start);
        // Draft steps, each on the CPU head's own output.
        let mut x = cx;
        for (i, t) in [28u32, 3405, 282].into_iter().enumerate() {
            let (cx, cl) = cpu_head
                .last_row(gpu, &x, &[t], cc.as_mut(), n + i)
                .unwrap();
            let (gx, gl) = gpu_head
                .last_row(gpu, &x, &[t], gc.as_mut(), n + i)
                .unwrap();
            close(&cx, &gx, "draft step: output");
            close(&cl, &gl, "draft step: scores");
            x = cx;
        }
    }
}

/// The tiny Llama, Qwen2 (Q/K/V biases) and Qwen3 (per-head Q/K norms) models on the GPU
/// against the float64 reference: last-position logits, and greedy tokens in any chunking.
#[test]
fn the_tiny_families_match_the_reference_on_the_gpu() {
    let _one = one_at_a_time();
    if models().is_none() {
        return;
    }
    let dev = CudaDevice::open(0).unwrap();
    for arch in ["llama", "qwen2", "qwen3"] {
        let gpu = CudaModel::load(&tiny_fixture::fixture(arch), dev.clone()).unwrap();
        tiny_fixture::check(&gpu, &gpu.cache_factory(), arch, 1e-4);
    }
}

/// `len` tokens: the golden prompts over and over.
fn long_prompt(len: usize) -> Vec<u32> {
    let g = golden();
    let mut prompt = Vec::new();
    while prompt.len() < len {
        for c in &g.cases {
            prompt.extend_from_slice(&c.prompt_ids);
        }
    }
    prompt.truncate(len);
    prompt
}

/// A prompt past several attention parts (256 positions each) gives the CPU model's tokens
/// and logits, and a row's logits do not depend on the prefill's chunking.
#[test]
fn long_prompts_span_attention_parts_and_match_the_cpu() {
    let _one = one_at_a_time();
    let Some((b, gpu)) = models() else { return };
    let prompt = long_prompt(3000);
    let mut cpu = b.model.new_sequence(&CacheFactory::contiguous());
    let want = prefill(&*b.model, &prompt, &mut cpu, 512).unwrap();
    let factory = gpu.cache_factory();
    let mut last: Option<Vec<f32>> = None;
    for chunk in [512, 700] {
        let mut seq = gpu.new_sequence(&factory);
        let got = prefill(gpu, &prompt, &mut seq, chunk).unwrap();
        let worst = got
            .last_logits()
            .iter()
            .zip(want.last_logits())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-2,
            "chunk {chunk}: CUDA and CPU logits differ by {worst}"
        );
        assert_eq!(argmax(got.last_logits()), argmax(want.last_logits()));
        if let Some(prev) = &last {
            assert_eq!(got.last_logits(), &prev[..], "chunk {chunk}");
        }
        last = Some(got.last_logits().to_vec());
    }
}

/// Plain greedy decoding's speed on the device at an empty context and after a long prompt
/// (a measurement, not a check: run with `--ignored --nocapture`).
#[test]
#[ignore]
fn decode_speed() {
    let _one = one_at_a_time();
    let Some((_, gpu)) = models() else { return };
    let factory = gpu.cache_factory();
    for prompt in [vec![1u32], long_prompt(4000)] {
        let mut seq = gpu.new_sequence(&factory);
        let t = std::time::Instant::now();
        let out = prefill(gpu, &prompt, &mut seq, 512).unwrap();
        let prefill_s = t.elapsed().as_secs_f64();
        let mut next = argmax(out.last_logits());
        // Warm up (graph capture), then time.
        for _ in 0..8 {
            next = argmax(
                gpu.forward(&[next], &mut seq, Want::Last)
                    .unwrap()
                    .last_logits(),
            );
        }
        let steps = 256;
        let t = std::time::Instant::now();
        for _ in 0..steps {
            next = argmax(
                gpu.forward(&[next], &mut seq, Want::Last)
                    .unwrap()
                    .last_logits(),
            );
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "context {}: prefill {:.1} tok/s, decode {:.3} ms a token ({:.1} tok/s)",
            prompt.len(),
            prompt.len() as f64 / prefill_s,
            1e3 * s / steps as f64,
            steps as f64 / s
        );
    }
}

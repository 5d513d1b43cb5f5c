//! A speed diagnostic, not a test of results (`#[ignore]`; run on a device with
//! `--ignored --nocapture`): the time a decode step's kernels take one by one, at a
//! Llama-3-8B's sizes, replayed from captured graphs (so no launch cost from the host), and
//! the bytes each reads per second. Weights and caches are rotated over copies larger than
//! the L2 cache, so every replay reads from device memory as a decode step does.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use mtplx_kv::{KvCache, KvDtype, KvShape};

use super::cache::CudaKvCache;
use super::device::attention::AttendIn;
use super::device::{AttendParts, CudaDevice};
use super::tests::{device, matrix, random_blocks, Rng};
use crate::kernels::{Activations, QuantFormat};

/// Bytes a kernel's inputs span across its rotated copies: well past a 50 MB L2.
const ROTATE_BYTES: usize = 200 << 20;

/// A count from the environment, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seconds one launch of `launch` takes, from graphs of `per_graph` launches (launch `i`
/// gets `i`), replayed 20 times after a warm-up. Under a profiler, which replays each
/// kernel itself, `MTPLX_SPEED_REPLAYS=0 MTPLX_SPEED_PER=1` launches each kernel once.
fn time_launches(dev: &CudaDevice, per_graph: usize, launch: &mut dyn FnMut(usize)) -> f64 {
    let replays = env_count("MTPLX_SPEED_REPLAYS", 20);
    let per_graph = per_graph
        .min(env_count("MTPLX_SPEED_PER", per_graph))
        .max(1);
    let graph = dev
        .capture(|| {
            (0..per_graph).for_each(&mut *launch);
            Ok(())
        })
        .unwrap();
    dev.replay(&graph).unwrap();
    dev.sync().unwrap();
    let t = Instant::now();
    for _ in 0..replays {
        dev.replay(&graph).unwrap();
    }
    dev.sync().unwrap();
    t.elapsed().as_secs_f64() / (per_graph * replays.max(1)) as f64
}

/// An `f16` cache of `layers` layers holding `len` random rows of `heads` (KV heads, head
/// size), every layer the same rows, and its K and V addresses per layer on the device.
fn f16_cache(
    dev: &Arc<CudaDevice>,
    rng: &mut Rng,
    layers: usize,
    len: usize,
    (kvh, hd): (usize, usize),
) -> (CudaKvCache, CudaSlice<u64>) {
    let shape = KvShape {
        layers,
        kv_heads: kvh,
        head_dim: hd,
    };
    let mut cache = CudaKvCache::new(dev.clone(), shape, KvDtype::F16);
    let row: Vec<f32> = (0..len * kvh * hd).map(|_| rng.unit()).collect();
    for l in 0..layers {
        cache.append(l, &row, &row).unwrap();
    }
    let kv = dev.upload(&cache.addresses()).unwrap();
    (cache, kv)
}

fn line(what: &str, secs: f64, bytes: usize) {
    println!(
        "{what:<44} {:>8.2} us {:>8.1} MB {:>7.0} GB/s",
        secs * 1e6,
        bytes as f64 / 1e6,
        bytes as f64 / secs / 1e9
    );
}

#[test]
#[ignore = "a speed diagnostic: prints each decode kernel's time and bandwidth"]
fn decode_kernels_at_llama3_8b_sizes() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(11);
    println!("device: {}", dev.name());
    // (what, format, outputs, inputs): a Q4_K_M file's decode products.
    let products = [
        ("qkv Q4_K 6144x4096", QuantFormat::Q4K, 6144, 4096),
        ("o Q4_K 4096x4096", QuantFormat::Q4K, 4096, 4096),
        ("gate_up Q4_K 28672x4096", QuantFormat::Q4K, 28672, 4096),
        ("down Q6_K 4096x14336", QuantFormat::Q6K, 4096, 14336),
        ("down Q4_K 4096x14336", QuantFormat::Q4K, 4096, 14336),
        ("head Q6_K 128256x4096", QuantFormat::Q6K, 128_256, 4096),
    ];
    // The rounding buffer, grown outside the graphs' captures (a capture can't allocate):
    // the widest row a product below rounds.
    dev.reserve_row_rounding(14_336).unwrap();
    for (what, format, rows, cols) in products {
        let bytes = random_blocks(format, rows, cols, &mut rng);
        let copies = ROTATE_BYTES.div_ceil(bytes.len()).max(2);
        let ms: Vec<_> = (0..copies)
            .map(|_| {
                let mut m = matrix(&dev, format, &bytes, rows, cols);
                m.activations = Activations::Q8;
                m
            })
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let x = dev.upload(&x).unwrap();
        let mut y = dev.zeros::<f32>(rows).unwrap();
        let per = copies.max(8);
        let secs = time_launches(&dev, per, &mut |i| {
            dev.matvec(&ms[i % copies], &x, &mut y, 1, false).unwrap()
        });
        line(what, secs, ms[0].bytes());
        // The product alone, x's row rounded by the kernel before it (a decode step's
        // qkv, gate_up and down).
        if dev.rounds_row_for(&ms[0]) {
            let rq = dev
                .zeros::<u8>(CudaDevice::rounded_row_bytes(cols))
                .unwrap();
            let secs = time_launches(&dev, per, &mut |i| {
                dev.matvec_from(&ms[i % copies], &x, Some(&rq), &mut y, 1, false)
                    .unwrap()
            });
            line(&format!("{what}, x rounded before"), secs, ms[0].bytes());
        }
    }
    // The rounding of x that a decode step's 8-bit products read (included above).
    for cols in [4096usize, 14_336] {
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let x = dev.upload(&x).unwrap();
        if dev.round_decode_row(&x, cols).unwrap() {
            let secs = time_launches(&dev, 64, &mut |_| {
                dev.round_decode_row(&x, cols).unwrap();
            });
            line(
                &format!("q8_round_rows 1x{cols} (in the above)"),
                secs,
                cols * 4,
            );
        }
    }
    // Attention of one row over f16 caches of a layer's 8 KV heads of 128 values, 32 query
    // heads, parts launched for a 34,816-position window (as the server's 8B runs do) and
    // for the context's own length.
    let (qh, kvh, hd) = (32usize, 8usize, 128usize);
    for len in [512usize, 4096, 8192, 32_768] {
        let layer_bytes = len * kvh * hd * 2 * 2;
        let layers = ROTATE_BYTES.div_ceil(layer_bytes).clamp(2, 64);
        let (_cache, kv) = f16_cache(&dev, &mut rng, layers, len, (kvh, hd));
        let at = (len - 1) as u32;
        let meta = dev.upload(&[at, at]).unwrap();
        let q: Vec<f32> = (0..qh * hd).map(|_| rng.unit()).collect();
        let q = dev.upload(&q).unwrap();
        let mut out = dev.zeros::<f32>(qh * hd).unwrap();
        for window in [34_816usize, len] {
            let mut parts = AttendParts::new(&dev, 1, (qh, kvh, hd), window).unwrap();
            let secs = time_launches(&dev, layers.max(8), &mut |i| {
                let a = AttendIn {
                    q: &q,
                    kv: &kv,
                    kv_dtype: KvDtype::F16,
                    layer: i % layers,
                    heads: (qh, kvh, hd),
                    n: 1,
                    meta: &meta,
                    scale: 0.088,
                    max_len: window,
                };
                dev.attend(&a, &mut parts, &mut out).unwrap()
            });
            line(
                &format!("attend_h 1 row, {len} keys, window {window}"),
                secs,
                layer_bytes,
            );
        }
    }
    // The small kernels of a step: their time is mostly a launch's fixed cost.
    let h = 4096;
    let x: CudaSlice<f32> = dev.upload(&vec![0.5f32; h]).unwrap();
    let w: CudaSlice<f32> = dev.upload(&vec![1.0f32; h]).unwrap();
    let mut o = dev.zeros::<f32>(h).unwrap();
    let secs = time_launches(&dev, 64, &mut |_| {
        dev.rms_norm(&x, &w, &mut o, 1, h, 1e-5).unwrap()
    });
    line("rms_norm 1x4096", secs, h * 8);
    let mut rq = dev
        .zeros::<u8>(CudaDevice::rounded_row_bytes(14_336))
        .unwrap();
    if dev.has_rounding_writers() {
        let secs = time_launches(&dev, 64, &mut |_| {
            dev.rms_norm_rounding(&x, &w, &mut o, 1, h, 1e-5, Some(&mut rq))
                .unwrap()
        });
        line("rms_norm_q8 1x4096 (+ its rounding)", secs, h * 8);
    }
    let gu: CudaSlice<f32> = dev.upload(&vec![0.5f32; 2 * 14_336]).unwrap();
    let mut act = dev.zeros::<f32>(14_336).unwrap();
    let secs = time_launches(&dev, 64, &mut |_| {
        dev.silu_mul(&gu, &mut act, 1, 14_336).unwrap()
    });
    line("silu_mul 1x14336", secs, 14_336 * 12);
    if dev.has_rounding_writers() {
        let secs = time_launches(&dev, 64, &mut |_| {
            dev.silu_mul_rounding(&gu, &mut act, 1, 14_336, Some(&mut rq))
                .unwrap()
        });
        line("silu_mul_q8 1x14336 (+ its rounding)", secs, 14_336 * 12);
    }
}

/// A speed diagnostic: a prefill chunk's attention against a long cache, one layer of a
/// Llama-3-8B's shape (32 query heads, 8 KV heads of 128 values, `f16`), the chunk's own
/// rows the cache's last: the time of one call (its launches of up to `ATTEND_ROWS` rows,
/// every part and merge) and the rate of useful work it reaches (q · k and p · v for each
/// key a row sees: 4 · head size flops a key and query head). 165 rows is a returning
/// turn's new tokens, 512 a prefill chunk. Under a profiler, which replays each kernel
/// itself: `MTPLX_SPEED_REPLAYS=0 MTPLX_SPEED_PER=1`.
#[test]
#[ignore = "a speed diagnostic: prints a prefill chunk's attention time at long contexts"]
fn prefill_attention_at_long_contexts() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(13);
    println!("device: {}", dev.name());
    let (qh, kvh, hd) = (32usize, 8usize, 128usize);
    for len in [4096usize, 32_768] {
        let (_cache, kv) = f16_cache(&dev, &mut rng, 1, len, (kvh, hd));
        for n in [165usize, 512] {
            let cached = len - n;
            let meta = dev.upload(&[cached as u32, cached as u32]).unwrap();
            let q: Vec<f32> = (0..n * qh * hd).map(|_| rng.unit()).collect();
            let q = dev.upload(&q).unwrap();
            let mut out = dev.zeros::<f32>(n * qh * hd).unwrap();
            let mut parts = AttendParts::new(&dev, n, (qh, kvh, hd), len).unwrap();
            let path = dev.attend_path(KvDtype::F16, (qh, kvh, hd), n).unwrap();
            let secs = time_launches(&dev, 2, &mut |_| {
                let a = AttendIn {
                    q: &q,
                    kv: &kv,
                    kv_dtype: KvDtype::F16,
                    layer: 0,
                    heads: (qh, kvh, hd),
                    n,
                    meta: &meta,
                    scale: 0.088,
                    max_len: len,
                };
                dev.attend(&a, &mut parts, &mut out).unwrap()
            });
            let keys: usize = (0..n).map(|r| cached + r + 1).sum();
            let flops = (keys * qh * hd * 4) as f64;
            println!(
                "attend {n} rows after {cached} cached ({path:?}): {:8.3} ms a layer, \
                 {:6.1} TFLOPS of useful work",
                secs * 1e3,
                flops / secs / 1e12
            );
        }
    }
}

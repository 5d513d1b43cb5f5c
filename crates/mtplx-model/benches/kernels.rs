//! The matrix kernels on the default model's shapes (SmolLM2-135M: hidden 576, K/V 192, FFN
//! 1536, vocabulary 49152), side by side with candle's quantized matmul (`QMatMul`, Q8
//! activations) and candle's dense `f32` GEMM, in the same run:
//! - `bandwidth/*`: plain reads of a buffer the size of the model's weights (96 MB) and of
//!   one past the caches (512 MB): the ceiling for decode;
//! - `matvec/*` (n = 1, throughput in weight bytes: GB/s) and `prefill/*` (n = 512,
//!   throughput in flops: "Gelem/s" = GFLOP/s) per shape and format, `mtplx_q8` the same
//!   weights with 8-bit activations (Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q6_K);
//! - `verify/*`: blocks of 1-8 rows (speculative verification) on one matrix;
//! - `step/*`: one decode step's products (30 layers of 7 projections + the tied Q8_0 head)
//!   over distinct weights, as a decode step streams them.
//!
//! `cargo bench -p mtplx-model --bench kernels [-- filter]`; set `MTPLX_THREADS` for the pool.

use std::hint::black_box;
use std::time::Duration;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mtplx_model::kernels::{Activations, Pool, QuantFormat, QuantMatrix};

#[path = "common/seeded.rs"]
mod seeded;
use seeded::{activations, weights};

const SHAPES: [(&str, usize, usize); 5] = [
    ("576x576", 576, 576),
    ("576to192", 192, 576),
    ("576to1536", 1536, 576),
    ("1536to576", 576, 1536),
    ("576to49152", 49152, 576),
];

struct Contenders {
    ours: QuantMatrix,
    /// The same weights with 8-bit activations, where the format has such kernels.
    ours_q8: Option<QuantMatrix>,
    candle: QMatMul,
    bytes: usize,
}

fn contenders(w: &Tensor, format: QuantFormat) -> Contenders {
    let q = QTensor::quantize(w, mtplx_model::kernels::ggml_dtype(format)).unwrap();
    let ours = mtplx_model::kernels::from_qtensor(&q).unwrap();
    let ours_q8 = mtplx_model::kernels::from_qtensor_with(&q, Activations::Q8)
        .ok()
        .filter(|m| m.activations() == Activations::Q8);
    let bytes = q.storage_size_in_bytes();
    Contenders {
        ours,
        ours_q8,
        candle: QMatMul::from_qtensor(q).unwrap(),
        bytes,
    }
}

/// XOR of every 64-byte line of `b` (a read that the core can keep up with).
fn read(b: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { read_avx512(b) };
    }
    b.chunks_exact(8).fold(0, |a, c| a ^ c[0] ^ c[7])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(b: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    for c in b.chunks_exact(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm512_xor_si512(*a, _mm512_loadu_si512(c.as_ptr().add(8 * k).cast()));
        }
    }
    let a = _mm512_xor_si512(
        _mm512_xor_si512(acc[0], acc[1]),
        _mm512_xor_si512(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi64(a) as u64
}

/// Plain reads of a buffer the size of the default model's weights (96 MB, as a decode
/// step streams them) and of a buffer far larger than the caches (512 MB).
fn bandwidth(c: &mut Criterion) {
    let pool = Pool::global();
    let mut g = c.benchmark_group("bandwidth");
    g.sample_size(10).warm_up_time(Duration::from_millis(300));
    for mb in [96usize, 512] {
        let buf: Vec<u64> = (0..mb << 17).map(|i| i as u64).collect();
        g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
        let mut counts = vec![1, pool.threads()];
        counts.dedup();
        for threads in counts {
            let id = BenchmarkId::new(format!("read{mb}MB"), format!("{threads}threads"));
            g.bench_function(id, |b| {
                b.iter(|| {
                    let part = buf.len() / threads;
                    pool.run(threads, &|p| {
                        black_box(read(&buf[p * part..(p + 1) * part]));
                    })
                })
            });
        }
    }
    g.finish();
}

fn per_shape(c: &mut Criterion) {
    for (name, rows, cols) in SHAPES {
        let w = weights(rows, cols, rows as u32);
        let wt = w.t().unwrap();
        let formats: &[QuantFormat] = if rows == 49152 {
            &[QuantFormat::Q8_0, QuantFormat::Q4_1]
        } else {
            &[
                QuantFormat::Q4_1,
                QuantFormat::Q8_0,
                QuantFormat::Q4_0,
                QuantFormat::Q5_0,
                QuantFormat::Q4K,
                QuantFormat::Q6K,
            ]
        };
        // Q4_K and Q6_K need whole 256-weight super-blocks per row.
        let formats: Vec<QuantFormat> = formats
            .iter()
            .copied()
            .filter(|f| cols % f.block_len() == 0)
            .collect();
        for (kind, n) in [("matvec", 1usize), ("prefill", 512)] {
            if rows == 49152 && n > 1 {
                continue; // the head runs on the last row only
            }
            let x = activations(n, cols);
            let xt = Tensor::from_slice(&x, (n, cols), &Device::Cpu).unwrap();
            let mut y = vec![0f32; n * rows];
            let mut g = c.benchmark_group(format!("{kind}/{name}"));
            g.sample_size(10).warm_up_time(Duration::from_millis(200));
            g.measurement_time(Duration::from_secs(2));
            let flops = Throughput::Elements((2 * rows * cols * n) as u64);
            for &format in &formats {
                let k = contenders(&w, format);
                let f = format!("{format:?}");
                g.throughput(if n == 1 {
                    Throughput::Bytes(k.bytes as u64)
                } else {
                    flops.clone()
                });
                g.bench_function(BenchmarkId::new("mtplx", &f), |b| {
                    b.iter(|| k.ours.matmul(black_box(&x), n, &mut y))
                });
                if let Some(q8) = &k.ours_q8 {
                    g.bench_function(BenchmarkId::new("mtplx_q8", &f), |b| {
                        b.iter(|| q8.matmul(black_box(&x), n, &mut y))
                    });
                }
                g.bench_function(BenchmarkId::new("candle_qmatmul", &f), |b| {
                    b.iter(|| k.candle.forward(black_box(&xt)).unwrap())
                });
            }
            let dense =
                QuantMatrix::from_f32(&w.flatten_all().unwrap().to_vec1().unwrap(), rows, cols)
                    .unwrap();
            g.throughput(if n == 1 {
                Throughput::Bytes((rows * cols * 4) as u64)
            } else {
                flops
            });
            g.bench_function(BenchmarkId::new("mtplx", "F32"), |b| {
                b.iter(|| dense.matmul(black_box(&x), n, &mut y))
            });
            g.bench_function(BenchmarkId::new("candle_gemm", "F32"), |b| {
                b.iter(|| xt.matmul(&wt).unwrap())
            });
            g.finish();
        }
    }
}

/// A speculative verify block of `n` rows reads the weights once: its cost next to a single
/// decode row's (576→1536 Q4_1, throughput in rows).
fn verify(c: &mut Criterion) {
    let k = contenders(&weights(1536, 576, 5), QuantFormat::Q4_1);
    let mut g = c.benchmark_group("verify/576to1536/Q4_1");
    g.sample_size(20).warm_up_time(Duration::from_millis(200));
    for n in [1usize, 2, 3, 5, 8] {
        let x = activations(n, 576);
        let mut y = vec![0f32; n * 1536];
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("mtplx", n), |b| {
            b.iter(|| k.ours.matmul(black_box(&x), n, &mut y))
        });
    }
    g.finish();
}

/// One decode step's products: 30 layers × (q, k, v, o, gate, up, down) + the head.
fn step(c: &mut Criterion) {
    let layer: [(usize, usize); 7] = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut ours = Vec::new();
    let mut candle = Vec::new();
    let mut bytes = 0;
    for l in 0..30u32 {
        for (i, &(rows, cols)) in layer.iter().enumerate() {
            let k = contenders(&weights(rows, cols, l * 8 + i as u32), QuantFormat::Q4_1);
            bytes += k.bytes;
            ours.push(k.ours);
            candle.push(k.candle);
        }
    }
    let head = contenders(&weights(49152, 576, 999), QuantFormat::Q8_0);
    bytes += head.bytes;
    ours.push(head.ours);
    candle.push(head.candle);

    let mut g = c.benchmark_group("step");
    g.sample_size(20).warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Bytes(bytes as u64));
    let x = activations(1, 1536);
    let mut y = vec![0f32; 49152];
    g.bench_function("mtplx/Q4_1+Q8_0", |b| {
        b.iter(|| {
            for m in &ours {
                m.matmul(black_box(&x[..m.cols()]), 1, &mut y[..m.rows()]);
            }
        })
    });
    let x576 = Tensor::from_slice(&x[..576], (1, 576), &Device::Cpu).unwrap();
    let x1536 = Tensor::from_slice(&x[..], (1, 1536), &Device::Cpu).unwrap();
    g.bench_function("candle_qmatmul/Q4_1+Q8_0", |b| {
        b.iter(|| {
            for (i, m) in candle.iter().enumerate() {
                let x = if i % 7 == 6 && i < 210 { &x1536 } else { &x576 };
                black_box(m.forward(x).unwrap());
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bandwidth, per_shape, verify, step);
criterion_main!(benches);

//! A diagnostic, not a result: how fast a decode step's product (one row of x, 8-bit
//! activations where the format has them) streams each weight format from memory, on
//! Qwen2.5-0.5B's shapes (and SmolLM2-135M's Q4_1, with `f32` and with 8-bit activations),
//! against a plain read of as many bytes, through the same pool (`MTPLX_THREADS`). Each
//! format's matrices are rotated over copies past the caches.
//!
//!     cargo run --release -p mtplx-model --example stream_formats

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::QTensor;
use mtplx_model::kernels::{Activations, Pool, QuantFormat, QuantMatrix};

#[path = "../benches/common/seeded.rs"]
mod seeded;
use seeded::{activations, weights};

fn main() {
    let pool = Pool::global();
    // (what, format, rows, cols, copies, activations): copies enough to pass the caches.
    let (q8, f32) = (Activations::Q8, Activations::F32);
    let cases = [
        (
            "head 151936x896",
            QuantFormat::Q8_0,
            151_936usize,
            896usize,
            1usize,
            q8,
        ),
        ("one 116736x896", QuantFormat::Q5_0, 116_736, 896, 1, q8),
        ("one 116736x896", QuantFormat::Q8_0, 116_736, 896, 1, q8),
        ("gate/up 4864x896", QuantFormat::Q8_0, 4864, 896, 24, q8),
        ("gate/up 4864x896", QuantFormat::Q5_0, 4864, 896, 24, q8),
        ("q/o 896x896", QuantFormat::Q5_0, 896, 896, 96, q8),
        ("down 896x4864", QuantFormat::Q4K, 896, 4864, 24, q8),
        ("down 896x4864", QuantFormat::Q6K, 896, 4864, 24, q8),
        // SmolLM2-135M's (the default file: Q4_1), with each kind of activations.
        ("s gate/up 1536x576", QuantFormat::Q4_1, 1536, 576, 60, f32),
        ("s gate/up 1536x576", QuantFormat::Q4_1, 1536, 576, 60, q8),
        ("s q/o 576x576", QuantFormat::Q4_1, 576, 576, 60, f32),
        ("s q/o 576x576", QuantFormat::Q4_1, 576, 576, 60, q8),
        ("s down 576x1536", QuantFormat::Q4_1, 576, 1536, 30, f32),
        ("s down 576x1536", QuantFormat::Q4_1, 576, 1536, 30, q8),
    ];
    // An argument picks the formats whose name contains it (e.g. `Q5_0`, to profile one).
    let only = std::env::args().nth(1);
    for (what, format, rows, cols, copies, acts) in cases {
        if only
            .as_ref()
            .is_some_and(|o| !format!("{format:?}").contains(o.as_str()))
        {
            continue;
        }
        // `COPIES=1` keeps one matrix in the caches: the kernel's own speed.
        let copies = std::env::var("COPIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(copies);
        let mats: Vec<(QuantMatrix, usize)> = (0..copies)
            .map(|c| {
                let q = QTensor::quantize(
                    &weights(rows, cols, c as u32 + 1),
                    mtplx_model::kernels::ggml_dtype(format),
                )
                .unwrap();
                let bytes = q.storage_size_in_bytes();
                let m = mtplx_model::kernels::from_qtensor_with(&q, acts).unwrap();
                (m, bytes)
            })
            .collect();
        let bytes: usize = mats.iter().map(|m| m.1).sum();
        let x = activations(1, cols);
        let mut y = vec![0f32; rows];
        let mut best = f64::MAX;
        let reps: usize = std::env::var("REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(12);
        for _ in 0..reps {
            let t = Instant::now();
            for (m, _) in &mats {
                m.matmul(black_box(&x), 1, &mut y);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        // A plain read of as many bytes, split over the pool's threads.
        let buf: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
        let threads = pool.threads();
        let mut read_best = f64::MAX;
        for _ in 0..12 {
            let t = Instant::now();
            let part = buf.len() / threads;
            pool.run(threads, &|p| {
                black_box(
                    buf[p * part..(p + 1) * part]
                        .iter()
                        .fold(0u64, |a, &b| a ^ b),
                );
            });
            read_best = read_best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{what:18} {format:?} {acts:?} x{copies}: {:6.1} MB  product {:6.2} ms = {:5.1} GB/s   read {:5.1} GB/s   ({:.0}%)",
            bytes as f64 / 1e6,
            best * 1e3,
            bytes as f64 / best / 1e9,
            bytes as f64 / read_best / 1e9,
            read_best / best * 100.0
        );
    }
}

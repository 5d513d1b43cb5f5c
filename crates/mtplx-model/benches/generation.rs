//! Prefill and decode speed of the default model: f32, candle-quantized and native (kernel)
//! weights, side by side.
//! Run with `cargo xtask bench` (which pins 2 threads and fetches the model).

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::{prefill, LanguageModel, Model, Want, WeightFormat};

fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

/// A deterministic token stream that looks like text to the model.
fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i * 7919) % 20_000).collect()
}

fn bench(c: &mut Criterion) {
    let path = model_path();
    for (format, prefill_lens, decode_ctx) in [
        (
            WeightFormat::F32,
            &[512usize, 2048][..],
            &[128usize, 2048][..],
        ),
        (WeightFormat::Quantized, &[512][..], &[128][..]),
        (
            WeightFormat::Native,
            &[512usize, 2048][..],
            &[128usize, 2048][..],
        ),
    ] {
        let model =
            Model::load(&path, format).expect("the default model (cargo xtask fetch-model)");
        let shape = model.state_shape();
        let name = format!("{format:?}").to_lowercase();

        let mut g = c.benchmark_group(format!("prefill/{name}"));
        g.sample_size(10).warm_up_time(Duration::from_millis(100));
        for &n in prefill_lens {
            let prompt = tokens(n);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::from_parameter(n), &prompt, |b, prompt| {
                b.iter(|| {
                    let mut cache = Sequence::new(&CacheFactory::contiguous(), &shape);
                    prefill(&model, prompt, &mut cache, 512).unwrap()
                })
            });
        }
        g.finish();

        let mut g = c.benchmark_group(format!("decode/{name}"));
        g.sample_size(10).warm_up_time(Duration::from_millis(100));
        g.throughput(Throughput::Elements(1));
        for &ctx in decode_ctx {
            let mut cache = Sequence::new(&CacheFactory::contiguous(), &shape);
            prefill(&model, &tokens(ctx), &mut cache, 512).unwrap();
            g.bench_function(BenchmarkId::new("context", ctx), |b| {
                b.iter(|| {
                    let out = model.forward(&[42], &mut cache, Want::Last).unwrap();
                    cache.rewind(ctx).unwrap();
                    out
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

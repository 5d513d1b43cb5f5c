//! Layout costs at 1K, 4K and 8K tokens of context with SmolLM2-135M's KV shape (30 layers,
//! 3 KV heads, head_dim 64, 9 query heads; `MTPLX_BENCH_LAYERS` overrides the layer count).
//!
//! - `decode_step`: one decode attention step, one query over every layer.
//! - `decode_interleaved`: the same step for the three layouts in alternating rounds; prints
//!   each layout's fastest round and the median per-round ratio to contiguous, which a
//!   machine whose load drifts during the run skews far less than separate groups.
//! - `prefill_append`: appending the whole context in 512-token chunks to an empty cache.
//! - `snapshot`, `fork`: taking a snapshot; forking and appending one token to the fork.
//! - `convert`: restoring a cache into another layout (`a->b`).
//!
//! `cargo xtask`-style short run: `RAYON_NUM_THREADS=2 cargo bench -p mtplx-kv --bench
//! layouts -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use mtplx_kv::{CacheFactory, KvCache, KvShape};

const CONTEXTS: [usize; 3] = [1024, 4096, 8192];
const Q_HEADS: usize = 9;
const PREFILL_CHUNK: usize = 512;

fn shape() -> KvShape {
    let layers = std::env::var("MTPLX_BENCH_LAYERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    KvShape {
        layers,
        kv_heads: 3,
        head_dim: 64,
    }
}

fn layouts() -> [(&'static str, CacheFactory); 3] {
    [
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", CacheFactory::segmented()),
    ]
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503));
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// `len` tokens of K and V for one layer.
fn rows(len: usize, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let n = len * shape().row_len();
    (values(n, 2 * layer as u32), values(n, 2 * layer as u32 + 1))
}

fn filled(factory: &CacheFactory, len: usize) -> Box<dyn KvCache> {
    let shape = shape();
    let mut cache = factory.new_cache(shape);
    for layer in 0..shape.layers {
        let (k, v) = rows(len, layer);
        for (k, v) in k
            .chunks(PREFILL_CHUNK * shape.row_len())
            .zip(v.chunks(PREFILL_CHUNK * shape.row_len()))
        {
            cache.append(layer, k, v).unwrap();
        }
    }
    cache
}

fn decode_step(c: &mut Criterion) {
    let shape = shape();
    let q = values(Q_HEADS * shape.head_dim, 99);
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let mut g = c.benchmark_group("decode_step");
    g.sample_size(10);
    for ctx in CONTEXTS {
        for (name, factory) in layouts() {
            let cache = filled(&factory, ctx);
            let mut out = vec![0f32; q.len()];
            g.bench_function(BenchmarkId::new(name, ctx), |b| {
                b.iter(|| {
                    for layer in 0..shape.layers {
                        cache.attend(layer, &q, Q_HEADS, scale, &mut out).unwrap();
                    }
                    black_box(out[0])
                })
            });
        }
    }
    g.finish();
}

fn decode_interleaved(c: &mut Criterion) {
    let shape = shape();
    let q = values(Q_HEADS * shape.head_dim, 99);
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let mut g = c.benchmark_group("decode_interleaved");
    g.sample_size(10);
    for ctx in CONTEXTS {
        let caches = layouts().map(|(name, f)| (name, filled(&f, ctx)));
        let mut out = vec![0f32; q.len()];
        let mut rounds: Vec<[Duration; 3]> = Vec::new();
        g.bench_function(BenchmarkId::from_parameter(ctx), |b| {
            b.iter(|| {
                let mut round = [Duration::ZERO; 3];
                for (t, (_, cache)) in round.iter_mut().zip(&caches) {
                    let start = Instant::now();
                    for layer in 0..shape.layers {
                        cache.attend(layer, &q, Q_HEADS, scale, &mut out).unwrap();
                    }
                    *t = start.elapsed();
                }
                rounds.push(round);
                black_box(out[0])
            })
        });
        if rounds.is_empty() {
            continue; // filtered out
        }
        let best = |i: usize| rounds.iter().map(|r| r[i]).min().unwrap();
        let median_ratio = |i: usize| {
            let mut r: Vec<f64> = rounds
                .iter()
                .map(|r| r[i].as_secs_f64() / r[0].as_secs_f64())
                .collect();
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        };
        let mut line = format!("decode_interleaved/{ctx} ({} rounds):", rounds.len());
        for (i, (name, _)) in caches.iter().enumerate() {
            line += &format!(
                " {name} best {:.2} ms, x{:.3} (best), x{:.3} (median of rounds);",
                best(i).as_secs_f64() * 1e3,
                best(i).as_secs_f64() / best(0).as_secs_f64(),
                median_ratio(i)
            );
        }
        println!("{line}");
    }
    g.finish();
}

fn prefill_append(c: &mut Criterion) {
    let shape = shape();
    let mut g = c.benchmark_group("prefill_append");
    g.sample_size(10);
    for ctx in CONTEXTS {
        let data: Vec<_> = (0..shape.layers).map(|l| rows(ctx, l)).collect();
        for (name, factory) in layouts() {
            g.bench_function(BenchmarkId::new(name, ctx), |b| {
                b.iter_batched(
                    || factory.new_cache(shape),
                    |mut cache| {
                        let step = PREFILL_CHUNK * shape.row_len();
                        for (layer, (k, v)) in data.iter().enumerate() {
                            for (k, v) in k.chunks(step).zip(v.chunks(step)) {
                                cache.append(layer, k, v).unwrap();
                            }
                        }
                        cache
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

fn snapshot_and_fork(c: &mut Criterion) {
    let shape = shape();
    let (k1, v1) = (values(shape.row_len(), 7), values(shape.row_len(), 8));
    let mut snap = c.benchmark_group("snapshot");
    snap.sample_size(10);
    for ctx in CONTEXTS {
        for (name, factory) in layouts() {
            let cache = filled(&factory, ctx);
            snap.bench_function(BenchmarkId::new(name, ctx), |b| {
                b.iter_batched(|| (), |_| cache.snapshot(), BatchSize::PerIteration)
            });
        }
    }
    snap.finish();
    let mut fork = c.benchmark_group("fork");
    fork.sample_size(10);
    for ctx in CONTEXTS {
        for (name, factory) in layouts() {
            let cache = filled(&factory, ctx);
            fork.bench_function(BenchmarkId::new(name, ctx), |b| {
                b.iter_batched(
                    || (),
                    |_| {
                        let mut f = cache.fork();
                        for layer in 0..shape.layers {
                            f.append(layer, &k1, &v1).unwrap();
                        }
                        f
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    fork.finish();
}

fn convert(c: &mut Criterion) {
    let [(_, contiguous), (_, paged), (_, segmented)] = layouts();
    let pairs = [
        ("contiguous->paged", &contiguous, &paged),
        ("contiguous->segmented", &contiguous, &segmented),
        ("paged->contiguous", &paged, &contiguous),
        ("segmented->contiguous", &segmented, &contiguous),
        ("segmented->segmented", &segmented, &segmented),
    ];
    let mut g = c.benchmark_group("convert");
    g.sample_size(10);
    for ctx in CONTEXTS {
        for (name, from, to) in pairs {
            let cache = filled(from, ctx);
            g.bench_function(BenchmarkId::new(name, ctx), |b| {
                b.iter_batched(
                    || (),
                    |_| to.restore(&*cache, ctx).unwrap(),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    decode_step,
    decode_interleaved,
    prefill_append,
    snapshot_and_fork,
    convert
);
criterion_main!(benches);

//! A diagnostic, not a result: the attention of one decode step over a long context, all
//! layers, in each layout and element type, with the K/V bytes it reads per second.
//!
//! `cargo run --release -p mtplx-kv --example attend_decode -- [CONTEXT] [REPEATS] [DTYPE] [GEOMETRY] [QUERIES] [LAYERS]`
//! (defaults 6500, 20, every element type (`all`), `smollm2` and 1: the default model's 30
//! layers, 9 query heads over 3 KV heads of 64; `qwen2.5-0.5b` is 24 layers, 14 query heads
//! over 2 KV heads of 64, seven query heads to a KV head). With `QUERIES` above 1 the step is
//! a prefill chunk's attention instead: that many queries at the newest positions. `LAYERS`
//! (default the model's) below it keeps a short context's K/V in the caches.

use std::time::Instant;

use mtplx_kv::{CacheFactory, KvCache, KvDtype, KvShape};

fn main() {
    let mut args = std::env::args().skip(1);
    let context: usize = args.next().map_or(6500, |a| a.parse().expect("CONTEXT"));
    let repeats: usize = args.next().map_or(20, |a| a.parse().expect("REPEATS"));
    let only: Option<KvDtype> = args
        .next()
        .filter(|a| a != "all")
        .map(|a| a.parse().expect("DTYPE"));
    let (shape, q_heads) = match args.next().as_deref() {
        None | Some("smollm2") => (
            KvShape {
                layers: 30,
                kv_heads: 3,
                head_dim: 64,
            },
            9,
        ),
        Some("qwen2.5-0.5b") => (
            KvShape {
                layers: 24,
                kv_heads: 2,
                head_dim: 64,
            },
            14,
        ),
        Some(other) => panic!("GEOMETRY: smollm2 or qwen2.5-0.5b, not {other}"),
    };
    let queries: usize = args.next().map_or(1, |a| a.parse().expect("QUERIES"));
    // Fewer layers than the model's keep the step's K/V in the caches: the fold's own
    // speed, without the memory's.
    let mut shape = shape;
    if let Some(layers) = args.next() {
        shape.layers = layers.parse().expect("LAYERS");
    }
    let row = shape.row_len();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let rows: Vec<f32> = (0..context * row).map(|_| next()).collect();
    let q: Vec<f32> = (0..queries * q_heads * shape.head_dim)
        .map(|_| next())
        .collect();
    println!(
        "context {context}, {repeats} steps of {} layers, {q_heads} query heads over {} KV heads, \
         {queries} queries a step",
        shape.layers, shape.kv_heads
    );
    for dtype in KvDtype::ALL
        .into_iter()
        .filter(|d| only.is_none_or(|o| o == *d))
    {
        for (name, factory) in [
            ("contiguous", CacheFactory::contiguous()),
            ("paged", CacheFactory::paged()),
            ("segmented", CacheFactory::segmented()),
        ] {
            let factory = factory.with_dtype(dtype).unwrap();
            let mut cache = factory.new_cache(shape);
            for layer in 0..shape.layers {
                cache.append(layer, &rows, &rows).unwrap();
            }
            let mut out = vec![0f32; q.len()];
            let step = |cache: &dyn KvCache, out: &mut [f32]| {
                for layer in 0..shape.layers {
                    cache.attend(layer, &q, q_heads, 0.125, out).unwrap();
                }
            };
            step(&*cache, &mut out);
            // The mean, and the best step (on a shared machine the least disturbed one).
            let (mut total, mut best) = (0f64, f64::INFINITY);
            for _ in 0..repeats {
                let t = Instant::now();
                step(&*cache, &mut out);
                let s = t.elapsed().as_secs_f64();
                (total, best) = (total + s, best.min(s));
            }
            let per = total / repeats as f64;
            let keys = (context * shape.layers * shape.kv_heads) as f64;
            if queries > 1 {
                // A prefill chunk reads the K/V once per tile of queries: a rate of bytes
                // would say nothing; time per query and key does.
                println!(
                    "{dtype:>4} {name:>10}: {:7.2} ms a step (best {:.2}), best {:.2} ns per \
                     query, key and KV head",
                    per * 1e3,
                    best * 1e3,
                    best * 1e9 / (keys * queries as f64)
                );
                continue;
            }
            let bytes = context * shape.bytes_per_token(dtype);
            println!(
                "{dtype:>4} {name:>10}: {:7.2} ms a step (best {:.2}), {:6.1} GB/s of K/V \
                 ({:.0} MB), best {:.0} ns per key and KV head",
                per * 1e3,
                best * 1e3,
                bytes as f64 / per / 1e9,
                bytes as f64 / 1e6,
                best * 1e9 / keys
            );
        }
    }
}

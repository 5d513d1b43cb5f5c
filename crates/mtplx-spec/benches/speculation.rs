//! Decode speed of plain decoding against speculation (prompt lookup at depths 2-4), side
//! by side in one run, on a chat turn and on a code-editing turn (a file in the context,
//! the answer rewrites part of it). Greedy, the default model, 2 threads.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mtplx_kv::CacheFactory;
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, Generator, LanguageModel, WeightFormat};
use mtplx_spec::{generate, DepthPolicy, PromptLookup, SpecDecoder};

const NEW_TOKENS: usize = 48;

const CODE: &str = "Rename the function `area` to `rectangle_area` in this file and show the whole file.\n\n```python\ndef area(width, height):\n    \"\"\"Return the area of a rectangle.\"\"\"\n    return width * height\n\n\ndef perimeter(width, height):\n    \"\"\"Return the perimeter of a rectangle.\"\"\"\n    return 2 * (width + height)\n\n\nif __name__ == \"__main__\":\n    print(area(3, 4))\n    print(perimeter(3, 4))\n```";

fn prompt(b: &Bundle, text: &str) -> Vec<u32> {
    let req = ChatRequest {
        messages: vec![ChatMessage::text(Role::User, text)],
        add_generation_prompt: true,
        ..Default::default()
    };
    let rendered = b
        .template
        .as_ref()
        .expect("template")
        .render(&req)
        .expect("render");
    b.tokenizer.encode(&rendered, true).expect("encode")
}

fn bench(c: &mut Criterion) {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        });
    let b = Bundle::load(&path, WeightFormat::F32).expect("default model");
    let model = &b.model;
    let shape = model.config().kv_shape();
    for (name, text) in [
        ("chat", "Write a short paragraph about why the sky is blue."),
        ("code_edit", CODE),
    ] {
        let ids = prompt(&b, text);
        let mut g = c.benchmark_group(format!("decode48/{name}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .throughput(Throughput::Elements(NEW_TOKENS as u64));
        // The prompt is prefilled once; each iteration decodes from a restored copy.
        let mut base = CacheFactory::contiguous().new_cache(shape);
        mtplx_model::prefill(model, &ids[..ids.len() - 1], base.as_mut(), 512).unwrap();
        let snapshot = base.snapshot();
        let fresh = || {
            CacheFactory::contiguous()
                .restore(&*snapshot, ids.len() - 1)
                .unwrap()
        };
        g.bench_function("plain", |bench| {
            bench.iter(|| {
                let mut cache = fresh();
                let mut gen =
                    Generator::new(model, cache.as_mut(), &ids, Sampler::greedy(), 512).unwrap();
                for _ in 0..NEW_TOKENS {
                    gen.step().unwrap();
                }
            })
        });
        for depth in [2, 3, 4] {
            g.bench_function(BenchmarkId::new("lookup", depth), |bench| {
                bench.iter(|| {
                    let mut cache = fresh();
                    let mut d =
                        SpecDecoder::new(model, cache.as_mut(), &ids, Sampler::greedy(), 512)
                            .unwrap();
                    let mut lookup = PromptLookup::default();
                    let mut policy = DepthPolicy::fixed(depth);
                    generate(&mut d, &mut lookup, &mut policy, NEW_TOKENS, &|_| false).unwrap();
                    d.stats.mean_acceptance_length()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

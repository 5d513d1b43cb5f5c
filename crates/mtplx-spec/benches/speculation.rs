//! Decode speed of plain decoding against speculation, side by side in one run: the MTP
//! head (`models/mtp/`) at depths 1-3, prompt lookup at depth 3, and prompt lookup falling
//! back to the MTP head (depths 2 and 3, the cost policy up to 3, one cost policy per draft
//! source, and that policy carried from each answer to the next), on three chat turns and
//! on two code-editing turns (a file in the context, the answer rewrites part of it), 48
//! new tokens each (`MTPLX_SPEC_TOKENS` sets another count). All prompts are held out from
//! the head's training. Greedy, the default model's native weights, the process's thread
//! pool (2 threads under `cargo xtask bench`). Before the timings, one run
//! of each prints its acceptance by depth.
//!
//! `MTPLX_SPEC_ROUNDS=n` replaces criterion with `n` interleaved rounds (each times plain
//! and every variant once, in a rotating order) and prints each variant's median and its
//! ratio to plain's median: a quick side-by-side figure, e.g. across `MTPLX_THREADS`.
//!
//! `MTPLX_DEVICE=cuda` (built with `--features cuda`) runs the trunk on the GPU: the CUDA
//! backend's model and device KV caches, and the MTP head there too (`MTPLX_SPEC_HEAD=cpu`
//! keeps the head on the CPU). Prompt lookup runs on the CPU.

use mtplx_model::tokenizer::Special;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::mtp::{MtpHead, MtpRunner, Vocab};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, LanguageModel, Want, WeightFormat};
use mtplx_spec::{
    drive, Collect, Decode, DepthPolicy, DraftSampling, LookupThenMtp, MtpProposer, PromptLookup,
    Proposer, Request, SpecStats, TrunkRows,
};

/// New tokens per prompt (`MTPLX_SPEC_TOKENS` overrides: adaptive policies learn over longer
/// answers).
fn new_tokens() -> usize {
    std::env::var("MTPLX_SPEC_TOKENS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(48)
}

/// Held-out chat prompts (never trained on; `xtask/src/train_mtp.rs` EVAL_CHAT).
const CHAT: &[&str] = &[
    "Write a short paragraph about why the sky is blue.",
    "Explain what a linked list is.",
    "Give me a recipe for a simple tomato soup.",
];

/// Held-out code-editing turns: a file in the context, the answer rewrites it.
const CODE: &[&str] = &[
    "Rename the function `area` to `rectangle_area` in this file and show the whole file.\n\n```python\ndef area(width, height):\n    \"\"\"Return the area of a rectangle.\"\"\"\n    return width * height\n\n\ndef perimeter(width, height):\n    \"\"\"Return the perimeter of a rectangle.\"\"\"\n    return 2 * (width + height)\n\n\nif __name__ == \"__main__\":\n    print(area(3, 4))\n    print(perimeter(3, 4))\n```",
    "Rename `total` to `sum` in this Rust function and show the whole function.\n\n```rust\nfn average(values: &[f64]) -> f64 {\n    let mut total = 0.0;\n    for v in values {\n        total += v;\n    }\n    total / values.len() as f64\n}\n```",
];

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
    b.tokenizer
        .encode(&rendered, Special::Parse)
        .expect("encode")
}

fn bench(c: &mut Criterion) {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        });
    let b = Bundle::load(&path, WeightFormat::Native).expect("default model");
    let cuda = std::env::var("MTPLX_DEVICE").is_ok_and(|d| d == "cuda");
    #[cfg(feature = "cuda")]
    let gpu = cuda.then(|| {
        let dev = mtplx_model::cuda::CudaDevice::open(0).expect("MTPLX_DEVICE=cuda: a device");
        eprintln!("trunk on {dev:?}");
        mtplx_model::cuda::CudaModel::from_model(
            &mtplx_model::Model::load(&b.path, mtplx_model::WeightFormat::Native)
                .expect("the dense model"),
            dev,
        )
        .expect("upload the model")
    });
    #[cfg(feature = "cuda")]
    let (model, factory): (&dyn LanguageModel, CacheFactory) = match &gpu {
        Some(g) => (g, g.cache_factory()),
        None => (&*b.model, CacheFactory::contiguous()),
    };
    #[cfg(not(feature = "cuda"))]
    let (model, factory): (&dyn LanguageModel, CacheFactory) = {
        assert!(
            !cuda,
            "MTPLX_DEVICE=cuda needs the bench built with --features cuda"
        );
        (&*b.model, CacheFactory::contiguous())
    };
    let shape = model.state_shape();
    let head_path = std::env::var_os("MTPLX_MTP_HEAD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/mtp/smollm2-135m-mtp.safetensors")
        });
    let cpu_head = MtpHead::load(&head_path, model, Vocab::FromFile).expect("MTP head");
    let head_on_cpu = std::env::var("MTPLX_SPEC_HEAD").is_ok_and(|h| h == "cpu");
    // The head, and the factory of its own one-layer cache, where the head runs.
    #[cfg(feature = "cuda")]
    let (head, head_factory): (Arc<dyn MtpRunner>, CacheFactory) = match &gpu {
        Some(g) if !head_on_cpu => {
            let h = mtplx_model::cuda::CudaMtpHead::new(&cpu_head, g).expect("upload the head");
            eprintln!("MTP head on the GPU");
            (Arc::new(h), g.cache_factory())
        }
        _ => (Arc::new(cpu_head), CacheFactory::contiguous()),
    };
    #[cfg(not(feature = "cuda"))]
    let (head, head_factory): (Arc<dyn MtpRunner>, CacheFactory) = {
        let _ = head_on_cpu;
        (Arc::new(cpu_head), CacheFactory::contiguous())
    };
    for (name, texts) in [("chat", CHAT), ("code_edit", CODE)] {
        let mut g = c.benchmark_group(format!("decode48/{name}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .throughput(Throughput::Elements((new_tokens() * texts.len()) as u64));
        // Each prompt is prefilled once; each iteration decodes from a restored copy. The
        // head observes the prompt once (as the server's prefill shows it); each iteration
        // drafts from a fork.
        let cases: Vec<Case> = texts
            .iter()
            .map(|text| {
                let ids = prompt(&b, text);
                let mut base = Sequence::new(&factory, &shape);
                let rows = model
                    .forward(&ids[..ids.len() - 1], &mut base, Want::Hidden)
                    .unwrap();
                let mut observed =
                    MtpProposer::new(model, head.clone(), &head_factory, DraftSampling::Greedy);
                observed
                    .observe(&TrunkRows {
                        pos: 0,
                        hidden: &rows.hidden,
                        next: &ids[1..],
                    })
                    .unwrap();
                Case {
                    snapshot: base.kv().snapshot(),
                    ids,
                    observed,
                }
            })
            .collect();
        let fresh = |case: &Case| {
            Sequence::from(
                factory
                    .restore(&*case.snapshot, case.ids.len() - 1)
                    .unwrap(),
            )
        };
        // The server's own loop (mtplx_spec::drive), never stopping early.
        let never = |_: u32| false;
        let plain = || {
            for case in &cases {
                let mut cache = fresh(case);
                let r = Request::new(&case.ids, Sampler::greedy(), new_tokens(), &never);
                drive(
                    model,
                    &mut cache,
                    &r,
                    Decode::Plain,
                    &mut Collect::default(),
                )
                .unwrap();
            }
        };
        // What `…-learned` carries from one answer to the next.
        let learned = std::cell::RefCell::new(None::<DepthPolicy>);
        let speculate = |kind: &str, depth: usize| -> SpecStats {
            let mut total = SpecStats::default();
            for case in &cases {
                let mut cache = fresh(case);
                let proposer: Box<dyn Proposer + '_> = match kind {
                    "mtp" => Box::new(case.observed.fork()),
                    "lookup" => Box::new(PromptLookup::default()),
                    _ => Box::new(LookupThenMtp::new(case.observed.fork())),
                };
                // `…-cost`: the cost policy, exploring depths 0..=depth by measured time;
                // `…-cost-by-source`: one cost policy for lookup drafts and one for the head's
                // (the server's default).
                // `…-learned`: that policy carried over from the previous answer.
                let policy = if kind.ends_with("-cost") {
                    DepthPolicy::cost(depth)
                } else if kind.ends_with("-learned") {
                    learned
                        .take()
                        .unwrap_or_else(|| DepthPolicy::by_source(DepthPolicy::cost(depth)))
                } else if kind.ends_with("-cost-by-source") {
                    DepthPolicy::by_source(DepthPolicy::cost(depth))
                } else {
                    DepthPolicy::fixed(depth)
                };
                let r = Request::new(&case.ids, Sampler::greedy(), new_tokens(), &never);
                let decode = Decode::Speculative { proposer, policy };
                let report = drive(model, &mut cache, &r, decode, &mut Collect::default())
                    .unwrap()
                    .speculation
                    .expect("a speculative generation reports its speculation");
                if kind.ends_with("-learned") {
                    learned.replace(Some(report.policy));
                }
                total.merge(&report.stats);
            }
            total
        };
        let runs = [
            ("mtp", 1),
            ("mtp", 2),
            ("mtp", 3),
            ("lookup", 3),
            ("lookup+mtp", 2),
            ("lookup+mtp", 3),
            ("lookup+mtp-cost", 3),
            ("lookup+mtp-cost-by-source", 3),
            ("lookup+mtp-cost-by-source-learned", 3),
        ];
        // One pass outside criterion: acceptance by depth (and the pass's time, a first
        // look before the timed runs).
        let t = std::time::Instant::now();
        plain();
        eprintln!(
            "[{name}] plain: one pass {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        for (kind, depth) in runs {
            let t = std::time::Instant::now();
            let stats = speculate(kind, depth);
            let took = t.elapsed().as_secs_f64() * 1e3;
            let rate: Vec<String> = stats
                .drafted_by_depth
                .iter()
                .zip(&stats.accepted_by_depth)
                .map(|(d, a)| format!("{:.2}", *a as f64 / (*d).max(1) as f64))
                .collect();
            eprintln!(
                "[{name}] {kind}/{depth}: acceptance by depth [{}], mean accepted length {:.2}, \
                 one pass {took:.1} ms",
                rate.join(", "),
                stats.mean_acceptance_length(),
            );
        }
        if let Some(rounds) = std::env::var("MTPLX_SPEC_ROUNDS")
            .ok()
            .and_then(|r| r.parse::<usize>().ok())
        {
            interleaved(name, rounds, &plain, &runs, &speculate);
            continue;
        }
        g.bench_function("plain", |bench| bench.iter(plain));
        for (kind, depth) in runs {
            g.bench_function(BenchmarkId::new(kind, depth), |bench| {
                bench.iter(|| speculate(kind, depth).mean_acceptance_length())
            });
        }
        g.finish();
    }
}

/// `rounds` rounds of plain and every variant, each round in a rotated order; prints the
/// medians and their ratio to plain's.
fn interleaved(
    set: &str,
    rounds: usize,
    plain: &dyn Fn(),
    runs: &[(&str, usize)],
    speculate: &dyn Fn(&str, usize) -> SpecStats,
) {
    let mut times = vec![Vec::new(); runs.len() + 1];
    for r in 0..rounds {
        for j in 0..=runs.len() {
            let v = (j + r) % (runs.len() + 1);
            let t = std::time::Instant::now();
            match v {
                0 => plain(),
                _ => {
                    let (kind, depth) = runs[v - 1];
                    speculate(kind, depth);
                }
            }
            times[v].push(t.elapsed().as_secs_f64());
        }
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let base = median(&mut times[0]);
    eprintln!("[{set}] plain: {:.1} ms (median of {rounds})", base * 1e3);
    for (v, (kind, depth)) in runs.iter().enumerate() {
        let m = median(&mut times[v + 1]);
        eprintln!(
            "[{set}] {kind}/{depth}: {:.1} ms, {:.2}x plain",
            m * 1e3,
            base / m
        );
    }
}

/// One prompt, prefilled once.
struct Case<'a> {
    ids: Vec<u32>,
    snapshot: std::sync::Arc<dyn mtplx_kv::KvView>,
    observed: MtpProposer<'a>,
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The cost of invariance (issue 9): the batch-invariant kernels against the fastest
//! non-invariant orders we could justify, in one run, on the default model's shapes
//! (SmolLM2-135M: Q4_1 projections, fused Q/K/V 960×576, output 576×576, fused gate/up
//! 3072×576, down 576×1536, and the tied Q8_0 head 49152×576).
//!
//! Contenders for each product, at n = 1 (a decode step) and n = 512 (a prefill chunk):
//! - `invariant`: the product kernel (one FMA chain per output, in input order);
//! - `wide8` (n = 1): the same order, bits and blocking (8 output tiles per pass at one
//!   row) through the variants' code: a control for that code's own overheads;
//! - `split2`, `split4`: the same kernel with 2 or 4 partial chains per output
//!   (`kernels::non_invariant`), which another row count could have chosen differently;
//! - `candle_q8` (n = 1): candle's quantized matmul (activations rounded to Q8, ggml's
//!   order; candle 0.11 runs Q4_1 on a scalar fallback, so it is no contender at n = 512);
//! - `candle_f32`: candle's `f32` GEMM over the dequantized weights (its blocking and
//!   reduction order depend on the row count).
//!
//! Attention (`attention`): the kernel's blocks of 16 keys against blocks of 8, 64 and 256
//! (`mtplx_kernels::attention::non_invariant`: more or fewer running-max merges), per decode step
//! and prefill chunk.
//!
//! Then composites: `step`, one decode step's products over 30 layers of distinct weights
//! plus the head (what a decode step streams); `layer512`, one layer's products at n = 512
//! (a prefill chunk is bound by the multiply-adds, not by memory); and, on the real model,
//! a decode step at context 128 and a 512-token prefill for the native (invariant) and candle
//! `f32` weights, with the attention kernel's own share.
//!
//! Criterion records each contender; a summary at the end times them interleaved (every
//! round runs each contender once untimed, then once timed, starting with another contender
//! each round, so a change in machine load or cache state hits all of them; candle's are
//! followed by a pause, so that no contender pays for rayon's
//! spinning threads) and prints the medians and each one's ratio to `invariant`: above 1
//! means slower than invariant.
//!
//! `cargo bench -p mtplx-model --bench invariance_cost [-- filter]` (a filter such as
//! `invariance_cost_attention/` also limits the summaries); `MTPLX_THREADS` sets the pool.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mtplx_kernels::attention::non_invariant::attend_blocks;
use mtplx_kernels::attention::{attend, AttnGeometry, RowSource};
use mtplx_kernels::non_invariant::{matmul_split_chains, matmul_wide_rows};
use mtplx_kv::{CacheFactory, KvCache, Sequence};
use mtplx_model::kernels::{Pool, QuantMatrix};
use mtplx_model::{prefill, LanguageModel, Model, Want, WeightFormat};

#[path = "common/seeded.rs"]
mod seeded;
use seeded::{activations, weights};

/// (name, rows, cols, format) of the products of one layer, then the head.
const LAYER: [(&str, usize, usize); 4] = [
    ("qkv_960x576", 960, 576),
    ("o_576x576", 576, 576),
    ("gateup_3072x576", 3072, 576),
    ("down_576x1536", 576, 1536),
];
const HEAD: (&str, usize, usize) = ("head_49152x576", 49152, 576);
const LAYERS: usize = 30;

/// One weight matrix, as each contender keeps it.
struct Mat {
    ours: QuantMatrix,
    q8: QMatMul,
    /// Dequantized, transposed (`[cols, rows]`) for `x · Wᵀ` as one GEMM.
    f32t: Tensor,
    rows: usize,
    cols: usize,
}

fn mat(rows: usize, cols: usize, seed: u32, format: GgmlDType) -> Mat {
    let w = weights(rows, cols, seed);
    let q = QTensor::quantize(&w, format).unwrap();
    let f32t = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .t()
        .unwrap()
        .contiguous()
        .unwrap();
    Mat {
        ours: mtplx_model::kernels::from_qtensor(&q).unwrap(),
        q8: QMatMul::from_qtensor(q).unwrap(),
        f32t,
        rows,
        cols,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Invariant,
    Wide8,
    Split2,
    Split4,
    CandleQ8,
    CandleF32,
}

static ALL: [Who; 6] = [
    Who::Invariant,
    Who::Wide8,
    Who::Split2,
    Who::Split4,
    Who::CandleQ8,
    Who::CandleF32,
];
/// At n = 512: `wide8` is the product's own blocking there, and candle 0.11 has no SIMD
/// Q4_1 dot product (a scalar fallback, 20-30× slower: not a contender).
static PREFILL: [Who; 4] = [Who::Invariant, Who::Split2, Who::Split4, Who::CandleF32];

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Invariant => "invariant",
            Who::Wide8 => "wide8",
            Who::Split2 => "split2",
            Who::Split4 => "split4",
            Who::CandleQ8 => "candle_q8",
            Who::CandleF32 => "candle_f32",
        }
    }
}

/// `out = x · Wᵀ` by `who` (`x` is `n × cols`; the candle contenders take it as a tensor).
fn product(who: Who, m: &Mat, x: &[f32], xt: &Tensor, n: usize, out: &mut [f32]) {
    match who {
        Who::Invariant => m.ours.matmul(x, n, out),
        Who::Wide8 => matmul_wide_rows(&m.ours, x, n, out),
        Who::Split2 => matmul_split_chains(&m.ours, 2, x, n, out),
        Who::Split4 => matmul_split_chains(&m.ours, 4, x, n, out),
        Who::CandleQ8 => {
            black_box(m.q8.forward(xt).unwrap());
        }
        Who::CandleF32 => {
            black_box(xt.matmul(&m.f32t).unwrap());
        }
    }
}

/// A case: some products, run in order by one contender.
struct Case {
    name: String,
    mats: Vec<Mat>,
    n: usize,
    /// Calls per timed sample (small products are repeated to reach ~a millisecond).
    reps: usize,
    who: &'static [Who],
}

impl Case {
    fn run(&self, who: Who, x: &[Vec<f32>], xt: &[Tensor], out: &mut [Vec<f32>]) {
        for _ in 0..self.reps {
            for (i, m) in self.mats.iter().enumerate() {
                let xi = x.iter().position(|v| v.len() == self.n * m.cols).unwrap();
                product(who, m, &x[xi], &xt[xi], self.n, &mut out[i]);
            }
        }
    }

    fn inputs(&self) -> (Vec<Vec<f32>>, Vec<Tensor>, Vec<Vec<f32>>) {
        let mut cols: Vec<usize> = self.mats.iter().map(|m| m.cols).collect();
        cols.sort();
        cols.dedup();
        let x: Vec<Vec<f32>> = cols.iter().map(|&c| activations(self.n, c)).collect();
        let xt = x
            .iter()
            .zip(&cols)
            .map(|(v, &c)| Tensor::from_vec(v.clone(), (self.n, c), &Device::Cpu).unwrap())
            .collect();
        let out = self
            .mats
            .iter()
            .map(|m| vec![0f32; self.n * m.rows])
            .collect();
        (x, xt, out)
    }
}

fn cases() -> Vec<Case> {
    let q4 = GgmlDType::Q4_1;
    let mut out = Vec::new();
    for (name, rows, cols) in LAYER {
        for (n, reps, who) in [(1, 20, &ALL[..]), (512, 1, &PREFILL[..])] {
            out.push(Case {
                name: format!("{name}/n{n}"),
                mats: vec![mat(rows, cols, rows as u32, q4)],
                n,
                reps,
                who,
            });
        }
    }
    // A prefill computes the head for its last row only: n = 1 is the case that counts.
    out.push(Case {
        name: format!("{}/n1", HEAD.0),
        mats: vec![mat(HEAD.1, HEAD.2, 7, GgmlDType::Q8_0)],
        n: 1,
        reps: 1,
        who: &ALL,
    });
    // A decode step streams 30 layers of distinct weights and the head.
    let mut step = Vec::new();
    for l in 0..LAYERS {
        for (_, rows, cols) in LAYER {
            step.push(mat(rows, cols, (l * 4099 + rows) as u32, q4));
        }
    }
    step.push(mat(HEAD.1, HEAD.2, 7, GgmlDType::Q8_0));
    out.push(Case {
        name: "step/n1".into(),
        mats: step,
        n: 1,
        reps: 1,
        who: &ALL,
    });
    out.push(Case {
        name: "layer512/n512".into(),
        mats: LAYER
            .iter()
            .map(|&(_, rows, cols)| mat(rows, cols, rows as u32 + 1, q4))
            .collect(),
        n: 512,
        reps: 1,
        who: &PREFILL,
    });
    out
}

/// Whether the command line's filter (criterion's: a substring of the benchmark id) may
/// select something in `group` (`invariance_cost/`, `invariance_cost/step`): a group not
/// selected skips its set-up and summary too.
fn wanted(group: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    filters.is_empty()
        || filters
            .iter()
            .any(|f| group.contains(f.as_str()) || f.starts_with(group))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn products(c: &mut Criterion) {
    if !wanted("invariance_cost/") {
        return;
    }
    let cases = cases();
    let mut g = c.benchmark_group("invariance_cost");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for case in &cases {
        let (x, xt, mut out) = case.inputs();
        for &who in case.who {
            g.bench_function(BenchmarkId::new(&case.name, who.name()), |b| {
                b.iter(|| case.run(who, &x, &xt, &mut out))
            });
        }
    }
    g.finish();

    // Interleaved summary.
    let rounds = 15;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\ninvariance cost: median µs per call over {rounds} interleaved rounds, {} threads, \
         load average at start {}",
        Pool::global().threads(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    print!("{:<22}", "case");
    for who in ALL {
        print!("{:>18}", who.name());
    }
    println!();
    for case in &cases {
        let (x, xt, mut out) = case.inputs();
        for &who in case.who {
            case.run(who, &x, &xt, &mut out);
        }
        let mut t: Vec<Vec<f64>> = vec![Vec::new(); case.who.len()];
        for round in 0..rounds {
            // Each round starts with another contender: whatever the one before leaves in the
            // caches (candle's f32 weights evict them) does not always hit the same one.
            for k in 0..case.who.len() {
                let i = (round + k) % case.who.len();
                let who = case.who[i];
                // Untimed first: wakes this contender's threads.
                case.run(who, &x, &xt, &mut out);
                let s = Instant::now();
                case.run(who, &x, &xt, &mut out);
                t[i].push(s.elapsed().as_secs_f64() * 1e6 / case.reps as f64);
                if matches!(who, Who::CandleQ8 | Who::CandleF32) {
                    // Let rayon's workers go to sleep before our pool runs again.
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let med: Vec<f64> = t.iter_mut().map(|v| median(v)).collect();
        let mut line = format!("{:<22}", case.name);
        for who in ALL {
            match case.who.iter().position(|&w| w == who) {
                Some(0) => line += &format!("{:>18.1}", med[0]),
                Some(i) => line += &format!("{:>11.1} ({:>4.2})", med[i], med[i] / med[0]),
                None => line += &format!("{:>18}", "-"),
            }
        }
        println!("{line}");
    }
    println!("(ratio = contender / invariant; below 1.00 = faster than invariant)\n");
}

fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i * 7919) % 20_000).collect()
}

/// The real model: a decode step at context 128 and a 512-token prefill per weight format,
/// and what the attention kernel alone costs in each (30 layers, the model's geometry).
fn model(c: &mut Criterion) {
    if !wanted("invariance_cost_model/") {
        return;
    }
    let path = model_path();
    if !path.exists() {
        eprintln!("{} missing: skipping the model benches", path.display());
        return;
    }
    // Not candle's quantized weights: no SIMD Q4_1 kernel in candle 0.11 (see `PREFILL`).
    let formats = [
        ("native", WeightFormat::Native),
        ("candle_f32", WeightFormat::F32),
    ];
    let models: Vec<Model> = formats
        .iter()
        .map(|(_, f)| Model::load(&path, *f).unwrap())
        .collect();
    let factory = CacheFactory::contiguous();
    let ctx = tokens(128);
    let long = tokens(512);
    let decode = |m: &Model, cache: &mut Sequence| {
        cache.rewind(ctx.len()).unwrap();
        black_box(m.forward(&[42], cache, Want::Last).unwrap());
    };
    let fill = |m: &Model, cache: &mut Sequence| {
        cache.rewind(0).unwrap();
        black_box(prefill(m, &long, cache, 512).unwrap());
    };
    let mut caches: Vec<Sequence> = models
        .iter()
        .map(|m| {
            let mut c = m.new_sequence(&factory);
            prefill(m, &ctx, &mut c, 512).unwrap();
            c
        })
        .collect();

    // Attention alone: the model's geometry over random rows.
    let cfg = models[0].config();
    let (qh, hd) = (cfg.num_heads, cfg.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    // Caches of 129 and 512 positions: a decode step's query and a prefill chunk's.
    let shape = models[0].config().kv_shape();
    let att: Vec<Box<dyn KvCache>> = [129, 512]
        .iter()
        .map(|&len| {
            let mut c = factory.new_cache(shape);
            let rows = activations(len, shape.row_len());
            for layer in 0..shape.layers {
                c.append(layer, &rows, &rows).unwrap();
            }
            c
        })
        .collect();
    let attend = |cache: &dyn KvCache, n_q: usize| {
        let q = activations(n_q, qh * hd);
        let mut out = vec![0f32; q.len()];
        for layer in 0..shape.layers {
            cache.attend(layer, &q, qh, scale, &mut out).unwrap();
        }
        black_box(&out);
    };

    let mut g = c.benchmark_group("invariance_cost_model");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    for (((name, _), m), cache) in formats.iter().zip(&models).zip(caches.iter_mut()) {
        g.bench_function(BenchmarkId::new("decode_ctx128", name), |b| {
            b.iter(|| decode(m, cache))
        });
        g.bench_function(BenchmarkId::new("prefill512", name), |b| {
            let mut c = m.new_sequence(&factory);
            b.iter(|| fill(m, &mut c))
        });
    }
    g.finish();

    let rounds = 9;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\ninvariance cost, model: median ms over {rounds} interleaved rounds, load average at \
         start {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut d: Vec<Vec<f64>> = vec![Vec::new(); models.len() + 1];
    let mut p: Vec<Vec<f64>> = vec![Vec::new(); models.len() + 1];
    let mut fill_caches: Vec<Sequence> = models.iter().map(|m| m.new_sequence(&factory)).collect();
    for _ in 0..rounds {
        for (i, m) in models.iter().enumerate() {
            let s = Instant::now();
            for _ in 0..10 {
                decode(m, &mut caches[i]);
            }
            d[i].push(s.elapsed().as_secs_f64() * 100.0);
            let s = Instant::now();
            fill(m, &mut fill_caches[i]);
            p[i].push(s.elapsed().as_secs_f64() * 1e3);
        }
        // The attention of a decode step at context 129, and of a 512-token prefill.
        let s = Instant::now();
        for _ in 0..10 {
            attend(att[0].as_ref(), 1);
        }
        d[models.len()].push(s.elapsed().as_secs_f64() * 100.0);
        let s = Instant::now();
        attend(att[1].as_ref(), 512);
        p[models.len()].push(s.elapsed().as_secs_f64() * 1e3);
    }
    let dm: Vec<f64> = d.iter_mut().map(|v| median(v)).collect();
    let pm: Vec<f64> = p.iter_mut().map(|v| median(v)).collect();
    println!("{:<26}{:>14}{:>14}", "", "decode ctx128", "prefill 512");
    for (i, (name, _)) in formats.iter().enumerate() {
        println!(
            "{:<26}{:>8.2} ({:.2}){:>8.1} ({:.2})",
            name,
            dm[i],
            dm[i] / dm[0],
            pm[i],
            pm[i] / pm[0]
        );
    }
    let a = models.len();
    println!(
        "{:<26}{:>8.2} ({:.2}){:>8.1} ({:.2})",
        "attention alone (30 layers)",
        dm[a],
        dm[a] / dm[0],
        pm[a],
        pm[a] / pm[0]
    );
    println!("(ms; ratio to native; the attention row's ratio is its share of native)\n");
}

/// K/V rows of one layer, back to back (one stored run, like a contiguous layer).
struct Rows {
    k: Vec<f32>,
    v: Vec<f32>,
    row: usize,
}

impl RowSource for Rows {
    type Elem = f32;
    fn k_row(&self, pos: usize) -> &[f32] {
        &self.k[pos * self.row..(pos + 1) * self.row]
    }
    fn v_row(&self, pos: usize) -> &[f32] {
        &self.v[pos * self.row..(pos + 1) * self.row]
    }
    fn run(&self, start: usize) -> Option<(&[f32], &[f32])> {
        Some((&self.k[start * self.row..], &self.v[start * self.row..]))
    }
}

/// The attention kernel (blocks of 16 keys aligned to absolute positions) against blocks of
/// 8, 64 and 256, for the default model's geometry (9 query heads, 3 KV heads, head_dim 64)
/// over 30 layers: a decode step at context 129 and 2048, and a 512-token prefill chunk.
fn attention(c: &mut Criterion) {
    if !wanted("invariance_cost_attention/") {
        return;
    }
    let (qh, kvh, hd, layers) = (9, 3, 64, LAYERS);
    let row = kvh * hd;
    let cases = [
        ("decode_ctx129", 129, 1),
        ("decode_ctx2048", 2048, 1),
        ("prefill512", 512, 512),
    ];
    type Attend = fn(&Rows, &[f32], AttnGeometry, &mut [f32]);
    // `blocks16` is the variant's code at the kernel's block size (the same bits): a
    // control for the variant's own overheads.
    let who: [(&str, Attend); 5] = [
        ("invariant16", attend::<Rows>),
        ("blocks16", attend_blocks::<16, Rows>),
        ("blocks8", attend_blocks::<8, Rows>),
        ("blocks64", attend_blocks::<64, Rows>),
        ("blocks256", attend_blocks::<256, Rows>),
    ];
    let mut g = c.benchmark_group("invariance_cost_attention");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    let setup = |len: usize, n_q: usize| {
        let rows = Rows {
            k: activations(len, row),
            v: activations(len, row).into_iter().rev().collect(),
            row,
        };
        let q: Vec<f32> = activations(n_q, qh * hd).iter().map(|x| x * 0.3).collect();
        let geo = AttnGeometry {
            q_heads: qh,
            kv_heads: kvh,
            head_dim: hd,
            first_pos: len - n_q,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        (rows, q, geo)
    };
    let run = |f: Attend, rows: &Rows, q: &[f32], geo: AttnGeometry, out: &mut [f32]| {
        for _ in 0..layers {
            f(rows, q, geo, out);
        }
    };
    for (name, len, n_q) in cases {
        let (rows, q, geo) = setup(len, n_q);
        let mut out = vec![0f32; q.len()];
        for (wname, f) in who {
            g.bench_function(BenchmarkId::new(name, wname), |b| {
                b.iter(|| run(f, &rows, &q, geo, &mut out))
            });
        }
    }
    g.finish();

    let rounds = 15;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\ninvariance cost, attention (30 layers): median µs over {rounds} interleaved rounds, \
         load average at start {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    print!("{:<18}", "case");
    for (name, _) in who {
        print!("{name:>18}");
    }
    println!();
    for (name, len, n_q) in cases {
        let (rows, q, geo) = setup(len, n_q);
        let mut out = vec![0f32; q.len()];
        let mut t: Vec<Vec<f64>> = vec![Vec::new(); who.len()];
        for _ in 0..rounds {
            for (i, (_, f)) in who.iter().enumerate() {
                let s = Instant::now();
                run(*f, &rows, &q, geo, &mut out);
                t[i].push(s.elapsed().as_secs_f64() * 1e6);
            }
        }
        let med: Vec<f64> = t.iter_mut().map(|v| median(v)).collect();
        let mut line = format!("{name:<18}{:>18.1}", med[0]);
        for m in &med[1..] {
            line += &format!("{:>11.1} ({:>4.2})", m, m / med[0]);
        }
        println!("{line}");
    }
    println!("(ratio = contender / invariant16)\n");
}

criterion_group!(benches, products, attention, model);
criterion_main!(benches);

//! A hybrid conversation coming back, against computing it again: the synthetic Qwen3-Next
//! model (`cargo xtask make-hybrid`'s geometry), a prompt of 4K and 8K tokens committed to
//! the bank with its checkpoints, then the next turn (16 more tokens) restored from RAM,
//! from the SSD tier after a restart, or prefilled cold. Prints, in one run: the times and
//! their ratios, the bytes of one checkpoint (this model's and Qwen3-Next-80B's), and the
//! peak heap growth of a cold prefill of 1K, 4K and 8K tokens next to its K/V bytes.
//!
//! `cargo bench -p mtplx-tests --bench hybrid_restore` (also under `cargo xtask bench`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mtplx_bank::{Bank, Commit, LookupQuery, SessionId};
use mtplx_cold::Identity;
use mtplx_kv::{CacheFactory, Sequence, MAX_CHECKPOINTS};
use mtplx_model::hybrid::{synthetic, HybridConfig, HybridModel, HybridWeights};
use mtplx_model::{prefill, LanguageModel};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const CHUNK: usize = 512;
const SUFFIX: usize = 16;

#[path = "../tests/hybrid_support/mod.rs"]
mod hybrid_support;

use hybrid_support::{bank_config, cold_store, xorshift_tokens as tokens};

fn identity() -> Identity {
    hybrid_support::identity("synthetic-hybrid-bench")
}

/// The first turn's state: `prompt` prefilled, checkpoints thinned as the server keeps them.
fn commit(model: &HybridModel, session: &str, prompt: &[u32]) -> Commit {
    let mut seq = model.new_sequence(&CacheFactory::paged());
    prefill(model, prompt, &mut seq, CHUNK).unwrap();
    seq.thin(MAX_CHECKPOINTS);
    Commit {
        session: SessionId::new(session),
        identity: identity(),
        tokens: prompt.to_vec(),
        kv: seq.kv().snapshot(),
        continuation: None,
        checkpoints: seq.checkpoints().map(<[_]>::to_vec),
    }
}

/// Seconds to restore the longest stored prefix of `next` from `bank` and prefill the rest
/// (the next turn's time to its first logits), and the tokens restored.
fn restore_and_finish(bank: &Bank, model: &HybridModel, next: &[u32]) -> (f64, usize) {
    let start = Instant::now();
    let id = identity();
    let plan = bank.lookup(&LookupQuery {
        identity: &id,
        prompt: next,
        session: None,
        floor: 512,
    });
    let restored = plan
        .restore(&CacheFactory::paged(), &model.state_shape())
        .unwrap();
    let mut seq = restored.sequence;
    let at = seq.len();
    prefill(model, &next[at..], &mut seq, CHUNK).unwrap();
    (start.elapsed().as_secs_f64(), at)
}

fn cold(model: &HybridModel, next: &[u32]) -> f64 {
    let start = Instant::now();
    let mut seq = model.new_sequence(&CacheFactory::paged());
    prefill(model, next, &mut seq, CHUNK).unwrap();
    start.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Qwen3-Next-80B-A3B's published geometry (its `config.json`), for the checkpoint size.
fn qwen3_next_80b() -> HybridConfig {
    HybridConfig {
        vocab_size: 151_936,
        hidden_size: 2048,
        intermediate_size: 5120,
        num_layers: 48,
        full_attention_interval: 4,
        layer_types: None,
        rms_norm_eps: 1e-6,
        context_length: 262_144,
        rope_theta: 10_000_000.0,
        partial_rotary_factor: 0.25,
        num_attention_heads: 16,
        num_key_value_heads: 2,
        head_dim: 256,
        linear_num_key_heads: 16,
        linear_num_value_heads: 32,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        linear_conv_kernel_dim: 4,
        tie_word_embeddings: false,
    }
}

fn main() {
    let config = synthetic::config();
    let model = HybridModel::new(config.clone(), &HybridWeights::random(&config, 7)).unwrap();
    let shape = model.state_shape();
    let rounds = 3;
    println!(
        "hybrid restore vs re-prefill: synthetic Qwen3-Next ({} layers, hidden {}), \
         next turn = prompt + {SUFFIX} tokens, prefill chunk {CHUNK}, median of {rounds}",
        config.num_layers, config.hidden_size
    );
    println!("| prompt | cold prefill | RAM restore + rest | SSD restore (restarted) + rest | cold / RAM | cold / SSD | restored at |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for n in [4096usize, 8000] {
        let prompt = tokens(n, 1 + n as u64, config.vocab_size);
        let mut next = prompt.clone();
        next.extend(tokens(SUFFIX, 99, config.vocab_size));

        let cold_s = median((0..rounds).map(|_| cold(&model, &next)).collect());

        let ram = Bank::new(bank_config(10));
        ram.commit(commit(&model, "a", &prompt)).unwrap();
        let ram_runs: Vec<(f64, usize)> = (0..rounds)
            .map(|_| restore_and_finish(&ram, &model, &next))
            .collect();
        drop(ram);

        let dir = tempfile::tempdir().unwrap();
        {
            let bank = Bank::new(bank_config(1)).with_cold(cold_store(dir.path()));
            bank.commit(commit(&model, "a", &prompt)).unwrap();
            // Another conversation takes the only RAM slot: the first spills to the SSD.
            let other = tokens(600, 3, config.vocab_size);
            bank.commit(commit(&model, "b", &other)).unwrap();
            let done = bank.wait_for_spills();
            assert!(done.written >= 1, "{done:?}");
        }
        let mut ssd_runs = Vec::new();
        for _ in 0..rounds {
            // A restarted server: a new bank (empty RAM) over the same SSD directory.
            while mtplx_cold::storage::FsStorage::in_use(dir.path()).unwrap() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let bank = Bank::new(bank_config(1)).with_cold(cold_store(dir.path()));
            ssd_runs.push(restore_and_finish(&bank, &model, &next));
        }
        let at = ram_runs[0].1;
        assert_eq!(
            ssd_runs[0].1, at,
            "RAM and SSD restore at the same checkpoint"
        );
        let ram_s = median(ram_runs.iter().map(|r| r.0).collect());
        let ssd_s = median(ssd_runs.iter().map(|r| r.0).collect());
        println!(
            "| {n} | {:.0} ms | {:.1} ms | {:.1} ms | {:.0}x | {:.0}x | {at} |",
            cold_s * 1e3,
            ram_s * 1e3,
            ssd_s * 1e3,
            cold_s / ram_s,
            cold_s / ssd_s
        );
    }

    println!("\nbytes per checkpoint (f32 recurrent state of every gated delta net):");
    println!("| model | GDN layers | one checkpoint | {MAX_CHECKPOINTS} kept |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, c) in [
        ("synthetic", config.clone()),
        ("Qwen3-Next-80B-A3B", qwen3_next_80b()),
    ] {
        let s = c.state_shape();
        let b = s.recurrent_bytes();
        println!(
            "| {name} | {} | {:.2} MB | {:.1} MB |",
            s.recurrent.len(),
            b as f64 / 1e6,
            (b * MAX_CHECKPOINTS) as f64 / 1e6
        );
    }

    println!("\npeak heap growth of a cold prefill (chunks of {CHUNK}, checkpoints thinned to {MAX_CHECKPOINTS}):");
    println!("| prompt | peak growth | of which K/V | rest |");
    println!("| ---: | ---: | ---: | ---: |");
    for n in [1024usize, 4096, 8000] {
        let prompt = tokens(n, 5, config.vocab_size);
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let mut seq: Sequence = model.new_sequence(&CacheFactory::paged());
        // What the driver does: checkpoints at chunk ends, thinned as it goes.
        for piece in prompt.chunks(CHUNK) {
            model
                .forward(piece, &mut seq, mtplx_model::Want::Nothing)
                .unwrap();
            if seq.checkpoint() {
                seq.thin(MAX_CHECKPOINTS);
            }
        }
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let kv = n * shape.kv.bytes_per_token(mtplx_kv::KvDtype::F32);
        drop(seq);
        println!(
            "| {n} | {:.2} MB | {:.2} MB | {:.2} MB |",
            peak as f64 / 1e6,
            kv as f64 / 1e6,
            peak.saturating_sub(kv) as f64 / 1e6
        );
    }
}

//! Lookup cost against the number of stored entries, and RAM restore (clone) throughput
//! into each layout.
//!
//! `cargo bench -p mtplx-bank --bench bank`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use mtplx_bank::{Bank, BankConfig, Commit, Continuation, Identity, LookupQuery, SessionId};
use mtplx_cold::Mtp;
use mtplx_kv::{CacheFactory, KvShape, KvView, StateShape};

const SHAPE: KvShape = KvShape {
    layers: 8,
    kv_heads: 3,
    head_dim: 64,
};

fn identity() -> Identity {
    Identity {
        model: "bench".into(),
        chat_template: "bench".into(),
        mtp: Mtp::Off,
        policy: "bench".into(),
        kv_dtype: mtplx_bank::cold_dtype(mtplx_kv::KvDtype::F32),
    }
}

fn roomy() -> BankConfig {
    BankConfig {
        max_bytes: u64::MAX,
        max_session_bytes: u64::MAX,
        max_entries: usize::MAX,
        max_entries_per_session: usize::MAX,
        idle_ttl: Duration::from_secs(1 << 30),
        ..BankConfig::for_machine(1 << 40)
    }
}

/// A conversation: a shared 512-token system prompt, then its own tokens.
fn conversation(salt: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| if i < 512 { i } else { salt * 1_000_000 + i })
        .collect()
}

fn view(tokens: usize, shape: KvShape) -> Arc<dyn KvView> {
    let mut c = CacheFactory::contiguous().new_cache(shape);
    let n = tokens * shape.row_len();
    let rows: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
    for layer in 0..shape.layers {
        c.append(layer, &rows, &rows).unwrap();
    }
    c.snapshot()
}

fn commit(bank: &Bank, salt: u32, tokens: Vec<u32>, kv: Arc<dyn KvView>) {
    bank.commit(Commit {
        session: SessionId::new(format!("s{salt}")),
        identity: identity(),
        tokens,
        kv,
        continuation: Some(Continuation::default()),
        checkpoints: None,
    })
    .unwrap();
}

fn lookup(c: &mut Criterion) {
    let tiny = KvShape {
        layers: 1,
        kv_heads: 1,
        head_dim: 1,
    };
    let mut g = c.benchmark_group("lookup_2048_token_entries");
    for n in [8u32, 24, 96] {
        let bank = Bank::new(roomy());
        for s in 0..n {
            commit(&bank, s, conversation(s, 2048), view(2048, tiny));
        }
        let mut prompt = conversation(n / 2, 2048);
        prompt.extend(0..100);
        let id = identity();
        g.bench_with_input(BenchmarkId::from_parameter(n), &prompt, |b, prompt| {
            b.iter(|| {
                let plan = bank.lookup(&LookupQuery {
                    identity: &id,
                    prompt,
                    session: None,
                    floor: 0,
                });
                black_box(plan.cached_tokens())
            })
        });
    }
    g.finish();
}

fn restore(c: &mut Criterion) {
    let tokens = 2048;
    let bank = Bank::new(roomy());
    commit(&bank, 1, conversation(1, tokens), view(tokens, SHAPE));
    let mut prompt = conversation(1, tokens);
    prompt.push(7);
    let id = identity();
    let mut g = c.benchmark_group("ram_clone_restore_2048_tokens");
    g.throughput(Throughput::Bytes(
        (tokens * SHAPE.bytes_per_token(mtplx_kv::KvDtype::F32)) as u64,
    ));
    let factories = [
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", CacheFactory::segmented()),
    ];
    for (name, factory) in factories {
        g.bench_function(name, |b| {
            b.iter(|| {
                let plan = bank.lookup(&LookupQuery {
                    identity: &id,
                    prompt: &prompt,
                    session: None,
                    floor: 0,
                });
                let r = plan
                    .restore(&factory, &StateShape::attention_only(SHAPE))
                    .unwrap();
                black_box(r.prefix_len())
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    lookup(&mut c);
    restore(&mut c);
    c.final_summary();
}

//! Restore throughput against a raw sequential read of the same blob files on the same
//! disk, with the page cache dropped (posix_fadvise DONTNEED) and warm; write throughput;
//! blake3 and manifest overhead as fractions of a restore.
//!
//! `cargo bench -p mtplx-cold --bench cold`; the store goes under `$MTPLX_BENCH_DIR`
//! (default: the system temp dir). A summary of the ratios is printed at the end.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use mtplx_cold::storage::drop_page_cache;
use mtplx_cold::{
    BoxError, ColdCandidate, ColdConfig, ColdIndex, ColdQuery, ColdStore, Identity, KvGeometry,
    KvRows, KvSink, Mtp, Recurrent, SpillEntry, GIB,
};

/// SmolLM2-135M: 30 layers × 3 KV heads × 64 dims (11.25 MiB per 256-token block in f32).
const GEOMETRY: KvGeometry = KvGeometry {
    layers: 30,
    kv_heads: 3,
    head_dim: 64,
};
const TOKENS: usize = 2048;

fn identity() -> Identity {
    Identity {
        model: "smollm2-135m".into(),
        chat_template: "bench".into(),
        mtp: Mtp::Off,
        policy: "bench".into(),
    }
}

fn entry(salt: u32) -> SpillEntry {
    let tokens: Vec<u32> = (0..TOKENS as u32).map(|i| i * 7 + salt).collect();
    let rows = KvRows::from_fn(GEOMETRY, TOKENS, |l, p, i, v| {
        (l * 31 + p * 7 + i) as f32 * if v { 0.5 } else { -0.25 }
    });
    SpillEntry {
        identity: identity(),
        tokens,
        geometry: GEOMETRY,
        kv: Box::new(rows),
        recurrent: Recurrent::None,
        tail: None,
    }
}

/// A contiguous cache the caller preallocated: what a restore into the bank's layout costs.
struct Contiguous {
    row: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Contiguous {
    fn new() -> Contiguous {
        let n = TOKENS * GEOMETRY.row_len();
        let layers = GEOMETRY.layers as usize;
        Contiguous {
            row: GEOMETRY.row_len(),
            k: vec![vec![0.0; n]; layers],
            v: vec![vec![0.0; n]; layers],
        }
    }
}

impl KvSink for Contiguous {
    fn begin(&mut self, _: KvGeometry, _: usize) -> Result<(), BoxError> {
        Ok(())
    }

    fn write_rows(&mut self, l: usize, start: usize, k: &[f32], v: &[f32]) -> Result<(), BoxError> {
        let at = start * self.row;
        self.k[l][at..at + k.len()].copy_from_slice(k);
        self.v[l][at..at + v.len()].copy_from_slice(v);
        Ok(())
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: ColdStore,
    hit: ColdCandidate,
    prompt: Vec<u32>,
    blobs: Vec<PathBuf>,
    bytes: u64,
}

fn fixture() -> Fixture {
    let base = std::env::var_os("MTPLX_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(base).expect("bench dir");
    let config = ColdConfig {
        cap_bytes: 100 * GIB,
        free_disk_floor: 0,
        backlog_cap_bytes: GIB,
    };
    let store = ColdStore::open_dir(dir.path(), config).expect("open");
    let e = entry(0);
    let prompt = e.tokens.clone();
    store.put(&e).expect("put");
    let hit = store
        .lookup(&ColdQuery {
            identity: &identity(),
            prompt: &prompt,
            floor: 0,
        })
        .exact
        .expect("stored");
    let mut blobs: Vec<PathBuf> = std::fs::read_dir(dir.path().join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    blobs.sort();
    let bytes = hit.read_bytes;
    Fixture {
        _dir: dir,
        store,
        hit,
        prompt,
        blobs,
        bytes,
    }
}

fn drop_cache(paths: &[PathBuf]) {
    for p in paths {
        drop_page_cache(p).expect("fadvise");
    }
}

/// Reads every file start to end into one reused buffer.
fn raw_read(paths: &[PathBuf], buf: &mut Vec<u8>) -> u64 {
    let mut n = 0;
    for p in paths {
        let mut f = File::open(p).unwrap();
        buf.clear();
        n += f.read_to_end(buf).unwrap() as u64;
    }
    n
}

fn restore(f: &Fixture, sink: &mut Contiguous) {
    f.store.restore(&f.hit, sink).expect("restore");
}

fn benches(c: &mut Criterion, f: &Fixture) {
    let mut g = c.benchmark_group("restore_2048_tokens");
    g.throughput(Throughput::Bytes(f.bytes));
    let mut sink = Contiguous::new();
    let mut buf = Vec::with_capacity(12 << 20);
    g.bench_function("restore_cold", |b| {
        b.iter_batched(
            || drop_cache(&f.blobs),
            |_| restore(f, &mut sink),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("raw_read_cold", |b| {
        b.iter_batched(
            || drop_cache(&f.blobs),
            |_| raw_read(&f.blobs, &mut buf),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("restore_warm", |b| b.iter(|| restore(f, &mut sink)));
    g.bench_function("raw_read_warm", |b| b.iter(|| raw_read(&f.blobs, &mut buf)));
    g.finish();

    let mut g = c.benchmark_group("write_2048_tokens");
    g.throughput(Throughput::Bytes(f.bytes));
    let mut salt = 1;
    g.bench_function("put", |b| {
        b.iter_custom(|iters| write_time(f, iters, &mut salt))
    });
    g.finish();

    let mut g = c.benchmark_group("overhead");
    let payload = vec![0x5au8; f.bytes as usize];
    g.throughput(Throughput::Bytes(f.bytes));
    g.bench_function("blake3_same_bytes", |b| b.iter(|| blake3::hash(&payload)));
    g.bench_function("lookup", |b| b.iter(|| lookup(f)));
    g.finish();
}

fn lookup(f: &Fixture) -> usize {
    let l = f.store.lookup(&ColdQuery {
        identity: &identity(),
        prompt: &f.prompt,
        floor: 0,
    });
    l.exact.map_or(0, |c| c.covered)
}

/// Time of `iters` puts of fresh entries (each removed afterwards, outside the timing).
fn write_time(f: &Fixture, iters: u64, salt: &mut u32) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        *salt += 1;
        let e = entry(*salt * 1_000_003);
        let t = Instant::now();
        let id = f.store.put(&e).expect("put");
        total += t.elapsed();
        f.store.remove(id).expect("remove");
    }
    total
}

fn median(mut f: impl FnMut() -> Duration, runs: usize) -> f64 {
    let mut v: Vec<f64> = (0..runs).map(|_| f().as_secs_f64()).collect();
    v.sort_by(f64::total_cmp);
    v[runs / 2]
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// The figures the issue asks for, measured side by side in this run.
fn summary(f: &Fixture) {
    let mut sink = Contiguous::new();
    let mut buf = Vec::with_capacity(12 << 20);
    let runs = 7;
    let cold_restore = median(
        || {
            drop_cache(&f.blobs);
            timed(|| restore(f, &mut sink))
        },
        runs,
    );
    let cold_raw = median(
        || {
            drop_cache(&f.blobs);
            timed(|| {
                raw_read(&f.blobs, &mut buf);
            })
        },
        runs,
    );
    let warm_restore = median(|| timed(|| restore(f, &mut sink)), runs);
    let warm_raw = median(
        || {
            timed(|| {
                raw_read(&f.blobs, &mut buf);
            })
        },
        runs,
    );
    let payload = vec![0x5au8; f.bytes as usize];
    let hash = median(
        || {
            timed(|| {
                blake3::hash(&payload);
            })
        },
        runs,
    );
    let look = median(
        || {
            timed(|| {
                lookup(f);
            })
        },
        runs,
    );
    let mut salt = 10_000;
    let write = median(|| write_time(f, 1, &mut salt), 3);
    let gib = |s: f64| f.bytes as f64 / s / GIB as f64;
    println!(
        "\n== mtplx-cold summary ({} MiB, {} blobs, {} tokens) ==",
        f.bytes >> 20,
        f.blobs.len(),
        TOKENS
    );
    println!("restore cold  {:>8.1} ms  {:>5.2} GiB/s   raw read cold {:>8.1} ms  {:>5.2} GiB/s   ratio {:.2}",
        cold_restore * 1e3, gib(cold_restore), cold_raw * 1e3, gib(cold_raw), cold_raw / cold_restore);
    println!("restore warm  {:>8.1} ms  {:>5.2} GiB/s   raw read warm {:>8.1} ms  {:>5.2} GiB/s   ratio {:.2}",
        warm_restore * 1e3, gib(warm_restore), warm_raw * 1e3, gib(warm_raw), warm_raw / warm_restore);
    println!(
        "write         {:>8.1} ms  {:>5.2} GiB/s (fsync'd)",
        write * 1e3,
        gib(write)
    );
    println!(
        "blake3 {:.1} ms = {:.1}% of a cold restore, {:.1}% of a warm one",
        hash * 1e3,
        100.0 * hash / cold_restore,
        100.0 * hash / warm_restore
    );
    println!(
        "lookup {:.3} ms = {:.2}% of a cold restore",
        look * 1e3,
        100.0 * look / cold_restore
    );
}

fn main() {
    let f = fixture();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    benches(&mut c, &f);
    c.final_summary();
    summary(&f);
}

//! Restore throughput against a raw sequential read of the same blob files on the same
//! disk, with the page cache dropped (posix_fadvise DONTNEED) and warm, into rows a sink
//! lends, through staging, and through host buffers a sink lends; write throughput;
//! blake3 and manifest overhead as fractions of a restore.
//!
//! `cargo bench -p mtplx-cold --bench cold`; the store goes under `$MTPLX_BENCH_DIR`
//! (default: the system temp dir), rows are of `$MTPLX_BENCH_KV_DTYPE` (`f32` by default,
//! as the figures in `docs/bench/` were measured; `f16`, the server's default, or `bf16`:
//! half the bytes). A summary of the ratios is printed at the end.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use mtplx_cold::storage::drop_page_cache;
use mtplx_cold::{
    BoxError, ColdCandidate, ColdConfig, ColdIndex, ColdQuery, ColdStore, DirectLayer, DirectPiece,
    Identity, KvDtype, KvGeometry, KvRows, KvSink, Mtp, Recurrent, RestoreTimings, SpillEntry,
    StagingBuffer, GIB,
};

/// The rows' element type: `$MTPLX_BENCH_KV_DTYPE`, f32 by default.
fn dtype() -> KvDtype {
    let name = std::env::var("MTPLX_BENCH_KV_DTYPE").unwrap_or_else(|_| "f32".into());
    KvDtype::ALL
        .into_iter()
        .find(|d| d.as_str() == name)
        .unwrap_or_else(|| panic!("MTPLX_BENCH_KV_DTYPE={name}: not f32, f16, bf16, q8 or q4"))
}

/// SmolLM2-135M: 30 layers × 3 KV heads × 64 dims (11.25 MiB per 256-token block in f32,
/// 5.6 MiB in f16).
fn geometry() -> KvGeometry {
    KvGeometry {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        dtype: dtype(),
    }
}
const TOKENS: usize = 2048;

fn identity() -> Identity {
    Identity {
        model: "smollm2-135m".into(),
        chat_template: "bench".into(),
        mtp: Mtp::Off,
        policy: "bench".into(),
        kv_dtype: dtype(),
    }
}

fn entry(salt: u32) -> SpillEntry {
    let tokens: Vec<u32> = (0..TOKENS as u32).map(|i| i * 7 + salt).collect();
    // Quantized rows are bytes to the cold tier: any bytes do.
    let rows = match geometry().dtype.group() {
        1 => KvRows::from_fn(geometry(), TOKENS, |l, p, i, v| {
            (l * 31 + p * 7 + i) as f32 * if v { 0.5 } else { -0.25 }
        }),
        _ => KvRows::from_bytes_fn(geometry(), TOKENS, |l, i, v| {
            (l * 31 + i * 7 + usize::from(v)) as u8
        }),
    };
    SpillEntry {
        identity: identity(),
        tokens,
        geometry: geometry(),
        kv: Box::new(rows),
        recurrent: Recurrent::None,
        tail: None,
    }
}

/// A cache the caller preallocated. `direct`: it lends its rows, so blocks are read
/// straight into it; otherwise rows are staged and copied in through `write_rows` (what an
/// append-only layout costs), or, with `lent` buffers, read into host buffers it lends and
/// copied in from there (the path of a device's cache, whose copy here is a host one).
/// `page`: it lends its rows in pieces of that many positions, as a paged cache does (the
/// server's default layout has 16-position pages).
struct Contiguous {
    /// Bytes of a row.
    row: usize,
    rows: usize,
    direct: bool,
    page: Option<usize>,
    /// Buffers to lend, kept between restores as a device keeps its own.
    lent: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
}

/// A buffer a lending [`Contiguous`] lent: back to its pool when the restore drops it.
struct Lent {
    bytes: Vec<u8>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl StagingBuffer for Lent {
    fn to_fill(&mut self) -> Result<&mut [u8], BoxError> {
        Ok(&mut self.bytes)
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        self.pool.lock().unwrap().push(bytes);
    }
}

impl Contiguous {
    fn new(direct: bool) -> Contiguous {
        let g = geometry();
        let n = TOKENS * g.row_bytes();
        let layers = g.layers as usize;
        Contiguous {
            row: g.row_bytes(),
            rows: 0,
            direct,
            page: None,
            lent: None,
            k: vec![vec![0; n]; layers],
            v: vec![vec![0; n]; layers],
        }
    }

    fn paged(page: usize) -> Contiguous {
        Contiguous {
            page: Some(page),
            ..Contiguous::new(true)
        }
    }

    fn lending() -> Contiguous {
        Contiguous {
            lent: Some(Arc::default()),
            ..Contiguous::new(false)
        }
    }
}

impl KvSink for Contiguous {
    fn begin(&mut self, _: KvGeometry, rows: usize) -> Result<(), BoxError> {
        self.rows = rows;
        Ok(())
    }

    fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
        let (rows, row, n) = (self.rows, self.row, self.rows * self.row);
        let page = self.page.unwrap_or(rows.max(1));
        self.direct.then(|| {
            self.k
                .iter_mut()
                .zip(self.v.iter_mut())
                .map(|(k, v)| DirectLayer {
                    pieces: k[..n]
                        .chunks_mut(page * row)
                        .zip(v[..n].chunks_mut(page * row))
                        .enumerate()
                        .map(|(j, (k, v))| DirectPiece {
                            positions: j * page..j * page + k.len() / row,
                            k,
                            v,
                        })
                        .collect(),
                })
                .collect()
        })
    }

    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        let pool = self.lent.as_ref()?;
        let lend = |_| {
            let mut kept = pool.lock().unwrap().pop().unwrap_or_default();
            kept.resize(bytes, 0);
            Box::new(Lent {
                bytes: kept,
                pool: pool.clone(),
            }) as Box<dyn StagingBuffer>
        };
        Some((0..count).map(lend).collect())
    }

    fn write_rows(&mut self, l: usize, start: usize, k: &[u8], v: &[u8]) -> Result<(), BoxError> {
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
        write_budget_per_hour: u64::MAX,
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

/// Reads every file into its own part of `dest` (as large as all of them): the copy a
/// restore cannot avoid, into memory the size of what it restores. `raw_read` reuses one
/// file-sized buffer, which stays in the CPU's caches when the files are warm.
fn raw_read_spread(paths: &[PathBuf], dest: &mut [u8]) -> u64 {
    let mut at = 0;
    for p in paths {
        let mut f = File::open(p).unwrap();
        let n = f.metadata().unwrap().len() as usize;
        f.read_exact(&mut dest[at..at + n]).unwrap();
        at += n;
    }
    at as u64
}

fn restore(f: &Fixture, sink: &mut Contiguous) -> RestoreTimings {
    f.store.restore(&f.hit, sink).expect("restore").timings
}

fn benches(c: &mut Criterion, f: &Fixture) {
    let mut g = c.benchmark_group("restore_2048_tokens");
    g.throughput(Throughput::Bytes(f.bytes));
    let mut sink = Contiguous::new(true);
    let mut staged = Contiguous::new(false);
    let mut lending = Contiguous::lending();
    let mut buf = Vec::with_capacity(12 << 20);
    g.bench_function("restore_cold", |b| {
        b.iter_batched(
            || drop_cache(&f.blobs),
            |_| restore(f, &mut sink),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("restore_staged_cold", |b| {
        b.iter_batched(
            || drop_cache(&f.blobs),
            |_| restore(f, &mut staged),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("restore_lent_cold", |b| {
        b.iter_batched(
            || drop_cache(&f.blobs),
            |_| restore(f, &mut lending),
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
    g.bench_function("restore_staged_warm", |b| {
        b.iter(|| restore(f, &mut staged))
    });
    g.bench_function("restore_lent_warm", |b| b.iter(|| restore(f, &mut lending)));
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Medians of one kind of restore: wall time, and the shares of it the manifest and
/// unhidden verification took (from the restore's own timings).
struct Restores {
    time: f64,
    manifest_share: f64,
    stalled_share: f64,
}

fn restores(f: &Fixture, sink: &mut Contiguous, cold: bool, runs: usize) -> Restores {
    let mut time = Vec::new();
    let mut manifest = Vec::new();
    let mut stalled = Vec::new();
    for _ in 0..runs {
        if cold {
            drop_cache(&f.blobs);
        }
        let t = restore(f, sink);
        let total = t.total.as_secs_f64();
        time.push(total);
        manifest.push(t.manifest.as_secs_f64() / total);
        stalled.push(t.io_stalled.as_secs_f64() / total);
    }
    Restores {
        time: median(time),
        manifest_share: median(manifest),
        stalled_share: median(stalled),
    }
}

fn raw(f: &Fixture, cold: bool, runs: usize) -> f64 {
    let mut buf = Vec::with_capacity(12 << 20);
    median(
        (0..runs)
            .map(|_| {
                if cold {
                    drop_cache(&f.blobs);
                }
                timed(|| {
                    raw_read(&f.blobs, &mut buf);
                })
            })
            .collect(),
    )
}

/// The figures the issue asks for, measured side by side in this run: each restore kind
/// alternates with a raw read of the same files, so drift in the machine hits both.
fn summary(f: &Fixture) {
    let runs = 9;
    let mut direct = Contiguous::new(true);
    let mut staged = Contiguous::new(false);
    let mut paged = Contiguous::paged(16);
    let gib = |s: f64| f.bytes as f64 / s / GIB as f64;
    println!(
        "\n== mtplx-cold summary ({} MiB, {} blobs, {} tokens of {} rows, median of {runs}) ==",
        f.bytes >> 20,
        f.blobs.len(),
        TOKENS,
        dtype(),
    );
    for (name, cold) in [("cold", true), ("warm", false)] {
        let raw_t = raw(f, cold, runs);
        let d = restores(f, &mut direct, cold, runs);
        let s = restores(f, &mut staged, cold, runs);
        let p = restores(f, &mut paged, cold, runs);
        let raw_t = raw_t.min(raw(f, cold, runs));
        println!(
            "{name}: raw read {:>7.1} ms {:>5.2} GiB/s | restore direct {:>7.1} ms {:>5.2} GiB/s = {:.2}x raw | restore staged {:>7.1} ms = {:.2}x raw",
            raw_t * 1e3,
            gib(raw_t),
            d.time * 1e3,
            gib(d.time),
            raw_t / d.time,
            s.time * 1e3,
            raw_t / s.time,
        );
        println!(
            "{name}: restore direct into 16-position pages {:>7.1} ms = {:.2}x raw",
            p.time * 1e3,
            raw_t / p.time,
        );
        println!(
            "{name}: share of restore time: blake3 not hidden by I/O {:.2}% (staged: hashing + copying {:.2}%), manifest {:.3}%",
            100.0 * d.stalled_share,
            100.0 * s.stalled_share,
            100.0 * d.manifest_share,
        );
        if !cold {
            let total: u64 = f
                .blobs
                .iter()
                .map(|p| std::fs::metadata(p).unwrap().len())
                .sum();
            let mut dest = vec![0u8; total as usize];
            let spread = median(
                (0..runs)
                    .map(|_| {
                        timed(|| {
                            raw_read_spread(&f.blobs, &mut dest);
                        })
                    })
                    .collect(),
            );
            println!(
                "{name}: raw read into one {} MiB destination (the copy a restore can't avoid) {:>7.1} ms {:>5.2} GiB/s | restore direct = {:.2}x that",
                f.bytes >> 20,
                spread * 1e3,
                gib(spread),
                spread / d.time,
            );
        }
    }
    let payload = vec![0x5au8; f.bytes as usize];
    let hash = median(
        (0..runs)
            .map(|_| {
                timed(|| {
                    blake3::hash(&payload);
                })
            })
            .collect(),
    );
    println!(
        "blake3 of the same bytes on one core: {:.1} ms ({:.2} GiB/s), the CPU work the reader overlaps",
        hash * 1e3,
        gib(hash)
    );
    let mut salt = 10_000;
    let write = median(
        (0..3)
            .map(|_| write_time(f, 1, &mut salt).as_secs_f64())
            .collect(),
    );
    println!(
        "write {:>7.1} ms {:>5.2} GiB/s (blobs fsync'd, manifest committed)",
        write * 1e3,
        gib(write)
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

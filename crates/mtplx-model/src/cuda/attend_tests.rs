//! The attention kernels against host references and against themselves: a row's bits
//! whichever rows share its launch, whichever kernel (decode tile, prefill rows) and however
//! many parts a block takes; past many key parts. Skipped without a device unless
//! `MTPLX_CUDA_TESTS=1`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use mtplx_kv::{KvCache, KvDtype, KvShape, KvView};

use super::cache::CudaKvCache;
use super::device::attention::{AttendIn, AttendPath};
use super::device::{AttendParts, CudaDevice};
use super::source::ATTEND_MMA_HEADS;
use super::tests::{device, Rng};

/// One layer's cache (`kv`, its addresses) attended by query rows whose first sits at cache
/// row `row0`, over a window of `len` positions.
struct Attention<'a> {
    kv: &'a CudaSlice<u64>,
    dtype: KvDtype,
    heads: (usize, usize, usize),
    scale: f32,
    len: usize,
    row0: usize,
}

impl Attention<'_> {
    /// The attention of query rows `first .. first + rows` of `q` (`[rows, qh, hd]` each),
    /// in one call, as the host reads it back.
    fn run(&self, dev: &CudaDevice, q: &[f32], first: usize, rows: usize) -> Vec<f32> {
        let (qh, _, hd) = self.heads;
        let at = (self.row0 + first) as u32;
        let meta = dev.upload(&[at, at]).unwrap();
        let qd = dev
            .upload(&q[first * qh * hd..(first + rows) * qh * hd])
            .unwrap();
        let mut parts = AttendParts::new(dev, rows, self.heads, self.len).unwrap();
        let mut out = dev.zeros::<f32>(rows * qh * hd).unwrap();
        let a = AttendIn {
            q: &qd,
            kv: self.kv,
            kv_dtype: self.dtype,
            layer: 0,
            heads: self.heads,
            n: rows,
            meta: &meta,
            scale: self.scale,
            max_len: self.len,
        };
        dev.attend(&a, &mut parts, &mut out).unwrap();
        let mut host = vec![0f32; rows * qh * hd];
        dev.read(&out, 0, &mut host).unwrap();
        host
    }
}

/// One layer's `f16` cache of `len` positions, K and V drawn from `rng` (K's rows first),
/// and its addresses on the device.
fn random_f16_cache(
    dev: &Arc<CudaDevice>,
    rng: &mut Rng,
    len: usize,
    (kvh, hd): (usize, usize),
) -> (CudaKvCache, CudaSlice<u64>) {
    let shape = KvShape {
        layers: 1,
        kv_heads: kvh,
        head_dim: hd,
    };
    let k: Vec<f32> = (0..len * kvh * hd).map(|_| rng.unit()).collect();
    let v: Vec<f32> = (0..len * kvh * hd).map(|_| rng.unit()).collect();
    let mut cache = CudaKvCache::new(dev.clone(), shape, KvDtype::F16);
    cache.append(0, &k, &v).unwrap();
    let kv = dev.upload(&cache.addresses()).unwrap();
    (cache, kv)
}

/// A prefill chunk's attention over an `f16` cache (on sm_80 and later the tensor cores'
/// `attend_mma`, whose tiles hold 16 (row, head) pairs; before, `attend_tile_h` from 16
/// rows) gives each row the bits that row gets alone (a decode step): rows whose context
/// fits one part, rows whose block straddles a part's edge (some rows with one part, some
/// with two), rows past several parts, a launch's partial block, heads of 64 and 128
/// values, four query heads a KV head, and three and seven (SmolLM2's and Qwen2.5-0.5B's:
/// a row's heads split across two tiles).
#[test]
fn prefill_attention_tiles_give_each_rows_decode_bits() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(37);
    for (hd, qh, kvh) in [
        (64usize, 8usize, 2usize),
        (128, 8, 2),
        (64, 9, 3),
        (64, 14, 2),
    ] {
        assert_tensor_cores_where_built(&dev, (qh, kvh, hd));
        let len = 1600;
        let (_cache, kv) = random_f16_cache(&dev, &mut rng, len, (kvh, hd));
        let scale = 1.0 / (hd as f32).sqrt();
        for (row0, n) in [(0usize, 70usize), (200, 70), (1500, 40)] {
            let q: Vec<f32> = (0..n * qh * hd).map(|_| rng.unit() * 4.0).collect();
            let at = Attention {
                kv: &kv,
                dtype: KvDtype::F16,
                heads: (qh, kvh, hd),
                scale,
                len,
                row0,
            };
            let run = |first: usize, rows: usize| at.run(&dev, &q, first, rows);
            let block = run(0, n);
            for r in 0..n {
                let alone = run(r, 1);
                let got = &block[r * qh * hd..(r + 1) * qh * hd];
                for (i, (a, b)) in got.iter().zip(&alone).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "hd {hd}, rows from {row0}: row {r} head {} dim {}: {a} vs {b}",
                        i / hd,
                        i % hd
                    );
                }
            }
        }
    }
}

/// A tensor-core attention block that takes several parts one after another (a long
/// prefill chunk on a large device) gives every row the bits that blocks of one part each
/// give it, on both kernels (a prefill chunk's rows, a decode step's tile): rows on both
/// sides of a part's first key (4,608), so some blocks hold only some of a row's parts and
/// some none of them.
#[test]
fn a_block_of_several_parts_gives_each_parts_bits() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(53);
    for (qh, kvh, hd) in [(8usize, 2usize, 128usize), (9, 3, 64)] {
        assert_tensor_cores_where_built(&dev, (qh, kvh, hd));
        let len = 4700;
        let (_cache, kv) = random_f16_cache(&dev, &mut rng, len, (kvh, hd));
        let (row0, n) = (4600, 100);
        let q: Vec<f32> = (0..n * qh * hd).map(|_| rng.unit() * 4.0).collect();
        let at = Attention {
            kv: &kv,
            dtype: KvDtype::F16,
            heads: (qh, kvh, hd),
            scale: 1.0 / (hd as f32).sqrt(),
            len,
            row0,
        };
        let runs = |per: usize| {
            dev.force_attend_span(per);
            let block = at.run(&dev, &q, 0, n);
            let rows: Vec<Vec<f32>> = [0, 7, 8, 99].map(|r| at.run(&dev, &q, r, 1)).into();
            dev.force_attend_span(0);
            (block, rows)
        };
        let one = runs(1);
        for per in [2, 3, 8] {
            let (block, rows) = runs(per);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&block),
                bits(&one.0),
                "{qh}/{kvh}x{hd}, {per} parts a block"
            );
            for (r, (a, b)) in rows.iter().zip(&one.1).enumerate() {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "{qh}/{kvh}x{hd}, {per} parts a block, row {r}"
                );
            }
        }
    }
}

/// On a device of sm_80 or later (unless `MTPLX_CUDA_ATTEND_MMA=0`), attention over an
/// `f16` cache with heads of 64 or 128 values runs on tensor cores at every row count (so
/// the tests of its bits test that kernel, and a kernel that failed to load is a failure,
/// not a silent fallback).
fn assert_tensor_cores_where_built(dev: &CudaDevice, heads: (usize, usize, usize)) {
    let built = dev.capability().0 >= 8
        && super::switches::switched_on("MTPLX_CUDA_ATTEND_MMA")
        && ATTEND_MMA_HEADS.contains(&heads.2);
    // On unless switched off (a device run with it off tests the 64-pair kernel alone).
    let split = built && super::switches::switched_on("MTPLX_CUDA_ATTEND_SPLIT");
    for n in [1, 4, 70] {
        let path = dev.attend_path(KvDtype::F16, heads, n).unwrap();
        assert_eq!(
            path == AttendPath::TensorCores,
            built,
            "{heads:?}, {n} rows: {path:?}"
        );
        // A decode step's row (and 4 rows of up to 4 heads a KV head) on the split kernel.
        assert_eq!(
            dev.attend_splits(heads, n).unwrap(),
            split && n * (heads.0 / heads.1) <= 16,
            "{heads:?}, {n} rows: split"
        );
    }
}

/// Attention over 20,000 cached positions (79 parts of 256), rows stored as `f32` and as
/// `f16` (heads of 64 and 128 values, two to seven query heads a KV head), equals a
/// float64 softmax over the stored values, and a query row's output is the same bits
/// alone or in a block of rows.
#[test]
fn attention_runs_past_many_parts_and_is_row_invariant() {
    let Some(dev) = device() else { return };
    for (dtype, heads) in [
        (KvDtype::F32, (4, 2, 64)),
        (KvDtype::F16, (4, 2, 64)),
        (KvDtype::F16, (14, 2, 64)),
        (KvDtype::F16, (8, 2, 128)),
    ] {
        attention_over(&dev, dtype, heads);
    }
}

fn attention_over(dev: &Arc<CudaDevice>, dtype: KvDtype, heads: (usize, usize, usize)) {
    let mut rng = Rng(11);
    let ((qh, kvh, hd), len) = (heads, 20_000usize);
    let shape = KvShape {
        layers: 1,
        kv_heads: kvh,
        head_dim: hd,
    };
    let row = kvh * hd;
    let k: Vec<f32> = (0..len * row).map(|_| rng.unit()).collect();
    let v: Vec<f32> = (0..len * row).map(|_| rng.unit()).collect();
    let mut cache = CudaKvCache::new(dev.clone(), shape, dtype);
    cache.append(0, &k, &v).unwrap();
    // Stored as the host rounds them, and read back as stored.
    let (mut kb, mut vb) = (
        vec![0u8; dtype.bytes(len * row)],
        vec![0u8; dtype.bytes(len * row)],
    );
    cache.read_raw(0, 0..len, &mut kb, &mut vb).unwrap();
    assert_eq!((kb, vb), (dtype.encode(&k), dtype.encode(&v)), "{dtype}");
    let (k, v) = (
        dtype.decode(&dtype.encode(&k)).unwrap(),
        dtype.decode(&dtype.encode(&v)).unwrap(),
    );
    let kv = dev.upload(&cache.addresses()).unwrap();
    let n = 3;
    let row0 = len - n;
    let q: Vec<f32> = (0..n * qh * hd).map(|_| rng.unit() * 4.0).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    let at = Attention {
        kv: &kv,
        dtype,
        heads: (qh, kvh, hd),
        scale,
        len,
        row0,
    };
    let run = |rows: usize, first: usize| at.run(dev, &q, first, rows);
    let block = run(n, 0);
    for r in 0..n {
        let upto = row0 + r + 1;
        for h in 0..qh {
            let g = h / (qh / kvh);
            let qr = &q[(r * qh + h) * hd..(r * qh + h + 1) * hd];
            let scores: Vec<f64> = (0..upto)
                .map(|j| {
                    let kr = &k[j * row + g * hd..j * row + (g + 1) * hd];
                    qr.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..upto)
                    .map(|j| e[j] * v[j * row + g * hd + d] as f64)
                    .sum::<f64>()
                    / l;
                let got = block[(r * qh + h) * hd + d] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "{dtype} {heads:?}: row {r} head {h} dim {d}: {got} vs {want}"
                );
            }
        }
    }
    let alone = run(1, n - 1);
    assert_eq!(
        alone,
        block[(n - 1) * qh * hd..],
        "{dtype} {heads:?}: the last row alone"
    );
}

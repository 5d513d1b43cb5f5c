//! Random append (copied or filled in place) / trim / snapshot / fork / convert / restore
//! sequences run on all three layouts at once, against a plain reference copy of the rows.

use std::sync::Arc;

use mtplx_kv::{
    footprint, BlockPool, CacheFactory, KvCache, KvDtype, KvShape, KvView, Layout, LayoutKind,
    LentLayer,
};
use proptest::prelude::*;

const LAYOUTS: usize = 3;
const MAX_SEQS: usize = 6;

#[derive(Debug, Clone)]
struct Config {
    shape: KvShape,
    /// Query heads per KV head.
    group: usize,
    chunk_tokens: usize,
    block_tokens: usize,
    segment_tokens: usize,
    /// What every layout stores rows as.
    dtype: KvDtype,
}

impl Config {
    fn factories(&self, pool: &BlockPool) -> [CacheFactory; LAYOUTS] {
        [
            Layout::Contiguous {
                chunk_tokens: self.chunk_tokens,
            },
            Layout::Paged {
                block_tokens: self.block_tokens,
                pool: pool.clone(),
            },
            Layout::Segmented {
                segment_tokens: self.segment_tokens,
            },
        ]
        .map(|l| CacheFactory::from(l).with_dtype(self.dtype).unwrap())
    }

    /// `x` (whole rows) as the caches store it.
    fn stored(&self, x: &[f32]) -> Vec<f32> {
        self.dtype.decode(&self.encoded(x)).unwrap()
    }

    /// `x` (whole rows) as the bytes of stored values.
    fn encoded(&self, x: &[f32]) -> Vec<u8> {
        self.dtype.encode(x)
    }

    /// Bytes of `rows` stored rows.
    fn row_bytes(&self, rows: usize) -> usize {
        self.dtype.bytes(rows * self.shape.row_len())
    }
}

fn config() -> impl Strategy<Value = Config> {
    (
        1usize..=3,
        1usize..=3,
        prop::sample::select(vec![2usize, 4, 8, 12, 16]),
        1usize..=3,
        1usize..=40,
        prop::sample::select(vec![1usize, 3, 4, 16, 32]),
        1usize..=70,
        prop::sample::select(KvDtype::ALL.to_vec()),
    )
        .prop_map(
            |(
                layers,
                kv_heads,
                head_dim,
                group,
                chunk_tokens,
                block_tokens,
                segment_tokens,
                dtype,
            )| {
                // A quantized type stores heads of whole groups of 32 values.
                let head_dim = if dtype.is_quantized() {
                    dtype.group() * (1 + head_dim / 8)
                } else {
                    head_dim
                };
                Config {
                    shape: KvShape {
                        layers,
                        kv_heads,
                        head_dim,
                    },
                    group,
                    chunk_tokens,
                    block_tokens,
                    segment_tokens,
                    dtype,
                }
            },
        )
}

#[derive(Debug, Clone)]
enum Op {
    /// `n` rows appended as values or (`stored`) as their stored bytes, at an odd address
    /// ([`KvCache::append_stored`]).
    Append {
        seq: usize,
        n: usize,
        seed: u64,
        stored: bool,
    },
    /// Like `Append`, but the rows are written into storage the cache lends
    /// ([`KvCache::append_in_place`]).
    AppendInPlace {
        seq: usize,
        n: usize,
        seed: u64,
    },
    Trim {
        seq: usize,
        keep: f64,
    },
    Snapshot {
        seq: usize,
    },
    Fork {
        seq: usize,
    },
    /// Rebuild each layout's cache from another layout's cache.
    Convert {
        seq: usize,
        rot: usize,
    },
    /// A new sequence restored from a snapshot, each layout from the snapshot of layout
    /// `(i + rot) % 3`.
    Restore {
        snap: usize,
        keep: f64,
        rot: usize,
    },
    /// Drop a sequence (its caches), so blocks and segments others share become theirs alone.
    DropSeq {
        seq: usize,
    },
    DropSnap {
        snap: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0usize..MAX_SEQS;
    prop_oneof![
        5 => (seq.clone(), 1usize..=40, any::<u64>(), any::<bool>())
            .prop_map(|(seq, n, seed, stored)| Op::Append { seq, n, seed, stored }),
        3 => (seq.clone(), 0usize..=40, any::<u64>()).prop_map(|(seq, n, seed)| Op::AppendInPlace { seq, n, seed }),
        2 => (seq.clone(), 0.0f64..1.2).prop_map(|(seq, keep)| Op::Trim { seq, keep }),
        2 => seq.clone().prop_map(|seq| Op::Snapshot { seq }),
        2 => seq.clone().prop_map(|seq| Op::Fork { seq }),
        1 => (seq, 1usize..LAYOUTS).prop_map(|(seq, rot)| Op::Convert { seq, rot }),
        1 => (0usize..16, 0.0f64..1.0, 0usize..LAYOUTS)
            .prop_map(|(snap, keep, rot)| Op::Restore { snap, keep, rot }),
        1 => (0usize..MAX_SEQS).prop_map(|seq| Op::DropSeq { seq }),
        1 => (0usize..16).prop_map(|snap| Op::DropSnap { snap }),
    ]
}

/// xorshift64*: test data that proptest can replay from a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        x as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// The rows a sequence should hold, per layer: flat K and V.
#[derive(Debug, Clone)]
struct Reference {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Reference {
    fn len(&self, row: usize) -> usize {
        self.k[0].len() / row
    }
    fn truncated(&self, len: usize, row: usize) -> Reference {
        Reference {
            k: self.k.iter().map(|k| k[..len * row].to_vec()).collect(),
            v: self.v.iter().map(|v| v[..len * row].to_vec()).collect(),
        }
    }
}

struct Seq {
    reference: Reference,
    caches: [Box<dyn KvCache>; LAYOUTS],
}

struct Snap {
    reference: Reference,
    views: [Arc<dyn KvView>; LAYOUTS],
}

/// Textbook causal softmax attention in f64 for query `qi` of `n_q` (at the newest
/// positions), head `h`.
fn naive(cfg: &Config, r: &Reference, layer: usize, q: &[f32], pos: usize, h: usize) -> Vec<f64> {
    let KvShape {
        kv_heads, head_dim, ..
    } = cfg.shape;
    let row = kv_heads * head_dim;
    let off = (h / cfg.group) * head_dim;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let (k, v) = (&r.k[layer], &r.v[layer]);
    let s: Vec<f64> = (0..=pos)
        .map(|j| {
            let kr = &k[j * row + off..j * row + off + head_dim];
            q.iter()
                .zip(kr)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..head_dim)
        .map(|d| {
            (0..=pos)
                .map(|j| e[j] * v[j * row + off + d] as f64)
                .sum::<f64>()
                / z
        })
        .collect()
}

fn check_rows(cfg: &Config, r: &Reference, view: &dyn KvView) -> Result<(), TestCaseError> {
    let row = cfg.shape.row_len();
    let len = r.len(row);
    prop_assert_eq!(view.len(), len);
    for layer in 0..cfg.shape.layers {
        prop_assert_eq!(view.layer_len(layer), len);
        let (mut k, mut v) = (vec![0f32; len * row], vec![0f32; len * row]);
        view.read_rows(layer, 0..len, &mut k, &mut v).unwrap();
        prop_assert!(
            k == r.k[layer] && v == r.v[layer],
            "{:?} rows differ",
            view.layout()
        );
        // As bytes: the stored values themselves.
        let bytes = cfg.row_bytes(len);
        let (mut kb, mut vb) = (vec![0u8; bytes], vec![0u8; bytes]);
        view.read_raw(layer, 0..len, &mut kb, &mut vb).unwrap();
        prop_assert!(kb == cfg.encoded(&r.k[layer]) && vb == cfg.encoded(&r.v[layer]));
    }
    Ok(())
}

fn check_bytes(cfg: &Config, r: &Reference, view: &dyn KvView) -> Result<(), TestCaseError> {
    let len = r.len(cfg.shape.row_len());
    prop_assert_eq!(view.dtype(), cfg.dtype);
    prop_assert_eq!(
        view.logical_bytes(),
        len * cfg.shape.bytes_per_token(cfg.dtype)
    );
    // Every buffer is reported once and physical bytes are exactly the buffers reported.
    prop_assert_eq!(footprint(&[view]), view.physical_bytes());
    prop_assert!(view.physical_bytes() >= view.logical_bytes());
    prop_assert!(view.unique_bytes() <= view.physical_bytes());
    if view.layout() == LayoutKind::Paged {
        let b = cfg.block_tokens;
        let blocks = cfg.shape.layers * len.div_ceil(b);
        prop_assert_eq!(view.physical_bytes(), blocks * 2 * cfg.row_bytes(b));
    }
    Ok(())
}

/// Attention of random queries at the newest positions: every layout bit-identical, all
/// within 1e-5 of the f64 reference, and the newest query's output the same bits whether
/// computed alone or in a block.
fn check_attention(cfg: &Config, seq: &Seq, seed: u64) -> Result<(), TestCaseError> {
    let KvShape {
        layers, head_dim, ..
    } = cfg.shape;
    let row = cfg.shape.row_len();
    let len = seq.reference.len(row);
    if len == 0 {
        return Ok(());
    }
    let q_heads = cfg.shape.kv_heads * cfg.group;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut rng = Rng::new(seed);
    for layer in 0..layers {
        let n_q = 1 + (seed as usize + layer) % len.min(4);
        let q = rng.fill(
            n_q * q_heads * head_dim,
            if seed.is_multiple_of(3) { 8.0 } else { 1.0 },
        );
        let outs: Vec<Vec<f32>> = seq
            .caches
            .iter()
            .map(|c| {
                let mut out = vec![0f32; q.len()];
                c.attend(layer, &q, q_heads, scale, &mut out).unwrap();
                out
            })
            .collect();
        let bits = |o: &[f32]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for o in &outs[1..] {
            prop_assert_eq!(bits(o), bits(&outs[0]), "layouts disagree in bits");
        }
        for qi in 0..n_q {
            for h in 0..q_heads {
                let at = (qi * q_heads + h) * head_dim;
                let want = naive(
                    cfg,
                    &seq.reference,
                    layer,
                    &q[at..at + head_dim],
                    len - n_q + qi,
                    h,
                );
                for (a, b) in outs[0][at..at + head_dim].iter().zip(&want) {
                    prop_assert!((*a as f64 - b).abs() < 1e-5, "{} vs {}", a, b);
                }
            }
        }
        let last = (n_q - 1) * q_heads * head_dim;
        for c in &seq.caches {
            let mut one = vec![0f32; q_heads * head_dim];
            c.attend(layer, &q[last..], q_heads, scale, &mut one)
                .unwrap();
            prop_assert_eq!(
                bits(&one),
                bits(&outs[0][last..]),
                "batch size changed bits"
            );
        }
    }
    Ok(())
}

fn run(cfg: Config, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let pool = BlockPool::new();
    let factories = cfg.factories(&pool);
    let row = cfg.shape.row_len();
    let layers = cfg.shape.layers;
    let mut seqs = vec![Seq {
        reference: Reference {
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
        },
        caches: [0, 1, 2].map(|i| factories[i].new_cache(cfg.shape)),
    }];
    let mut snaps: Vec<Snap> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Append {
                seq,
                n,
                seed,
                stored,
            } => {
                let at = seq % seqs.len();
                let s = &mut seqs[at];
                let mut rng = Rng::new(seed);
                for layer in 0..layers {
                    let (k, v) = (rng.fill(n * row, 1.0), rng.fill(n * row, 1.0));
                    // The stored bytes, one byte into a buffer: not aligned for the type.
                    let odd = |x: &[f32]| [&[0u8][..], &cfg.encoded(x)].concat();
                    let (kb, vb) = (odd(&k), odd(&v));
                    for c in &mut s.caches {
                        match stored {
                            true => c.append_stored(layer, &kb[1..], &vb[1..]).unwrap(),
                            false => c.append(layer, &k, &v).unwrap(),
                        }
                    }
                    s.reference.k[layer].extend(cfg.stored(&k));
                    s.reference.v[layer].extend(cfg.stored(&v));
                }
            }
            Op::AppendInPlace { seq, n, seed } => {
                let at = seq % seqs.len();
                let s = &mut seqs[at];
                let mut rng = Rng::new(seed);
                let start = s.reference.len(row);
                let rows: Vec<_> = (0..layers)
                    .map(|_| (rng.fill(n * row, 1.0), rng.fill(n * row, 1.0)))
                    .collect();
                for c in &mut s.caches {
                    let layout = c.layout();
                    let lent = c.append_in_place(n).expect("every layout lends");
                    prop_assert_eq!(lent.len(), layers);
                    for (layer, (k, v)) in lent.into_iter().zip(&rows) {
                        fill_lent(layer, start, n, &cfg.encoded(k), &cfg.encoded(v))
                            .map_err(|e| TestCaseError::fail(format!("{layout:?}: {e}")))?;
                    }
                }
                for (layer, (k, v)) in rows.iter().enumerate() {
                    s.reference.k[layer].extend(cfg.stored(k));
                    s.reference.v[layer].extend(cfg.stored(v));
                }
            }
            Op::Trim { seq, keep } => {
                let at = seq % seqs.len();
                let s = &mut seqs[at];
                let len = (s.reference.len(row) as f64 * keep) as usize;
                for c in &mut s.caches {
                    c.truncate(len);
                }
                if len < s.reference.len(row) {
                    s.reference = s.reference.truncated(len, row);
                }
            }
            Op::Snapshot { seq } => {
                let s = &seqs[seq % seqs.len()];
                snaps.push(Snap {
                    reference: s.reference.clone(),
                    views: [0, 1, 2].map(|i| s.caches[i].snapshot()),
                });
            }
            Op::Fork { seq } => {
                if seqs.len() < MAX_SEQS {
                    let s = &seqs[seq % seqs.len()];
                    let forked = Seq {
                        reference: s.reference.clone(),
                        caches: [0, 1, 2].map(|i| s.caches[i].fork()),
                    };
                    // Paged and segmented forks allocate nothing.
                    for i in 1..LAYOUTS {
                        let (a, b) = (&*s.caches[i], &*forked.caches[i]);
                        prop_assert_eq!(
                            footprint(&[view_of(a), view_of(b)]),
                            footprint(&[view_of(a)])
                        );
                    }
                    seqs.push(forked);
                }
            }
            Op::Convert { seq, rot } => {
                let at = seq % seqs.len();
                let s = &mut seqs[at];
                let len = s.reference.len(row);
                let converted = [0, 1, 2].map(|i| {
                    let from = &*s.caches[(i + rot) % LAYOUTS];
                    factories[i].restore(from, len).unwrap()
                });
                for (i, c) in converted.iter().enumerate() {
                    prop_assert_eq!(c.layout(), factories[i].layout());
                }
                s.caches = converted;
            }
            Op::Restore { snap, keep, rot } => {
                if !snaps.is_empty() && seqs.len() < MAX_SEQS {
                    let sn = &snaps[snap % snaps.len()];
                    let len = (sn.reference.len(row) as f64 * keep) as usize;
                    let caches = [0, 1, 2].map(|i| {
                        let from = &*sn.views[(i + rot) % LAYOUTS];
                        factories[i].restore(from, len).unwrap()
                    });
                    seqs.push(Seq {
                        reference: sn.reference.truncated(len, row),
                        caches,
                    });
                }
            }
            Op::DropSeq { seq } => {
                if seqs.len() > 1 {
                    let at = seq % seqs.len();
                    seqs.remove(at);
                }
            }
            Op::DropSnap { snap } => {
                if !snaps.is_empty() {
                    let at = snap % snaps.len();
                    snaps.remove(at);
                }
            }
        }
        for (i, s) in seqs.iter().enumerate() {
            for c in &s.caches {
                check_rows(&cfg, &s.reference, view_of(&**c))?;
                check_bytes(&cfg, &s.reference, view_of(&**c))?;
            }
            check_attention(&cfg, s, (step * 7 + i) as u64)?;
        }
        // Snapshots never change, whatever their origins did since.
        for sn in &snaps {
            for v in &sn.views {
                check_rows(&cfg, &sn.reference, &**v)?;
                check_bytes(&cfg, &sn.reference, &**v)?;
            }
        }
        // The pool's live blocks are exactly those the caches and snapshots reference.
        let mut paged: Vec<&dyn KvView> = seqs.iter().map(|s| view_of(&*s.caches[1])).collect();
        paged.extend(snaps.iter().map(|s| &*s.views[1]));
        prop_assert_eq!(pool.stats().live_bytes, footprint(&paged));
    }
    drop((seqs, snaps));
    prop_assert_eq!(
        pool.stats().live_blocks,
        0,
        "every block went back to the pool"
    );
    Ok(())
}

/// Checks that `layer`'s lent pieces are zeroed and cover positions `start .. start + n` in
/// order, then fills them with the bytes `k` and `v` (`n` rows each).
fn fill_lent(
    layer: LentLayer<'_>,
    start: usize,
    n: usize,
    k: &[u8],
    v: &[u8],
) -> Result<(), String> {
    let mut at = start;
    // Bytes per stored row (a quantized row is not a whole number of bytes per value).
    let per_row = k.len().checked_div(n).unwrap_or(0);
    for p in layer.pieces {
        if p.positions.start != at || p.positions.end > start + n {
            return Err(format!("piece {:?} after position {at}", p.positions));
        }
        let len = p.positions.len() * per_row;
        if p.k.len() != len || p.v.len() != len {
            return Err(format!(
                "piece {:?} holds {} values",
                p.positions,
                p.k.len()
            ));
        }
        if p.k.iter().chain(p.v.iter()).any(|x| *x != 0) {
            return Err(format!("piece {:?} is not zeroed", p.positions));
        }
        let from = (at - start) * per_row;
        p.k.copy_from_slice(&k[from..from + len]);
        p.v.copy_from_slice(&v[from..from + len]);
        at = p.positions.end;
    }
    match at == start + n {
        true => Ok(()),
        false => Err(format!("pieces end at {at}, not {}", start + n)),
    }
}

/// 256 cases by default; `PROPTEST_CASES` overrides.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

/// A cache seen as a view (trait upcasting).
fn view_of(c: &dyn KvCache) -> &dyn KvView {
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn layouts_agree_with_the_reference_and_each_other(
        cfg in config(),
        ops in prop::collection::vec(op(), 1..30),
    ) {
        run(cfg, ops)?;
    }

    /// A fork of a `len`-token cache that appends `n` tokens grows the memory the two hold
    /// together by its own new tokens only: for paged, the blocks from the fork's first
    /// partly filled block on; for segmented, its new segments.
    #[test]
    fn a_fork_pays_only_for_its_new_tokens(
        cfg in config(),
        len in 0usize..120,
        n in 1usize..60,
        one_at_a_time in any::<bool>(),
    ) {
        let pool = BlockPool::new();
        let factories = cfg.factories(&pool);
        let row = cfg.shape.row_len();
        let row_bytes = 2 * cfg.row_bytes(1) * cfg.shape.layers;
        let mut rng = Rng::new(len as u64 * 31 + n as u64);
        for (i, f) in factories.iter().enumerate().skip(1) {
            let mut origin = f.new_cache(cfg.shape);
            for layer in 0..cfg.shape.layers {
                origin.append(layer, &rng.fill(len * row, 1.0), &rng.fill(len * row, 1.0)).unwrap();
            }
            let before = footprint(&[view_of(&*origin)]);
            let mut fork = origin.fork();
            let steps: Vec<usize> = if one_at_a_time { vec![1; n] } else { vec![n] };
            for step in steps {
                for layer in 0..cfg.shape.layers {
                    fork.append(layer, &rng.fill(step * row, 1.0), &rng.fill(step * row, 1.0)).unwrap();
                }
            }
            prop_assert_eq!(footprint(&[view_of(&*origin)]), before, "the origin is untouched");
            let grown = footprint(&[view_of(&*origin), view_of(&*fork)]) - before;
            prop_assert_eq!(grown, fork.unique_bytes());
            if i == 1 {
                let b = cfg.block_tokens;
                let blocks = (len + n).div_ceil(b) - len / b;
                let block = 2 * cfg.row_bytes(b);
                prop_assert_eq!(grown, blocks * cfg.shape.layers * block);
            } else {
                prop_assert!(grown >= n * row_bytes);
                prop_assert!(grown <= (2 * n + 16) * row_bytes, "{} for {} tokens", grown, n);
            }
        }
    }
}

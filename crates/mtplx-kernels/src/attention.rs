//! The attention kernel every layout shares.
//!
//! Keys are reduced in fixed blocks of [`ATTN_BLOCK`] positions aligned to absolute
//! positions, and the partial results (running max, sum, weighted values) are merged in
//! position order. A query at position `p` therefore performs exactly the same floating
//! point operations whichever layout stores the rows and however many other queries are
//! computed beside it: layouts agree bit for bit, and a prefill chunk gives the same result
//! as one-token decode.
//!
//! # The arithmetic of one query head and one key block
//! For keys `j` of the block (those at positions `≤ p`):
//!
//! ```text
//! s[j] = fma chain over d = 0..head_dim of q[d]·k[j][d], then × scale
//! m'   = max(m, max_j s[j]);  if m' ≠ m { c = exp(m − m'); l ×= c; acc ×= c }
//! p[j] = exp(s[j] − m');  then, for j in order: l += p[j]; acc = fma(p[j], v[j], acc)
//! ```
//!
//! with `exp` the polynomial [`exp`] (not libm's). The blocks are folded in *spans* of
//! [`ATTN_SPAN`] positions, aligned to absolute positions, each from a fresh state; the spans'
//! states are then merged in position order (`m = max(m₁, m₂)`, `l = fma(l₂, c₂, l₁ c₁)`,
//! `acc = fma(acc₂, c₂, acc₁ c₁)` with `cᵢ = exp(mᵢ − m)`), and finally
//! `out = acc × (1 / l)`. Every step is one IEEE operation or a fused multiply-add, so the
//! AVX-512, AVX2 and portable builds of the kernel give the same bits.
//!
//! # Speed
//! Work is split over the shared [`Pool`] (the one the model's matrix kernels use) by KV
//! head and by tiles of query heads: the query heads that share a KV head, for several
//! consecutive positions, go through each key block together. The block's keys are
//! transposed once into a `[head_dim][16]` tile so that the scores of 16 keys are one
//! vector per query, with no horizontal sums. When that gives the threads too few items (a
//! decode step: one query, a few KV heads), each span becomes an item of its own, and the
//! spans' states are merged after: the same merges, in the same order, as an item that
//! folds every span itself. How queries are grouped and keys split is a speed choice only:
//! each query head's operations are the ones above, in that order.

use std::any::TypeId;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::elem::{KvElem, Q4Group, Q8Group};
use crate::pool::Pool;

mod block;
pub use block::{exp, ATTN_BLOCK};
use block::{finish, fold, merge, merge_spans, scores, SpanHead, State, GROUP};

/// Bench-only attention that gives up invariance (see `mtplx-model/benches/invariance_cost.rs`).
#[doc(hidden)]
#[cfg(feature = "bench")]
pub mod non_invariant;

/// The largest head dimension the kernel supports (scratch lives on the stack).
pub const MAX_HEAD_DIM: usize = 256;
/// Keys are folded in spans of this many positions (a multiple of [`ATTN_BLOCK`], aligned
/// to absolute positions) and the spans merged in order: the unit a long context's keys are
/// split over the threads by.
pub const ATTN_SPAN: usize = 256;

/// Random access to the K and V rows of one layer. A row holds all KV heads of one position
/// (`kv_heads * head_dim` values, in `kv_heads * head_dim / Elem::GROUP` elements).
///
/// Rows are stored as [`RowSource::Elem`] and widened to `f32` (exactly) as the kernel reads
/// them: the arithmetic below runs on the stored values, whatever their type.
pub trait RowSource: Sync {
    /// What the rows are stored as.
    type Elem: KvElem;

    fn k_row(&self, pos: usize) -> &[Self::Elem];
    fn v_row(&self, pos: usize) -> &[Self::Elem];

    /// The K and V rows from `start` to the end of the stored run that holds `start`: rows
    /// the layout keeps back to back (a contiguous layer, a paged block, a segment). The
    /// kernel reads whole key blocks of [`ATTN_BLOCK`] inside a run as slices and asks
    /// again after it; a block that straddles two runs, or a `None`, is read with
    /// [`RowSource::k_row`] / [`RowSource::v_row`]. Either way the kernel performs the same
    /// arithmetic on the same values, so this is a speed hint only: it never changes a
    /// result.
    fn run(&self, start: usize) -> Option<Run<'_, Self::Elem>> {
        let _ = start;
        None
    }
}

/// K and V rows stored back to back ([`RowSource::run`]).
pub type Run<'a, E> = (&'a [E], &'a [E]);

/// The geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnGeometry {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Absolute position of the first query; query `i` sits at `first_pos + i` and sees keys
    /// `0..=first_pos + i`.
    pub first_pos: usize,
    pub scale: f32,
}

/// A dot product with eight independent lanes summed in a fixed tree: vectorisable and
/// deterministic.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Query heads that go through a key block together (a speed knob only).
const TILE_VECTORS: usize = 24;
/// Query heads of one KV head that fold a whole key block in registers together
/// ([`x86::block_fused`]); more go through it in turns (a speed knob only). Measured
/// (`attend_decode`, 6,500 positions, f16, 2-core Zen4), against four at a time with more
/// than four through a transposed tile (as before): a 512-query prefill chunk's attention
/// 28% less time (SmolLM2 and Qwen2.5-0.5B alike; four at a time in registers: 13% less);
/// a decode step of seven query heads to a KV head (Qwen2.5-0.5B) 26% less.
#[cfg(target_arch = "x86_64")]
const WHOLE_GROUP: usize = 8;

/// Causal attention for `q` (`[n_q, q_heads, head_dim]`) into `out` (same shape), on the
/// [global pool](Pool::global).
pub fn attend<S: RowSource>(src: &S, q: &[f32], g: AttnGeometry, out: &mut [f32]) {
    attend_with(Pool::global(), src, q, g, out)
}

/// [`attend`] on `pool`. The result does not depend on the pool's size.
///
/// # Panics
/// If `q` or `out` is not a whole number of `[q_heads, head_dim]` rows, the head dimension
/// exceeds [`MAX_HEAD_DIM`], or `q_heads` is not a multiple of `kv_heads`.
pub fn attend_with<S: RowSource>(
    pool: &Pool,
    src: &S,
    q: &[f32],
    g: AttnGeometry,
    out: &mut [f32],
) {
    stored_as(pool, src, q, g, out)
}

// The kernel, compiled in this crate once per stored type (`stored_as` hands it a layout's
// rows as a trait object; it asks a source for a run once a key block, so the indirect call
// costs nothing measurable). Instantiated in the crates above for each of their row sources
// instead, it was most of a cold build: mtplx-kv's fifteen layout x type copies, ~18 of the
// workspace's 35 compile-minutes on two cores.
macro_rules! kernel_per_type {
    ($($name:ident: $t:ty),+) => {
        fn stored_as<S: RowSource>(
            pool: &Pool, src: &S, q: &[f32], g: AttnGeometry, out: &mut [f32],
        ) {
            let src: &dyn RowSource<Elem = S::Elem> = src;
            $(if TypeId::of::<S::Elem>() == TypeId::of::<$t>() {
                // SAFETY: `S::Elem` is `$t` (the same type id): one trait-object type.
                let src = unsafe {
                    std::mem::transmute_copy::<
                        &dyn RowSource<Elem = S::Elem>,
                        &dyn RowSource<Elem = $t>,
                    >(&src)
                };
                return $name(pool, src, q, g, out);
            })+
            unreachable!("KvElem is sealed: every type that implements it is handled above")
        }
        $(#[inline(never)]
        fn $name(
            pool: &Pool, src: &dyn RowSource<Elem = $t>, q: &[f32], g: AttnGeometry,
            out: &mut [f32],
        ) {
            attend_on(Isa::detect(), pool, src, q, g, out)
        })+
    };
}
kernel_per_type!(attend_f32: f32, attend_f16: half::f16, attend_bf16: half::bf16,
    attend_q8: Q8Group, attend_q4: Q4Group);

/// [`attend_with`] on the instruction set `isa` (tests compare them).
fn attend_on<S: RowSource + ?Sized>(
    isa: Isa,
    pool: &Pool,
    src: &S,
    q: &[f32],
    g: AttnGeometry,
    out: &mut [f32],
) {
    let per_q = g.q_heads * g.head_dim;
    assert!(g.head_dim <= MAX_HEAD_DIM && g.head_dim > 0, "head_dim");
    assert!(
        g.head_dim.is_multiple_of(S::Elem::GROUP),
        "a head is whole groups of the stored type"
    );
    assert!(g.kv_heads > 0 && g.q_heads.is_multiple_of(g.kv_heads));
    assert_eq!(q.len(), out.len());
    assert!(q.len().is_multiple_of(per_q));
    let n_q = q.len() / per_q;
    if n_q == 0 {
        return;
    }
    let group = g.q_heads / g.kv_heads;
    let chunks = (n_q * group).div_ceil(TILE_VECTORS);
    let spans = (g.first_pos + n_q - 1) / ATTN_SPAN + 1;
    let items = g.kv_heads * chunks;
    if items >= 2 * pool.threads() || spans == 1 {
        let out_ptr = OutPtr(out.as_mut_ptr());
        // Enough items: each folds every span of its query heads and writes their output.
        for_each_item(pool, items, &|i, scratch| {
            // The latest queries see the most keys: start with them.
            let (chunk, kvh) = (chunks - 1 - i / g.kv_heads, i % g.kv_heads);
            let item = Item::new(q, g, n_q, kvh, chunk, 0..usize::MAX);
            // SAFETY: items write disjoint query heads of `out` (each query head belongs to
            // one KV head and one chunk), and `out` outlives `run`; `isa` runs on this CPU.
            unsafe { isa.run(src, &item, Dst::Out(out_ptr), scratch) };
        });
        return;
    }
    // Few items (a decode step): one per span (and band of KV heads), each writing its query
    // heads' span state to `partial`; then the spans merged in order, as an item folding
    // them all would. An item takes several KV heads side by side, so that it reads whole
    // K and V rows (a stream the memory system keeps up with) rather than one head's slice
    // of each (a strided read that leaves most of the bandwidth unused); as few as still
    // give every thread two items.
    let per_chunk = (n_q * group).min(TILE_VECTORS);
    let mut band = (TILE_VECTORS / per_chunk).clamp(1, g.kv_heads);
    while band > 1 && chunks * g.kv_heads.div_ceil(band) * spans < 2 * pool.threads() {
        band -= 1;
    }
    let bands = g.kv_heads.div_ceil(band);
    let units = chunks * bands;
    let unit = |at: usize, keys| {
        let (chunk, b) = (at / bands, at % bands);
        let kvhs = b * band..((b + 1) * band).min(g.kv_heads);
        Item::band(q, g, n_q, kvhs, chunk, keys)
    };
    let slot = TILE_VECTORS * (g.head_dim + 2);
    let split = units * spans;
    SCRATCH.with(|cell| {
        let mut partial = cell.borrow_mut();
        partial.clear();
        partial.resize(split * slot, 0.0);
        let part = PartPtr(partial.as_mut_ptr());
        for_each_item(pool, split, &|i, scratch| {
            // The newest span first: it has the most query heads.
            let (span, at) = (spans - 1 - i / units, i % units);
            let item = unit(at, span * ATTN_SPAN..(span + 1) * ATTN_SPAN);
            // SAFETY: each item writes its own slot of `partial`, which outlives `run`.
            let dst = unsafe { part.at((span * units + at) * slot) };
            unsafe { isa.run(src, &item, Dst::Partial(dst), scratch) };
        });
        let hd = g.head_dim;
        let heads: Vec<SpanHead> = (0..units)
            .flat_map(|at| {
                let item = unit(at, 0..usize::MAX);
                (0..item.len()).map(move |t| SpanHead {
                    first: at * slot + t * (hd + 2),
                    spans: item.pos_of(t) / ATTN_SPAN + 1,
                    out: item.at(t),
                })
            })
            .collect();
        // Every query head belongs to one unit, so each output slice is written once.
        merge_spans(
            !matches!(isa, Isa::Portable),
            &partial,
            units * slot,
            hd,
            &heads,
            out,
        );
    });
}

thread_local! {
    /// The span states of a split call, reused from call to call.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each worker's item buffers, allocated once.
    static ITEM_SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::new());
}

/// One item's working buffers (query heads' accumulators, a key block transposed, a value
/// block widened): kept per thread, so an item clears only what it uses.
pub(crate) struct Scratch {
    acc: Vec<f32>,
    macc: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            acc: vec![0.0; TILE_VECTORS * MAX_HEAD_DIM],
            macc: vec![0.0; TILE_VECTORS * MAX_HEAD_DIM],
            kt: vec![0.0; MAX_HEAD_DIM * ATTN_BLOCK],
            vt: vec![0.0; MAX_HEAD_DIM * ATTN_BLOCK],
        }
    }
}

/// Runs `f(i, scratch)` for every `i < n` on `pool`'s threads, each taking the next index
/// as it finishes one (so a slow item does not hold back the rest), with its own
/// [`Scratch`].
pub(crate) fn for_each_item(pool: &Pool, n: usize, f: &(dyn Fn(usize, &mut Scratch) + Sync)) {
    let next = AtomicUsize::new(0);
    pool.run(pool.threads().min(n), &|_| {
        ITEM_SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i, &mut scratch);
            }
        })
    });
}

/// Where an item's results go.
#[derive(Clone, Copy)]
enum Dst {
    /// Its query heads' outputs.
    Out(OutPtr),
    /// Its query heads' states for its one span: per query head `m`, `l`, `acc`.
    Partial(*mut f32),
}

/// The span states of a split call, shared by the workers, each writing its own slot.
#[derive(Clone, Copy)]
struct PartPtr(*mut f32);
// SAFETY: workers write disjoint slots (see `attend_with`).
unsafe impl Send for PartPtr {}
unsafe impl Sync for PartPtr {}

impl PartPtr {
    /// # Safety
    /// `offset` is inside the scratch.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}

/// `out`, shared by the workers, each writing its own query heads.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: workers write disjoint ranges (see `attend_with`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// One work item: a run of the query heads (position-major) that share a KV head, for
/// `heads` consecutive KV heads from `kvh` side by side, over the keys at positions in
/// `keys` (every key they see, or one span of them). The item's query head `t` belongs to
/// KV head `kvh + t / vectors.len()`.
struct Item<'a> {
    q: &'a [f32],
    g: AttnGeometry,
    n_q: usize,
    kvh: usize,
    heads: usize,
    /// Indices `qi * group + h` into the `n_q × group` query heads of each of its KV heads.
    vectors: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
}

impl<'a> Item<'a> {
    fn new(
        q: &'a [f32],
        g: AttnGeometry,
        n_q: usize,
        kvh: usize,
        chunk: usize,
        keys: std::ops::Range<usize>,
    ) -> Self {
        Item::band(q, g, n_q, kvh..kvh + 1, chunk, keys)
    }

    /// The item of the KV heads `kvhs` side by side (`kvhs.len()` times the chunk's query
    /// heads at most [`TILE_VECTORS`]).
    fn band(
        q: &'a [f32],
        g: AttnGeometry,
        n_q: usize,
        kvhs: std::ops::Range<usize>,
        chunk: usize,
        keys: std::ops::Range<usize>,
    ) -> Self {
        let group = g.q_heads / g.kv_heads;
        let first = chunk * TILE_VECTORS;
        let vectors = first..(first + TILE_VECTORS).min(n_q * group);
        debug_assert!(kvhs.len() * vectors.len() <= TILE_VECTORS);
        Item {
            q,
            g,
            n_q,
            kvh: kvhs.start,
            heads: kvhs.len(),
            vectors,
            keys,
        }
    }

    /// How many query heads the item computes.
    fn len(&self) -> usize {
        self.heads * self.vectors.len()
    }

    /// The position of the item's query head `t`.
    fn pos_of(&self, t: usize) -> usize {
        let v = t % self.vectors.len();
        self.g.first_pos + (self.vectors.start + v) / (self.g.q_heads / self.g.kv_heads)
    }

    /// Where query head `t`'s q and out rows start.
    fn at(&self, t: usize) -> usize {
        let group = self.g.q_heads / self.g.kv_heads;
        let (band, v) = (t / self.vectors.len(), t % self.vectors.len());
        let (qi, h) = (
            (self.vectors.start + v) / group,
            (self.vectors.start + v) % group,
        );
        (qi * self.g.q_heads + (self.kvh + band) * group + h) * self.g.head_dim
    }
}

#[derive(Debug, Clone, Copy)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Isa {
    fn detect() -> Isa {
        use std::sync::OnceLock;
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::env::var_os("MTPLX_ATTN_PORTABLE").is_some() {
                    return Isa::Portable;
                }
                let f16c = is_x86_feature_detected!("f16c");
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("fma")
                    && f16c
                {
                    return Isa::Avx512;
                }
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && f16c {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        })
    }

    /// # Safety
    /// As [`item`]; `self` is [`Isa::detect`]'s or one it implies (AVX-512 implies AVX2).
    unsafe fn run<S: RowSource + ?Sized>(self, src: &S, it: &Item<'_>, out: Dst, s: &mut Scratch) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => item_avx512(src, it, out, s),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => item_avx2(src, it, out, s),
            Isa::Portable => item::<S, false, false>(src, it, out, s),
        }
    }
}

/// The AVX2 code with AVX-512VL's 32 vector registers and embedded broadcasts: eight query
/// heads' scores and sums in registers without spills (`attend_decode`, 6,500 positions,
/// f16, 2-core Zen 4: a 512-query prefill chunk 13-25% faster, a decode step 4-8%); and for
/// 16-bit K/V, whole key blocks on 512-bit vectors ([`zmm`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn item_avx512<S: RowSource + ?Sized>(src: &S, it: &Item<'_>, out: Dst, s: &mut Scratch) {
    item::<S, true, true>(src, it, out, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn item_avx2<S: RowSource + ?Sized>(src: &S, it: &Item<'_>, out: Dst, s: &mut Scratch) {
    item::<S, true, false>(src, it, out, s)
}

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod zmm;

/// `dst = src` widened; `F16C`: the caller runs with AVX2 and F16C enabled (its
/// conversions then inline here).
#[inline(always)]
unsafe fn widen<E: KvElem, const F16C: bool>(src: &[E], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: the caller was compiled for, and detected, AVX2 and F16C.
        return E::widen_f16c(src, dst);
    }
    E::widen(src, dst)
}

/// Runs one work item: every key block of its keys up to the newest query's position, in
/// order, for all of the item's query heads; a new span starts each from a fresh state, the
/// finished one merged into what came before.
///
/// # Safety
/// `out` points to the `out` of [`attend_with`] (or a slot of its span states); no other
/// thread writes these query heads.
#[inline(always)]
unsafe fn item<S: RowSource + ?Sized, const F16C: bool, const ZMM: bool>(
    src: &S,
    it: &Item<'_>,
    out: Dst,
    scratch: &mut Scratch,
) {
    let g = it.g;
    let hd = g.head_dim;
    // Rows and heads in stored elements (a quantized element holds a group of values).
    let (row, hde) = (g.kv_heads * hd / S::Elem::GROUP, hd / S::Elem::GROUP);
    // The item's query heads: `nvk` for each of its KV heads, KV head by KV head.
    let (nt, nvk) = (it.len(), it.vectors.len());
    // Each query head's position and where its q and out rows start, worked out once (the
    // block loop asks for them at every block).
    let mut pos = [0usize; TILE_VECTORS];
    let mut at = [0usize; TILE_VECTORS];
    for t in 0..nt {
        (pos[t], at[t]) = (it.pos_of(t), it.at(t));
    }
    let pos_of = |t: usize| pos[t];
    let at_of = |t: usize| at[t];
    debug_assert!(it.vectors.end <= it.n_q * g.q_heads / g.kv_heads);
    let fresh = State {
        m: f32::NEG_INFINITY,
        l: 0.0,
    };
    let mut st = [fresh; TILE_VECTORS];
    let Scratch { acc, macc, kt, vt } = scratch;
    let acc = &mut acc[..nt * hd];
    acc.fill(0.0);
    // The spans before the current one, merged (`None`: still in the first; `macc` is
    // written before it is read).
    let mut merged = [None::<State>; TILE_VECTORS];
    // One key's row, widened; the block's values, widened, by row (keys past the block's
    // end keep stale values: their scores are computed and never used).
    let mut kw = [0f32; MAX_HEAD_DIM];
    // Where the padded lanes of a group folded in registers write (see `group!`).
    #[cfg(target_arch = "x86_64")]
    let mut pad = [0f32; MAX_HEAD_DIM];
    let mut vrows: [&[S::Elem]; ATTN_BLOCK] = [&[]; ATTN_BLOCK];
    let last = pos_of(nt - 1).min(it.keys.end - 1);
    let mut start = it.keys.start;
    // Whether the fold of the block before asked for this one's rows.
    #[cfg(target_arch = "x86_64")]
    let mut asked = false;
    while start <= last {
        let nb = ATTN_BLOCK.min(last + 1 - start);
        // Query heads whose position is before the block are done: in each KV head's run
        // of query heads they form a prefix, the same for every KV head.
        let active = (0..nvk).find(|&v| pos_of(v) >= start).unwrap_or(nvk);
        if start.is_multiple_of(ATTN_SPAN) && start > it.keys.start {
            for t in (0..nt).filter(|&t| t % nvk >= active) {
                let (a, ma) = (&acc[t * hd..(t + 1) * hd], &mut macc[t * hd..(t + 1) * hd]);
                match &mut merged[t] {
                    Some(m) => merge(m, ma, st[t], a),
                    None => {
                        merged[t] = Some(st[t]);
                        ma.copy_from_slice(a);
                    }
                }
                st[t] = fresh;
                acc[t * hd..(t + 1) * hd].fill(0.0);
            }
        }
        // A decode step streams keys from memory. A block folded whole asks for the next
        // block's rows as it folds its values (`x86::Ahead`: the requests spread over the
        // block's work, so the fold's own loads are not queued behind them); any other
        // block is asked for here, all of its lines at once, as its fold starts. (Measured,
        // `attend_decode` at 6,500 positions, SmolLM2, 2 threads, Zen 5: 7.9-8.2 ms a step
        // with every block asked for at its start, 5.5-5.7 spread over the previous block;
        // spread two blocks ahead 6.7-7.2; one block ahead in one burst was 10-20% slower
        // than at its start on a Zen 3.)
        #[cfg(target_arch = "x86_64")]
        if !asked && start + ATTN_BLOCK <= last + 1 {
            if let Some((ks, vs)) = src.run(start) {
                x86::prefetch_rows(ks, vs, row, it.kvh * hde, it.heads * hde);
            }
        }
        let run = src.run(start).filter(|(ks, _)| ks.len() >= nb * row);
        #[cfg(target_arch = "x86_64")]
        let transposed = F16C && nb == ATTN_BLOCK && hd.is_multiple_of(8);
        #[cfg(not(target_arch = "x86_64"))]
        let transposed = false;
        // A decode step's query heads go through the block in one group: their scores are
        // computed from the rows directly, with no tile (the same operations).
        let fused = transposed && nvk - active <= GROUP;
        // When every active query head sees the whole block (however many: a prefill
        // tile's, or a decode step's when many share a KV head), all of the block's work is
        // done in registers ([`x86::block_fused`]), [`WHOLE_GROUP`] query heads at a time.
        let whole = transposed && active < nvk && pos_of(active) >= start + ATTN_BLOCK - 1;
        // The next block, when whole, for the folds below to ask for.
        #[cfg(target_arch = "x86_64")]
        let next = match whole && start + 2 * ATTN_BLOCK <= last + 1 {
            true => src
                .run(start + ATTN_BLOCK)
                .filter(|(ks, _)| ks.len() >= ATTN_BLOCK * row),
            false => None,
        };
        #[cfg(target_arch = "x86_64")]
        {
            asked = next.is_some();
        }
        for band in (0..it.heads).filter(|_| active < nvk) {
            let off = (it.kvh + band) * hde;
            #[cfg(target_arch = "x86_64")]
            let ahead = match next {
                Some((ks, vs)) => x86::Ahead::rows(&ks[off..], &vs[off..], row, hde),
                None => x86::Ahead::NONE,
            };
            // A whole block folded in registers ([`x86::block_fused`]) by the `take` query
            // heads from `t0` (query head `t0 + r`: its softmax state and accumulator),
            // reading the rows through `$k` and `$v`.
            #[cfg(target_arch = "x86_64")]
            macro_rules! group {
                ($k:expr, $v:expr, $t0:expr, $take:expr; $($r:expr),+) => {{
                    // Query heads `t0 .. t0 + take`; lanes past `take` (a group padded to
                    // the next instantiated width) repeat the last one's query and state
                    // and write into `pad`, and are dropped.
                    let (t0, take) = ($t0, $take);
                    let t = |r: usize| t0 + r.min(take - 1);
                    let (acc, pad) = (acc.as_mut_ptr(), pad.as_mut_ptr());
                    let mut s = [$(x86::Softmax { m: st[t($r)].m, l: st[t($r)].l }),+];
                    let a = [$(if $r < take { acc.add(t($r) * hd) } else { pad }),+];
                    let qs = [$(&it.q[at_of(t($r))..at_of(t($r)) + hd]),+];
                    if ZMM && zmm::takes::<S::Elem>(hd) {
                        zmm::block_fused($k, $v, hd, &qs, g.scale, &mut s, a, ahead);
                    } else {
                        x86::block_fused($k, $v, hd, &qs, g.scale, &mut s, a, ahead);
                    }
                    for (r, s) in s.into_iter().enumerate().take(take) {
                        st[t0 + r] = State { m: s.m, l: s.l };
                    }
                }};
            }
            #[cfg(target_arch = "x86_64")]
            macro_rules! fold_whole {
                ($k:expr, $v:expr) => {{
                    let mut from = active;
                    while from < nvk {
                        let (t0, take) = (band * nvk + from, (nvk - from).min(WHOLE_GROUP));
                        // Widths 1-4 and 8 are instantiated (5-7 run padded to 8).
                        match take {
                            1 => group!($k, $v, t0, 1; 0),
                            2 => group!($k, $v, t0, 2; 0, 1),
                            3 => group!($k, $v, t0, 3; 0, 1, 2),
                            4 => group!($k, $v, t0, 4; 0, 1, 2, 3),
                            _ => group!($k, $v, t0, take; 0, 1, 2, 3, 4, 5, 6, 7),
                        }
                        from += take;
                    }
                }};
            }
            // Inside one run the rows are read at a stride from the block's first, with no
            // slice per key built and checked.
            #[cfg(target_arch = "x86_64")]
            if let (true, Some((ks, vs))) = (whole, run) {
                let strided = |rows: &[S::Elem]| x86::Strided {
                    base: rows[off..].as_ptr(),
                    stride: row,
                };
                fold_whole!(&strided(ks), &strided(vs));
                continue;
            }
            // The block's keys, transposed; its values, by row.
            let mut krows: [&[S::Elem]; ATTN_BLOCK] = [&[]; ATTN_BLOCK];
            for j in 0..nb {
                (krows[j], vrows[j]) = match run {
                    Some((ks, vs)) => (&ks[j * row + off..][..hde], &vs[j * row + off..][..hde]),
                    None => (
                        &src.k_row(start + j)[off..off + hde],
                        &src.v_row(start + j)[off..off + hde],
                    ),
                };
                if !whole && S::Elem::as_f32(vrows[j]).is_none() {
                    widen::<_, F16C>(vrows[j], &mut vt[j * hd..(j + 1) * hd]);
                }
            }
            #[cfg(target_arch = "x86_64")]
            if whole {
                fold_whole!(&krows, &vrows);
                continue;
            }
            if transposed {
                #[cfg(target_arch = "x86_64")]
                if !fused {
                    x86::transpose_block(&krows, hd, kt);
                }
            } else {
                for (j, k) in krows.iter().enumerate().take(nb) {
                    let k = match S::Elem::as_f32(k) {
                        Some(k) => k,
                        None => {
                            widen::<_, F16C>(k, &mut kw[..hd]);
                            &kw[..hd]
                        }
                    };
                    for (d, &x) in k.iter().enumerate() {
                        kt[d * ATTN_BLOCK + j] = x;
                    }
                }
            }
            // The values as `f32`: in place when stored so, else widened into `vt`.
            let vs: [&[f32]; ATTN_BLOCK] =
                std::array::from_fn(|j| match S::Elem::as_f32(vrows[j]) {
                    Some(v) => v,
                    None => &vt[j * hd..(j + 1) * hd],
                });
            let end = (band + 1) * nvk;
            let mut t0 = band * nvk + active;
            while t0 < end {
                let take = GROUP.min(end - t0);
                let qs: [&[f32]; GROUP] = std::array::from_fn(|r| {
                    let base = at_of(t0 + r.min(take - 1));
                    &it.q[base..base + hd]
                });
                #[cfg(target_arch = "x86_64")]
                let scores = if fused {
                    x86::scores_fused_group(&krows, hd, &qs, take, g.scale)
                } else {
                    scores(&qs, &kt[..hd * ATTN_BLOCK], g.scale)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let scores = scores(&qs, &kt[..hd * ATTN_BLOCK], g.scale);
                for (r, sc) in scores.iter().enumerate().take(take) {
                    let t = t0 + r;
                    let n = nb.min(pos_of(t) + 1 - start);
                    let a = &mut acc[t * hd..(t + 1) * hd];
                    fold(&mut st[t], a, sc, n, &vs);
                }
                t0 += take;
            }
        }
        start += nb;
    }
    for t in 0..nt {
        let a = &acc[t * hd..(t + 1) * hd];
        match out {
            Dst::Out(out) => {
                // SAFETY: query head `t`'s output row, written only by this item (see above).
                let o = std::slice::from_raw_parts_mut(out.0.add(at_of(t)), hd);
                match &mut merged[t] {
                    Some(m) => {
                        let ma = &mut macc[t * hd..(t + 1) * hd];
                        merge(m, ma, st[t], a);
                        finish(*m, ma, o);
                    }
                    None => finish(st[t], a, o),
                }
            }
            // Query heads before the span saw none of its keys: nothing to write.
            Dst::Partial(_) if pos_of(t) < it.keys.start => {}
            Dst::Partial(p) => {
                // SAFETY: this item's own slot, `TILE_VECTORS × (hd + 2)` long.
                let slot = std::slice::from_raw_parts_mut(p.add(t * (hd + 2)), hd + 2);
                slot[0] = st[t].m;
                slot[1] = st[t].l;
                slot[2..].copy_from_slice(a);
            }
        }
    }
}

#[cfg(test)]
mod tests;

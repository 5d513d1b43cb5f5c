//! The arithmetic of one query head over one key block (see the parent module's docs): the
//! online-softmax state, its fold and merge, and the portable score and value loops. The
//! x86 paths perform these same operations in this same order.

/// Keys are reduced in blocks of this many positions, aligned to absolute positions.
pub const ATTN_BLOCK: usize = 16;
/// Query heads whose scores are computed in one pass over the key tile.
pub(super) const GROUP: usize = 4;

/// [`exp`]'s constants, which its vector builds (`x86::exp8`, `zmm::exp16`) use too: the same
/// bits need the same constants. `1.5 · 2²³`: adding it rounds to an integer.
pub(super) const EXP_MAGIC: f32 = 12_582_912.0;
/// `ln 2` split in two for the Cody–Waite reduction.
pub(super) const EXP_LN2_HI: f32 = 0.693_145_75;
pub(super) const EXP_LN2_LO: f32 = 1.428_606_8e-6;
/// The Taylor polynomial's coefficients, highest degree first (Horner's steps from the first).
pub(super) const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `e^x` for the softmax (`x ≤ 0`): Cody–Waite reduction to `r ∈ [−ln2/2, ln2/2]`, a degree-7
/// Taylor polynomial (relative error below 2·10⁻⁷), scaled by `2ⁿ`; 0 below −87.
/// Fused multiply-adds and plain IEEE operations only, so every build gives the same bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(-87.0, 88.0);
    let t = xc.mul_add(std::f32::consts::LOG2_E, EXP_MAGIC);
    let n = t - EXP_MAGIC;
    let r = n.mul_add(-EXP_LN2_HI, xc);
    let r = n.mul_add(-EXP_LN2_LO, r);
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p.mul_add(r, *c);
    }
    let k = (t.to_bits() as i32).wrapping_sub(EXP_MAGIC.to_bits() as i32);
    let scale = f32::from_bits(((k + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// The online-softmax state of one query head.
#[derive(Clone, Copy)]
pub(super) struct State {
    pub(super) m: f32,
    pub(super) l: f32,
}

/// Merges span state `b` (the next span) into `a`: the one formula both the in-item fold
/// and the split call use, so they give the same bits.
#[inline(always)]
pub(super) fn merge(a: &mut State, acc: &mut [f32], b: State, b_acc: &[f32]) {
    let m = a.m.max(b.m);
    let (ca, cb) = (exp(a.m - m), exp(b.m - m));
    a.l = b.l.mul_add(cb, a.l * ca);
    for (x, &y) in acc.iter_mut().zip(b_acc) {
        *x = y.mul_add(cb, *x * ca);
    }
    a.m = m;
}

/// `out = acc × (1 / l)`.
#[inline(always)]
pub(super) fn finish(st: State, acc: &[f32], out: &mut [f32]) {
    let inv = 1.0 / st.l;
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

/// The scores of [`GROUP`] query heads against a transposed key tile (`[head_dim][16]`):
/// for each key, one fused multiply-add chain in dimension order, then × `scale`.
#[inline(always)]
pub(super) fn scores(qs: &[&[f32]; GROUP], kt: &[f32], scale: f32) -> [[f32; ATTN_BLOCK]; GROUP] {
    let mut s = [[0f32; ATTN_BLOCK]; GROUP];
    for (d, k) in kt.chunks_exact(ATTN_BLOCK).enumerate() {
        for r in 0..GROUP {
            let x = qs[r][d];
            for j in 0..ATTN_BLOCK {
                s[r][j] = x.mul_add(k[j], s[r][j]);
            }
        }
    }
    for row in s.iter_mut() {
        for x in row.iter_mut() {
            *x *= scale;
        }
    }
    s
}

/// Folds the first `n` keys of a block (scores `s`, values `v`) into one query head's state.
#[inline(always)]
pub(super) fn fold(st: &mut State, acc: &mut [f32], s: &[f32; ATTN_BLOCK], n: usize, v: &[&[f32]]) {
    let bm = s[..n].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let m_new = st.m.max(bm);
    if m_new != st.m {
        let c = exp(st.m - m_new);
        st.l *= c;
        for a in acc.iter_mut() {
            *a *= c;
        }
        st.m = m_new;
    }
    let mut p = [0f32; ATTN_BLOCK];
    for j in 0..ATTN_BLOCK {
        p[j] = exp(s[j] - st.m);
    }
    for &pj in &p[..n] {
        st.l += pj;
    }
    // The same fused multiply-adds, in the same order for each element, whatever the width:
    // a known width keeps the accumulator in registers across the block's keys.
    match acc.len() {
        64 => accumulate::<8>(acc, &p, n, v),
        128 => accumulate::<16>(acc, &p, n, v),
        _ => {
            for j in 0..n {
                for (a, &x) in acc.iter_mut().zip(v[j]) {
                    *a = p[j].mul_add(x, *a);
                }
            }
        }
    }
}

/// `acc += Σ_j p[j] · v[j]` over the first `n` keys, in key order, for an accumulator of
/// `C` eight-lane chunks held in locals (registers) for the whole block.
#[inline(always)]
pub(super) fn accumulate<const C: usize>(
    acc: &mut [f32],
    p: &[f32; ATTN_BLOCK],
    n: usize,
    v: &[&[f32]],
) {
    let mut a = [[0f32; 8]; C];
    for (c, chunk) in a.iter_mut().enumerate() {
        chunk.copy_from_slice(&acc[c * 8..c * 8 + 8]);
    }
    for j in 0..n {
        let (pj, vj) = (p[j], &v[j][..C * 8]);
        for (c, chunk) in a.iter_mut().enumerate() {
            let x = &vj[c * 8..c * 8 + 8];
            for l in 0..8 {
                chunk[l] = pj.mul_add(x[l], chunk[l]);
            }
        }
    }
    for (c, chunk) in a.iter().enumerate() {
        acc[c * 8..c * 8 + 8].copy_from_slice(chunk);
    }
}

/// Where one query head's span states lie in a split call's `partial` buffer, and its output
/// in `out`.
pub(super) struct SpanHead {
    /// Span 0's state: `m`, `l`, then `head_dim` accumulator values.
    pub(super) first: usize,
    /// How many spans the head sees (span `s` lies `s × stride` after span 0).
    pub(super) spans: usize,
    /// The head's output slice.
    pub(super) out: usize,
}

/// A split call's last step: each head's span states merged in span order ([`merge`]), then
/// [`finish`]ed into `out`. With `fma` (the CPU has the instruction), compiled for it: without,
/// `merge`'s `f32::mul_add` is a library call a value, ~7% of a 6,500-token decode step on the
/// calling thread while the others wait. The same bits either way (one rounding per fused
/// multiply-add).
pub(super) fn merge_spans(
    fma: bool,
    partial: &[f32],
    stride: usize,
    hd: usize,
    heads: &[SpanHead],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: the caller saw FMA on this CPU.
        return unsafe { merge_spans_fma(partial, stride, hd, heads, out) };
    }
    let _ = fma;
    merge_spans_with(partial, stride, hd, heads, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn merge_spans_fma(
    partial: &[f32],
    stride: usize,
    hd: usize,
    heads: &[SpanHead],
    out: &mut [f32],
) {
    merge_spans_with(partial, stride, hd, heads, out)
}

#[inline(always)]
fn merge_spans_with(
    partial: &[f32],
    stride: usize,
    hd: usize,
    heads: &[SpanHead],
    out: &mut [f32],
) {
    let mut acc = vec![0f32; hd];
    for h in heads {
        let read = |span: usize| {
            let base = h.first + span * stride;
            let st = State {
                m: partial[base],
                l: partial[base + 1],
            };
            (st, &partial[base + 2..base + 2 + hd])
        };
        let (mut st, first) = read(0);
        acc.copy_from_slice(first);
        for span in 1..h.spans {
            let (other, other_acc) = read(span);
            merge(&mut st, &mut acc, other, other_acc);
        }
        finish(st, &acc, &mut out[h.out..h.out + hd]);
    }
}

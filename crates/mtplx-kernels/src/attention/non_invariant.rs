//! For measuring the cost of invariance only (`mtplx-model/benches/invariance_cost.rs`);
//! nothing in the product calls it.
//!
//! [`attend_blocks`] is [`attend`](super::attend) with key blocks of `B` positions instead
//! of [`ATTN_BLOCK`](super::ATTN_BLOCK): fewer block merges (running-max updates and
//! rescales) per key. A prefill chunk could take large blocks and a decode step small ones
//! only by giving up invariance: the block size decides where the softmax rescales, so it
//! changes bits.

use super::{exp, AttnGeometry, OutPtr, RowSource, State, GROUP, MAX_HEAD_DIM, TILE_VECTORS};
use crate::pool::Pool;

/// The largest block [`attend_blocks`] takes.
pub const MAX_B: usize = 256;

/// Causal attention with key blocks of `B` positions (aligned to absolute positions), on
/// the global pool. Same arguments as [`attend`](super::attend).
///
/// # Panics
/// As [`attend_with`](super::attend_with), or if `B` is 0 or over [`MAX_B`].
pub fn attend_blocks<const B: usize, S: RowSource<Elem = f32>>(
    src: &S,
    q: &[f32],
    g: AttnGeometry,
    out: &mut [f32],
) {
    assert!(B > 0 && B <= MAX_B, "block size {B}");
    let per_q = g.q_heads * g.head_dim;
    assert!(g.head_dim <= MAX_HEAD_DIM && g.head_dim > 0, "head_dim");
    assert!(g.kv_heads > 0 && g.q_heads.is_multiple_of(g.kv_heads));
    assert_eq!(q.len(), out.len());
    assert!(q.len().is_multiple_of(per_q));
    let n_q = q.len() / per_q;
    if n_q == 0 {
        return;
    }
    let pool = Pool::global();
    let group = g.q_heads / g.kv_heads;
    let chunks = (n_q * group).div_ceil(TILE_VECTORS);
    let items = g.kv_heads * chunks;
    let out_ptr = OutPtr(out.as_mut_ptr());
    super::for_each_item(pool, items, &|i, _| {
        let (chunk, kvh) = (chunks - 1 - i / g.kv_heads, i % g.kv_heads);
        let it = super::Item::new(q, g, n_q, kvh, chunk, 0..usize::MAX);
        // SAFETY: as in `attend_with`: items write disjoint query heads of `out`.
        unsafe { run::<B, S>(src, &it, out_ptr) };
    });
}

unsafe fn run<const B: usize, S: RowSource<Elem = f32>>(
    src: &S,
    it: &super::Item<'_>,
    out: OutPtr,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            return item_avx512::<B, S>(src, it, out);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return item_avx2::<B, S>(src, it, out);
        }
    }
    item::<B, S>(src, it, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn item_avx512<const B: usize, S: RowSource<Elem = f32>>(
    src: &S,
    it: &super::Item<'_>,
    out: OutPtr,
) {
    item::<B, S>(src, it, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn item_avx2<const B: usize, S: RowSource<Elem = f32>>(
    src: &S,
    it: &super::Item<'_>,
    out: OutPtr,
) {
    item::<B, S>(src, it, out)
}

/// `super::item` with blocks of `B` keys.
#[inline(always)]
unsafe fn item<const B: usize, S: RowSource<Elem = f32>>(
    src: &S,
    it: &super::Item<'_>,
    out: OutPtr,
) {
    let g = it.g;
    let hd = g.head_dim;
    let row = g.kv_heads * hd;
    let group = g.q_heads / g.kv_heads;
    let off = it.kvh * hd;
    let nv = it.vectors.len();
    let pos_of = |v: usize| g.first_pos + (it.vectors.start + v) / group;
    let at = |v: usize| {
        let (qi, h) = (
            (it.vectors.start + v) / group,
            (it.vectors.start + v) % group,
        );
        (qi * g.q_heads + it.kvh * group + h) * hd
    };
    let mut st = [State {
        m: f32::NEG_INFINITY,
        l: 0.0,
    }; TILE_VECTORS];
    let mut acc = [0f32; TILE_VECTORS * MAX_HEAD_DIM];
    // On the heap: a stack array sized for the largest `B` would cost its zeroing per item.
    let mut kt = vec![0f32; hd * B];
    let mut vrows: Vec<&[f32]> = vec![&[]; B];
    let last = pos_of(nv - 1);
    let mut start = 0;
    while start <= last {
        let nb = B.min(last + 1 - start);
        let run = src.run(start).filter(|(ks, _)| ks.len() >= nb * row);
        for j in 0..nb {
            let (k, v) = match run {
                Some((ks, vs)) => (&ks[j * row + off..][..hd], &vs[j * row + off..][..hd]),
                None => (
                    &src.k_row(start + j)[off..off + hd],
                    &src.v_row(start + j)[off..off + hd],
                ),
            };
            for (d, &x) in k.iter().enumerate() {
                kt[d * B + j] = x;
            }
            vrows[j] = v;
        }
        let first_active = (0..nv).find(|&v| pos_of(v) >= start).unwrap_or(nv);
        let mut v0 = first_active;
        while v0 < nv {
            let take = GROUP.min(nv - v0);
            let qs: [&[f32]; GROUP] = std::array::from_fn(|r| {
                let base = at(v0 + r.min(take - 1));
                &it.q[base..base + hd]
            });
            let scores = scores::<B>(&qs, &kt, g.scale);
            for (r, sc) in scores.iter().enumerate().take(take) {
                let v = v0 + r;
                let n = nb.min(pos_of(v) + 1 - start);
                let a = &mut acc[v * hd..(v + 1) * hd];
                fold::<B>(&mut st[v], a, sc, n, &vrows[..B]);
            }
            v0 += take;
        }
        start += nb;
    }
    for (v, s) in st[..nv].iter().enumerate() {
        let inv = 1.0 / s.l;
        // SAFETY: query head `v`'s output row, written only by this item.
        let o = std::slice::from_raw_parts_mut(out.0.add(at(v)), hd);
        for (o, a) in o.iter_mut().zip(&acc[v * hd..(v + 1) * hd]) {
            *o = a * inv;
        }
    }
}

#[inline(always)]
fn scores<const B: usize>(qs: &[&[f32]; GROUP], kt: &[f32], scale: f32) -> [[f32; B]; GROUP] {
    let mut s = [[0f32; B]; GROUP];
    for (d, k) in kt.chunks_exact(B).enumerate() {
        for r in 0..GROUP {
            let x = qs[r][d];
            for j in 0..B {
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

#[inline(always)]
fn fold<const B: usize>(st: &mut State, acc: &mut [f32], s: &[f32; B], n: usize, v: &[&[f32]]) {
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
    let mut p = [0f32; B];
    for j in 0..B {
        p[j] = exp(s[j] - st.m);
    }
    for j in 0..n {
        st.l += p[j];
        for (a, &x) in acc.iter_mut().zip(v[j]) {
            *a = p[j].mul_add(x, *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{attend, AttnGeometry, RowSource};
    use super::attend_blocks;

    struct Rows {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    }

    impl RowSource for Rows {
        type Elem = f32;
        fn k_row(&self, pos: usize) -> &[f32] {
            &self.k[pos]
        }
        fn v_row(&self, pos: usize) -> &[f32] {
            &self.v[pos]
        }
    }

    /// Blocks of 16 give `attend`'s bits; blocks of 64 the same values up to rounding.
    #[test]
    fn block_size_changes_rounding_only() {
        let (hd, kvh, qh, n) = (32, 2, 4, 100);
        let val = |i: usize| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.0;
        let rows = Rows {
            k: (0..n)
                .map(|p| (0..kvh * hd).map(|d| val(p * 131 + d)).collect())
                .collect(),
            v: (0..n)
                .map(|p| (0..kvh * hd).map(|d| val(p * 71 + d + 5)).collect())
                .collect(),
        };
        let g = AttnGeometry {
            q_heads: qh,
            kv_heads: kvh,
            head_dim: hd,
            first_pos: 0,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let q: Vec<f32> = (0..n * qh * hd).map(|i| val(i * 3 + 1)).collect();
        let mut want = vec![0f32; q.len()];
        attend(&rows, &q, g, &mut want);
        let mut same = vec![0f32; q.len()];
        attend_blocks::<16, _>(&rows, &q, g, &mut same);
        assert!(same
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut big = vec![0f32; q.len()];
        attend_blocks::<64, _>(&rows, &q, g, &mut big);
        for (a, b) in big.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert!(big
            .iter()
            .zip(&want)
            .any(|(a, b)| a.to_bits() != b.to_bits()));
    }
}

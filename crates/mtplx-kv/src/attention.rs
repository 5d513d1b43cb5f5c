//! The attention kernel every layout shares.
//!
//! Keys are reduced in fixed blocks of [`ATTN_BLOCK`] positions aligned to absolute
//! positions, and the partial results (running max, sum, weighted values) are merged in
//! position order. A query at position `p` therefore performs exactly the same floating
//! point operations whichever layout stores the rows and however many other queries are
//! computed beside it: layouts agree bit for bit, and a prefill chunk gives the same result
//! as one-token decode.

use rayon::prelude::*;

/// Keys are reduced in blocks of this many positions, aligned to absolute positions.
pub const ATTN_BLOCK: usize = 16;
/// The largest head dimension the kernel supports (scratch lives on the stack).
pub const MAX_HEAD_DIM: usize = 256;

/// Random access to the K and V rows of one layer. A row holds all KV heads of one position
/// (`kv_heads * head_dim` values).
pub trait RowSource: Sync {
    fn k_row(&self, pos: usize) -> &[f32];
    fn v_row(&self, pos: usize) -> &[f32];

    /// The K and V rows from `start` to the end of the stored run that holds `start`: rows
    /// the layout keeps back to back (a contiguous layer, a paged block, a segment). The
    /// kernel reads whole key blocks of [`ATTN_BLOCK`] inside a run as slices and asks
    /// again after it; a block that straddles two runs, or a `None`, is read with
    /// [`RowSource::k_row`] / [`RowSource::v_row`]. Either way the kernel performs the same
    /// arithmetic on the same values, so this is a speed hint only: it never changes a
    /// result.
    fn run(&self, start: usize) -> Option<(&[f32], &[f32])> {
        let _ = start;
        None
    }
}

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

/// Causal attention for `q` (`[n_q, q_heads, head_dim]`) into `out` (same shape).
pub fn attend<S: RowSource>(src: &S, q: &[f32], g: AttnGeometry, out: &mut [f32]) {
    let hd = g.head_dim;
    let row = g.kv_heads * hd;
    let group = g.q_heads / g.kv_heads;
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (qi, h) = (idx / g.q_heads, idx % g.q_heads);
        let kvh = h / group;
        let qv = &q[idx * hd..idx * hd + hd];
        attend_one(src, qv, g.first_pos + qi, kvh * hd, row, g.scale, o);
    });
}

/// The running state of the online softmax for one query head.
struct Online<'a> {
    m: f32,
    l: f32,
    acc: &'a mut [f32],
}

impl Online<'_> {
    /// Folds one block of `n` keys into the state. `k(j)` and `v(j)` give the head's slice of
    /// the block's row `j`; how they are found does not change the arithmetic.
    #[inline(always)]
    fn block<'r>(
        &mut self,
        q: &[f32],
        n: usize,
        scale: f32,
        k: impl Fn(usize) -> &'r [f32],
        v: impl Fn(usize) -> &'r [f32],
    ) {
        let mut scores = [0f32; ATTN_BLOCK];
        let mut bm = f32::NEG_INFINITY;
        for (j, s) in scores[..n].iter_mut().enumerate() {
            *s = dot(q, k(j)) * scale;
            bm = bm.max(*s);
        }
        let m_new = self.m.max(bm);
        if m_new != self.m {
            let corr = (self.m - m_new).exp();
            self.l *= corr;
            for a in self.acc.iter_mut() {
                *a *= corr;
            }
            self.m = m_new;
        }
        for (j, &s) in scores[..n].iter().enumerate() {
            let p = (s - self.m).exp();
            self.l += p;
            for (a, &x) in self.acc.iter_mut().zip(v(j)) {
                *a += p * x;
            }
        }
    }
}

#[inline]
fn attend_one<S: RowSource>(
    src: &S,
    q: &[f32],
    pos: usize,
    off: usize,
    row: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = q.len();
    let mut acc = [0f32; MAX_HEAD_DIM];
    let mut st = Online {
        m: f32::NEG_INFINITY,
        l: 0.0,
        acc: &mut acc[..hd],
    };
    let mut start = 0;
    while start <= pos {
        // Whole blocks inside the run that holds `start`, read as slices.
        if let Some((ks, vs)) = src.run(start) {
            let (first, run_end) = (start, start + ks.len() / row);
            while start <= pos {
                let end = (start + ATTN_BLOCK).min(pos + 1);
                if end > run_end {
                    break;
                }
                let base = (start - first) * row + off;
                st.block(
                    q,
                    end - start,
                    scale,
                    |j| &ks[base + j * row..base + j * row + hd],
                    |j| &vs[base + j * row..base + j * row + hd],
                );
                start = end;
            }
            if start > pos {
                break;
            }
        }
        // A block across two runs (or a source without runs): row by row.
        let end = (start + ATTN_BLOCK).min(pos + 1);
        st.block(
            q,
            end - start,
            scale,
            |j| &src.k_row(start + j)[off..off + hd],
            |j| &src.v_row(start + j)[off..off + hd],
        );
        start = end;
    }
    let inv = 1.0 / st.l;
    for (o, a) in out.iter_mut().zip(st.acc.iter()) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rows {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    }
    impl RowSource for Rows {
        fn k_row(&self, pos: usize) -> &[f32] {
            &self.k[pos]
        }
        fn v_row(&self, pos: usize) -> &[f32] {
            &self.v[pos]
        }
    }

    /// Textbook softmax attention in f64.
    fn naive(rows: &Rows, q: &[f32], pos: usize, hd: usize, scale: f32) -> Vec<f64> {
        let s: Vec<f64> = (0..=pos)
            .map(|j| {
                q.iter()
                    .zip(&rows.k[j][..hd])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| (0..=pos).map(|j| e[j] * rows.v[j][d] as f64).sum::<f64>() / z)
            .collect()
    }

    #[test]
    fn matches_naive_softmax_across_block_edges() {
        let hd = 8;
        let n = 40;
        let val = |i: usize, d: usize, s: f32| ((i * 31 + d * 7) as f32 * s).sin();
        let rows = Rows {
            k: (0..n)
                .map(|i| (0..hd).map(|d| val(i, d, 0.37)).collect())
                .collect(),
            v: (0..n)
                .map(|i| (0..hd).map(|d| val(i, d, 0.11)).collect())
                .collect(),
        };
        for pos in [0, 15, 16, 17, 39] {
            let q: Vec<f32> = (0..hd).map(|d| val(pos, d, 0.23) * 3.0).collect();
            let g = AttnGeometry {
                q_heads: 1,
                kv_heads: 1,
                head_dim: hd,
                first_pos: pos,
                scale: 0.5,
            };
            let mut out = vec![0f32; hd];
            attend(&rows, &q, g, &mut out);
            let want = naive(&rows, &q, pos, hd, 0.5);
            for (a, b) in out.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "pos {pos}: {a} vs {b}");
            }
        }
    }

    /// The same rows, offered in runs (ragged against the blocks) or only row by row.
    struct Runs<'a>(&'a [f32], &'a [f32], usize);
    impl RowSource for Runs<'_> {
        fn k_row(&self, pos: usize) -> &[f32] {
            &self.0[pos * self.2..(pos + 1) * self.2]
        }
        fn v_row(&self, pos: usize) -> &[f32] {
            &self.1[pos * self.2..(pos + 1) * self.2]
        }
        fn run(&self, start: usize) -> Option<(&[f32], &[f32])> {
            // Runs of 21 rows, so blocks of 16 straddle them; none in the third run.
            let (r, end) = (start / 21, (start / 21 + 1) * 21);
            (r != 2).then(|| {
                (
                    &self.0[start * self.2..end * self.2],
                    &self.1[start * self.2..end * self.2],
                )
            })
        }
    }

    #[test]
    fn runs_and_rows_give_the_same_bits_at_any_batch_size() {
        let (kv_heads, hd, n) = (2, 12, 84);
        let row = kv_heads * hd;
        let val = |i: usize, s: f32| ((i * 13) as f32 * s).sin();
        let k: Vec<f32> = (0..n * row).map(|i| val(i, 0.31)).collect();
        let v: Vec<f32> = (0..n * row).map(|i| val(i, 0.17)).collect();
        let rows = Rows {
            k: k.chunks(row).map(<[f32]>::to_vec).collect(),
            v: v.chunks(row).map(<[f32]>::to_vec).collect(),
        };
        let q_heads = 4;
        let n_q = 20;
        let q: Vec<f32> = (0..n_q * q_heads * hd).map(|i| val(i, 0.7) * 4.0).collect();
        let g = |first_pos| AttnGeometry {
            q_heads,
            kv_heads,
            head_dim: hd,
            first_pos,
            scale: 0.3,
        };
        let mut by_rows = vec![0f32; q.len()];
        attend(&rows, &q, g(n - n_q), &mut by_rows);
        let mut by_runs = vec![0f32; q.len()];
        attend(&Runs(&k, &v, row), &q, g(n - n_q), &mut by_runs);
        let bits = |o: &[f32]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&by_rows), bits(&by_runs));
        // Each query alone gives the bits it got inside the block.
        let per_q = q_heads * hd;
        for i in 0..n_q {
            let mut one = vec![0f32; per_q];
            let qi = &q[i * per_q..(i + 1) * per_q];
            attend(&Runs(&k, &v, row), qi, g(n - n_q + i), &mut one);
            assert_eq!(bits(&one), bits(&by_rows[i * per_q..(i + 1) * per_q]));
        }
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (0..13).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &a), (0..13).map(|i| (i * i) as f32).sum::<f32>());
    }
}

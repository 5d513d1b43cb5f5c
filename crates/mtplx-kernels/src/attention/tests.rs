//! The attention kernel against a naive softmax, and its bits across batch sizes, thread
//! splits, element types and ISAs.

use super::*;

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
    type Elem = f32;
    fn k_row(&self, pos: usize) -> &[f32] {
        &self.0[pos * self.2..(pos + 1) * self.2]
    }
    fn v_row(&self, pos: usize) -> &[f32] {
        &self.1[pos * self.2..(pos + 1) * self.2]
    }
    fn run(&self, start: usize) -> Option<(&[f32], &[f32])> {
        // Runs of 21 rows, so blocks of 16 straddle them; none in the third run.
        let (r, end) = (
            start / 21,
            ((start / 21 + 1) * 21).min(self.0.len() / self.2),
        );
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

/// Past one span the keys are folded span by span and merged: a decode step split over
/// the threads by span, the same query inside a prefill batch (one item folding every
/// span), any pool size and the naive softmax all agree (the first three bit for bit).
#[test]
fn spans_split_over_threads_give_the_unsplit_bits() {
    let (kv_heads, hd, n) = (3, 16, 3 * ATTN_SPAN + 37);
    let q_heads = 9;
    let row = kv_heads * hd;
    let val = |i: usize, s: f32| ((i * 13) as f32 * s).sin();
    let k: Vec<f32> = (0..n * row).map(|i| val(i, 0.31)).collect();
    let v: Vec<f32> = (0..n * row).map(|i| val(i, 0.17)).collect();
    let rows = Rows {
        k: k.chunks(row).map(<[f32]>::to_vec).collect(),
        v: v.chunks(row).map(<[f32]>::to_vec).collect(),
    };
    let g = |first_pos| AttnGeometry {
        q_heads,
        kv_heads,
        head_dim: hd,
        first_pos,
        scale: 0.3,
    };
    let per_q = q_heads * hd;
    // A batch of 40 queries ending at the last key: many items, no split.
    let n_q = 40;
    let q: Vec<f32> = (0..n_q * per_q).map(|i| val(i, 0.7) * 3.0).collect();
    let mut batch = vec![0f32; q.len()];
    attend_with(&Pool::new(2), &rows, &q, g(n - n_q), &mut batch);
    let bits = |o: &[f32]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for i in [0, ATTN_SPAN - (n - n_q) % ATTN_SPAN, n_q - 1] {
        let qi = &q[i * per_q..(i + 1) * per_q];
        let want = bits(&batch[i * per_q..(i + 1) * per_q]);
        // One query alone: split by span on 2 and 3 threads, not on 1.
        for threads in [1, 2, 3] {
            let mut one = vec![0f32; per_q];
            attend_with(
                &Pool::new(threads),
                &Runs(&k, &v, row),
                qi,
                g(n - n_q + i),
                &mut one,
            );
            assert_eq!(bits(&one), want, "query {i}, {threads} threads");
        }
        for h in 0..q_heads {
            let kvh = h / (q_heads / kv_heads);
            let head = Rows {
                k: rows
                    .k
                    .iter()
                    .map(|r| r[kvh * hd..(kvh + 1) * hd].to_vec())
                    .collect(),
                v: rows
                    .v
                    .iter()
                    .map(|r| r[kvh * hd..(kvh + 1) * hd].to_vec())
                    .collect(),
            };
            let exact = naive(&head, &qi[h * hd..(h + 1) * hd], n - n_q + i, hd, 0.3);
            for (a, b) in batch[i * per_q + h * hd..][..hd].iter().zip(&exact) {
                assert!(
                    (*a as f64 - b).abs() < 1e-5,
                    "query {i} head {h}: {a} vs {b}"
                );
            }
        }
    }
}

/// K and V rows of any element type, `row` elements each, back to back (one run).
struct Typed<E>(Vec<E>, Vec<E>, usize);
impl<E: KvElem> RowSource for Typed<E> {
    type Elem = E;
    fn k_row(&self, pos: usize) -> &[E] {
        &self.0[pos * self.2..(pos + 1) * self.2]
    }
    fn v_row(&self, pos: usize) -> &[E] {
        &self.1[pos * self.2..(pos + 1) * self.2]
    }
    fn run(&self, start: usize) -> Option<(&[E], &[E])> {
        Some((&self.0[start * self.2..], &self.1[start * self.2..]))
    }
}

/// `values` as stored in `E` (one rounding, as a cache stores a row).
fn narrowed<E: KvElem>(values: &[f32]) -> Vec<E> {
    let mut out = vec![E::default(); values.len() / E::GROUP];
    E::narrow(values, &mut out);
    out
}

/// The values `stored` holds.
fn widened<E: KvElem>(stored: &[E]) -> Vec<f32> {
    let mut out = vec![0f32; stored.len() * E::GROUP];
    E::widen(stored, &mut out);
    out
}

/// Stored rows of every element type (16-bit floats, quantized groups) give the bits of
/// `f32` rows holding the values they widen to, on every instruction set.
#[test]
fn stored_rows_give_the_bits_of_f32_rows_holding_their_values() {
    fn check<E: KvElem>() {
        let (kv_heads, hd, n) = (3, 64, 600);
        let row = kv_heads * hd;
        let val = |i: usize, s: f32| ((i * 13) as f32 * s).sin() * 4.0;
        let stored =
            |s: f32| -> Vec<E> { narrowed(&(0..n * row).map(|i| val(i, s)).collect::<Vec<_>>()) };
        let (k, v) = (stored(0.31), stored(0.17));
        let typed = Typed(k.clone(), v.clone(), row / E::GROUP);
        let plain = Typed(widened(&k), widened(&v), row);
        let g = AttnGeometry {
            q_heads: 9,
            kv_heads,
            head_dim: hd,
            first_pos: n - 2,
            scale: 0.125,
        };
        let q: Vec<f32> = (0..2 * 9 * hd).map(|i| val(i, 0.23)).collect();
        let pool = Pool::new(2);
        let mut want = vec![0f32; q.len()];
        attend_on(Isa::Portable, &pool, &plain, &q, g, &mut want);
        for isa in [Isa::Portable, Isa::detect()] {
            let mut got = vec![0f32; q.len()];
            attend_on(isa, &pool, &typed, &q, g, &mut got);
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{:?}",
                E::DTYPE
            );
        }
        // The rounding did happen: not the f32 rows' answer.
        if E::DTYPE != crate::KvDtype::F32 {
            let exact = Typed(
                (0..n * row).map(|i| val(i, 0.31)).collect::<Vec<f32>>(),
                (0..n * row).map(|i| val(i, 0.17)).collect::<Vec<f32>>(),
                row,
            );
            let mut other = vec![0f32; q.len()];
            attend_on(Isa::Portable, &pool, &exact, &q, g, &mut other);
            assert_ne!(other, want);
        }
    }
    check::<f32>();
    check::<half::f16>();
    check::<half::bf16>();
    check::<crate::elem::Q8Group>();
    check::<crate::elem::Q4Group>();
}

#[test]
fn dot_handles_tails() {
    let a: Vec<f32> = (0..13).map(|i| i as f32).collect();
    assert_eq!(dot(&a, &a), (0..13).map(|i| (i * i) as f32).sum::<f32>());
}

/// A decode step (one or two queries, each KV head's query heads in one group, whole key
/// blocks folded in registers, KV heads side by side in an item) and a short prefill chunk
/// (nine queries: tiles of query heads folded in registers eight at a time, partial
/// blocks through the transposed tile) give the portable kernel's bits, at every element
/// type, head size, group size (the widths in registers, 1-4 and 8, and those padded to
/// 8) and thread count.
#[test]
fn decode_steps_give_the_portable_bits_on_this_cpu() {
    fn check<E: KvElem>(kv_heads: usize, group: usize, hd: usize) {
        let n = 2 * ATTN_SPAN + 45;
        let row = kv_heads * hd;
        let q_heads = kv_heads * group;
        // Scores spread enough that the running maximum moves within blocks and between.
        let val = |i: usize, s: f32| ((i * 13) as f32 * s).sin() * 3.0 + (i % 7) as f32 * 0.1;
        let stored =
            |s: f32| -> Vec<E> { narrowed(&(0..n * row).map(|i| val(i, s)).collect::<Vec<_>>()) };
        let rows = Typed(stored(0.31), stored(0.17), row / E::GROUP);
        for n_q in [1, 2, 9] {
            // Mid-block, the last key of a block, the first of a span, deep in the last span.
            for last in [40, 47, ATTN_SPAN, n - 1] {
                let g = AttnGeometry {
                    q_heads,
                    kv_heads,
                    head_dim: hd,
                    first_pos: last + 1 - n_q,
                    scale: 0.3,
                };
                let q: Vec<f32> = (0..n_q * q_heads * hd).map(|i| val(i, 0.23)).collect();
                let mut want = vec![0f32; q.len()];
                attend_on(Isa::Portable, &Pool::new(1), &rows, &q, g, &mut want);
                // The AVX2 build too where the CPU has AVX-512 (CI's machines may have either).
                for (isa, threads) in supported()
                    .into_iter()
                    .flat_map(|isa| [1, 2, 3].map(|t| (isa, t)))
                {
                    let mut got = vec![0f32; q.len()];
                    attend_on(isa, &Pool::new(threads), &rows, &q, g, &mut got);
                    let bits = |o: &[f32]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{:?} {kv_heads}x{group} heads of {hd}, {n_q} queries to {last}, \
                         {threads} threads, {isa:?}",
                        E::DTYPE
                    );
                }
            }
        }
    }
    for (kv_heads, group, hd) in [
        (3, 3, 64),
        (2, 7, 64),
        (2, 4, 128),
        (4, 1, 8),
        (1, 2, 32),
        (1, 8, 64),
        (1, 13, 32),
        (2, 6, 64),
        (1, 5, 128),
        (2, 1, 64),
    ] {
        check::<f32>(kv_heads, group, hd);
        check::<half::f16>(kv_heads, group, hd);
        check::<half::bf16>(kv_heads, group, hd);
        if hd.is_multiple_of(crate::elem::GROUP) {
            check::<crate::elem::Q8Group>(kv_heads, group, hd);
            check::<crate::elem::Q4Group>(kv_heads, group, hd);
        }
    }
}

/// Every instruction set this CPU runs, the detected one first.
fn supported() -> Vec<Isa> {
    let mut all = vec![Isa::detect()];
    #[cfg(target_arch = "x86_64")]
    if matches!(all[0], Isa::Avx512) {
        all.push(Isa::Avx2);
    }
    all
}

/// The eight-lane `exp` gives, lane by lane, the scalar `exp`'s bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn exp8_gives_the_bits_of_exp() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return;
    }
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        -87.0,
        -87.000_01,
        -86.999_99,
        88.0,
        100.0,
        -1e30,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
    ];
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..100_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        xs.push(-100.0 * (seed >> 40) as f32 / (1u64 << 24) as f32 + 1.0);
    }
    xs.resize(xs.len().next_multiple_of(16), 0.0);
    #[target_feature(enable = "avx2,fma")]
    unsafe fn lanes(x: &[f32]) -> [f32; 8] {
        use std::arch::x86_64::*;
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), x86::exp8(_mm256_loadu_ps(x.as_ptr())));
        out
    }
    for chunk in xs.chunks(8) {
        // SAFETY: AVX2 and FMA were detected above; the chunk holds 8 values.
        let got = unsafe { lanes(chunk) };
        for (x, e) in chunk.iter().zip(got) {
            assert_eq!(e.to_bits(), exp(*x).to_bits(), "exp({x})");
        }
    }
    // And the sixteen-lane one, where the CPU has it.
    if !is_x86_feature_detected!("avx512f") {
        return;
    }
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes16(x: &[f32]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let mut out = [0f32; 16];
        _mm512_storeu_ps(
            out.as_mut_ptr(),
            super::zmm::exp16(_mm512_loadu_ps(x.as_ptr())),
        );
        out
    }
    for chunk in xs.chunks_exact(16) {
        // SAFETY: AVX-512F was detected above; the chunk holds 16 values.
        let got = unsafe { lanes16(chunk) };
        for (x, e) in chunk.iter().zip(got) {
            assert_eq!(e.to_bits(), exp(*x).to_bits(), "exp16({x})");
        }
    }
}

//! The 8-bit activation kernels (`Activations::Q8`: Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q6_K) against
//! their definition written the slow way from the GGUF bytes, as ggml's `vec_dot_*_q8_*` reads
//! them: the activations rounded per block, the weights' integers summed exactly, one `f32` step
//! per block. Bit for bit on every instruction set, at every row count and thread count; within the
//! rounding's error bound of the exact product; and the packed weights dequantize to candle's
//! (ggml's) values.

mod kernels_common;

use half::f16;
use kernels_common::*;
use mtplx_model::kernels::{Activations, Isa, Pool, QuantFormat, QuantMatrix};
use proptest::prelude::*;

const FORMATS: [QuantFormat; 6] = [
    QuantFormat::Q8_0,
    QuantFormat::Q5_0,
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q4K,
    QuantFormat::Q6K,
];

/// One row of `x` rounded as the kernels' docs say: per block of `len`, scale
/// `amax / 127` (an f16 for 32-input blocks), `q = round-half-even(x × 127 / amax)`.
fn round(x: &[f32], len: usize) -> (Vec<i32>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::new();
    for b in x.chunks(len) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            q.extend(b.iter().map(|_| 0));
            d.push(0.0);
            continue;
        }
        let id = 127.0 / amax;
        q.extend(b.iter().map(|v| (v * id).round_ties_even() as i32));
        let s = amax / 127.0;
        d.push(if len == 32 {
            f16::from_f32(s).to_f32()
        } else {
            s
        });
    }
    (q, d)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// ggml's `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(q[j] & 63), i32::from(q[j + 4] & 63))
    } else {
        (
            i32::from((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
            i32::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4)),
        )
    }
}

/// The product of one GGUF block row `blk` with rounded inputs `q` (scale `dx`), folded into
/// `acc` as the kernels do, transcribed from ggml's block loops.
fn block(format: QuantFormat, blk: &[u8], q: &[i32], dx: f32, acc: f32) -> f32 {
    match format {
        QuantFormat::Q8_0 => {
            let s: i32 = (0..32).map(|i| i32::from(blk[2 + i] as i8) * q[i]).sum();
            (s as f32).mul_add(f16_at(blk, 0) * dx, acc)
        }
        QuantFormat::Q5_0 => {
            let qh = u32::from_le_bytes(blk[2..6].try_into().unwrap());
            let mut s = 0;
            for j in 0..16 {
                let x0 = i32::from(blk[6 + j] & 0xF) | (((qh >> j) & 1) << 4) as i32;
                let x1 = i32::from(blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
                s += (x0 - 16) * q[j] + (x1 - 16) * q[j + 16];
            }
            (s as f32).mul_add(f16_at(blk, 0) * dx, acc)
        }
        QuantFormat::Q4_0 => {
            // ggml's vec_dot_q4_0_q8_0: Σ (q − 8) x by d dx.
            let mut s = 0i32;
            for j in 0..16 {
                let (x0, x1) = (i32::from(blk[2 + j] & 0xF), i32::from(blk[2 + j] >> 4));
                s += (x0 - 8) * q[j] + (x1 - 8) * q[j + 16];
            }
            (s as f32).mul_add(f16_at(blk, 0) * dx, acc)
        }
        QuantFormat::Q4_1 => {
            // ggml's vec_dot_q4_1_q8_1: Σ q x by d dx, then the mins by m Σ x (here
            // `m dx` times the exact integer sum, not llama.cpp's f16 of `dx Σ x`).
            let (mut s, mut sx) = (0i32, 0i32);
            for j in 0..16 {
                s += i32::from(blk[4 + j] & 0xF) * q[j] + i32::from(blk[4 + j] >> 4) * q[j + 16];
                sx += q[j] + q[j + 16];
            }
            let acc = (s as f32).mul_add(f16_at(blk, 0) * dx, acc);
            (sx as f32).mul_add(f16_at(blk, 2) * dx, acc)
        }
        QuantFormat::Q4K => {
            let (mut sum, mut mins) = (0i32, 0i32);
            for c in 0..4 {
                let (sc0, m0) = scale_min_k4(2 * c, &blk[4..16]);
                let (sc1, m1) = scale_min_k4(2 * c + 1, &blk[4..16]);
                let qs = &blk[16 + 32 * c..];
                let y = &q[64 * c..];
                let (mut s0, mut s1, mut y0, mut y1) = (0, 0, 0, 0);
                for l in 0..32 {
                    s0 += i32::from(qs[l] & 0xF) * y[l];
                    s1 += i32::from(qs[l] >> 4) * y[l + 32];
                    y0 += y[l];
                    y1 += y[l + 32];
                }
                sum += sc0 * s0 + sc1 * s1;
                mins += m0 * y0 + m1 * y1;
            }
            let acc = (sum as f32).mul_add(f16_at(blk, 0) * dx, acc);
            (mins as f32).mul_add(f16_at(blk, 2) * -dx, acc)
        }
        QuantFormat::Q6K => {
            let mut sum = 0i32;
            for h in 0..2 {
                let (ql, qh) = (&blk[64 * h..], &blk[128 + 32 * h..]);
                let y = &q[128 * h..];
                let sc = &blk[192 + 8 * h..];
                let mut sub = [0i32; 8];
                for l in 0..32 {
                    let is = l / 16;
                    let v = [
                        (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                        (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                    ];
                    for (k, v) in v.iter().enumerate() {
                        sub[is + 2 * k] += (i32::from(*v) - 32) * y[l + 32 * k];
                    }
                }
                for (s, v) in sub.iter().enumerate() {
                    sum += i32::from(sc[s] as i8) * v;
                }
            }
            (sum as f32).mul_add(f16_at(blk, 208) * dx, acc)
        }
        f => unreachable!("{f:?}"),
    }
}

/// The definition, the slow way.
fn reference(
    format: QuantFormat,
    bytes: &[u8],
    x: &[f32],
    n: usize,
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let (bl, bb) = (format.block_len(), format.block_bytes());
    let mut y = vec![0f32; n * rows];
    for r in 0..n {
        let (q, d) = round(&x[r * cols..(r + 1) * cols], bl);
        for o in 0..rows {
            let row = &bytes[o * (cols / bl) * bb..];
            y[r * rows + o] = (0..cols / bl).fold(0f32, |acc, b| {
                block(format, &row[b * bb..(b + 1) * bb], &q[b * bl..], d[b], acc)
            });
        }
    }
    y
}

fn check(format: QuantFormat, rows: usize, blocks: usize, n: usize, seed: u64, pool: &Pool) {
    let mut rng = Rng(seed);
    let cols = blocks * format.block_len();
    let bytes = random_gguf(&mut rng, format, rows, cols);
    let m = QuantMatrix::from_gguf_bytes_with(format, &bytes, rows, cols, Activations::Q8).unwrap();
    assert_eq!(m.activations(), Activations::Q8);
    let w = dequantize(&qtensor(format, &bytes, rows, cols));

    // The packed weights are candle's, bit for bit.
    assert_rows_are(&m, &w, &format!("{format:?}"));

    // Mostly moderate values, with a block of zeros and a large outlier now and then.
    let mut x = rng.vec(n * cols, -2.0, 2.0);
    if seed.is_multiple_of(3) {
        x[..32.min(cols)].fill(0.0);
    }
    if seed.is_multiple_of(5) {
        x[cols / 2] = 300.0;
    }
    let want = reference(format, &bytes, &x, n, rows, cols);
    assert_every_isa_gives(&m, pool, &x, n, &want);

    // Within the rounding's bound of the exact product: each input moves by at most half a
    // step (d_x / 2, d_x ≤ amax (1 + 2⁻¹¹) / 127), plus the f32 steps.
    let bl = format.block_len();
    for r in 0..n {
        let xr = &x[r * cols..(r + 1) * cols];
        for o in 0..rows {
            let wr = &w[o * cols..(o + 1) * cols];
            let (mut exact, mut bound) = (0f64, 0f64);
            for (wb, xb) in wr.chunks(bl).zip(xr.chunks(bl)) {
                let amax = xb.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
                let step = amax / 127.0 * (1.0 + 2f64.powi(-10));
                for (a, b) in wb.iter().zip(xb) {
                    let (a, b) = (f64::from(*a), f64::from(*b));
                    exact += a * b;
                    bound += a.abs() * (step / 2.0 + (b.abs() + step) * 2f64.powi(-10));
                }
            }
            let got = f64::from(want[r * rows + o]);
            assert!(
                (got - exact).abs() <= bound + 1e-30,
                "{format:?} row {r} output {o}: {got} vs {exact}, bound {bound}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any shape, row count and thread count: the definition's bits.
    #[test]
    fn every_shape_gives_the_definitions_bits(
        f in prop::sample::select(FORMATS.to_vec()),
        rows in 1usize..70,
        blocks in 1usize..4,
        n in 1usize..12,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let pool = Pool::new(threads);
        check(f, rows, blocks, n, seed, &pool);
    }
}

/// A row's result does not depend on the rows computed with it: each row alone, then all of
/// them in one product (prefill-sized: enough values that the rounding is split over the
/// pool's threads too), same bits.
#[test]
fn a_rows_bits_do_not_depend_on_the_batch() {
    let pool = Pool::new(2);
    for format in FORMATS {
        let (rows, cols, n) = (48, 2 * 256, 161);
        let mut rng = Rng(7);
        let bytes = random_gguf(&mut rng, format, rows, cols);
        let m =
            QuantMatrix::from_gguf_bytes_with(format, &bytes, rows, cols, Activations::Q8).unwrap();
        let x = rng.vec(n * cols, -1.0, 1.0);
        let mut all = vec![0f32; n * rows];
        m.matmul_with(&pool, Isa::detect(), &x, n, &mut all);
        for r in 0..n {
            let mut one = vec![0f32; rows];
            m.matmul_with(
                &pool,
                Isa::detect(),
                &x[r * cols..(r + 1) * cols],
                1,
                &mut one,
            );
            assert_bits_eq(
                &one,
                &all[r * rows..(r + 1) * rows],
                &format!("{format:?} row {r}"),
            );
        }
    }
}

/// Formats without 8-bit kernels keep `f32` activations; concatenation keeps the setting
/// and refuses to mix settings.
#[test]
fn other_formats_keep_f32_and_parts_must_agree() {
    let mut rng = Rng(3);
    for format in [QuantFormat::Q5_1, QuantFormat::F16, QuantFormat::Q5K] {
        let cols = 256;
        let bytes = random_gguf(&mut rng, format, 16, cols);
        let m =
            QuantMatrix::from_gguf_bytes_with(format, &bytes, 16, cols, Activations::Q8).unwrap();
        assert_eq!(m.activations(), Activations::F32, "{format:?}");
    }
    let bytes = random_gguf(&mut rng, QuantFormat::Q8_0, 16, 64);
    let a = QuantMatrix::from_gguf_bytes_with(QuantFormat::Q8_0, &bytes, 16, 64, Activations::Q8)
        .unwrap();
    let b = QuantMatrix::from_gguf_bytes(QuantFormat::Q8_0, &bytes, 16, 64).unwrap();
    let both = QuantMatrix::concat_rows(&[a.clone(), a.clone()]).unwrap();
    assert_eq!(both.activations(), Activations::Q8);
    assert!(QuantMatrix::concat_rows(&[a, b]).is_err());
}

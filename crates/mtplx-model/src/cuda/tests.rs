//! The device kernels against host references: every weight format dequantized as the
//! kernels crate (ggml's arithmetic) does, bit for bit; products over them; attention past
//! many key parts. Skipped without a device unless `MTPLX_CUDA_TESTS=1`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::f16;
use mtplx_kv::{KvCache, KvDtype, KvShape, KvView};

use super::cache::CudaKvCache;
use super::device::CudaDevice;
use super::matrix::DeviceMatrix;
use crate::kernels::{Activations, QuantFormat, QuantMatrix};
use crate::weights::{FileData, FilePart};

pub(super) fn device() -> Option<Arc<CudaDevice>> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var_os("MTPLX_CUDA_TESTS").is_some() => {
            panic!("MTPLX_CUDA_TESTS is set but there is no usable device: {e}")
        }
        Err(e) => {
            eprintln!("skipped, no CUDA device: {e}");
            None
        }
    }
}

/// xorshift64*: the same numbers on every run.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn half(&mut self, scale: f32) -> [u8; 2] {
        f16::from_f32(self.unit() * scale).to_le_bytes()
    }
}

/// `rows` random rows of `cols` values in `format`'s blocks: random bits, with the scales
/// (and the dense formats' values) finite.
pub(super) fn random_blocks(
    format: QuantFormat,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Vec<u8> {
    let blocks = rows * cols / format.block_len();
    let bb = format.block_bytes();
    let mut out = Vec::with_capacity(blocks * bb);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..bb).map(|_| rng.next() as u8).collect();
        match format {
            QuantFormat::F32 => b.copy_from_slice(&rng.unit().to_le_bytes()),
            QuantFormat::F16 => b.copy_from_slice(&rng.half(4.0)),
            QuantFormat::BF16 => {
                b.copy_from_slice(&half::bf16::from_f32(rng.unit() * 4.0).to_le_bytes())
            }
            QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => {
                b[..2].copy_from_slice(&rng.half(0.1))
            }
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => {
                b[..2].copy_from_slice(&rng.half(0.1));
                b[2..4].copy_from_slice(&rng.half(0.1));
            }
            QuantFormat::Q6K => b[208..].copy_from_slice(&rng.half(0.1)),
        }
        out.extend(b);
    }
    out
}

pub(super) fn matrix(
    dev: &CudaDevice,
    format: QuantFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> DeviceMatrix {
    let part = FilePart {
        rows,
        cols,
        data: FileData::Blocks {
            format,
            bytes: bytes.to_vec(),
        },
    };
    DeviceMatrix::from_parts(dev, vec![part], None).unwrap()
}

/// Every format's rows, read by the embedding kernel, are the kernels crate's dequantized
/// rows (ggml's arithmetic) bit for bit.
#[test]
fn every_format_dequantizes_as_ggml_does() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (rows, cols) = (37, 512);
    for format in QuantFormat::ALL {
        let bytes = random_blocks(format, rows, cols, &mut rng);
        let host = QuantMatrix::from_gguf_bytes(format, &bytes, rows, cols).unwrap();
        let m = matrix(&dev, format, &bytes, rows, cols);
        let tokens: Vec<u32> = (0..rows as u32).rev().collect();
        let mut meta = vec![0u32, 0];
        meta.extend(&tokens);
        let meta = dev.upload(&meta).unwrap();
        let mut out = dev.zeros::<f32>(rows * cols).unwrap();
        dev.embed(&meta, &m, &mut out, rows).unwrap();
        let mut got = vec![0f32; rows * cols];
        dev.read(&out, 0, &mut got).unwrap();
        let mut want = vec![0f32; cols];
        for (i, &t) in tokens.iter().enumerate() {
            host.dequantize_row(t as usize, &mut want);
            let row = &got[i * cols..(i + 1) * cols];
            for (j, (a, b)) in row.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{format:?} row {t} value {j}: {a} vs {b}"
                );
            }
        }
    }
}

/// Products over every format equal a float64 product of the dequantized rows (to f32
/// rounding), and a row's result does not depend on how many rows share the launch. Rows
/// of 768 values are 24 chunks (three whole steps of a warp's 8 chunks); rows of 576 (the
/// default model's width) are 18, so a warp's last step has only some of its lanes.
#[test]
fn products_over_every_format_are_right_and_row_invariant() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(7);
    let (rows, n) = (70, 11);
    let shapes = QuantFormat::ALL.into_iter().flat_map(|f| {
        let narrow = (576 % f.block_len() == 0).then_some((f, 576));
        std::iter::once((f, 768)).chain(narrow)
    });
    for (format, cols) in shapes {
        let bytes = random_blocks(format, rows, cols, &mut rng);
        let host = QuantMatrix::from_gguf_bytes(format, &bytes, rows, cols).unwrap();
        let m = matrix(&dev, format, &bytes, rows, cols);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
        let xd = dev.upload(&x).unwrap();
        let mut y = dev.zeros::<f32>(n * rows).unwrap();
        dev.matvec(&m, &xd, &mut y, n, false).unwrap();
        let mut all = vec![0f32; n * rows];
        dev.read(&y, 0, &mut all).unwrap();
        let mut w = vec![0f32; cols];
        for o in 0..rows {
            host.dequantize_row(o, &mut w);
            for r in 0..n {
                let exact: f64 = w
                    .iter()
                    .zip(&x[r * cols..(r + 1) * cols])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                let mag: f64 = w
                    .iter()
                    .zip(&x[r * cols..(r + 1) * cols])
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = all[r * rows + o] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * mag.max(1e-30),
                    "{format:?} {cols} wide, out {o} row {r}: {got} vs {exact}"
                );
            }
        }
        // The last row alone: the same bits.
        let last = dev.upload(&x[(n - 1) * cols..]).unwrap();
        let mut y1 = dev.zeros::<f32>(rows).unwrap();
        dev.matvec(&m, &last, &mut y1, 1, false).unwrap();
        let mut one = vec![0f32; rows];
        dev.read(&y1, 0, &mut one).unwrap();
        assert_eq!(one, all[(n - 1) * rows..], "{format:?} {cols} wide");
    }
}

/// With 8-bit activations, Q4_K and Q6_K products are the CPU's `Activations::Q8` products
/// bit for bit, a row alone or among others: widths of 3 blocks of 256 and of 17 (a warp
/// takes 16 a step: a whole step and a partial one), 70 and 200 outputs (partial warps and
/// blocks), a row with an all-zero block of inputs and one with a block of tiny values; 6
/// rows of x (`matvecq_F`) and 83 (`mmq_F`, on tensor cores: a whole block of 64 rows and
/// a partial one).
#[test]
fn eight_bit_products_are_the_cpus_bit_for_bit() {
    let Some(dev) = device() else { return };
    // 83 rows go to the tensor cores wherever the device has them.
    assert_eq!(dev.q8_on_tensor_cores(), dev.capability().0 >= 8);
    let mut rng = Rng(23);
    for (format, rows, n) in [
        (QuantFormat::Q4K, 70, 6),
        (QuantFormat::Q6K, 70, 6),
        (QuantFormat::Q4K, 200, 83),
        (QuantFormat::Q6K, 200, 83),
    ] {
        for cols in [768, 17 * 256] {
            let bytes = random_blocks(format, rows, cols, &mut rng);
            let host =
                QuantMatrix::from_gguf_bytes_with(format, &bytes, rows, cols, Activations::Q8)
                    .unwrap();
            assert_eq!(host.activations(), Activations::Q8);
            let mut m = matrix(&dev, format, &bytes, rows, cols);
            m.activations = Activations::Q8;
            let mut x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            x[cols + 256..cols + 512].fill(0.0);
            for v in &mut x[2 * cols..2 * cols + 256] {
                *v *= 1e-30;
            }
            let mut want = vec![0f32; n * rows];
            host.matmul(&x, n, &mut want);
            let xd = dev.upload(&x).unwrap();
            let mut y = dev.zeros::<f32>(n * rows).unwrap();
            dev.matvec(&m, &xd, &mut y, n, false).unwrap();
            let mut got = vec![0f32; n * rows];
            dev.read(&y, 0, &mut got).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{format:?} {cols} wide, row {} out {}: {a} vs {b}",
                    i / rows,
                    i % rows
                );
            }
            for r in 0..n {
                let one = dev.upload(&x[r * cols..(r + 1) * cols]).unwrap();
                let mut y1 = dev.zeros::<f32>(rows).unwrap();
                dev.matvec(&m, &one, &mut y1, 1, false).unwrap();
                let mut alone = vec![0f32; rows];
                dev.read(&y1, 0, &mut alone).unwrap();
                assert_eq!(
                    alone,
                    want[r * rows..(r + 1) * rows],
                    "{format:?} {cols} row {r}"
                );
            }
        }
    }
}

/// A product of two parts in the two 8-bit formats (a fused QKV whose V is Q6_K), over 40
/// rows of x (tensor cores: x rounded once, read by both parts' launches) and added to
/// what y held (the residual's accumulation): each part's columns are the CPU's products
/// plus y's values, bit for bit.
#[test]
fn a_two_format_product_on_tensor_cores_is_the_cpus_and_accumulates() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(29);
    let (cols, n) = (5 * 256, 40);
    let shapes = [(QuantFormat::Q4K, 72), (QuantFormat::Q6K, 56)];
    let blocks: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(f, rows)| random_blocks(f, rows, cols, &mut rng))
        .collect();
    let parts = shapes
        .iter()
        .zip(&blocks)
        .map(|(&(format, rows), bytes)| FilePart {
            rows,
            cols,
            data: FileData::Blocks {
                format,
                bytes: bytes.clone(),
            },
        })
        .collect();
    let mut m = DeviceMatrix::from_parts(&*dev, parts, None).unwrap();
    m.activations = Activations::Q8;
    assert_eq!(m.parts.len(), 2);
    let total: usize = shapes.iter().map(|s| s.1).sum();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    let y0: Vec<f32> = (0..n * total).map(|_| rng.unit()).collect();
    let mut want = y0.clone();
    let mut at = 0;
    for (&(format, rows), bytes) in shapes.iter().zip(&blocks) {
        let host =
            QuantMatrix::from_gguf_bytes_with(format, bytes, rows, cols, Activations::Q8).unwrap();
        let mut part = vec![0f32; n * rows];
        host.matmul(&x, n, &mut part);
        for r in 0..n {
            for o in 0..rows {
                want[r * total + at + o] += part[r * rows + o];
            }
        }
        at += rows;
    }
    let xd = dev.upload(&x).unwrap();
    let mut y = dev.upload(&y0).unwrap();
    dev.matvec(&m, &xd, &mut y, n, true).unwrap();
    let mut got = vec![0f32; n * total];
    dev.read(&y, 0, &mut got).unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "row {} out {}: {a} vs {b}",
            i / total,
            i % total
        );
    }
}

/// A decode step's row rounded by the kernel that writes it (`rms_norm_q8`, `silu_mul_q8`)
/// is the row `rms_norm` and `silu_mul` write, bit for bit, and the 8-bit products that
/// read that rounding give the CPU's products of the row (a block of zeros and one of tiny
/// values included).
#[test]
fn a_row_rounded_by_its_writer_gives_the_products_bits() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(31);
    let (cols, rows) = (17 * 256, 70);
    // On unless switched off (a device run with it off tests the products without them).
    let on = super::switches::switched_on("MTPLX_CUDA_DECODE_ROUNDED");
    let plain = |x: &CudaSlice<f32>, len: usize| {
        let mut v = vec![0f32; len];
        dev.read(x, 0, &mut v).unwrap();
        v
    };
    for format in [QuantFormat::Q4K, QuantFormat::Q6K] {
        let bytes = random_blocks(format, rows, cols, &mut rng);
        let host =
            QuantMatrix::from_gguf_bytes_with(format, &bytes, rows, cols, Activations::Q8).unwrap();
        let mut m = matrix(&dev, format, &bytes, rows, cols);
        m.activations = Activations::Q8;
        assert_eq!(dev.rounds_row_for(&m), on, "{format:?}");
        if !on {
            continue;
        }
        let check = |x: &CudaSlice<f32>, rq: &CudaSlice<u8>, what: &str| {
            let mut want = vec![0f32; rows];
            host.matmul(&plain(x, cols), 1, &mut want);
            let mut y = dev.zeros::<f32>(rows).unwrap();
            dev.matvec_from(&m, x, Some(rq), &mut y, 1, false).unwrap();
            let got = plain(&y, rows);
            for (o, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{format:?} {what} out {o}: {a} vs {b}"
                );
            }
        };
        let mut rq = dev
            .zeros::<u8>(CudaDevice::rounded_row_bytes(cols))
            .unwrap();
        // The norm: a row, its weights with a block of zeros and one of tiny values.
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let mut w: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        w[256..512].fill(0.0);
        for v in &mut w[512..768] {
            *v *= 1e-30;
        }
        let (xd, wd) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
        let mut a = dev.zeros::<f32>(cols).unwrap();
        let mut b = dev.zeros::<f32>(cols).unwrap();
        dev.rms_norm(&xd, &wd, &mut a, 1, cols, 1e-5).unwrap();
        dev.rms_norm_rounding(&xd, &wd, &mut b, 1, cols, 1e-5, Some(&mut rq))
            .unwrap();
        assert_eq!(
            plain(&a, cols),
            plain(&b, cols),
            "{format:?} the norm's values"
        );
        check(&b, &rq, "after the norm");
        // silu_mul: gate values of zero in a block (its outputs all zero).
        let mut gu: Vec<f32> = (0..2 * cols).map(|_| 4.0 * rng.unit()).collect();
        gu[1024..1280].fill(0.0);
        let gud = dev.upload(&gu).unwrap();
        dev.silu_mul(&gud, &mut a, 1, cols).unwrap();
        dev.silu_mul_rounding(&gud, &mut b, 1, cols, Some(&mut rq))
            .unwrap();
        assert_eq!(
            plain(&a, cols),
            plain(&b, cols),
            "{format:?} silu_mul's values"
        );
        check(&b, &rq, "after silu_mul");
    }
}

/// A decode step's product that rounds x itself (the o projection's, unless
/// `MTPLX_CUDA_DECODE_ROUNDED=0`), recorded into a graph before any other product ran (a
/// server's first pass may be a captured one-row step), finds its rounding's room made by
/// `reserve_row_rounding` and gives the CPU's bits; growing the buffer inside the capture
/// would wait for the capture's own lock.
#[test]
fn a_captured_first_decode_product_rounds_without_allocating() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(37);
    let (rows, cols) = (48, 3 * 256);
    let bytes = random_blocks(QuantFormat::Q4K, rows, cols, &mut rng);
    let host =
        QuantMatrix::from_gguf_bytes_with(QuantFormat::Q4K, &bytes, rows, cols, Activations::Q8)
            .unwrap();
    let mut m = matrix(&dev, QuantFormat::Q4K, &bytes, rows, cols);
    m.activations = Activations::Q8;
    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
    let mut want = vec![0f32; rows];
    host.matmul(&x, 1, &mut want);
    let xd = dev.upload(&x).unwrap();
    let mut y = dev.zeros::<f32>(rows).unwrap();
    dev.reserve_row_rounding(cols).unwrap();
    let graph = dev
        .capture(|| dev.matvec(&m, &xd, &mut y, 1, false))
        .unwrap();
    dev.replay(&graph).unwrap();
    let mut got = vec![0f32; rows];
    dev.read(&y, 0, &mut got).unwrap();
    assert_eq!(got, want);
}

/// Bytes copied through pinned staging (several buffers' worth, so each buffer is reused
/// while an earlier copy may still be in flight) land where they were sent, whatever the
/// caller does with its own bytes after each call returns.
#[test]
fn staged_copies_land_whole_and_in_order() {
    let Some(dev) = device() else { return };
    let len = (8 << 20) * 3 + 4099;
    let mut dst = dev.zeros::<u8>(2 * len + 64).unwrap();
    let mut host: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    let first = host.clone();
    dev.write_staged(&host, &mut dst, 17).unwrap();
    // Overwritten at once: a copy still reading it would show.
    host.iter_mut().for_each(|b| *b = b.wrapping_add(101));
    dev.write_staged(&host, &mut dst, 17 + len).unwrap();
    host.fill(0);
    let mut back = vec![0u8; 2 * len];
    dev.read(&dst, 17, &mut back).unwrap();
    assert!(back[..len] == first[..], "the first copy");
    let second: Vec<u8> = first.iter().map(|b| b.wrapping_add(101)).collect();
    assert!(back[len..] == second[..], "the second copy");
    assert!(dev.write_staged(&first, &mut dst, len + 100).is_err());
}

/// Many calls smaller than a staging buffer, of uneven sizes (a restore's rows), fill each
/// buffer end to end and wrap around both several times: every call's bytes land where
/// they were sent, though the caller reuses its buffer at once.
#[test]
fn small_staged_copies_share_buffers_and_land_in_order() {
    let Some(dev) = device() else { return };
    let sizes: Vec<usize> = (0..120).map(|i| (300 << 10) + i * 4097).collect();
    let total: usize = sizes.iter().sum();
    assert!(
        total > 4 * (8 << 20),
        "wraps around both buffers at least twice"
    );
    let mut dst = dev.zeros::<u8>(total + 5).unwrap();
    let mut want = Vec::with_capacity(total);
    let mut host = vec![0u8; *sizes.iter().max().unwrap()];
    let mut at = 5;
    for (i, &n) in sizes.iter().enumerate() {
        host[..n]
            .iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i * 31 + j * 7 + j / 251) as u8);
        want.extend_from_slice(&host[..n]);
        dev.write_staged(&host[..n], &mut dst, at).unwrap();
        host.fill(0xEE);
        at += n;
    }
    let mut back = vec![0u8; total];
    dev.read(&dst, 5, &mut back).unwrap();
    let first_bad = back.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "of {total} bytes");
}

/// Rows handed over from buffers the device lent (page-locked, copied to the device straight
/// out of them) land where they belong though each buffer is refilled right after its
/// hand-over (the refill waits for the copy); ranges outside a buffer are refused; dropped
/// buffers go back to the device and are lent again.
#[test]
fn rows_from_lent_buffers_land_though_each_is_refilled_at_once() {
    let Some(dev) = device() else { return };
    let shape = KvShape {
        layers: 2,
        kv_heads: 8,
        head_dim: 128,
    };
    let row = KvDtype::F16.bytes(shape.row_len());
    let n = 256;
    let (k, v) = (0..n * row, n * row..2 * n * row);
    for pass in 0..2 {
        let mut cache = CudaKvCache::new(dev.clone(), shape, KvDtype::F16);
        let mut lent = cache.lend_staging(2, 2 * n * row).expect("a device lends");
        let mut want = vec![(Vec::new(), Vec::new()); shape.layers];
        for round in 0..12 {
            let (layer, buf) = (round % 2, &mut lent[(round / 2) % 2]);
            let bytes = buf.to_fill().unwrap();
            assert!(bytes.len() >= 2 * n * row);
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (i * 13 + round * 101 + pass + i / 509) as u8;
            }
            want[layer].0.extend_from_slice(&bytes[k.clone()]);
            want[layer].1.extend_from_slice(&bytes[v.clone()]);
            cache
                .append_staged(layer, buf.as_mut(), k.clone(), v.clone())
                .unwrap();
        }
        let len = lent[0].bytes().len();
        let outside = cache.append_staged(0, lent[0].as_mut(), len - row..len + row, k.clone());
        assert!(outside.is_err());
        drop(lent);
        for (layer, (wk, wv)) in want.iter().enumerate() {
            let (mut gk, mut gv) = (vec![0u8; wk.len()], vec![0u8; wv.len()]);
            cache.read_raw(layer, 0..6 * n, &mut gk, &mut gv).unwrap();
            assert!(gk == *wk && gv == *wv, "pass {pass}, layer {layer}");
        }
    }
}

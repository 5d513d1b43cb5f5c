//! Training windows, batches of them, the loss and the agreement with the trunk.

use super::features::{Features, TOP_K};
use super::head::Head;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};

/// Windows of positions: `(first flat row, length)`, within one sequence.
pub(super) type Windows = Vec<(usize, usize)>;

/// Training and held-out windows (every `held_out_every`-th sequence is held out); a window
/// covers inputs `i` whose target row `i + 1` exists.
pub(super) fn windows(f: &Features, len: usize, held_out_every: usize) -> (Windows, Windows) {
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for (s, w) in f.bounds.windows(2).enumerate() {
        let (start, end) = (w[0], w[1]);
        let usable = end - start - 1;
        let mut i = 0;
        while i < usable {
            let n = len.min(usable - i);
            if n >= 8 {
                let dst = if s % held_out_every == held_out_every - 1 {
                    &mut held
                } else {
                    &mut train
                };
                dst.push((start + i, n));
            }
            i += len;
        }
    }
    (train, held)
}

/// One batch of windows (padded to `len`): embeddings of the next tokens, trunk hidden,
/// target indices into the shortlist and their weights.
pub(super) struct Batch {
    pub(super) emb: Tensor,
    pub(super) hid: Tensor,
    pub(super) tgt: Tensor,
    pub(super) weight: Tensor,
    /// Trunk argmax's shortlist index per position (`u32::MAX`: outside or padding).
    pub(super) top1: Vec<u32>,
}

pub(super) fn batch(
    f: &Features,
    embed: &Tensor,
    slot: &[u32],
    wins: &[(usize, usize)],
    len: usize,
    h: usize,
) -> Result<Batch> {
    let b = wins.len();
    let mut next = vec![0u32; b * len];
    let mut hid = vec![half::f16::ZERO; b * len * h];
    let mut tgt = vec![0u32; b * len * TOP_K];
    let mut weight = vec![0f32; b * len * TOP_K];
    let mut top1 = vec![u32::MAX; b * len];
    for (wi, &(start, n)) in wins.iter().enumerate() {
        for j in 0..n {
            let r = start + j;
            let o = wi * len + j;
            next[o] = f.tokens[r + 1];
            hid[o * h..(o + 1) * h].copy_from_slice(&f.hidden[r * h..(r + 1) * h]);
            let row = r + 1;
            let ids = &f.top_ids[row * TOP_K..(row + 1) * TOP_K];
            let ps = &f.top_p[row * TOP_K..(row + 1) * TOP_K];
            let mass: f32 = ids
                .iter()
                .zip(ps)
                .filter(|(&t, _)| slot[t as usize] != u32::MAX)
                .map(|(_, p)| p)
                .sum();
            for k in 0..TOP_K {
                let s = slot[ids[k] as usize];
                if s != u32::MAX && mass > 0.0 {
                    tgt[o * TOP_K + k] = s;
                    weight[o * TOP_K + k] = ps[k] / mass;
                }
            }
            top1[o] = slot[ids[0] as usize];
        }
    }
    let dev = Device::Cpu;
    let ids = Tensor::from_vec(next, b * len, &dev)?;
    Ok(Batch {
        emb: embed.index_select(&ids, 0)?.reshape((b, len, h))?,
        hid: Tensor::from_vec(hid, (b, len, h), &dev)?.to_dtype(DType::F32)?,
        tgt: Tensor::from_vec(tgt, (b * len, TOP_K), &dev)?,
        weight: Tensor::from_vec(weight, (b * len, TOP_K), &dev)?,
        top1,
    })
}

/// Soft cross-entropy against the trunk's (shortlisted) top-k, and the student's argmax
/// per position.
pub(super) fn loss(head: &Head, bt: &Batch, out: &Tensor) -> Result<(Tensor, Vec<u32>)> {
    let x = head.forward(&bt.emb, &bt.hid)?;
    let (b, t, h) = x.dims3()?;
    let logits = head.logits(&x.reshape((b * t, h))?, out)?;
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let picked = logp.gather(&bt.tgt, 1)?;
    let rows = bt.weight.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64;
    let l = ((picked * &bt.weight)?.sum_all()? * (-1.0 / rows))?;
    let argmax = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
    Ok((l, argmax))
}

pub(super) fn agreement(argmax: &[u32], top1: &[u32]) -> (usize, usize) {
    let valid = top1.iter().filter(|&&t| t != u32::MAX).count();
    let hit = argmax
        .iter()
        .zip(top1)
        .filter(|(a, t)| **t != u32::MAX && a == t)
        .count();
    (hit, valid)
}

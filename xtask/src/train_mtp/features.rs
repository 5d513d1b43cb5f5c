//! What the trunk says about every position of the corpus, computed once and cached.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use mtplx_model::{Bundle, Want};

/// Top-k of the trunk's next-token distribution kept per position.
pub(super) const TOP_K: usize = 8;

/// What the trunk says about every position of the corpus.
pub(super) struct Features {
    /// Start of each sequence in the flat arrays, plus the total at the end.
    pub(super) bounds: Vec<usize>,
    pub(super) tokens: Vec<u32>,
    /// `[n, H]` trunk hidden (before the final norm), f16.
    pub(super) hidden: Vec<half::f16>,
    /// `[n, TOP_K]` most likely next tokens and their probabilities.
    pub(super) top_ids: Vec<u32>,
    pub(super) top_p: Vec<f32>,
}

pub(super) fn compute_features(b: &Bundle, seqs: &[Vec<u32>]) -> Result<Features> {
    let m = &*b.model;
    let h = m.dims().hidden_size;
    let mut f = Features {
        bounds: vec![0],
        tokens: Vec::new(),
        hidden: Vec::new(),
        top_ids: Vec::new(),
        top_p: Vec::new(),
    };
    let t = Instant::now();
    for seq in seqs {
        let mut cache = m.new_sequence(&mtplx_kv::CacheFactory::contiguous());
        let out = m.forward(seq, &mut cache, Want::All)?;
        assert_eq!(out.hidden.len(), seq.len() * h);
        f.tokens.extend_from_slice(seq);
        f.hidden
            .extend(out.hidden.iter().map(|&x| half::f16::from_f32(x)));
        for r in 0..out.rows {
            let logits = out.logits_row(r);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
            let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
            idx.select_nth_unstable_by(TOP_K, |&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            let mut top = idx[..TOP_K].to_vec();
            top.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            for id in top {
                f.top_ids.push(id);
                f.top_p
                    .push((((logits[id as usize] - max) as f64).exp() / z) as f32);
            }
        }
        f.bounds.push(f.tokens.len());
    }
    eprintln!(
        "[train-mtp] trunk features for {} positions in {:.0}s",
        f.tokens.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(f)
}

pub(super) fn save_features(f: &Features, path: &Path) -> Result<()> {
    let dev = Device::Cpu;
    let n = f.tokens.len();
    let h = f.hidden.len() / n.max(1);
    let bounds: Vec<u32> = f.bounds.iter().map(|&x| x as u32).collect();
    let map: HashMap<String, Tensor> = [
        ("bounds", Tensor::from_vec(bounds, f.bounds.len(), &dev)?),
        ("tokens", Tensor::from_vec(f.tokens.clone(), n, &dev)?),
        ("hidden", Tensor::from_vec(f.hidden.clone(), (n, h), &dev)?),
        (
            "top_ids",
            Tensor::from_vec(f.top_ids.clone(), (n, TOP_K), &dev)?,
        ),
        (
            "top_p",
            Tensor::from_vec(f.top_p.clone(), (n, TOP_K), &dev)?,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    std::fs::create_dir_all(path.parent().expect("a parent"))?;
    candle_core::safetensors::save(&map, path)?;
    Ok(())
}

pub(super) fn load_features(path: &Path) -> Result<Features> {
    let map = candle_core::safetensors::load(path, &Device::Cpu)?;
    let get = |k: &str| {
        map.get(k)
            .with_context(|| format!("{k} in {}", path.display()))
    };
    Ok(Features {
        bounds: get("bounds")?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|x| x as usize)
            .collect(),
        tokens: get("tokens")?.to_vec1()?,
        hidden: get("hidden")?.flatten_all()?.to_vec1()?,
        top_ids: get("top_ids")?.flatten_all()?.to_vec1()?,
        top_p: get("top_p")?.flatten_all()?.to_vec1()?,
    })
}

/// The most frequent tokens of the corpus (inputs and trunk predictions), topped up with the
/// lowest ids (the tokenizer's earliest merges), most frequent first.
pub(super) fn shortlist(f: &Features, vocab: usize, size: usize) -> Vec<u32> {
    let mut count = vec![0u64; vocab];
    for &t in &f.tokens {
        count[t as usize] += 2;
    }
    for row in f.top_ids.chunks_exact(TOP_K) {
        count[row[0] as usize] += 2;
        for &t in &row[1..] {
            count[t as usize] += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).collect();
    ids.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
    ids.truncate(size.min(vocab));
    ids
}

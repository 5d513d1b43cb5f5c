//! `cargo xtask train-mtp`: trains an MTP head for the default model with the trunk frozen.
//!
//! Self-distillation: the targets are the trunk's own predictions. The recipe, all
//! deterministic (fixed prompts, files picked in sorted order, fixed seeds, fixed order):
//!
//! 1. Text the machine already has: the model's own greedy answers to varied chat prompts,
//!    code-editing turns built from source files installed on the machine (Rust crates under
//!    `~/.cargo/registry/src`, the Python standard library), and documentation from
//!    `/usr/share/doc`.
//! 2. Trunk features, computed once and cached under `target/`: for every position the
//!    trunk's last hidden state, the token, and the trunk's top-8 next-token distribution.
//! 3. The head (`fc`, one decoder layer initialised from the trunk's last layer, norms)
//!    learns, from `h_t` and the embedding of token `t+1`, the trunk's distribution for
//!    token `t+2`, over a shortlist of the most frequent tokens (the drafting vocabulary),
//!    with candle autograd and AdamW on the CPU.
//! 4. Written as `f16` safetensors under the real `mtp.*` names plus `mtp.shortlist`.
//!
//! This is the CPU-scale recipe. The shipped head comes from the same idea at GPU scale,
//! trained recursively to depth 3 (`xtask/mtp_gpu/train.py` over `cargo xtask mtp-corpus`;
//! see `models/mtp/README.md`); `--eval-only` measures any head's acceptance here.

//!
//! The pieces, one job each: [`args`] (the sizes of a run), [`corpus`] (the text),
//! [`features`] (what the trunk says about it), [`head`] (the candle copy of the MTP head
//! that autograd trains), [`batch`] (windows, batches, the loss), [`eval`] (acceptance).
//!
//! This module is the one place outside `mtplx-model` that uses candle (`cargo xtask tidy`
//! holds it there): training needs autograd, which the inference crates must not carry.

pub mod args;
mod batch;
pub(crate) mod corpus;
pub mod eval;
mod features;
mod head;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use mtplx_model::sampling::Rng;
use mtplx_model::{Bundle, WeightFormat};

pub use args::TrainArgs;
use batch::{agreement, batch, loss, windows};
use corpus::{corpus, CHAT_PROMPTS};
use eval::evaluate;
use features::{compute_features, load_features, save_features, shortlist};
use head::{last_layer, Head};

/// `cargo xtask train-mtp`: corpus, features (cached under `target/`), training, the head
/// written to `args.out`, then its acceptance.
pub fn run(model_path: &Path, args: &TrainArgs) -> Result<()> {
    let total = Instant::now();
    let b = Bundle::load(model_path, WeightFormat::F32)?;
    if args.eval_only {
        return evaluate(&b, &args.out);
    }
    let c = b
        .model
        .mtp_layer()
        .context("an MTP head can be trained only for a model whose head layout mtplx knows")?
        .clone();
    let h = c.hidden_size;
    let key = format!(
        "v1-{}-{}-{}-{}",
        args.code_turns,
        args.answer_tokens,
        CHAT_PROMPTS.len(),
        b.id.replace(['/', '.'], "_")
    );
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let cache = target.join(format!("mtp-features-{key}.safetensors"));
    let f = if cache.exists() {
        eprintln!("[train-mtp] reusing {}", cache.display());
        load_features(&cache)?
    } else {
        let seqs = corpus(&b, args)?;
        let f = compute_features(&b, &seqs)?;
        save_features(&f, &cache)?;
        f
    };

    let ids = shortlist(&f, c.vocab_size, args.shortlist);
    let mut slot = vec![u32::MAX; c.vocab_size];
    for (i, &t) in ids.iter().enumerate() {
        slot[t as usize] = i as u32;
    }
    let out = Tensor::from_vec(b.model.embed(&ids)?, (ids.len(), h), &Device::Cpu)?;
    let all: Vec<u32> = (0..c.vocab_size as u32).collect();
    let embed = Tensor::from_vec(b.model.embed(&all)?, (c.vocab_size, h), &Device::Cpu)?;

    let init = last_layer(model_path, &c)?;
    let head = Head::new(&c, &init, args.seed)?;
    let (train, held) = windows(&f, args.window, 10);
    eprintln!(
        "[train-mtp] {} training windows, {} held-out windows, shortlist {}",
        train.len(),
        held.len(),
        ids.len()
    );
    let params = ParamsAdamW {
        lr: args.lr,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(head.vars.iter().map(|(_, v)| v.clone()).collect(), params)?;
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = Rng::new(args.seed);
    let mut cursor = order.len();
    let t = Instant::now();
    let eval = |head: &Head| -> Result<f64> {
        let (mut hit, mut valid) = (0, 0);
        for chunk in held.chunks(args.batch) {
            let bt = batch(&f, &embed, &slot, chunk, args.window, h)?;
            let (_, am) = loss(head, &bt, &out)?;
            let (a, v) = agreement(&am, &bt.top1);
            hit += a;
            valid += v;
        }
        Ok(hit as f64 / valid.max(1) as f64)
    };
    for step in 0..args.steps {
        if cursor + args.batch > order.len() {
            // Fisher–Yates with the fixed stream.
            for i in (1..order.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            cursor = 0;
        }
        let wins: Vec<(usize, usize)> = order[cursor..cursor + args.batch]
            .iter()
            .map(|&i| train[i])
            .collect();
        cursor += args.batch;
        // Linear warm-up over 5% of the steps, then cosine decay to 10%.
        let warm = (args.steps / 20).max(1);
        let lr = if step < warm {
            args.lr * (step + 1) as f64 / warm as f64
        } else {
            let p = (step - warm) as f64 / (args.steps - warm).max(1) as f64;
            args.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
        };
        opt.set_learning_rate(lr);
        let bt = batch(&f, &embed, &slot, &wins, args.window, h)?;
        let (l, am) = loss(&head, &bt, &out)?;
        opt.backward_step(&l)?;
        if step % 20 == 0 || step + 1 == args.steps {
            let (hit, valid) = agreement(&am, &bt.top1);
            eprintln!(
                "[train-mtp] step {step:4} loss {:.3} train top-1 {:.3} lr {lr:.2e} {:.0}s",
                l.to_scalar::<f32>()?,
                hit as f64 / valid.max(1) as f64,
                t.elapsed().as_secs_f64()
            );
        }
    }
    let acc = eval(&head)?;
    eprintln!("[train-mtp] held-out top-1 agreement with the trunk (depth 1): {acc:.3}");
    head.save(&args.out, Some(&ids), DType::F16)?;
    eprintln!(
        "[train-mtp] wrote {} ({} bytes) in {:.0}s total",
        args.out.display(),
        std::fs::metadata(&args.out)?.len(),
        total.elapsed().as_secs_f64()
    );
    evaluate(&b, &args.out)
}

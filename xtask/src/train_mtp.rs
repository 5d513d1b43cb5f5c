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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::mtp::{self, tensor_name};
use mtplx_model::sampling::{Rng, Sampler};
use mtplx_model::source::{GgufSource, TensorRole, WeightSource};
use mtplx_model::{Bundle, Generator, LanguageModel, ModelConfig, RopeStyle, Want, WeightFormat};

/// Sizes of one run.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Where to write the head.
    #[arg(long, default_value = "models/mtp/smollm2-135m-mtp.safetensors")]
    pub out: PathBuf,
    /// Output rows of the drafting head (most frequent tokens).
    #[arg(long, default_value_t = 8192)]
    pub shortlist: usize,
    /// Optimiser steps.
    #[arg(long, default_value_t = 150)]
    pub steps: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Positions per window.
    #[arg(long, default_value_t = 128)]
    pub window: usize,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Code-editing turns built from source files.
    #[arg(long, default_value_t = 60)]
    pub code_turns: usize,
    /// Tokens each chat prompt's answer is generated to.
    #[arg(long, default_value_t = 64)]
    pub answer_tokens: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Skip training: only measure the acceptance of the head at `--out`.
    #[arg(long)]
    pub eval_only: bool,
}

/// Held-out chat prompts for the acceptance table (not in `CHAT_PROMPTS`).
pub(crate) const EVAL_CHAT: &[&str] = &[
    "Write a short paragraph about why the sky is blue.",
    "What are three good habits for learning a new language?",
    "Explain what a linked list is.",
    "Give me a recipe for a simple tomato soup.",
];

/// Held-out code-editing turns (a file in the context, the answer rewrites it).
pub(crate) const EVAL_CODE: &[&str] = &[
    "Rename the function `area` to `rectangle_area` in this file and show the whole file.\n\n```python\ndef area(width, height):\n    \"\"\"Return the area of a rectangle.\"\"\"\n    return width * height\n\n\ndef perimeter(width, height):\n    \"\"\"Return the perimeter of a rectangle.\"\"\"\n    return 2 * (width + height)\n\n\nif __name__ == \"__main__\":\n    print(area(3, 4))\n    print(perimeter(3, 4))\n```",
    "Rename `total` to `sum` in this Rust function and show the whole function.\n\n```rust\nfn average(values: &[f64]) -> f64 {\n    let mut total = 0.0;\n    for v in values {\n        total += v;\n    }\n    total / values.len() as f64\n}\n```",
    "Add a docstring to this function and show the whole file.\n\n```python\ndef greet(name):\n    message = \"Hello, \" + name + \"!\"\n    print(message)\n    return message\n```",
];

/// Acceptance by depth of the head at `path` on the held-out prompts (greedy, depth 3).
pub fn evaluate(b: &Bundle, path: &Path) -> Result<()> {
    use mtplx_spec::{
        generate, DepthPolicy, DraftSampling, MtpProposer, PromptHidden, SpecDecoder,
    };
    let head = std::sync::Arc::new(mtplx_model::mtp::MtpHead::load(
        path,
        &b.model,
        mtplx_model::mtp::Vocab::FromFile,
    )?);
    let factory = mtplx_kv::CacheFactory::contiguous();
    for (kind, prompts) in [("chat", EVAL_CHAT), ("code-edit", EVAL_CODE)] {
        let (mut drafted, mut accepted, mut calls) = (vec![0u64; 3], vec![0u64; 3], 0u64);
        let mut produced = 0usize;
        for p in prompts {
            let ids = render(b, vec![ChatMessage::text(Role::User, *p)], true)?;
            let mut cache = factory.new_cache(b.model.config().kv_shape());
            let mut d = SpecDecoder::with_prompt_hidden(
                &b.model,
                cache.as_mut(),
                &ids,
                Sampler::greedy(),
                256,
                PromptHidden::All,
            )?;
            let mut mtp = MtpProposer::new(&b.model, head.clone(), &factory, DraftSampling::Greedy);
            let stop = b.tokenizer.stop_ids().to_vec();
            generate(&mut d, &mut mtp, &mut DepthPolicy::fixed(3), 64, &|t| {
                stop.contains(&t)
            })?;
            for i in 0..d.stats.drafted_by_depth.len().min(3) {
                drafted[i] += d.stats.drafted_by_depth[i];
                accepted[i] += d.stats.accepted_by_depth[i];
            }
            calls += d.stats.verify_calls;
            produced += d.generated().len();
        }
        let rates: Vec<String> = (0..3)
            .map(|i| format!("{:.2}", accepted[i] as f64 / drafted[i].max(1) as f64))
            .collect();
        eprintln!(
            "[train-mtp] held-out {kind} ({} prompts, {produced} tokens): acceptance by depth \
             (share of depth-d drafts accepted) [{}], mean tokens per verify {:.2}",
            prompts.len(),
            rates.join(", "),
            (accepted.iter().sum::<u64>() + calls) as f64 / calls.max(1) as f64
        );
    }
    Ok(())
}

/// Top-k of the trunk's next-token distribution kept per position.
const TOP_K: usize = 8;
/// Longest sequence run through the trunk.
const MAX_SEQ: usize = 384;

/// Chat prompts whose answers the model generates (held-out prompts live in the README and
/// the bench, not here).
pub(crate) const CHAT_PROMPTS: &[&str] = &[
    "What is the capital of France? Answer in one sentence.",
    "Explain how a hash map works to a beginner.",
    "Write a haiku about autumn leaves.",
    "Give me three tips for writing clean code.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
    "How do I reverse a string in Rust?",
    "Why do cats purr?",
    "Write a short email asking a colleague to review my pull request.",
    "What are the benefits of regular exercise?",
    "Explain recursion with a simple example.",
    "What is a good name for a pet goldfish? Give five ideas.",
    "How does a compiler differ from an interpreter?",
    "Describe the water cycle.",
    "Write a Python function that checks whether a number is prime.",
    "What is the Pythagorean theorem?",
    "List the planets of the solar system in order.",
    "How can I improve my sleep?",
    "Explain what an API is.",
    "Write a limerick about a programmer.",
    "What does the `git rebase` command do?",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Explain the difference between TCP and UDP.",
    "Write a SQL query that counts the rows of a table named users.",
];

/// Instructions for code-editing turns; `{a}` is a name in the file, `{b}` its new name.
pub(crate) const EDITS: &[&str] = &[
    "Rename `{a}` to `{b}` in this file and show the whole file.",
    "In the following code, rename `{a}` to `{b}`. Reply with the complete updated code.",
    "Please rewrite this file so that `{a}` is called `{b}` everywhere.",
    "Refactor: `{a}` should be named `{b}`. Show the full file after the change.",
];

pub(crate) fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

/// Every file under `dir` whose name ends with one of `exts`, sorted.
pub(crate) fn files_under(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_symlink() {
            continue;
        }
        if p.is_dir() {
            files_under(&p, exts, out);
        } else if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
            if exts.iter().any(|e| name.ends_with(e)) {
                out.push(p);
            }
        }
    }
}

/// `count` files spread evenly over the sorted list.
pub(crate) fn spread(files: &[PathBuf], count: usize) -> Vec<PathBuf> {
    if files.is_empty() || count == 0 {
        return Vec::new();
    }
    let step = (files.len() / count).max(1);
    files.iter().step_by(step).take(count).cloned().collect()
}

/// A snippet of at most `max_lines` lines and 1,400 bytes from the middle of `text`.
pub(crate) fn snippet(text: &str, max_lines: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(max_lines) / 2;
    let mut s = String::new();
    for l in lines.iter().skip(start).take(max_lines) {
        if s.len() + l.len() > 1400 {
            break;
        }
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// The first identifier that follows `fn `, `def `, `let ` or `struct ` in `code`.
pub(crate) fn a_name(code: &str) -> Option<String> {
    for kw in ["fn ", "def ", "struct ", "class ", "let "] {
        if let Some(i) = code.find(kw) {
            let name: String = code[i + kw.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.len() >= 3 {
                return Some(name);
            }
        }
    }
    None
}

/// A rename request about `code` (`i` picks the wording and the new name): the user's
/// message and the answer (the file with the rename applied); `None` when no name is found.
pub(crate) fn rename_edit(code: &str, lang: &str, i: usize) -> Option<(String, String)> {
    let a = a_name(code)?;
    let b_name = format!("{a}_{}", ["new", "v2", "renamed", "impl"][i % 4]);
    let ask = EDITS[i % EDITS.len()]
        .replace("{a}", &a)
        .replace("{b}", &b_name);
    Some((
        format!(
            "{ask}

```{lang}
{code}```"
        ),
        format!(
            "```{lang}
{}```",
            code.replace(&a, &b_name)
        ),
    ))
}

/// [`rename_edit`]'s turn in the chat template: the user asks, the assistant answers.
pub(crate) fn edit_turn(b: &Bundle, code: &str, lang: &str, i: usize) -> Result<Option<Vec<u32>>> {
    let Some((user, answer)) = rename_edit(code, lang, i) else {
        return Ok(None);
    };
    let messages = vec![
        ChatMessage::text(Role::User, user),
        ChatMessage::text(Role::Assistant, answer),
    ];
    Ok(Some(render(b, messages, false)?))
}

pub(crate) fn render(
    b: &Bundle,
    messages: Vec<ChatMessage>,
    generation_prompt: bool,
) -> Result<Vec<u32>> {
    let req = ChatRequest {
        messages,
        add_generation_prompt: generation_prompt,
        ..Default::default()
    };
    let text = b.template.as_ref().context("chat template")?.render(&req)?;
    Ok(b.tokenizer.encode(&text, true)?)
}

/// The token sequences the features are computed on.
fn corpus(b: &Bundle, args: &TrainArgs) -> Result<Vec<Vec<u32>>> {
    let mut seqs = Vec::new();
    let t = Instant::now();
    // 1. The model's own answers.
    for p in CHAT_PROMPTS {
        let prompt = render(b, vec![ChatMessage::text(Role::User, *p)], true)?;
        let mut cache = mtplx_kv::CacheFactory::contiguous().new_cache(b.model.config().kv_shape());
        let mut g = Generator::new(&b.model, cache.as_mut(), &prompt, Sampler::greedy(), 256)?;
        for _ in 1..args.answer_tokens {
            if g.generated()
                .last()
                .is_some_and(|t| b.tokenizer.stop_ids().contains(t))
            {
                break;
            }
            g.step()?;
        }
        let mut all = prompt;
        all.extend_from_slice(g.generated());
        seqs.push(all);
    }
    eprintln!(
        "[train-mtp] {} own answers in {:.0}s",
        seqs.len(),
        t.elapsed().as_secs_f64()
    );
    // 2. Code-editing turns from installed sources: the answer copies the file with the
    // rename applied.
    let mut rust = Vec::new();
    files_under(&home().join(".cargo/registry/src"), &[".rs"], &mut rust);
    let mut python = Vec::new();
    files_under(Path::new("/usr/lib/python3.11"), &[".py"], &mut python);
    let mut sources: Vec<(PathBuf, &str)> = Vec::new();
    let half = args.code_turns / 2;
    sources.extend(spread(&rust, half).into_iter().map(|p| (p, "rust")));
    sources.extend(
        spread(&python, args.code_turns - half)
            .into_iter()
            .map(|p| (p, "python")),
    );
    let mut made = 0;
    for (i, (path, lang)) in sources.iter().enumerate() {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let code = snippet(&text, 30);
        let Some(mut ids) = edit_turn(b, &code, lang, i)? else {
            continue;
        };
        ids.truncate(MAX_SEQ);
        seqs.push(ids);
        made += 1;
    }
    // 3. Documentation.
    let mut docs = Vec::new();
    files_under(
        Path::new("/usr/share/doc"),
        &[".md", "README", ".txt"],
        &mut docs,
    );
    let mut n_docs = 0;
    for path in spread(&docs, 40) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut ids = b.tokenizer.encode(&snippet(&text, 60), false)?;
        ids.truncate(256);
        if ids.len() >= 32 {
            seqs.push(ids);
            n_docs += 1;
        }
    }
    eprintln!(
        "[train-mtp] corpus: {} chat answers, {made} code edits, {n_docs} documents, {} tokens",
        CHAT_PROMPTS.len(),
        seqs.iter().map(Vec::len).sum::<usize>()
    );
    Ok(seqs)
}

/// What the trunk says about every position of the corpus.
struct Features {
    /// Start of each sequence in the flat arrays, plus the total at the end.
    bounds: Vec<usize>,
    tokens: Vec<u32>,
    /// `[n, H]` trunk hidden (before the final norm), f16.
    hidden: Vec<half::f16>,
    /// `[n, TOP_K]` most likely next tokens and their probabilities.
    top_ids: Vec<u32>,
    top_p: Vec<f32>,
}

fn compute_features(b: &Bundle, seqs: &[Vec<u32>]) -> Result<Features> {
    let m = &b.model;
    let h = m.config().hidden_size;
    let mut f = Features {
        bounds: vec![0],
        tokens: Vec::new(),
        hidden: Vec::new(),
        top_ids: Vec::new(),
        top_p: Vec::new(),
    };
    let t = Instant::now();
    for seq in seqs {
        let mut cache = mtplx_kv::CacheFactory::contiguous().new_cache(m.config().kv_shape());
        let out = m.forward(seq, cache.as_mut(), Want::All)?;
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

fn save_features(f: &Features, path: &Path) -> Result<()> {
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

fn load_features(path: &Path) -> Result<Features> {
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
fn shortlist(f: &Features, vocab: usize, size: usize) -> Vec<u32> {
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

/// The head's trainable tensors, by checkpoint name.
pub struct Head {
    pub vars: Vec<(String, Var)>,
    config: ModelConfig,
}

impl Head {
    fn var(&self, name: &str) -> &Tensor {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_tensor())
            .unwrap_or_else(|| panic!("no variable {name}"))
    }

    /// A head for `config`: the decoder layer from `init` (name → tensor, trunk layer names
    /// already mapped to `mtp.*`) where given, else random; norms at one; `fc` random.
    pub fn new(config: &ModelConfig, init: &HashMap<String, Tensor>, seed: u64) -> Result<Self> {
        if config.qkv_bias || config.qk_norm {
            bail!("train-mtp supports Llama-style layers (no QKV bias, no QK norm)");
        }
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (qd, kvd, ff) = (
            config.num_heads * hd,
            config.num_kv_heads * hd,
            config.intermediate_size,
        );
        let mut rng = Rng::new(seed);
        let mut normal = |shape: (usize, usize), std: f32| -> Result<Tensor> {
            // Irwin–Hall approximation of a normal: deterministic and enough for an init.
            let v: Vec<f32> = (0..shape.0 * shape.1)
                .map(|_| {
                    let s: f64 = (0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0;
                    (s * (3.0f64).sqrt()) as f32 * std
                })
                .collect();
            Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
        };
        let mut vars = Vec::new();
        let matrices = [
            (mtp::FC.to_string(), (h, 2 * h)),
            (tensor_name(TensorRole::Q), (qd, h)),
            (tensor_name(TensorRole::K), (kvd, h)),
            (tensor_name(TensorRole::V), (kvd, h)),
            (tensor_name(TensorRole::O), (h, qd)),
            (tensor_name(TensorRole::Gate), (ff, h)),
            (tensor_name(TensorRole::Up), (ff, h)),
            (tensor_name(TensorRole::Down), (h, ff)),
        ];
        for (name, shape) in matrices {
            let t = match init.get(&name) {
                Some(t) => t.clone(),
                None => normal(shape, 0.02)?,
            };
            vars.push((name, Var::from_tensor(&t)?));
        }
        for name in [
            mtp::NORM_EMBEDDING.to_string(),
            mtp::NORM_HIDDEN.to_string(),
            tensor_name(TensorRole::AttnNorm),
            tensor_name(TensorRole::FfnNorm),
            tensor_name(TensorRole::FinalNorm),
        ] {
            let t = match init.get(&name) {
                Some(t) => t.clone(),
                None => Tensor::ones(h, DType::F32, &Device::Cpu)?,
            };
            vars.push((name, Var::from_tensor(&t)?));
        }
        Ok(Head {
            vars,
            config: config.clone(),
        })
    }

    fn rms(&self, x: &Tensor, w: &str) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f64;
        let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
        Ok(x.broadcast_mul(&inv)?.broadcast_mul(self.var(w))?)
    }

    fn linear(&self, x: &Tensor, w: &str) -> Result<Tensor> {
        Ok(x.broadcast_matmul(&self.var(w).t()?)?)
    }

    /// RoPE on `[b, heads, t, hd]` for positions `0..t`, in the trunk's style.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (b, nh, t, hd) = x.dims4()?;
        let half = hd / 2;
        Ok(match self.config.rope_style {
            RopeStyle::Half => {
                let x0 = x.narrow(3, 0, half)?;
                let x1 = x.narrow(3, half, half)?;
                let r0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
                let r1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
                Tensor::cat(&[r0, r1], 3)?
            }
            RopeStyle::Interleaved => {
                let x = x.reshape((b, nh, t, half, 2))?;
                let x0 = x.narrow(4, 0, 1)?.squeeze(4)?;
                let x1 = x.narrow(4, 1, 1)?.squeeze(4)?;
                let r0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
                let r1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
                Tensor::stack(&[r0, r1], 4)?.reshape((b, nh, t, hd))?
            }
        })
    }

    /// The head's layer output (`[b, t, H]`, before `mtp.norm`) for embeddings `emb` of the
    /// next tokens and trunk hidden states `hid` (both `[b, t, H]`), causal over `t`.
    pub fn forward(&self, emb: &Tensor, hid: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (b, t, h) = emb.dims3()?;
        let (nh, kvh, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let e = self.rms(emb, mtp::NORM_EMBEDDING)?;
        let hn = self.rms(hid, mtp::NORM_HIDDEN)?;
        let x = self.linear(&Tensor::cat(&[e, hn], 2)?, mtp::FC)?;

        let normed = self.rms(&x, &tensor_name(TensorRole::AttnNorm))?;
        let q = self.linear(&normed, &tensor_name(TensorRole::Q))?;
        let k = self.linear(&normed, &tensor_name(TensorRole::K))?;
        let v = self.linear(&normed, &tensor_name(TensorRole::V))?;
        let q = q.reshape((b, t, nh, hd))?.transpose(1, 2)?.contiguous()?;
        let k = k.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let v = v.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let (cos, sin) = rope_tables(c, t)?;
        let q = self.rope(&q, &cos, &sin)?;
        let k = self.rope(&k, &cos, &sin)?;
        // Grouped-query attention: query head `i` reads KV head `i / (nh / kvh)`.
        let rep = nh / kvh;
        let expand = |x: Tensor| -> Result<Tensor> {
            Ok(x.unsqueeze(2)?
                .broadcast_as((b, kvh, rep, t, hd))?
                .reshape((b, nh, t, hd))?)
        };
        let (k, v) = (expand(k)?, expand(v)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu)?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let attn = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, nh * hd))?;
        let x = (x + self.linear(&attn, &tensor_name(TensorRole::O))?)?;
        let normed = self.rms(&x, &tensor_name(TensorRole::FfnNorm))?;
        let g = self.linear(&normed, &tensor_name(TensorRole::Gate))?;
        let u = self.linear(&normed, &tensor_name(TensorRole::Up))?;
        let y = self.linear(
            &(candle_nn::ops::silu(&g)? * u)?,
            &tensor_name(TensorRole::Down),
        )?;
        let _ = h;
        Ok((x + y)?)
    }

    /// Scores over the output rows `out` (`[rows, H]`) for layer outputs `x`.
    pub fn logits(&self, x: &Tensor, out: &Tensor) -> Result<Tensor> {
        let y = self.rms(x, &tensor_name(TensorRole::FinalNorm))?;
        Ok(y.broadcast_matmul(&out.t()?)?)
    }

    /// Writes the head (`dtype`) and the shortlist as safetensors.
    pub fn save(&self, path: &Path, shortlist: Option<&[u32]>, dtype: DType) -> Result<()> {
        let mut map = HashMap::new();
        for (name, v) in &self.vars {
            map.insert(name.clone(), v.as_tensor().to_dtype(dtype)?);
        }
        if let Some(ids) = shortlist {
            map.insert(
                mtp::SHORTLIST.to_string(),
                Tensor::from_vec(ids.to_vec(), ids.len(), &Device::Cpu)?,
            );
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        candle_core::safetensors::save(&map, path)?;
        Ok(())
    }
}

/// `[t, hd/2]` cosine and sine tables, computed as `mtplx_model::ops::Rope` does.
fn rope_tables(c: &ModelConfig, t: usize) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for p in 0..t {
        for i in 0..half {
            let inv = (c.rope_theta as f64).powf(-((2 * i) as f64) / c.head_dim as f64);
            let a = p as f64 * inv;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, (t, half), &Device::Cpu)?,
        Tensor::from_vec(sin, (t, half), &Device::Cpu)?,
    ))
}

/// The trunk's last layer under `mtp.layers.0.*` names: the head's starting point.
fn last_layer(path: &Path, config: &ModelConfig) -> Result<HashMap<String, Tensor>> {
    let mut src = GgufSource::open(path)?;
    let last = config.num_layers - 1;
    let mut map = HashMap::new();
    for role in [
        TensorRole::Q,
        TensorRole::K,
        TensorRole::V,
        TensorRole::O,
        TensorRole::Gate,
        TensorRole::Up,
        TensorRole::Down,
        TensorRole::AttnNorm,
        TensorRole::FfnNorm,
        TensorRole::FinalNorm,
    ] {
        let name = if role == TensorRole::FinalNorm {
            src.name(role, 0)
        } else {
            src.name(role, last)
        };
        let w = src
            .get(&name)?
            .with_context(|| format!("trunk tensor {name}"))?;
        map.insert(tensor_name(role), w.to_dense()?);
    }
    Ok(map)
}

/// Windows of positions: `(first flat row, length)`, within one sequence.
type Windows = Vec<(usize, usize)>;

/// Training and held-out windows (every `held_out_every`-th sequence is held out); a window
/// covers inputs `i` whose target row `i + 1` exists.
fn windows(f: &Features, len: usize, held_out_every: usize) -> (Windows, Windows) {
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
struct Batch {
    emb: Tensor,
    hid: Tensor,
    tgt: Tensor,
    weight: Tensor,
    /// Trunk argmax's shortlist index per position (`u32::MAX`: outside or padding).
    top1: Vec<u32>,
}

fn batch(
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
fn loss(head: &Head, bt: &Batch, out: &Tensor) -> Result<(Tensor, Vec<u32>)> {
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

fn agreement(argmax: &[u32], top1: &[u32]) -> (usize, usize) {
    let valid = top1.iter().filter(|&&t| t != u32::MAX).count();
    let hit = argmax
        .iter()
        .zip(top1)
        .filter(|(a, t)| **t != u32::MAX && a == t)
        .count();
    (hit, valid)
}

pub fn run(model_path: &Path, args: &TrainArgs) -> Result<()> {
    let total = Instant::now();
    let b = Bundle::load(model_path, WeightFormat::F32)?;
    if args.eval_only {
        return evaluate(&b, &args.out);
    }
    let c = b.model.config().clone();
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

#[cfg(test)]
mod tests {
    use super::*;
    use mtplx_kv::CacheFactory;
    use mtplx_model::mtp::{MtpHead, Vocab};
    use mtplx_model::Model;

    /// The candle training graph and the inference graph compute the same head.
    #[test]
    fn training_forward_matches_inference_forward() -> Result<()> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny/llama");
        let trunk = Model::load(&dir, WeightFormat::F32)?;
        let c = trunk.config().clone();
        let head = Head::new(&c, &HashMap::new(), 3)?;
        // Norm weights away from one so a mix-up of norms shows.
        for (i, (name, v)) in head.vars.iter().enumerate() {
            if v.as_tensor().rank() == 1 {
                let t = (Tensor::ones(c.hidden_size, DType::F32, &Device::Cpu)?
                    * (0.5 + 0.25 * i as f64))?;
                v.set(&t).with_context(|| name.clone())?;
            }
        }
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("head.safetensors");
        let ids: Vec<u32> = (0..c.vocab_size as u32).rev().step_by(3).collect();
        head.save(&path, Some(&ids), DType::F32)?;
        let inf = MtpHead::load(&path, &trunk, Vocab::FromFile)?;
        assert_eq!(inf.shortlist(), Some(&ids[..]));

        let t = 21;
        let h = c.hidden_size;
        let next: Vec<u32> = (0..t as u32).map(|i| (i * 37 + 5) % 300).collect();
        let hidden: Vec<f32> = (0..t * h)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let out = Tensor::from_vec(trunk.embed(&ids)?, (ids.len(), h), &Device::Cpu)?;
        let emb = Tensor::from_vec(trunk.embed(&next)?, (1, t, h), &Device::Cpu)?;
        let hid = Tensor::from_vec(hidden.clone(), (1, t, h), &Device::Cpu)?;
        let x = head.forward(&emb, &hid)?;
        let want: Vec<f32> = head
            .logits(&x.reshape((t, h))?, &out)?
            .flatten_all()?
            .to_vec1()?;

        // Inference: rows one at a time through its own cache.
        let mut cache = CacheFactory::contiguous().new_cache(inf.kv_shape());
        let mut got = Vec::new();
        for r in 0..t {
            let y = inf.forward(
                &trunk,
                &hidden[r * h..(r + 1) * h],
                &next[r..r + 1],
                cache.as_mut(),
                r,
            )?;
            got.extend(inf.logits(&y)?);
        }
        assert_eq!(got.len(), want.len());
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < 1e-3,
            "training and inference logits differ by {diff}"
        );
        Ok(())
    }
}

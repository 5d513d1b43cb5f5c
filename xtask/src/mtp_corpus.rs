//! `cargo xtask mtp-corpus`: the token sequences the GPU recipe (`xtask/mtp_gpu/train.py`)
//! trains the MTP head on, tokenized here so the GPU machine needs no tokenizer.
//!
//! Everything comes from text this machine already has, picked deterministically (fixed
//! lists, files in sorted order, evenly spread):
//! - `prompts.bin`: chat prompts, rendered in the model's chat template with the generation
//!   prompt, which the trunk answers greedily on the GPU (the model's own text): questions
//!   built from a topic list and question forms, requests about documentation pieces from
//!   `/usr/share/doc`, and requests about code snippets (explain, rename, comment, test)
//!   from Rust sources under `~/.cargo/registry/src` and Python's standard library;
//! - `texts.bin`: sequences used as they are (teacher-forced): code-editing turns whose
//!   answer copies the snippet with a rename applied, documentation pieces, and source
//!   files cut into pieces.
//!
//! Both files: `u32` sequence count, `u32` length of each sequence, then every token as a
//! `u16` (the vocabulary has 49,152 tokens), all little-endian. `meta.json` gives the stop
//! tokens and a check: a prompt and the greedy tokens the Rust model gives for it, which
//! the GPU trunk must reproduce before any training starts.
//!
//! The held-out prompts (`train_mtp::EVAL_CHAT`, `EVAL_CODE`, and the speculation bench's)
//! are left out.

use mtplx_model::tokenizer::Special;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use mtplx_model::chat::{ChatMessage, Role};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, Generator};

use crate::train_mtp::corpus::{
    edit_turn, files_under, home, rename_edit, render, snippet, spread,
};

#[derive(Debug, Clone, clap::Args)]
pub struct CorpusArgs {
    /// Directory the three files are written to.
    #[arg(long, default_value = ".gpu/corpus")]
    pub out: PathBuf,
    /// Chat prompts about code snippets.
    #[arg(long, default_value_t = 1400)]
    pub code_prompts: usize,
    /// Chat prompts about documentation pieces.
    #[arg(long, default_value_t = 500)]
    pub doc_prompts: usize,
    /// Teacher-forced code-editing turns.
    #[arg(long, default_value_t = 900)]
    pub edit_texts: usize,
    /// Teacher-forced documentation and source pieces.
    #[arg(long, default_value_t = 900)]
    pub plain_texts: usize,
}

/// Subjects of the generated chat questions. None overlaps the held-out prompts (the sky's
/// colour, language learning, linked lists, tomato soup).
const TOPICS: &[&str] = &[
    "photosynthesis",
    "black holes",
    "the French Revolution",
    "machine learning",
    "binary search",
    "the immune system",
    "climate change",
    "the stock market",
    "volcanoes",
    "the Roman Empire",
    "quantum computing",
    "electric cars",
    "DNA",
    "the internet",
    "blockchain",
    "the human heart",
    "gravity",
    "the Renaissance",
    "vaccines",
    "solar panels",
    "operating systems",
    "the moon landing",
    "inflation",
    "earthquakes",
    "neural networks",
    "the printing press",
    "coral reefs",
    "antibiotics",
    "public key cryptography",
    "the Great Wall of China",
    "rainbows",
    "hurricanes",
    "sorting algorithms",
    "the theory of evolution",
    "democracy",
    "the Industrial Revolution",
    "sleep",
    "meditation",
    "coffee",
    "chess",
    "the Olympic Games",
    "jazz music",
    "the periodic table",
    "plate tectonics",
    "bees",
    "the Amazon rainforest",
    "databases",
    "version control",
    "unit testing",
    "functional programming",
    "object-oriented programming",
    "garbage collection",
    "the TCP handshake",
    "DNS",
    "HTTP",
    "caching",
    "compilers",
    "regular expressions",
    "Docker containers",
    "Kubernetes",
    "cloud computing",
    "password security",
    "two-factor authentication",
    "the Fibonacci sequence",
    "prime numbers",
    "probability",
    "statistics",
    "calculus",
    "the speed of light",
    "magnets",
    "batteries",
    "nuclear energy",
    "wind turbines",
    "recycling",
    "composting",
    "healthy eating",
    "running a marathon",
    "time management",
    "public speaking",
    "job interviews",
    "writing a resume",
    "budgeting",
    "saving money",
    "the water table",
    "glaciers",
    "deserts",
    "penguins",
    "dolphins",
    "elephants",
    "ancient Egypt",
    "the Silk Road",
    "Shakespeare",
    "Mozart",
    "impressionist painting",
    "photography",
    "baking bread",
    "making pizza",
    "gardening",
    "houseplants",
];

/// Question forms; `{}` is a topic.
const FORMS: &[&str] = &[
    "Explain {} in simple terms.",
    "What is {}?",
    "Give me three interesting facts about {}.",
    "Write a short paragraph about {}.",
    "Why is {} important?",
    "How would you teach {} to a ten-year-old?",
    "Summarize the key ideas of {} in a few bullet points.",
    "What are common misconceptions about {}?",
    "Write a short poem about {}.",
    "What questions should I ask to learn more about {}?",
];

/// Requests about a code snippet; `{lang}` its language.
const CODE_ASKS: &[&str] = &[
    "Explain what this code does.",
    "Add comments to this code and show the whole code.",
    "Write a unit test for this code.",
    "Are there any bugs in this code? Explain briefly.",
    "Summarize this {lang} code in two sentences.",
    "Rewrite this code to be easier to read and show the whole code.",
];

/// Requests about a documentation piece.
const DOC_ASKS: &[&str] = &[
    "Summarize this text.",
    "Explain this in simple terms.",
    "What is this document about?",
    "List the main points of this text.",
];

/// Held-out and benchmark prompts must not be trained on.
fn held_out(text: &str) -> bool {
    crate::train_mtp::corpus::EVAL_CHAT
        .iter()
        .chain(crate::train_mtp::corpus::EVAL_CODE)
        .any(|p| text.contains(p))
}

struct Sources {
    rust: Vec<PathBuf>,
    python: Vec<PathBuf>,
    docs: Vec<PathBuf>,
}

impl Sources {
    fn find() -> Self {
        let mut rust = Vec::new();
        files_under(&home().join(".cargo/registry/src"), &[".rs"], &mut rust);
        let mut python = Vec::new();
        files_under(Path::new("/usr/lib/python3.11"), &[".py"], &mut python);
        let mut docs = Vec::new();
        files_under(
            Path::new("/usr/share/doc"),
            &[".md", "README", ".txt"],
            &mut docs,
        );
        Sources { rust, python, docs }
    }

    /// `count` snippets of at most `lines` lines, half Rust and half Python, with their
    /// language; files that cannot be read or give no snippet are skipped.
    fn code(&self, count: usize, lines: usize, offset: usize) -> Vec<(String, &'static str)> {
        let half = count / 2;
        let mut out = Vec::new();
        for (files, lang, n) in [
            (&self.rust, "rust", half),
            (&self.python, "python", count - half),
        ] {
            let picked = spread(&rotate(files, offset), n);
            for path in picked {
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let code = snippet(&text, lines);
                if code.trim().len() >= 80 {
                    out.push((code, lang));
                }
            }
        }
        out
    }

    fn doc_pieces(&self, count: usize, lines: usize, offset: usize) -> Vec<String> {
        spread(&rotate(&self.docs, offset), count)
            .into_iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|t| snippet(&t, lines))
            .filter(|s| s.trim().len() >= 120)
            .collect()
    }
}

/// The list started at `offset` (so two uses of one list pick different files).
fn rotate(files: &[PathBuf], offset: usize) -> Vec<PathBuf> {
    if files.is_empty() {
        return Vec::new();
    }
    let k = offset % files.len();
    files[k..].iter().chain(&files[..k]).cloned().collect()
}

fn write_seqs(path: &Path, seqs: &[Vec<u32>]) -> Result<()> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
    for s in seqs {
        bytes.extend_from_slice(&(s.len() as u32).to_le_bytes());
    }
    for s in seqs {
        for &t in s {
            let t = u16::try_from(t).context("token id above u16")?;
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

const MAX_PROMPT: usize = 640;
const MAX_TEXT: usize = 512;

pub fn run(b: &Bundle, args: &CorpusArgs) -> Result<()> {
    let src = Sources::find();
    let user = |text: String| render(b, vec![ChatMessage::text(Role::User, text)], true);
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    let push = |prompts: &mut Vec<Vec<u32>>, ids: Vec<u32>, text: &str| {
        if !held_out(text) && ids.len() <= MAX_PROMPT {
            prompts.push(ids);
        }
    };
    for p in crate::train_mtp::corpus::CHAT_PROMPTS {
        push(&mut prompts, user(p.to_string())?, p);
    }
    for (i, topic) in TOPICS.iter().enumerate() {
        for (j, form) in FORMS.iter().enumerate() {
            // Every topic with 6 of the 10 forms, rotating.
            if (i + j) % 10 < 6 {
                let q = form.replace("{}", topic);
                push(&mut prompts, user(q.clone())?, &q);
            }
        }
    }
    let n_chat = prompts.len();
    for (i, (code, lang)) in src.code(args.code_prompts, 30, 0).iter().enumerate() {
        let q = if i % 3 == 2 {
            let Some((user, _)) = rename_edit(code, lang, i) else {
                continue;
            };
            user
        } else {
            let ask = CODE_ASKS[i % CODE_ASKS.len()].replace("{lang}", lang);
            format!("{ask}\n\n```{lang}\n{code}```")
        };
        push(&mut prompts, user(q.clone())?, &q);
    }
    let n_code = prompts.len() - n_chat;
    for (i, piece) in src.doc_pieces(args.doc_prompts, 25, 7).iter().enumerate() {
        let q = format!("{}\n\n{piece}", DOC_ASKS[i % DOC_ASKS.len()]);
        push(&mut prompts, user(q.clone())?, &q);
    }
    let n_doc = prompts.len() - n_chat - n_code;

    let mut texts: Vec<Vec<u32>> = Vec::new();
    for (i, (code, lang)) in src.code(args.edit_texts, 30, 3).iter().enumerate() {
        let Some(mut ids) = edit_turn(b, code, lang, i)? else {
            continue;
        };
        ids.truncate(MAX_TEXT * 2);
        texts.push(ids);
    }
    let n_edit = texts.len();
    let half = args.plain_texts / 2;
    for piece in src.doc_pieces(half, 80, 13) {
        let mut ids = b.tokenizer.encode(&piece, Special::AsText)?;
        ids.truncate(MAX_TEXT);
        if ids.len() >= 64 {
            texts.push(ids);
        }
    }
    for (code, _) in src.code(args.plain_texts - half, 80, 11) {
        let mut ids = b.tokenizer.encode(&code, Special::AsText)?;
        ids.truncate(MAX_TEXT);
        if ids.len() >= 64 {
            texts.push(ids);
        }
    }
    let n_plain = texts.len() - n_edit;

    // The check the GPU trunk must pass: greedy tokens of the Rust model.
    let check_prompt = user("What is the capital of France?".into())?;
    let mut cache = b.model.new_sequence(&mtplx_kv::CacheFactory::contiguous());
    let mut g = Generator::new(&*b.model, &mut cache, &check_prompt, Sampler::greedy(), 16)?;
    while g.generated().len() < 8
        && !g
            .generated()
            .iter()
            .any(|t| b.tokenizer.stop_ids().contains(t))
    {
        g.step()?;
    }
    let expected = g.generated().to_vec();
    ensure!(expected.len() >= 4, "check generation stopped early");

    std::fs::create_dir_all(&args.out)?;
    write_seqs(&args.out.join("prompts.bin"), &prompts)?;
    write_seqs(&args.out.join("texts.bin"), &texts)?;
    let tokens = |s: &[Vec<u32>]| s.iter().map(Vec::len).sum::<usize>();
    let meta = serde_json::json!({
        "stop_ids": b.tokenizer.stop_ids(),
        "check": { "prompt": check_prompt, "expected": expected },
        "prompts": { "chat": n_chat, "code": n_code, "doc": n_doc, "tokens": tokens(&prompts) },
        "texts": { "edit": n_edit, "plain": n_plain, "tokens": tokens(&texts) },
    });
    std::fs::write(
        args.out.join("meta.json"),
        serde_json::to_string_pretty(&meta)?,
    )?;
    eprintln!("[mtp-corpus] {}", meta);
    Ok(())
}

//! How much the MTP head's context matters after a restore (issue 7).
//!
//! Runs multi-turn conversations on the default model with the shipped head (earlier turns
//! answered greedily by the model itself), then decodes the last turn (greedy, depth 3,
//! fixed) three times, the trunk's cache the same each time:
//! - `full`: the head has seen every row of the conversation (what a server that never
//!   restored would have shown it);
//! - `turn`: the trunk's prefix up to the previous turn's stored state is restored, and the
//!   head sees only the rows prefilled in this turn (what a restore gives the head today);
//! - `win`: the head sees the prompt's last 512 rows (the length of its training windows).
//!
//! All three give the model's own tokens; only the acceptance differs. Prints the drafts
//! accepted by depth for the MTP head alone and for lookup then MTP (the server's proposer),
//! per conversation and in total. Figures: `models/mtp/README.md`.
//!
//! `cargo run --release -p mtplx-spec --example mtp_context [new tokens, default 128]`

use mtplx_model::tokenizer::{Special, SpecialText};
use std::path::PathBuf;
use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::mtp::{MtpHead, Vocab};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, WeightFormat};
use mtplx_spec::{
    drive, Collect, Decode, DepthPolicy, DraftSampling, LookupThenMtp, MtpProposer, Proposer,
    Request, SpecStats,
};

const DEPTH: usize = 3;
const CHUNK: usize = 256;

/// The `win` arm: the head sees the prompt's last this many rows (its training windows were
/// 512 tokens long).
const WINDOW: usize = 512;

/// Earlier answers are the model's own, at most this long.
const ANSWER_TOKENS: usize = 256;

const PY: &str = r#"import json
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def load_items(path):
    with open(path) as f:
        data = json.load(f)
    return [Item(d["name"], d["price"], d["quantity"]) for d in data]


def total_price(items):
    total = 0.0
    for item in items:
        total += item.price * item.quantity
    return total


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best


def main():
    items = load_items("items.json")
    print("total:", total_price(items))
    print("cheapest:", cheapest(items).name)


if __name__ == "__main__":
    main()
"#;

const RS: &str = r#"use std::collections::HashMap;

pub struct Inventory {
    stock: HashMap<String, u32>,
}

impl Inventory {
    pub fn new() -> Self {
        Inventory { stock: HashMap::new() }
    }

    pub fn add(&mut self, name: &str, count: u32) {
        *self.stock.entry(name.to_string()).or_insert(0) += count;
    }

    pub fn remove(&mut self, name: &str, count: u32) -> bool {
        match self.stock.get_mut(name) {
            Some(have) if *have >= count => {
                *have -= count;
                true
            }
            _ => false,
        }
    }

    pub fn count(&self, name: &str) -> u32 {
        self.stock.get(name).copied().unwrap_or(0)
    }
}
"#;

struct Conversation {
    name: &'static str,
    system: Option<&'static str>,
    turns: Vec<String>,
}

fn conversations() -> Vec<Conversation> {
    vec![
        Conversation {
            name: "chat: photosynthesis",
            system: None,
            turns: vec![
                "What is photosynthesis?".into(),
                "Explain it again for a five-year-old.".into(),
                "Now list three reasons why it matters for people.".into(),
            ],
        },
        Conversation {
            name: "chat: trip",
            system: Some("You are a helpful travel assistant."),
            turns: vec![
                "I am going to Paris for three days in spring. What should I see?".into(),
                "Which of those places are free to visit?".into(),
                "Write a short plan for the first day.".into(),
            ],
        },
        Conversation {
            name: "chat: history",
            system: None,
            turns: vec![
                "Who built the pyramids of Giza, and when?".into(),
                "How long did it take to build the Great Pyramid?".into(),
            ],
        },
        Conversation {
            name: "code: python rename",
            system: Some("You are a coding assistant. Answer with complete files."),
            turns: vec![
                format!("Here is my file `shop.py`:\n\n```python\n{PY}```\n\nWhat does it do?"),
                "Rename `total_price` to `order_total` everywhere and show the whole file."
                    .into(),
            ],
        },
        Conversation {
            name: "code: rust edit",
            system: Some("You are a coding assistant. Answer with complete files."),
            turns: vec![
                format!("Here is `inventory.rs`:\n\n```rust\n{RS}```\n\nExplain `remove`."),
                "Add a method `clear(&mut self)` that empties the stock, and show the whole file."
                    .into(),
            ],
        },
        Conversation {
            name: "code: python follow-up",
            system: Some("You are a coding assistant."),
            turns: vec![
                format!("```python\n{PY}```\n\nFind a bug in `cheapest`."),
                "Fix it and show the corrected function.".into(),
                "Now write a unit test for `total_price`.".into(),
            ],
        },
        Conversation {
            name: "code: policy.rs",
            system: Some("You are a coding assistant."),
            turns: vec![
                format!("```rust\n{POLICY}```\n\nSummarise what this module does."),
                "What does the `Streak` policy do after a rejected draft?".into(),
                "Rename `DepthPolicy` to `DraftDepth` and show every line that changes.".into(),
            ],
        },
        Conversation {
            name: "code: lookup.rs",
            system: Some("You are a coding assistant. Answer with complete files."),
            turns: vec![
                format!("```rust\n{LOOKUP}```\n\nExplain how `PromptLookup` finds a draft."),
                "Write a unit test checking that a repeated phrase is drafted.".into(),
            ],
        },
        Conversation {
            name: "agent: failing test",
            system: Some(AGENT),
            turns: vec![
                format!("I ran `cargo test` and got:\n\n```\n{TEST_OUT}```\n\nHere is the file:\n\n```rust\n{RS}```\n\nWhat is wrong?"),
                "Show the fixed `remove` method.".into(),
                "Now run through what the test checks, step by step.".into(),
            ],
        },
        Conversation {
            name: "chat: sky",
            system: None,
            turns: vec![
                "Why is the sky blue?".into(),
                "And why are sunsets red?".into(),
                "Summarise both answers in two sentences.".into(),
            ],
        },
        Conversation {
            name: "chat: poem",
            system: None,
            turns: vec![
                "Write a short poem about the sea.".into(),
                "Now make every second line rhyme.".into(),
                "Give it a title and explain the title.".into(),
            ],
        },
        Conversation {
            name: "chat: cooking",
            system: Some("You are a friendly cooking assistant."),
            turns: vec![
                "How do I make a simple tomato sauce?".into(),
                "Can I make it without onions?".into(),
                "How long does it keep in the fridge?".into(),
            ],
        },
    ]
}

const POLICY: &str = include_str!("../src/policy.rs");
const LOOKUP: &str = include_str!("../src/lookup.rs");

const AGENT: &str = "You are a software engineering agent. You read files, run commands and \
propose minimal fixes. Explain your reasoning briefly, then give the change as code.";

const TEST_OUT: &str = r#"running 3 tests
test tests::add_then_count ... ok
test tests::remove_more_than_held ... ok
test tests::remove_all ... FAILED

failures:

---- tests::remove_all stdout ----
thread 'tests::remove_all' panicked at src/inventory.rs:48:9:
assertion `left == right` failed
  left: 1
 right: 0

failures:
    tests::remove_all

test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out
"#;

fn render(b: &Bundle, system: Option<&str>, messages: &[ChatMessage]) -> Vec<u32> {
    let mut all = Vec::new();
    if let Some(s) = system {
        all.push(ChatMessage::text(Role::System, s));
    }
    all.extend_from_slice(messages);
    let req = ChatRequest {
        messages: all,
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = b.template.as_ref().unwrap().render(&req).unwrap();
    b.tokenizer.encode(&text, Special::Parse).unwrap()
}

/// The model's greedy answer to `prompt`, and the tokens whose K/V a server would keep
/// (the prompt and the answer but its last token).
fn answer(b: &Bundle, prompt: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let model = &*b.model;
    let mut cache = model.new_sequence(&CacheFactory::contiguous());
    let is_stop = |t: u32| b.tokenizer.is_stop(t);
    let request = Request {
        chunk: CHUNK,
        ..Request::new(prompt, Sampler::greedy(), ANSWER_TOKENS, &is_stop)
    };
    let tokens = drive(
        model,
        &mut cache,
        &request,
        Decode::Plain,
        &mut Collect::default(),
    )
    .unwrap()
    .tokens;
    let answer = tokens[prompt.len()..].to_vec();
    (answer, tokens[..tokens.len() - 1].to_vec())
}

#[derive(Clone, Copy)]
enum Kind {
    Mtp,
    LookupThenMtp,
}

fn proposer<'a>(b: &'a Bundle, head: &Arc<MtpHead>, kind: Kind) -> Box<dyn Proposer + 'a> {
    let mtp = MtpProposer::new(
        &*b.model,
        head.clone(),
        &CacheFactory::contiguous(),
        DraftSampling::Greedy,
    );
    match kind {
        Kind::Mtp => Box::new(mtp),
        Kind::LookupThenMtp => Box::new(LookupThenMtp::new(mtp)),
    }
}

/// Decodes `prompt`'s answer with the trunk's first `restored` positions computed
/// beforehand and hidden from the head (0: the head sees every prompt row).
fn decode(
    b: &Bundle,
    head: &Arc<MtpHead>,
    kind: Kind,
    prompt: &[u32],
    restored: usize,
    new_tokens: usize,
) -> (Vec<u32>, SpecStats) {
    let model = &*b.model;
    let mut cache = model.new_sequence(&CacheFactory::contiguous());
    if restored > 0 {
        mtplx_model::prefill(model, &prompt[..restored], &mut cache, CHUNK).unwrap();
    }
    // The driver shows the head every prompt row it computes (an MTP head wants them).
    let decode = Decode::Speculative {
        proposer: proposer(b, head, kind),
        policy: DepthPolicy::fixed(DEPTH),
    };
    let is_stop = |t: u32| b.tokenizer.is_stop(t);
    let request = Request {
        chunk: CHUNK,
        ..Request::new(prompt, Sampler::greedy(), new_tokens, &is_stop)
    };
    let report = drive(model, &mut cache, &request, decode, &mut Collect::default()).unwrap();
    let stats = report.speculation.expect("speculative").stats;
    (report.tokens[prompt.len()..].to_vec(), stats)
}

fn line(label: &str, s: &SpecStats) -> String {
    let rate = |d: usize| {
        let (n, a) = (
            s.drafted_by_depth.get(d).copied().unwrap_or(0),
            s.accepted_by_depth.get(d).copied().unwrap_or(0),
        );
        if n == 0 {
            "   -  ".to_string()
        } else {
            format!("{:.3}", a as f64 / n as f64)
        }
    };
    let accepted: u64 = s.accepted_by_depth.iter().sum();
    let per_verify = if s.verify_calls == 0 {
        0.0
    } else {
        accepted as f64 / s.verify_calls as f64
    };
    format!(
        "{label:<6} verifies {:>4}  accepted/verify {:.3}  tokens/verify {:.3}  by depth {} {} {}  (drafted {:?} accepted {:?})",
        s.verify_calls,
        per_verify,
        s.mean_acceptance_length(),
        rate(0),
        rate(1),
        rate(2),
        s.drafted_by_depth,
        s.accepted_by_depth,
    )
}

fn main() {
    let new_tokens: usize = std::env::args()
        .nth(1)
        .map_or(128, |a| a.parse().expect("new tokens"));
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        });
    let b = Bundle::load(&path, WeightFormat::Native).unwrap();
    let head_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/mtp/smollm2-135m-mtp.safetensors");
    let head = Arc::new(MtpHead::load(&head_path, &*b.model, Vocab::FromFile).unwrap());

    let kinds = [(Kind::Mtp, "mtp"), (Kind::LookupThenMtp, "lookup+mtp")];
    let mut totals: Vec<[SpecStats; 3]> = vec![Default::default(), Default::default()];
    let mut chat_totals: Vec<[SpecStats; 3]> = vec![Default::default(), Default::default()];
    let mut code_totals: Vec<[SpecStats; 3]> = vec![Default::default(), Default::default()];
    for conv in conversations() {
        let mut messages = Vec::new();
        let mut stored: Vec<u32> = Vec::new();
        let (last, earlier) = conv.turns.split_last().unwrap();
        for turn in earlier {
            messages.push(ChatMessage::text(Role::User, turn.clone()));
            let prompt = render(&b, conv.system, &messages);
            let (ans, kept) = answer(&b, &prompt);
            let text = b.tokenizer.decode(&ans, SpecialText::Skip).unwrap();
            messages.push(ChatMessage::text(Role::Assistant, text.trim().to_string()));
            stored = kept;
        }
        messages.push(ChatMessage::text(Role::User, last.clone()));
        let prompt = render(&b, conv.system, &messages);
        // What a restore would cover: the stored state's match with the new prompt, short
        // of the prompt's last token.
        let common = stored
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let restored = common.min(prompt.len() - 1);
        println!(
            "\n== {} ({} turns): prompt {} tokens, stored {}, restored {}, new {}",
            conv.name,
            conv.turns.len(),
            prompt.len(),
            stored.len(),
            restored,
            prompt.len() - restored
        );
        for (i, &(kind, name)) in kinds.iter().enumerate() {
            let (full_tokens, full) = decode(&b, &head, kind, &prompt, 0, new_tokens);
            let (turn_tokens, turn) = decode(&b, &head, kind, &prompt, restored, new_tokens);
            let window = prompt.len().saturating_sub(WINDOW).min(restored);
            let (win_tokens, win) = decode(&b, &head, kind, &prompt, window, new_tokens);
            assert_eq!(full_tokens, turn_tokens, "speculation is lossless");
            assert_eq!(full_tokens, win_tokens, "speculation is lossless");
            println!("  {name} ({} tokens)", full_tokens.len());
            println!("    {}", line("full", &full));
            println!("    {}", line("turn", &turn));
            println!("    {}", line("win", &win));
            totals[i][0].merge(&full);
            totals[i][1].merge(&turn);
            totals[i][2].merge(&win);
            let group = if !conv.name.starts_with("chat") {
                &mut code_totals
            } else {
                &mut chat_totals
            };
            group[i][0].merge(&full);
            group[i][1].merge(&turn);
            group[i][2].merge(&win);
        }
    }
    for (title, t) in [
        ("chat", &chat_totals),
        ("code and agent", &code_totals),
        ("all", &totals),
    ] {
        println!("\n== totals: {title}");
        for (i, &(_, name)) in kinds.iter().enumerate() {
            println!("  {name}");
            println!("    {}", line("full", &t[i][0]));
            println!("    {}", line("turn", &t[i][1]));
            println!("    {}", line("win", &t[i][2]));
        }
    }
}

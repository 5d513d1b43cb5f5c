//! The training text: the model's own answers to chat prompts, code-editing turns built
//! from source files the machine has, and documentation; and the held-out prompts.

use mtplx_model::tokenizer::Special;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::args::TrainArgs;
use anyhow::{Context, Result};
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, Generator};

/// Longest sequence run through the trunk.
pub(super) const MAX_SEQ: usize = 384;

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
    Ok(b.tokenizer.encode(&text, Special::Parse)?)
}

/// The token sequences the features are computed on.
pub(super) fn corpus(b: &Bundle, args: &TrainArgs) -> Result<Vec<Vec<u32>>> {
    let mut seqs = Vec::new();
    let t = Instant::now();
    // 1. The model's own answers.
    for p in CHAT_PROMPTS {
        let prompt = render(b, vec![ChatMessage::text(Role::User, *p)], true)?;
        let mut cache = b.model.new_sequence(&mtplx_kv::CacheFactory::contiguous());
        let mut g = Generator::new(&*b.model, &mut cache, &prompt, Sampler::greedy(), 256)?;
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
        let mut ids = b.tokenizer.encode(&snippet(&text, 60), Special::AsText)?;
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

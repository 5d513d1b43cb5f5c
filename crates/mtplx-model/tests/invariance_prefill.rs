//! Issue 9 on the default model's native (kernel) path: the logits after a prompt are
//! bit-identical whichever way the prompt arrived (prefill chunks of 1, 7, 64 or 512, or a
//! long prefix in chunks followed by its last tokens one at a time, as a cached prefix
//! would be), and in every KV layout, for each K/V element type; so are the greedy continuations that follow.

use std::path::PathBuf;

use mtplx_kv::{CacheFactory, KvDtype, Sequence};
use mtplx_model::{prefill, ForwardOutput, LanguageModel, Model, Want, WeightFormat};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize, Clone)]
struct Case {
    name: String,
    prompt_ids: Vec<u32>,
}

fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

fn load() -> Model {
    let path = model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `cargo xtask fetch-model`",
        path.display()
    );
    let m = Model::load(&path, WeightFormat::Native).unwrap();
    assert!(m.is_batch_invariant());
    m
}

fn cases() -> Vec<Case> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/smollm2-135m-q4_1.json");
    let g: Golden = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    g.cases
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// How the prompt reaches the model.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    /// Chunks of this many tokens.
    Chunks(usize),
    /// All but the last `tail` tokens in chunks of 512, then the tail one token at a time.
    PrefixThenSingles { tail: usize },
}

fn run(model: &Model, cache: &mut Sequence, ids: &[u32], how: Arrival) -> ForwardOutput {
    match how {
        Arrival::Chunks(c) => prefill(model, ids, cache, c).unwrap(),
        Arrival::PrefixThenSingles { tail } => {
            let split = ids.len() - tail;
            prefill(model, &ids[..split], cache, 512).unwrap();
            let mut out = ForwardOutput::default();
            for t in &ids[split..] {
                model
                    .forward_into(&[*t], cache, Want::Last, &mut out)
                    .unwrap();
            }
            out
        }
    }
}

/// Greedy continuation of `n` tokens, with their logits' bits.
fn continue_greedy(model: &Model, cache: &mut Sequence, first: &[f32], n: usize) -> Vec<u32> {
    let mut next = mtplx_model::sampling::argmax(first);
    let mut got = vec![next];
    let mut out = ForwardOutput::default();
    while got.len() < n {
        model
            .forward_into(&[next], cache, Want::Last, &mut out)
            .unwrap();
        next = mtplx_model::sampling::argmax(out.last_logits());
        got.push(next);
    }
    got
}

#[test]
fn logits_do_not_depend_on_the_prefill_chunk_or_the_layout() {
    let model = load();
    let shape = model.state_shape();
    // One of the two 2K-token prompts: they take most of the time. Every K/V element type
    // on the short prompts; f32 and the server's default, f16, on the long one.
    for (case, dtype) in cases()
        .into_iter()
        .filter(|c| c.name != "chat_long_lighthouse")
        .flat_map(|c| KvDtype::ALL.map(|d| (c.clone(), d)))
        .filter(|(c, d)| c.prompt_ids.len() <= 512 || *d != KvDtype::Bf16)
    {
        let layouts = [
            ("contiguous", CacheFactory::contiguous()),
            ("paged", CacheFactory::paged()),
            ("segmented", CacheFactory::segmented()),
        ]
        .map(|(name, f)| (name, f.with_dtype(dtype).unwrap()));
        let ids = &case.prompt_ids;
        let long = ids.len() > 512;
        // Chunks of 1 on a 2K prompt are 2K decode steps: the long prompt gets its last 16
        // tokens one at a time instead (what a cached prefix plus a new turn looks like).
        let arrivals: Vec<Arrival> = if long {
            vec![
                Arrival::Chunks(512),
                Arrival::PrefixThenSingles { tail: 16 },
                Arrival::Chunks(64),
            ]
        } else {
            vec![
                Arrival::Chunks(512),
                Arrival::Chunks(64),
                Arrival::Chunks(7),
                Arrival::Chunks(1),
            ]
        };
        let mut reference: Option<(Vec<u32>, Vec<u32>)> = None;
        for (li, (layout, factory)) in layouts.iter().enumerate() {
            for (ai, &how) in arrivals.iter().enumerate() {
                // Every arrival in the contiguous layout; in the others, the first (and for the
                // short prompts the second).
                if li > 0 && (ai > 1 || (long && ai > 0)) {
                    continue;
                }
                let mut cache = Sequence::new(factory, &shape);
                let out = run(&model, &mut cache, ids, how);
                let logits = bits(out.last_logits());
                let tokens = continue_greedy(&model, &mut cache, out.last_logits(), 8);
                match &reference {
                    None => reference = Some((logits, tokens)),
                    Some((want, want_tokens)) => {
                        let differ = logits.iter().zip(want).filter(|(a, b)| a != b).count();
                        assert_eq!(
                            differ, 0,
                            "{} ({dtype} K/V): {layout} {how:?}: {differ} logits differ in their bits",
                            case.name
                        );
                        assert_eq!(
                            &tokens, want_tokens,
                            "{} ({dtype}): {layout} {how:?}",
                            case.name
                        );
                    }
                }
            }
        }
    }
}

/// A verify block (every row's logits at once) gives each row the bits of the one-token
/// step at that position.
#[test]
fn every_row_of_a_block_equals_the_step_at_its_position() {
    let model = load();
    let shape = model.state_shape();
    let case = cases().into_iter().find(|c| c.name == "chat_code").unwrap();
    let (ctx, block) = case.prompt_ids.split_at(case.prompt_ids.len() - 5);
    let mut a = Sequence::new(&CacheFactory::contiguous(), &shape);
    prefill(&model, ctx, &mut a, 64).unwrap();
    let all = model.forward(block, &mut a, Want::All).unwrap();
    let mut b = Sequence::new(&CacheFactory::paged(), &shape);
    prefill(&model, ctx, &mut b, 7).unwrap();
    for (r, t) in block.iter().enumerate() {
        let one = model.forward(&[*t], &mut b, Want::Last).unwrap();
        assert_eq!(bits(all.logits_row(r)), bits(one.last_logits()), "row {r}");
        let h = model.config().hidden_size;
        assert_eq!(bits(&all.hidden[r * h..(r + 1) * h]), bits(&one.hidden));
    }
}

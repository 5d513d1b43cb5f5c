//! The default model generates the same tokens, with bit-identical logits at every step,
//! whichever KV layout holds its cache, and whether the prompt's prefix came from a cold
//! prefill, a snapshot restored in the same layout, a fork, or a conversion from another
//! layout, for each K/V element type.

use mtplx_model::tokenizer::Special;
use std::path::PathBuf;

use mtplx_kv::{CacheFactory, KvDtype, Sequence};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{generate_greedy, Bundle, LanguageModel, Want, WeightFormat};

const PROMPT: &str = "The history of the printing press begins in the fifteenth century, when \
    Johannes Gutenberg combined movable metal type, oil-based ink and a wooden press. Within \
    fifty years, presses were running in more than two hundred European cities, and the price \
    of books fell sharply. Historians still debate which consequence mattered most:";
/// Prefill chunk: every path below splits the prompt at the same positions, so only the
/// layout differs between them.
const CHUNK: usize = 16;
const NEW_TOKENS: usize = 8;
const EOS: u32 = 2;

fn model_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    assert!(
        path.exists(),
        "test model {} is missing: set MTPLX_TEST_MODEL or fetch the default model with \
         `cargo run -p mtplx-serve`",
        path.display()
    );
    path
}

/// Every layout, storing K/V as `dtype`.
fn layouts(dtype: KvDtype) -> [(&'static str, CacheFactory); 3] {
    [
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", CacheFactory::segmented()),
    ]
    .map(|(name, f)| (name, f.with_dtype(dtype).expect("a host layout")))
}

/// The greedy tokens and the bits of every step's logits.
type Trace = (Vec<u32>, Vec<u32>);

/// Greedy tokens and the bits of every step's logits. `cache` already holds
/// `prompt[..cache.len()]`, a multiple of [`CHUNK`].
fn greedy_bits(model: &dyn LanguageModel, cache: &mut Sequence, prompt: &[u32]) -> Trace {
    assert_eq!(cache.len() % CHUNK, 0);
    let rest = &prompt[cache.len()..];
    let mut out = Default::default();
    let pieces: Vec<&[u32]> = rest.chunks(CHUNK).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let want = if i + 1 == pieces.len() {
            Want::Last
        } else {
            Want::Nothing
        };
        out = model.forward(piece, cache, want).unwrap();
    }
    let (mut tokens, mut bits) = (Vec::new(), Vec::new());
    for _ in 0..NEW_TOKENS {
        let logits = out.last_logits();
        bits.extend(logits.iter().map(|x| x.to_bits()));
        let next = (0..logits.len() as u32)
            .max_by(|&a, &b| {
                logits[a as usize]
                    .total_cmp(&logits[b as usize])
                    .then(b.cmp(&a))
            })
            .unwrap();
        tokens.push(next);
        out = model.forward(&[next], cache, Want::Last).unwrap();
    }
    (tokens, bits)
}

#[test]
fn greedy_generation_is_identical_in_every_layout() -> anyhow::Result<()> {
    let bundle = Bundle::load(&model_path(), WeightFormat::F32)?;
    let prompt = bundle.tokenizer.encode(PROMPT, Special::AsText)?;
    let shape = bundle.model.state_shape();
    for dtype in KvDtype::ALL {
        let mut runs = Vec::new();
        for (name, factory) in layouts(dtype) {
            let mut cache = Sequence::new(&factory, &shape);
            let tokens = generate_greedy(&*bundle.model, &mut cache, &prompt, 16, &[EOS], CHUNK)?;
            assert_eq!(cache.kv().layout(), factory.layout());
            assert_eq!(cache.kv().dtype(), dtype);
            runs.push((name, tokens));
        }
        assert!(!runs[0].1.is_empty());
        for (name, tokens) in &runs[1..] {
            assert_eq!(
                tokens, &runs[0].1,
                "{dtype}: {name} differs from {}",
                runs[0].0
            );
        }
    }
    Ok(())
}

#[test]
fn logits_are_bit_identical_across_layouts_and_prefix_paths() -> anyhow::Result<()> {
    let bundle = Bundle::load(&model_path(), WeightFormat::F32)?;
    let model = &*bundle.model;
    let prompt = bundle.tokenizer.encode(PROMPT, Special::AsText)?;
    let split = (prompt.len() / 2) / CHUNK * CHUNK;
    assert!(
        split >= CHUNK && prompt.len() > split,
        "the prompt is too short"
    );
    let shape = model.state_shape();
    for dtype in KvDtype::ALL {
        same_bits_on_every_path(model, &shape, &prompt, split, dtype)?;
    }
    Ok(())
}

/// The paths below, with K/V stored as `dtype`: the same tokens and logits' bits.
fn same_bits_on_every_path(
    model: &dyn LanguageModel,
    shape: &mtplx_kv::StateShape,
    prompt: &[u32],
    split: usize,
    dtype: KvDtype,
) -> anyhow::Result<()> {
    let shape = shape.clone();
    let layouts = || layouts(dtype);
    // Cold, in each layout.
    let mut paths: Vec<(String, Trace)> = Vec::new();
    for (name, factory) in layouts() {
        let mut cache = Sequence::new(&factory, &shape);
        paths.push((
            format!("cold {name}"),
            greedy_bits(model, &mut cache, prompt),
        ));
    }

    // The prefix prefilled once per layout, then continued from a snapshot restored in
    // every layout (same layout: shared storage; other layouts: converted), and from a fork.
    for (from, factory) in layouts() {
        let mut prefix = Sequence::new(&factory, &shape);
        for piece in prompt[..split].chunks(CHUNK) {
            model.forward(piece, &mut prefix, Want::Nothing)?;
        }
        let snap = prefix.kv().snapshot();
        for (to, target) in layouts() {
            let mut cache = Sequence::from(target.restore(&*snap, split)?);
            let run = greedy_bits(model, &mut cache, prompt);
            paths.push((format!("{from} snapshot -> {to}"), run));
        }
        let mut fork = prefix.fork();
        paths.push((
            format!("{from} fork"),
            greedy_bits(model, &mut fork, prompt),
        ));
        // The origin still continues as if nothing was shared.
        paths.push((
            format!("{from} origin"),
            greedy_bits(model, &mut prefix, prompt),
        ));
    }

    let (first, (tokens, bits)) = &paths[0];
    assert_eq!(tokens.len(), NEW_TOKENS);
    for (name, (t, b)) in &paths[1..] {
        assert_eq!(
            t, tokens,
            "{dtype}: {name} generated other tokens than {first}"
        );
        assert!(
            b == bits,
            "{dtype}: {name} logits differ in bits from {first}"
        );
    }
    Ok(())
}

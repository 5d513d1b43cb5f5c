//! Greedy chat generation from the command line (the rendered prompt's token ids go to
//! stderr):
//! `cargo run --release -p mtplx-model --example generate -- MODEL [f32|quantized] "prompt"`.

use std::time::Instant;

use mtplx_kv::CacheFactory;
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::{generate_greedy, Bundle, LanguageModel, WeightFormat};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: generate MODEL [f32|quantized] PROMPT");
    let format = args
        .get(2)
        .and_then(|f| WeightFormat::parse(f))
        .unwrap_or_default();
    let prompt = args.get(3).map_or("What is the capital of France?", |s| s);
    let t = Instant::now();
    let b = Bundle::load(path.as_ref(), format)?;
    eprintln!("loaded {} in {:.2?}", b.id, t.elapsed());
    let req = ChatRequest {
        messages: vec![ChatMessage::text(Role::User, prompt)],
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = b.template.as_ref().expect("chat template").render(&req)?;
    let ids = b.tokenizer.encode(&text, true)?;
    eprintln!("prompt ids ({}): {ids:?}", ids.len());
    let mut cache = CacheFactory::contiguous().new_cache(b.model.config().kv_shape());
    let t = Instant::now();
    let out = generate_greedy(
        &b.model,
        cache.as_mut(),
        &ids,
        64,
        b.tokenizer.stop_ids(),
        512,
    )?;
    let dt = t.elapsed();
    println!("{}", b.tokenizer.decode(&out, true)?);
    eprintln!(
        "{} prompt + {} new tokens in {:.2?} ({:.1} tok/s overall)",
        ids.len(),
        out.len(),
        dt,
        out.len() as f64 / dt.as_secs_f64()
    );
    Ok(())
}

//! Greedy chat generation from the command line, through the server's own loop
//! (`mtplx_spec::drive`), plainly or with prompt-lookup speculation (the rendered prompt's
//! token ids go to stderr):
//! `cargo run --release -p mtplx-spec --example generate -- MODEL [plain|lookup] "prompt"`.

use mtplx_model::tokenizer::{Special, SpecialText};
use std::ops::ControlFlow;
use std::time::Instant;

use mtplx_kv::CacheFactory;
use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Bundle, WeightFormat};
use mtplx_spec::{drive, Decode, DepthPolicy, Observer, PromptLookup, Request};

/// Prints the answer as it is generated.
struct Print {
    decoder: mtplx_model::tokenizer::StreamDecoder,
}

impl Observer for Print {
    fn token(&mut self, token: u32) -> ControlFlow<()> {
        match self.decoder.push(token) {
            Ok(Some(piece)) => print!("{piece}"),
            Ok(None) => {}
            Err(e) => {
                eprintln!("detokenizing: {e}");
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: generate MODEL [plain|lookup] PROMPT");
    let speculate = args.get(2).is_some_and(|m| m == "lookup");
    let prompt = args.get(3).map_or("What is the capital of France?", |s| s);
    let t = Instant::now();
    let b = Bundle::load(path.as_ref(), WeightFormat::default())?;
    eprintln!("loaded {} in {:.2?}", b.id, t.elapsed());
    let req = ChatRequest {
        messages: vec![ChatMessage::text(Role::User, prompt)],
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = b.template.as_ref().expect("chat template").render(&req)?;
    let ids = b.tokenizer.encode(&text, Special::Parse)?;
    eprintln!("prompt ids ({}): {ids:?}", ids.len());
    let mut cache = b.model.new_sequence(&CacheFactory::contiguous());
    let decode = if speculate {
        Decode::Speculative {
            proposer: Box::new(PromptLookup::default()),
            policy: DepthPolicy::fixed(3),
        }
    } else {
        Decode::Plain
    };
    let is_stop = |t: u32| b.tokenizer.is_stop(t);
    let request = Request::new(&ids, Sampler::greedy(), 64, &is_stop);
    let mut print = Print {
        decoder: b.tokenizer.stream_decoder(SpecialText::Skip),
    };
    let report = drive(&*b.model, &mut cache, &request, decode, &mut print)?;
    println!("{}", print.decoder.finish());
    eprintln!(
        "{} prompt tokens in {:.2} s, {} new tokens in {:.2} s ({:.1} tok/s), ended by {:?}",
        ids.len(),
        report.prefill_s,
        report.completion_tokens,
        report.decode_s(),
        report.completion_tokens.saturating_sub(1) as f64 / report.decode_s().max(1e-9),
        report.end
    );
    Ok(())
}

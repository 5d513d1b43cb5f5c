//! A head's acceptance by depth on the held-out prompts.

use std::path::Path;

use super::corpus::{render, EVAL_CHAT, EVAL_CODE};
use anyhow::Result;
use mtplx_model::chat::{ChatMessage, Role};
use mtplx_model::sampling::Sampler;
use mtplx_model::Bundle;

/// Acceptance by depth of the head at `path` on the held-out prompts (greedy, depth 3).
pub fn evaluate(b: &Bundle, path: &Path) -> Result<()> {
    use mtplx_spec::{
        generate, DepthPolicy, DraftSampling, MtpProposer, PromptHidden, SpecDecoder,
    };
    let head = std::sync::Arc::new(mtplx_model::mtp::MtpHead::load(
        path,
        &*b.model,
        mtplx_model::mtp::Vocab::FromFile,
    )?);
    let factory = mtplx_kv::CacheFactory::contiguous();
    for (kind, prompts) in [("chat", EVAL_CHAT), ("code-edit", EVAL_CODE)] {
        let (mut drafted, mut accepted, mut calls) = (vec![0u64; 3], vec![0u64; 3], 0u64);
        let mut produced = 0usize;
        for p in prompts {
            let ids = render(b, vec![ChatMessage::text(Role::User, *p)], true)?;
            let mut cache = b.model.new_sequence(&factory);
            let mut d = SpecDecoder::with_prompt_hidden(
                &*b.model,
                &mut cache,
                &ids,
                Sampler::greedy(),
                256,
                PromptHidden::All,
            )?;
            let mut mtp =
                MtpProposer::new(&*b.model, head.clone(), &factory, DraftSampling::Greedy);
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

//! `POST /v1/completions`: a raw prompt, no chat template.

use bytes::Bytes;
use http::{Request, Response};
use serde::Deserialize;
use serde_json::json;

use super::generate::{self, Generation};
use super::params::{stop_strings, token_limit, SamplingParams, StopParam};
use super::sse::{data, done_marker, SseEncoder};
use super::{check_model, json_response, openai_usage, read_json, sse, unix_now, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::job::Summary;
use crate::state::AppState;

pub const ENDPOINT: &str = "/v1/completions";

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptParam,
    pub stream: Option<bool>,
    pub stream_options: Option<super::chat::wire::StreamOptions>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopParam>,
    pub n: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub logprobs: Option<i64>,
    pub ignore_eos: Option<bool>,
    #[serde(flatten)]
    pub extras: super::extras::RequestExtras,
}

/// A prompt: text, token ids, or a one-element list of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptParam {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

impl CompletionRequest {
    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }
}

fn prompt_ids(state: &AppState, prompt: PromptParam) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        (n == 1).then_some(()).ok_or_else(|| {
            ApiError::invalid_param("prompt", "Only one prompt per request is supported.")
        })
    };
    match prompt {
        PromptParam::Text(t) => super::prompt::encode_text(state, &t),
        PromptParam::Tokens(ids) => Ok(ids),
        PromptParam::Texts(mut v) => {
            one(v.len())?;
            super::prompt::encode_text(state, &v.remove(0))
        }
        PromptParam::TokenLists(mut v) => {
            one(v.len())?;
            Ok(v.remove(0))
        }
    }
}

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: CompletionRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "Only `n: 1` is supported."));
    }
    if body.echo == Some(true) {
        return Err(ApiError::invalid_param("echo", "`echo` is not supported."));
    }
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "`suffix` is not supported.",
        ));
    }
    if body.logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid_param(
            "logprobs",
            "`logprobs` is not supported.",
        ));
    }
    let sampler = body.sampling().sampler()?;
    let max_tokens = token_limit("max_tokens", body.max_tokens)?;
    let streaming = body.stream.unwrap_or(false);
    let include_usage = body
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let stop = stop_strings(body.stop.clone());
    let ignore_eos = body.ignore_eos.unwrap_or(false);
    let prompt = prompt_ids(&state, body.prompt)?;
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens,
            stop,
            ignore_eos,
            extras: body.extras.clone(),
        },
    )
    .await?;
    let id = format!("cmpl-{}", ctx.id_suffix());
    let model = state.model_id().to_owned();
    if streaming {
        let encoder = CompletionStream {
            id,
            model,
            created: unix_now(),
            include_usage,
        };
        return Ok(sse::response(events, encoder));
    }
    let done = generate::collect(events).await?;
    Ok(json_response(&json!({
        "id": id,
        "object": "text_completion",
        "created": unix_now(),
        "model": model,
        "choices": [{
            "index": 0,
            "text": done.text,
            "logprobs": null,
            "finish_reason": done.summary.finish.as_openai(),
        }],
        "usage": openai_usage(&done.summary),
    })))
}

struct CompletionStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(&self, text: &str, finish: Option<&str>) -> Bytes {
        data(&json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
        }))
    }
}

impl SseEncoder for CompletionStream {
    fn open(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn text(&mut self, text: String) -> Vec<Bytes> {
        vec![self.chunk(&text, None)]
    }

    fn done(&mut self, summary: Summary) -> Vec<Bytes> {
        let mut out = vec![self.chunk("", Some(summary.finish.as_openai()))];
        if self.include_usage {
            out.push(data(&json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(&summary),
            })));
        }
        out.push(done_marker());
        out
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        vec![
            data(&ApiError::internal(message).to_json(Default::default())),
            done_marker(),
        ]
    }
}

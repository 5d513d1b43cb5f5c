//! `POST /v1/completions`: a raw prompt, no chat template.

use bytes::Bytes;
use http::{Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::chat::wire::StreamOptions;
use super::drive::{self, Delivery, Ending, Out, Render, StreamUsage, Turn, Whole};
use super::generate::{self, Generation};
use super::params::{stop_strings, token_limit, SamplingParams, StopParam};
use super::sse::{data, done_marker, openai_failed};
use super::{check_model, openai_usage, read_json, unix_now, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub const ENDPOINT: &str = "/v1/completions";

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptParam,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
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
    let delivery = Delivery::asked(body.stream);
    let usage = StreamUsage::asked(body.stream_options.as_ref().and_then(|o| o.include_usage));
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
    let render = CompletionRender {
        id: format!("cmpl-{}", ctx.id_suffix()),
        model: state.model_id().to_owned(),
        created: unix_now(),
        usage,
    };
    drive::answer(events, delivery, Turn::plain(), render).await
}

/// A text completion as it is written: `text_completion` chunks, or one whole.
struct CompletionRender {
    id: String,
    model: String,
    created: u64,
    usage: StreamUsage,
}

impl CompletionRender {
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

impl Render for CompletionRender {
    fn open(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn out(&mut self, out: Out, frames: &mut Vec<Bytes>) {
        // A plain turn parses no calls: everything is text.
        if let Out::Text(text) = out {
            frames.push(self.chunk(&text, None));
        }
    }

    fn done(&mut self, ending: &Ending, frames: &mut Vec<Bytes>) {
        let summary = &ending.summary;
        frames.push(self.chunk("", Some(summary.finish.as_openai())));
        if self.usage == StreamUsage::Included {
            frames.push(data(&json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(summary),
            })));
        }
        frames.push(done_marker());
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        openai_failed(message)
    }

    fn whole(self, whole: Whole) -> Value {
        let summary = &whole.ending.summary;
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": unix_now(),
            "model": self.model,
            "choices": [{
                "index": 0,
                "text": whole.content.unwrap_or_default(),
                "logprobs": null,
                "finish_reason": summary.finish.as_openai(),
            }],
            "usage": openai_usage(summary),
        })
    }
}

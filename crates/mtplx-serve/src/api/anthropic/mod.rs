//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic). Errors on these
//! routes are rendered in Anthropic's shape.

mod render;
mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::json;

use self::stream::MessagesRender;
use self::wire::MessagesRequest;
use super::drive::{self, Delivery, Tools, Turn};
use super::generate::{self, Generation};
use super::params::token_limit;
use super::tools::ToolChoice;
use super::{check_model, json_response, prompt, read_json, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub use render::{stop_reason, tool_use_block, usage};

pub const ENDPOINT: &str = "/v1/messages";
pub const COUNT_ENDPOINT: &str = "/v1/messages/count_tokens";

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: MessagesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let max_tokens = token_limit("max_tokens", body.max_tokens)?
        .ok_or_else(|| ApiError::invalid_param("max_tokens", "`max_tokens` is required."))?;
    let sampler = body.sampling().sampler()?;
    let conversation = body.conversation()?;
    let tools = Tools::offered(conversation.tools.is_some());
    let prompt = prompt::encode_chat(&state, conversation)?;
    let prompt_tokens = prompt.len();
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens: Some(max_tokens),
            stop: body.stop_sequences.clone().unwrap_or_default(),
            ignore_eos: false,
            extras: body.extras.clone(),
        },
    )
    .await?;
    let render = MessagesRender::new(
        format!("msg_{}", ctx.id_suffix()),
        state.model_id().to_owned(),
        prompt_tokens,
    );
    let delivery = Delivery::asked(body.stream);
    let turn = Turn::new(tools, ToolChoice::Auto);
    drive::answer(events, delivery, turn, render).await
}

pub async fn count_tokens(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let body: MessagesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let prompt = prompt::encode_chat(&state, body.conversation()?)?;
    Ok(json_response(&json!({ "input_tokens": prompt.len() })))
}

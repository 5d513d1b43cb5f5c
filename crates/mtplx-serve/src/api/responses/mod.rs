//! `POST /v1/responses` (OpenAI Responses): stateless, text and client-executed function
//! tools, streamed as typed events or returned whole.

mod render;
mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::json;

use self::stream::ResponsesRender;
use self::wire::ResponsesRequest;
use super::drive::{self, Delivery, Tools, Turn};
use super::generate::{self, Generation};
use super::params::token_limit;
use super::tools::ToolChoice;
use super::{check_model, prompt, read_json, unix_now, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub use render::{function_call_item, message_item, status_of, usage, Meta};

pub const ENDPOINT: &str = "/v1/responses";

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: ResponsesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let max_tokens = token_limit("max_output_tokens", body.max_output_tokens)?;
    let sampler = body.sampling().sampler()?;
    let conversation = body.conversation()?;
    let tools = Tools::offered(conversation.tools.is_some());
    let prompt = prompt::encode_chat(&state, conversation)?;
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens,
            stop: Vec::new(),
            ignore_eos: false,
            extras: body.extras.clone(),
        },
    )
    .await?;
    let meta = Meta {
        id: format!("resp_{}", ctx.id_suffix()),
        created_at: unix_now(),
        model: state.model_id().to_owned(),
        instructions: body.instructions.clone(),
        max_output_tokens: max_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        tools: serde_json::to_value(
            body.tools
                .iter()
                .flatten()
                .map(|t| {
                    json!({
                        "type": t.kind, "name": t.name, "description": t.description,
                        "parameters": t.parameters, "strict": false,
                    })
                })
                .collect::<Vec<_>>(),
        )
        .unwrap_or_default(),
        tool_choice: body.tool_choice.clone().unwrap_or(json!("auto")),
        metadata: body.extras.metadata.clone().unwrap_or(json!({})),
    };
    let delivery = Delivery::asked(body.stream);
    let turn = Turn::new(tools, ToolChoice::Auto);
    drive::answer(events, delivery, turn, ResponsesRender::new(meta)).await
}

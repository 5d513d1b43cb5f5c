//! `POST /v1/chat/completions`.

mod render;
mod stream;
pub mod wire;

use http::{Request, Response};

use self::stream::ChatRender;
use self::wire::ChatCompletionRequest;
use super::drive::{self, Delivery, StreamUsage, Tools, Turn};
use super::generate::{self, Generation};
use super::params::{stop_strings, token_limit};
use super::prompt::{self, Conversation};
use super::tools::ToolChoice;
use super::{check_model, read_json, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub use render::{assistant_message, message, tool_call_json};

pub const ENDPOINT: &str = "/v1/chat/completions";

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: ChatCompletionRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    if body.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty.",
        ));
    }
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "Only `n: 1` is supported."));
    }
    if body.logprobs == Some(true) {
        return Err(ApiError::invalid_param(
            "logprobs",
            "`logprobs` is not supported.",
        ));
    }
    let sampler = body.sampling().sampler()?;
    let max_tokens = match token_limit("max_completion_tokens", body.max_completion_tokens)? {
        Some(n) => Some(n),
        None => token_limit("max_tokens", body.max_tokens)?,
    };
    let choice = ToolChoice::parse(body.tool_choice.as_ref(), body.tools.as_deref())?;
    let tools = body.active_tools();
    let forced = choice.forced_prefix();
    let delivery = Delivery::asked(body.stream);
    let usage = StreamUsage::asked(body.stream_options.as_ref().and_then(|o| o.include_usage));
    let ignore_eos = body.ignore_eos.unwrap_or(false);
    let mut stop = stop_strings(body.stop.clone());
    if choice.forces_a_call() {
        // The call is read by structure; nothing after it is wanted.
        stop.push(super::tools::CLOSE.to_owned());
    }
    let extras = body.extras.clone();
    let template_kwargs = body.chat_template_kwargs.clone().unwrap_or_default();
    let messages = body
        .messages
        .into_iter()
        .map(wire::WireMessage::into_chat)
        .collect::<Result<Vec<_>, _>>()?;
    let offered = Tools::offered(tools.is_some());
    let prompt = prompt::encode_chat(
        &state,
        Conversation {
            messages,
            tools,
            template_kwargs,
            assistant_prefix: forced,
        },
    )?;
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
            extras,
        },
    )
    .await?;
    let id = format!("chatcmpl-{}", ctx.id_suffix());
    let render = ChatRender::new(id, state.model_id().to_owned(), usage);
    drive::answer(events, delivery, Turn::new(offered, choice), render).await
}

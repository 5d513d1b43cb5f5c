//! Chat templates render conversations the way `transformers` does: SmolLM2's own
//! template from its GGUF, Qwen-style tool templates, and typed errors for broken ones.

use mtplx_model::tokenizer::Special;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file;
use mtplx_model::chat::{
    ChatMessage, ChatRequest, ChatTemplate, ChatTemplateError, FunctionCall, Role, ToolCall,
    ToolCallKind,
};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::tokenizer::Tokenizer;
use serde_json::json;

/// The default model: `$MTPLX_TEST_MODEL`, else the store's copy. CI fetches it first, so
/// a missing file is a failure, not a skip.
fn model_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    assert!(
        path.is_file(),
        "test model {} is missing: fetch SmolLM2-135M-Instruct.Q4_1.gguf there or set MTPLX_TEST_MODEL",
        path.display()
    );
    path
}

fn smollm2() -> Result<(Tokenizer, ChatTemplate)> {
    let mut reader = BufReader::new(File::open(model_path())?);
    let content = gguf_file::Content::read(&mut reader)?;
    let tok = Tokenizer::from_gguf(&content)?;
    let source = tok
        .chat_template()
        .context("SmolLM2's GGUF has a chat template")?;
    let template = ChatTemplate::new(
        source,
        &tok.bos_token().unwrap_or_default(),
        &tok.eos_token().unwrap_or_default(),
    )?;
    Ok((tok, template))
}

fn conversation(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest {
        messages,
        add_generation_prompt: true,
        ..ChatRequest::default()
    }
}

#[test]
fn smollm2_template_renders_chatml() -> Result<()> {
    let (tok, template) = smollm2()?;
    let req = conversation(vec![
        ChatMessage::text(Role::System, "You are terse."),
        ChatMessage::text(Role::User, "What is 2+2?"),
        ChatMessage::text(Role::Assistant, "4."),
        ChatMessage::text(Role::User, "And 3+3?"),
    ]);
    let prompt = template.render(&req)?;
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4.<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // The markup becomes control tokens once special tokens are allowed.
    let ids = tok.encode(&prompt, Special::Parse)?;
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 4);
    Ok(())
}

#[test]
fn smollm2_template_adds_its_default_system_prompt() -> Result<()> {
    let (_, template) = smollm2()?;
    let mut req = conversation(vec![ChatMessage::text(Role::User, "Hi")]);
    req.add_generation_prompt = false;
    assert_eq!(
        template.render(&req)?,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n"
    );
    Ok(())
}

/// A conversation with one tool, one call (arguments as OpenAI sends them: JSON text) and
/// its result. Keys are in alphabetical order so the expected JSON does not depend on
/// whether serde_json preserves insertion order.
fn tool_conversation() -> ChatRequest {
    let tool = json!({
        "function": {
            "description": "Get the weather",
            "name": "get_weather",
            "parameters": {
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "type": "object"
            }
        },
        "type": "function"
    });
    let call = ChatMessage {
        content: None,
        tool_calls: Some(vec![ToolCall {
            id: Some("call_1".into()),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: "get_weather".into(),
                arguments: json!("{\"city\": \"Paris\"}"),
            },
        }]),
        ..ChatMessage::text(Role::Assistant, "")
    };
    let result = ChatMessage {
        tool_call_id: Some("call_1".into()),
        name: Some("get_weather".into()),
        ..ChatMessage::text(Role::Tool, "{\"temp\": 21}")
    };
    ChatRequest {
        tools: Some(vec![tool]),
        ..conversation(vec![
            ChatMessage::text(Role::User, "Weather in Paris?"),
            call,
            result,
        ])
    }
}

const TOOL_JSON: &str = r#"{"function": {"description": "Get the weather", "name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}, "type": "function"}"#;

const CALL_AND_RESULT: &str = "<|im_start|>user\nWeather in Paris?<|im_end|>\n\
    <|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
    <|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n\
    <|im_start|>assistant\n";

#[test]
fn tool_template_renders_tools_calls_and_results() -> Result<()> {
    let source = r#"
{%- if tools %}
    {{- '<|im_start|>system\n# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- set tool_call = tool_call.function %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;
    let template = ChatTemplate::new(source, "", "<|im_end|>")?;
    let prompt = template.render(&tool_conversation())?;
    let want = format!(
        "<|im_start|>system\n# Tools\n<tools>\n{TOOL_JSON}\n</tools><|im_end|>\n{CALL_AND_RESULT}"
    );
    assert_eq!(prompt, want);

    // Without tools the section disappears.
    let mut plain = tool_conversation();
    plain.tools = None;
    assert!(!template.render(&plain)?.contains("<tools>"));
    Ok(())
}

#[test]
fn qwen25_template_from_the_tiny_fixture_renders_tools() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/qwen2");
    let tok = Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )?;
    let source = tok.chat_template().context("the fixture has a template")?;
    let template = ChatTemplate::new(source, "", "<|im_end|>")?;
    let want = format!(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n\
         # Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {TOOL_JSON}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n\
         {CALL_AND_RESULT}"
    );
    assert_eq!(template.render(&tool_conversation())?, want);
    Ok(())
}

#[test]
fn broken_templates_are_typed_errors() -> Result<()> {
    let err = ChatTemplate::new("{% for m in %}", "", "").unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax { .. }), "{err:?}");

    let strict = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok",
        "",
        "",
    )?;
    let req = conversation(vec![ChatMessage::text(Role::Assistant, "hi")]);
    assert_eq!(
        strict.render(&req),
        Err(ChatTemplateError::Raised {
            message: "Conversation must start with a user message".into()
        })
    );
    let req = conversation(vec![ChatMessage::text(Role::User, "hi")]);
    assert_eq!(strict.render(&req)?, "ok");

    let failing = ChatTemplate::new("{{ messages[0].content.no_such_method() }}", "", "")?;
    let err = failing.render(&req).unwrap_err();
    match err {
        ChatTemplateError::Render { message } => {
            assert!(message.contains("no_such_method"), "{message}")
        }
        other => panic!("expected a render error, got {other:?}"),
    }
    Ok(())
}

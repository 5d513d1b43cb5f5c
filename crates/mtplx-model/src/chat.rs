//! Chat templates: a conversation rendered into a prompt by the model's own Jinja
//! template, in the environment Hugging Face `transformers` gives templates
//! (`trim_blocks`, `lstrip_blocks`, Python string and dict methods, `raise_exception`,
//! `strftime_now`, Python-style `tojson`).

mod error;
mod pyjson;
mod request;
mod strftime;

use std::borrow::Cow;

use minijinja::{context, Environment, ErrorKind, Value};
use serde::Serialize;

pub use error::ChatTemplateError;
pub use request::{
    ChatMessage, ChatRequest, ContentPart, FunctionCall, MessageContent, Role, ToolCall,
    ToolCallKind,
};

const NAME: &str = "chat";

/// How a template reads `message.content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// As a string: content parts are joined by newlines before rendering.
    Text,
    /// As a string or a list of `{"type": "text", "text": ...}` parts, passed as given.
    Parts,
}

impl ContentFormat {
    /// Guesses from the source: a template that tests whether content is a string, or loops
    /// over it, takes parts.
    pub fn detect(source: &str) -> Self {
        let compact: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
        let takes_parts = [
            "content is string",
            "content is not string",
            "content'] is string",
            "content'] is not string",
            "content is iterable",
            "in message.content",
            "in message['content']",
            "in message[\"content\"]",
        ]
        .iter()
        .any(|p| compact.contains(p));
        if takes_parts {
            ContentFormat::Parts
        } else {
            ContentFormat::Text
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    content_format: ContentFormat,
    bos_token: String,
    eos_token: String,
}

/// Marks the error `raise_exception` returns, to tell it from other render errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
            .with_source(Raised(message)),
    )
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template sees under
    /// those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime::strftime_now);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax {
                message: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            content_format: ContentFormat::detect(source),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// The prompt for `req`.
    pub fn render(&self, req: &ChatRequest) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .expect("the template was added in new()");
        let messages: Vec<MessageView<'_>> = req
            .messages
            .iter()
            .map(|m| MessageView::new(m, self.content_format))
            .collect();
        let ctx = context! {
            messages => Value::from_serialize(&messages),
            tools => Value::from_serialize(&req.tools),
            documents => Value::from(()),
            add_generation_prompt => req.add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..Value::from_serialize(&req.template_kwargs)
        };
        template.render(ctx).map_err(|e| match raised(&e) {
            Some(message) => ChatTemplateError::Raised { message },
            None => ChatTemplateError::Render {
                message: describe(&e),
            },
        })
    }
}

fn raised(e: &minijinja::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(Raised(message)) = err.downcast_ref::<Raised>() {
            return Some(message.clone());
        }
        source = err.source();
    }
    None
}

/// The error with its location, e.g. "unknown filter: ... (in chat:3)".
fn describe(e: &minijinja::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        message.push_str(": ");
        message.push_str(&err.to_string());
        source = err.source();
    }
    message
}

/// A message as templates see it.
#[derive(Serialize)]
struct MessageView<'a> {
    role: &'a str,
    content: Option<ContentView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallView<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ContentView<'a> {
    Text(Cow<'a, str>),
    Parts(&'a [ContentPart]),
}

#[derive(Serialize)]
struct ToolCallView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: ToolCallKind,
    function: FunctionView<'a>,
}

#[derive(Serialize)]
struct FunctionView<'a> {
    name: &'a str,
    arguments: Cow<'a, serde_json::Value>,
}

impl<'a> MessageView<'a> {
    fn new(m: &'a ChatMessage, format: ContentFormat) -> Self {
        let content = m.content.as_ref().map(|c| match (c, format) {
            (MessageContent::Text(s), _) => ContentView::Text(Cow::Borrowed(s)),
            (MessageContent::Parts(p), ContentFormat::Parts) => ContentView::Parts(p),
            (parts, ContentFormat::Text) => ContentView::Text(Cow::Owned(parts.joined_text())),
        });
        let tool_calls = m.tool_calls.as_ref().map(|calls| {
            calls
                .iter()
                .map(|call| ToolCallView {
                    id: call.id.as_deref(),
                    kind: call.kind,
                    function: FunctionView {
                        name: &call.function.name,
                        arguments: arguments(&call.function.arguments),
                    },
                })
                .collect()
        });
        MessageView {
            role: m.role.as_str(),
            content,
            tool_calls,
            tool_call_id: m.tool_call_id.as_deref(),
            name: m.name.as_deref(),
        }
    }
}

/// Arguments sent as JSON text become the object they spell; other values pass as given.
fn arguments(value: &serde_json::Value) -> Cow<'_, serde_json::Value> {
    if let serde_json::Value::String(text) = value {
        if let Ok(parsed @ serde_json::Value::Object(_)) = serde_json::from_str(text) {
            return Cow::Owned(parsed);
        }
    }
    Cow::Borrowed(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn block_tags_trim_like_transformers() {
        // transformers renders with trim_blocks and lstrip_blocks.
        let t = ChatTemplate::new("  {% if true %}\n  x\n  {% endif %}\ny", "", "").unwrap();
        assert_eq!(t.render(&ChatRequest::default()).unwrap(), "  x\ny");
    }

    #[test]
    fn content_format_detection() {
        assert_eq!(
            ContentFormat::detect("{{ message['content'] }}"),
            ContentFormat::Text
        );
        assert_eq!(
            ContentFormat::detect("{% if message.content is string %}{% endif %}"),
            ContentFormat::Parts
        );
        assert_eq!(
            ContentFormat::detect("{% for part in message.content %}{% endfor %}"),
            ContentFormat::Parts
        );
    }

    #[test]
    fn arguments_text_becomes_an_object() {
        assert_eq!(
            arguments(&json!("{\"a\": 1}")).into_owned(),
            json!({"a": 1})
        );
        assert_eq!(
            arguments(&json!("not json")).into_owned(),
            json!("not json")
        );
        assert_eq!(arguments(&json!("[1]")).into_owned(), json!("[1]"));
        assert_eq!(arguments(&json!({"b": 2})).into_owned(), json!({"b": 2}));
    }

    #[test]
    fn parts_are_joined_for_string_templates_and_kept_for_others() {
        let parts = MessageContent::Parts(vec![
            ContentPart::Text { text: "a".into() },
            ContentPart::Text { text: "b".into() },
        ]);
        let req = ChatRequest {
            messages: vec![ChatMessage {
                content: Some(parts),
                ..ChatMessage::text(Role::User, "")
            }],
            ..ChatRequest::default()
        };
        let text = ChatTemplate::new("{{ messages[0].content }}", "", "").unwrap();
        assert_eq!(text.render(&req).unwrap(), "a\nb");
        let parts = ChatTemplate::new(
            "{% if messages[0].content is string %}S{% else %}{% for p in messages[0].content %}[{{ p.text }}]{% endfor %}{% endif %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(parts.render(&req).unwrap(), "[a][b]");
    }

    #[test]
    fn kwargs_reach_the_template_but_do_not_override_core_names() {
        let t = ChatTemplate::new("{{ bos_token }}{{ enable_thinking }}", "<s>", "</s>").unwrap();
        let mut req = ChatRequest::default();
        req.template_kwargs
            .insert("enable_thinking".into(), json!(false));
        req.template_kwargs.insert("bos_token".into(), json!("X"));
        assert_eq!(t.render(&req).unwrap(), "<s>False");
    }

    #[test]
    fn absent_tools_are_none_not_undefined() {
        let t = ChatTemplate::new("{{ tools is none }}", "", "").unwrap();
        assert_eq!(t.render(&ChatRequest::default()).unwrap(), "True");
    }

    #[test]
    fn python_methods_and_strftime_are_available() {
        let t = ChatTemplate::new(
            "{{ '  x '.strip() }}{{ 'a,b'.split(',') | length }}{{ 'abc'.startswith('a') }}{{ strftime_now('%Y') | length }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&ChatRequest::default()).unwrap(), "x2True4");
    }
}

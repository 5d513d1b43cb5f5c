//! Tool calls in the model's output, Hermes/Qwen style:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! [`ToolCallParser`] works on streamed text: it lets plain text through as soon as it
//! cannot be the start of a call, and turns each complete call into a [`ParsedCall`]. A
//! call whose JSON does not parse is passed through as text, so nothing is lost.

use serde_json::Value;

use crate::error::ApiError;

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's wire form).
    pub arguments: String,
}

impl ParsedCall {
    /// A call to `name` with `arguments` (JSON text).
    pub fn new(name: &str, arguments: &str) -> Self {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The arguments as a JSON value (Anthropic's `input`).
    pub fn arguments_value(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or(Value::Object(Default::default()))
    }
}

/// What the parser lets out.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

/// Streaming parser; see the module docs.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    buf: String,
    inside: bool,
    /// Whitespace held until it is known not to be just the gap around a call.
    pending_space: String,
    calls: usize,
}

impl ToolCallParser {
    pub fn new() -> Self {
        ToolCallParser::default()
    }

    /// Calls seen so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds text; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body: String = self.buf.drain(..end + CLOSE.len()).collect();
                let body = &body[..end];
                self.inside = false;
                match parse_call(body) {
                    Some(call) => {
                        self.pending_space.clear();
                        self.calls += 1;
                        out.push(Piece::Call(call));
                    }
                    None => self.text(&format!("{OPEN}{body}{CLOSE}"), &mut out),
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before: String = self.buf.drain(..start + OPEN.len()).collect();
                self.text(&before[..start], &mut out);
                self.inside = true;
            } else {
                let keep = partial_suffix(&self.buf, OPEN);
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text(&ready, &mut out);
                break;
            }
        }
        out
    }

    /// Ends the stream: an unterminated call is parsed if its JSON is complete, else
    /// returned as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.inside {
            self.inside = false;
            match parse_call(&rest) {
                Some(call) => {
                    self.calls += 1;
                    out.push(Piece::Call(call));
                }
                None => self.text(&format!("{OPEN}{rest}"), &mut out),
            }
        } else {
            self.text(&rest, &mut out);
        }
        if self.calls == 0 && !self.pending_space.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut self.pending_space)));
        }
        out
    }

    /// Lets `text` out, holding back trailing whitespace until it is known not to be just
    /// the gap before a call (so streamed text matches the trimmed whole text).
    fn text(&mut self, text: &str, out: &mut Vec<Piece>) {
        let body = text.trim_end();
        if body.is_empty() {
            self.pending_space.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.pending_space);
        s.push_str(body);
        self.pending_space.push_str(&text[body.len()..]);
        match out.last_mut() {
            Some(Piece::Text(t)) => t.push_str(&s),
            _ => out.push(Piece::Text(s)),
        }
    }
}

/// Parses a whole output: the text (trimmed; `None` when empty) and the calls.
pub fn parse_all(text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let mut p = ToolCallParser::new();
    let mut pieces = p.push(text);
    pieces.extend(p.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    let content = if calls.is_empty() {
        content
    } else {
        content.trim().to_owned()
    };
    ((!content.is_empty()).then_some(content), calls)
}

/// `{"name": ..., "arguments": ...}` (or `parameters`), arguments an object or its text.
fn parse_call(body: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

/// Length of the longest suffix of `text` that is a proper prefix of `pat`.
fn partial_suffix(text: &str, pat: &str) -> usize {
    (1..pat.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && pat.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall::new(name, args)
    }

    #[test]
    fn parses_calls_and_keeps_the_text() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_all(out);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls, [call("get_weather", "{\"city\":\"Paris\"}")]);
    }

    #[test]
    fn plain_text_and_broken_calls_pass_through() {
        assert_eq!(parse_all("just text").0.as_deref(), Some("just text"));
        let broken = "<tool_call>{not json}</tool_call>";
        assert_eq!(parse_all(broken), (Some(broken.to_string()), vec![]));
        assert_eq!(parse_all("a <tool_c"), (Some("a <tool_c".into()), vec![]));
    }

    #[test]
    fn streaming_in_any_split_gives_the_same_result() {
        let out = "Hi <tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>\n<tool_call>{\"name\": \"g\"}";
        let want = parse_all(out);
        assert_eq!(want.1, [call("f", "{}"), call("g", "{}")]);
        for size in 1..8 {
            let mut p = ToolCallParser::new();
            let mut pieces = Vec::new();
            let chars: Vec<char> = out.chars().collect();
            for chunk in chars.chunks(size) {
                pieces.extend(p.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(p.finish());
            let text: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Text(t) => Some(t.as_str()),
                    Piece::Call(_) => None,
                })
                .collect();
            let calls: Vec<_> = pieces
                .into_iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c),
                    Piece::Text(_) => None,
                })
                .collect();
            assert_eq!(text.trim(), want.0.as_deref().unwrap_or(""));
            assert_eq!(calls, want.1);
        }
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_start_a_call() {
        let mut p = ToolCallParser::new();
        assert_eq!(p.push("hello <to"), [Piece::Text("hello".into())]);
        assert_eq!(p.push("y"), [Piece::Text(" <toy".into())]);
        assert_eq!(p.push(" \n"), []);
        assert_eq!(p.finish(), [Piece::Text(" \n".into())]);
    }
}

/// What a request's `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// No tools: the template doesn't see them.
    None,
    /// The model must call one of these tools (several: the model writes the name, and a
    /// name that is not among them leaves the text unparsed; there is no constrained
    /// decoding yet).
    Required(Vec<String>),
    /// The model must call this function.
    Named(String),
}

impl ToolChoice {
    /// Reads OpenAI's `tool_choice` (`"auto"`, `"none"`, `"required"`, or
    /// `{"type": "function", "function": {"name": ...}}`) against the request's tools:
    /// `required` without tools, or a name no tool has, is a 400.
    pub fn parse(value: Option<&Value>, tools: Option<&[Value]>) -> Result<Self, ApiError> {
        let names: Vec<&str> = tools
            .unwrap_or_default()
            .iter()
            .filter_map(|t| {
                t.get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| t.get("name"))
                    .and_then(Value::as_str)
            })
            .collect();
        let choice = match value {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" | "any" => {
                    ToolChoice::Required(names.iter().map(|n| n.to_string()).collect())
                }
                other => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        format!(
                        "`tool_choice` must be auto, none, required or a function, got {other:?}."
                    ),
                    ))
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| v.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid_param(
                            "tool_choice",
                            "`tool_choice` must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                        )
                    })?;
                ToolChoice::Named(name.to_owned())
            }
        };
        match &choice {
            ToolChoice::Required(names) if names.is_empty() => Err(ApiError::invalid_param(
                "tool_choice",
                "`tool_choice: required` needs at least one tool in `tools`.",
            )),
            // With one tool, `required` names it.
            ToolChoice::Required(names) if names.len() == 1 => {
                Ok(ToolChoice::Named(names[0].clone()))
            }
            ToolChoice::Named(n) if !names.contains(&n.as_str()) => Err(ApiError::invalid_param(
                "tool_choice",
                format!("`tool_choice` names `{n}`, which is not among the request's tools."),
            )),
            _ => Ok(choice),
        }
    }

    /// The start of the assistant's turn the server writes itself to force a call: the
    /// model continues from it, and the parser reads it as part of the output.
    pub fn forced_prefix(&self) -> String {
        match self {
            ToolChoice::Auto | ToolChoice::None => String::new(),
            ToolChoice::Required(_) => format!("{OPEN}\n{{\"name\": \""),
            ToolChoice::Named(name) => {
                let name = serde_json::to_string(name).unwrap_or_default();
                format!("{OPEN}\n{{\"name\": {name}, \"arguments\": ")
            }
        }
    }
}

impl ToolChoice {
    /// Whether the server writes the start of a call itself.
    pub fn forces_a_call(&self) -> bool {
        matches!(self, ToolChoice::Required(_) | ToolChoice::Named(_))
    }

    /// The forced call in `generated` (the model's text after [`forced_prefix`]): the
    /// server wrote the call's opening, so it reads the rest by structure (a name for
    /// `required`, then the first complete JSON object as the arguments) and closes the
    /// call itself, whatever a small model writes after the arguments. `None` when the
    /// model never completed an arguments object.
    ///
    /// [`forced_prefix`]: ToolChoice::forced_prefix
    pub fn forced_call(&self, generated: &str) -> Option<ParsedCall> {
        let (name, rest) = match self {
            ToolChoice::Named(name) => (name.clone(), generated),
            ToolChoice::Required(names) => {
                let end = generated.find('"')?;
                let name = generated[..end].to_owned();
                if !names.contains(&name) {
                    return None;
                }
                let after = &generated[end + 1..];
                let args_at = after.find("\"arguments\"")? + "\"arguments\"".len();
                let colon = after[args_at..].find(':')? + args_at + 1;
                (name, &after[colon..])
            }
            ToolChoice::Auto | ToolChoice::None => return None,
        };
        let mut values = serde_json::Deserializer::from_str(rest.trim_start()).into_iter::<Value>();
        match values.next() {
            Some(Ok(args @ Value::Object(_))) if !name.is_empty() => Some(ParsedCall {
                name,
                arguments: args.to_string(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod choice_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_choice_is_checked_against_the_tools() {
        let tools = [json!({"type": "function", "function": {"name": "get_weather"}})];
        let parse = |v: Value| ToolChoice::parse(Some(&v), Some(&tools));
        assert_eq!(parse(json!("auto")).unwrap(), ToolChoice::Auto);
        assert_eq!(
            parse(json!("required")).unwrap(),
            ToolChoice::Named("get_weather".into()),
            "one tool: required names it"
        );
        let named = parse(json!({"type": "function", "function": {"name": "get_weather"}}));
        assert_eq!(named.unwrap(), ToolChoice::Named("get_weather".into()));
        assert!(parse(json!({"type": "function", "function": {"name": "nope"}})).is_err());
        assert!(parse(json!("sometimes")).is_err());
        assert!(ToolChoice::parse(Some(&json!("required")), None).is_err());
        let prefix = ToolChoice::Named("get_weather".into()).forced_prefix();
        // A forced call with its arguments parses as a call to that function.
        let (content, calls) = parse_all(&format!("{prefix}{{\"city\": \"Paris\"}}}}\n{CLOSE}"));
        assert_eq!(content, None);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, "{\"city\":\"Paris\"}");
    }

    #[test]
    fn forced_calls_are_read_by_structure() {
        let named = ToolChoice::Named("get_time".into());
        // The model's arguments object, then no closing brace for the call, then chatter.
        let call = named
            .forced_call("\n{\"city\": \"Paris\"}\n</tool_call>\n\nIt is noon.")
            .unwrap();
        assert_eq!(call.name, "get_time");
        assert_eq!(call.arguments, "{\"city\":\"Paris\"}");
        assert_eq!(named.forced_call("\"Paris\""), None);
        assert_eq!(named.forced_call("{\"city\": \"Par"), None);
        let any = ToolChoice::Required(vec!["get_time".into(), "get_weather".into()]);
        let call = any
            .forced_call("get_weather\", \"arguments\": {\"city\": \"Oslo\"}}")
            .unwrap();
        assert_eq!(
            (call.name.as_str(), call.arguments.as_str()),
            ("get_weather", "{\"city\":\"Oslo\"}")
        );
        assert_eq!(any.forced_call("get_weather"), None);
        assert_eq!(
            any.forced_call("Paris\", \"arguments\": {}}"),
            None,
            "not a tool"
        );
        assert_eq!(ToolChoice::Auto.forced_call("{}"), None);
    }
}

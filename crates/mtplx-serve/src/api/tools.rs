//! Tool calls in the model's output, Hermes/Qwen style:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! [`ToolCallParser`] works on streamed text: it lets plain text through as soon as it
//! cannot be the start of a call, and turns each complete call into a [`ParsedCall`]. A
//! call whose JSON does not parse is passed through as text, so nothing is lost.

use serde_json::Value;

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
        ParsedCall {
            name: name.into(),
            arguments: args.into(),
        }
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

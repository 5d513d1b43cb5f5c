//! The `tojson` filter as Hugging Face defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`. Python's spacing (`", "`, `": "`) is what models were trained on,
//! so minijinja's compact, HTML-escaping `tojson` will not do.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Layout options of `json.dumps`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonStyle {
    /// Per-level indent; `None` writes everything on one line.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl JsonStyle {
    pub fn new(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        JsonStyle {
            indent,
            item_sep: item_sep.to_owned(),
            key_sep: ": ".to_owned(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// The filter: `x | tojson`, `x | tojson(indent=2)`, `tojson(x, 4)`.
pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_i64() {
            Some(n) => " ".repeat(usize::try_from(n).unwrap_or(0)),
            None => v
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| invalid("indent must be an integer or a string"))?,
        }),
    };
    let mut style = JsonStyle::new(indent);
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key] = <[String; 2]>::try_from(seps)
            .map_err(|_| invalid("separators must be a pair of strings"))?;
        style.item_sep = item;
        style.key_sep = key;
    }
    style.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    style.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_owned())
}

pub(crate) fn write_value(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    if depth > 128 {
        return Err(invalid("tojson: value nested too deeply"));
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key), item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, depth, '{', '}', entries.len(), |out, i| {
                let (key, item) = &entries[i];
                write_string(out, key, style);
                out.push_str(&style.key_sep);
                write_value(out, item, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', items.len(), |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        _ => write_string(out, &value.to_string(), style),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(out, i)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: `1` → `"1"`, `True` → `"true"`, `None` → `"null"`.
fn key_string(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            s
        }
        _ => key.to_string(),
    }
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        // i64, u64 and i128 alike print exactly.
        let _ = write!(out, "{value}");
    } else if let Ok(f) = f64::try_from(value.clone()) {
        out.push_str(&python_float(f));
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// -4..16, else `1e+16` / `1.5e-07`.
pub(crate) fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

/// A JSON string as Python writes it: `"`, `\` and control chars escaped (the usual short
/// forms, else `\u00XX`); non-ASCII kept unless `ensure_ascii`.
fn write_string(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;
    use serde_json::json;

    use super::*;

    fn render(template: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(
            template,
            minijinja::context! { x => Value::from_serialize(&value) },
        )
        .unwrap()
    }

    #[test]
    fn matches_python_json_dumps_spacing_and_escapes() {
        assert_eq!(
            render(
                "{{ x | tojson }}",
                json!({"a": [1, 2.5, 2.0, true, null], "b": "<é\"\n\u{1}>"})
            ),
            r#"{"a": [1, 2.5, 2.0, true, null], "b": "<é\"\n\u0001>"}"#
        );
        assert_eq!(render("{{ x | tojson }}", json!([])), "[]");
        assert_eq!(render("{{ x | tojson }}", json!({})), "{}");
    }

    #[test]
    fn indent_and_options() {
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", json!({"a": [1], "b": {}})),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(sort_keys=true, separators=[',', ':']) }}",
                json!({"b": 1, "a": 2})
            ),
            r#"{"a":2,"b":1}"#
        );
        assert_eq!(
            render("{{ x | tojson(ensure_ascii=true) }}", json!("é😀")),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float(f), s, "{f}");
        }
    }
}

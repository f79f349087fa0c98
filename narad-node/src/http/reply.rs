//! HTTP answers as plain data ([`Reply`]), and the JSON text the surface specifies: Go's string escaping
//! (`<`, `>`, `&`, U+2028 and U+2029 as `\u` escapes), fields in the surface's order, a final `\n`.

use std::fmt::Write as _;

/// `Content-Type` of every JSON answer.
pub const JSON: &str = "application/json";
/// The durability a 202 promises, named on every produce answer.
pub const DURABILITY_HEADER: (&str, &str) = ("narad-durability", "local-wal-fsync");

/// An HTTP answer, independent of the server library (the simulator reads it directly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// `Content-Type`, when there is a body.
    pub content_type: Option<&'static str>,
    /// Other headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Reply {
    /// A JSON answer; `body` is JSON text without the final newline.
    pub fn json(status: u16, body: String) -> Reply {
        let mut body = body.into_bytes();
        body.push(b'\n');
        Reply {
            status,
            content_type: Some(JSON),
            headers: Vec::new(),
            body,
        }
    }

    /// `{"error":"<message>"}`.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::json(status, format!("{{\"error\":{}}}", json_string(message)))
    }

    /// A plain-text answer (the cluster-forwarding errors).
    pub fn plain(status: u16, text: &str) -> Reply {
        Reply {
            status,
            content_type: Some("text/plain; charset=utf-8"),
            headers: Vec::new(),
            body: format!("{text}\n").into_bytes(),
        }
    }

    /// An answer with no body and no `Content-Type`.
    pub fn empty(status: u16) -> Reply {
        Reply {
            status,
            content_type: None,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, header: (&'static str, &'static str)) -> Reply {
        self.headers.push(header);
        self
    }

    /// The body as text (tests and logs).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A JSON string literal with Go's `encoding/json` escaping.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", character as u32);
            }
            control if (control as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", control as u32);
            }
            other => out.push(other),
        }
    }
    out.push('"');
    out
}

/// Builds a JSON object field by field, in the order they are added.
#[derive(Debug, Default)]
pub struct JsonObject {
    text: String,
}

impl JsonObject {
    /// An empty object.
    pub fn new() -> Self {
        JsonObject::default()
    }

    fn key(&mut self, key: &str) {
        self.text.push(if self.text.is_empty() { '{' } else { ',' });
        self.text.push_str(&json_string(key));
        self.text.push(':');
    }

    /// Adds a string field.
    pub fn string(mut self, key: &str, value: &str) -> Self {
        self.key(key);
        self.text.push_str(&json_string(value));
        self
    }

    /// Adds a number field.
    pub fn number(mut self, key: &str, value: u64) -> Self {
        self.key(key);
        let _ = write!(self.text, "{value}");
        self
    }

    /// Adds a field whose value is already JSON text.
    pub fn raw(mut self, key: &str, json: &str) -> Self {
        self.key(key);
        self.text.push_str(json);
        self
    }

    /// The object's text.
    pub fn finish(self) -> String {
        if self.text.is_empty() {
            "{}".to_string()
        } else {
            self.text + "}"
        }
    }
}

/// A JSON array of already-encoded values.
pub fn json_array(items: &[String]) -> String {
    format!("[{}]", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_go_does() {
        assert_eq!(
            json_string("a\"b\\c\n<x>&\u{2028}\u{1}é"),
            "\"a\\\"b\\\\c\\n\\u003cx\\u003e\\u0026\\u2028\\u0001é\""
        );
    }

    #[test]
    fn errors_are_a_json_object_ending_in_a_newline() {
        let reply = Reply::error(404, "topic not found");
        assert_eq!(reply.status, 404);
        assert_eq!(reply.content_type, Some("application/json"));
        assert_eq!(reply.text(), "{\"error\":\"topic not found\"}\n");
    }

    #[test]
    fn objects_keep_the_order_fields_were_added() {
        let text = JsonObject::new()
            .string("b", "x")
            .number("a", 7)
            .raw("c", "[1]")
            .finish();
        assert_eq!(text, "{\"b\":\"x\",\"a\":7,\"c\":[1]}");
        assert_eq!(JsonObject::new().finish(), "{}");
    }
}

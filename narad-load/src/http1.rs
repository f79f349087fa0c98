//! The HTTP/1.1 wire format of every client of a `narad` node in this workspace: `narad bench`'s
//! tokio connections and the black-box tests' blocking ones (`narad-tests`). Request bytes out,
//! response heads and bodies in: pure functions over byte slices, so the parsing is tested without a
//! socket, and each client only moves bytes.
//!
//! Enough of RFC 9112 for talking to a `narad` node: a status line, headers, a body framed by
//! `Content-Length` or `Transfer-Encoding: chunked`, none after a 204/304/1xx head, and otherwise one
//! that runs to the end of the connection; `Connection: close`. Every size is bounded: a client reading
//! a body to the end of the connection stops past [`BODY_BYTES_MAX`] with
//! [`ProtocolError::BodyTooLarge`].

use base64::Engine as _;

/// The longest response head accepted.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// The longest response body accepted.
pub const BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Why a response could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The head is longer than [`HEAD_BYTES_MAX`].
    #[error("response head longer than {HEAD_BYTES_MAX} bytes")]
    HeadTooLarge,
    /// The body is longer than [`BODY_BYTES_MAX`].
    #[error("response body longer than {BODY_BYTES_MAX} bytes")]
    BodyTooLarge,
    /// The head or the chunk framing does not parse.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

/// How the body after a head is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither a length nor chunking: the body runs to the end of the connection, which closes.
    UntilClose,
}

/// A parsed response head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Bytes of the head, including the blank line.
    pub head_bytes: usize,
    /// Status code.
    pub status: u16,
    /// How the body is framed.
    pub framing: Framing,
    /// Whether the server will close the connection after this response.
    pub close: bool,
}

/// The bytes of one request. `headers` are written as given; `Host`, `Content-Length` and (when
/// `body` is non-empty or the method is POST) the body are added.
pub fn request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(128 + body.len());
    bytes.extend_from_slice(method.as_bytes());
    bytes.push(b' ');
    bytes.extend_from_slice(target.as_bytes());
    bytes.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    bytes.extend_from_slice(host.as_bytes());
    bytes.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || method == "POST" || method == "PUT" || method == "PATCH" {
        bytes.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    bytes.extend_from_slice(b"\r\n");
    bytes.extend_from_slice(body);
    bytes
}

/// Parses a response head from the start of `buffer`: `Ok(None)` while it is incomplete.
pub fn parse_head(buffer: &[u8]) -> Result<Option<Head>, ProtocolError> {
    let Some(end) = find(buffer, b"\r\n\r\n") else {
        return if buffer.len() > HEAD_BYTES_MAX {
            Err(ProtocolError::HeadTooLarge)
        } else {
            Ok(None)
        };
    };
    if end > HEAD_BYTES_MAX {
        return Err(ProtocolError::HeadTooLarge);
    }
    let mut lines = head_text(&buffer[..end])?.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(ProtocolError::Malformed("not an HTTP/1.x status line"));
    }
    let status: u16 = parts
        .next()
        .and_then(|code| code.parse().ok())
        .ok_or(ProtocolError::Malformed("bad status code"))?;
    let mut length = None;
    let mut chunked = false;
    let mut close = version == "HTTP/1.0";
    for line in lines {
        let (name, value) = field(line)?;
        if name.eq_ignore_ascii_case("content-length") {
            let parsed: usize = value
                .parse()
                .map_err(|_| ProtocolError::Malformed("bad content-length"))?;
            length = Some(parsed);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            let value = value.to_ascii_lowercase();
            if value.contains("close") {
                close = true;
            } else if value.contains("keep-alive") {
                close = false;
            }
        }
    }
    let bodiless = status == 204 || status == 304 || (100..200).contains(&status);
    let framing = match (bodiless, chunked, length) {
        (true, _, _) => Framing::Empty,
        (false, true, _) => Framing::Chunked,
        (false, false, Some(0)) => Framing::Empty,
        (false, false, Some(length)) if length > BODY_BYTES_MAX => {
            return Err(ProtocolError::BodyTooLarge)
        }
        (false, false, Some(length)) => Framing::Length(length),
        (false, false, None) => Framing::UntilClose,
    };
    Ok(Some(Head {
        head_bytes: end + 4,
        status,
        framing,
        // A body that runs to the end of the connection ends it.
        close: close || framing == Framing::UntilClose,
    }))
}

/// The header fields of a complete head (the first [`Head::head_bytes`] bytes of a buffer that
/// [`parse_head`] accepted), in order: names as sent, values trimmed.
pub fn header_fields(head: &[u8]) -> Result<Vec<(&str, &str)>, ProtocolError> {
    let head = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    head_text(head)?.split("\r\n").skip(1).map(field).collect()
}

/// A head (without its blank line) as text.
fn head_text(head: &[u8]) -> Result<&str, ProtocolError> {
    std::str::from_utf8(head).map_err(|_| ProtocolError::Malformed("head is not UTF-8"))
}

/// One header line: `(name, value)`, the value trimmed.
fn field(line: &str) -> Result<(&str, &str), ProtocolError> {
    line.split_once(':')
        .map(|(name, value)| (name, value.trim()))
        .ok_or(ProtocolError::Malformed("header without a colon"))
}

/// Decodes a chunked body from the start of `buffer`: `Ok(None)` while incomplete, else the body and
/// how many bytes of `buffer` it took (trailers included).
pub fn decode_chunked(buffer: &[u8]) -> Result<Option<(Vec<u8>, usize)>, ProtocolError> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_end) = find(&buffer[at..], b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buffer[at..at + line_end])
            .map_err(|_| ProtocolError::Malformed("chunk size is not UTF-8"))?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| ProtocolError::Malformed("bad chunk size"))?;
        at += line_end + 2;
        if size == 0 {
            // Trailers, then a blank line.
            loop {
                let Some(line_end) = find(&buffer[at..], b"\r\n") else {
                    return Ok(None);
                };
                at += line_end + 2;
                if line_end == 0 {
                    return Ok(Some((body, at)));
                }
            }
        }
        if body.len() + size > BODY_BYTES_MAX {
            return Err(ProtocolError::BodyTooLarge);
        }
        if buffer.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buffer[at..at + size]);
        if &buffer[at + size..at + size + 2] != b"\r\n" {
            return Err(ProtocolError::Malformed("chunk not followed by CRLF"));
        }
        at += size + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The `Authorization` value for `user` and `password` (RFC 7617).
pub fn basic_authorization(user: &str, password: &str) -> String {
    let credentials =
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {credentials}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_carries_host_headers_length_and_body() {
        let bytes = request(
            "POST",
            "/v1/topics/t/produce?key=k1",
            "127.0.0.1:7942",
            &[("Content-Encoding", "gzip")],
            b"hello",
        );
        assert_eq!(
            bytes,
            b"POST /v1/topics/t/produce?key=k1 HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n\
              Content-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"
                .to_vec()
        );
        assert_eq!(
            request("GET", "/metrics", "h", &[], b""),
            b"GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n".to_vec()
        );
    }

    #[test]
    fn an_incomplete_head_waits_and_a_complete_one_parses() {
        let raw = b"HTTP/1.1 202 Accepted\r\nnarad-durability: local-wal-fsync\r\ncontent-length: 0\r\n\r\nNEXT";
        assert_eq!(parse_head(&raw[..20]), Ok(None));
        assert_eq!(
            parse_head(raw),
            Ok(Some(Head {
                head_bytes: raw.len() - 4,
                status: 202,
                framing: Framing::Empty,
                close: false
            }))
        );
    }

    #[test]
    fn framing_follows_length_chunked_and_bodiless_statuses() {
        let framing = |raw: &[u8]| parse_head(raw).map(|head| head.map(|h| (h.framing, h.close)));
        assert_eq!(
            framing(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 27\r\n\r\n"),
            Ok(Some((Framing::Length(27), false)))
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"),
            Ok(Some((Framing::Chunked, true)))
        );
        assert_eq!(
            framing(b"HTTP/1.1 204 No Content\r\n\r\n"),
            Ok(Some((Framing::Empty, false)))
        );
        assert_eq!(
            framing(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n"),
            Ok(Some((Framing::Length(1), true)))
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\n\r\n"),
            Ok(Some((Framing::UntilClose, true)))
        );
        assert_eq!(
            framing(b"HTTP/1.1 404 Not Found\r\nConnection: keep-alive\r\n\r\n"),
            Ok(Some((Framing::UntilClose, true))),
            "a body to the end of the connection ends it"
        );
        assert_eq!(
            framing(b"SMTP 200 OK\r\n\r\n"),
            Err(ProtocolError::Malformed("not an HTTP/1.x status line"))
        );
    }

    #[test]
    fn header_fields_keep_their_order_names_and_trimmed_values() {
        let raw = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nNarad-Durability:  local-wal-fsync \r\ncontent-length: 3\r\n\r\n{}\n";
        let head = parse_head(raw).unwrap().unwrap();
        assert_eq!(head.framing, Framing::Length(3));
        assert_eq!(
            header_fields(&raw[..head.head_bytes]),
            Ok(vec![
                ("content-type", "application/json"),
                ("Narad-Durability", "local-wal-fsync"),
                ("content-length", "3"),
            ])
        );
        assert_eq!(
            header_fields(b"HTTP/1.1 204 No Content\r\n\r\n"),
            Ok(vec![])
        );
        assert_eq!(
            header_fields(b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n"),
            Err(ProtocolError::Malformed("header without a colon"))
        );
    }

    #[test]
    fn heads_and_bodies_over_their_limits_are_refused() {
        let long = vec![b'a'; HEAD_BYTES_MAX + 1];
        assert_eq!(parse_head(&long), Err(ProtocolError::HeadTooLarge));
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            BODY_BYTES_MAX + 1
        );
        assert_eq!(
            parse_head(huge.as_bytes()),
            Err(ProtocolError::BodyTooLarge)
        );
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let raw = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\nREST";
        assert_eq!(
            decode_chunked(raw),
            Ok(Some((b"hello world".to_vec(), raw.len() - 4)))
        );
        assert_eq!(decode_chunked(&raw[..12]), Ok(None));
        assert_eq!(
            decode_chunked(b"zz\r\n"),
            Err(ProtocolError::Malformed("bad chunk size"))
        );
        assert_eq!(
            decode_chunked(b"1\r\nab\r\n"),
            Err(ProtocolError::Malformed("chunk not followed by CRLF"))
        );
    }
}

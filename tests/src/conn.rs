//! A blocking keep-alive HTTP/1.1 connection, for tests that send thousands of requests (producers,
//! replay scans), and under [`crate::http`]'s one request per connection.
//!
//! The wire format is `narad bench`'s ([`narad_load::http1`]): this connection only moves bytes
//! between a socket and that codec. One request in flight at a time; bodies framed by
//! `Content-Length`, chunked encoding, nothing (204, 304, 1xx) or the end of the connection, every
//! size bounded by the codec's limits. Every failure drops the socket, so the next request connects
//! again; the error says whether the request could have reached the server ([`ConnError::Exchange`])
//! or certainly did not ([`ConnError::Connect`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

use narad_load::http1::{self, Framing, ProtocolError};

use crate::{Response, HTTP_TIMEOUT};

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Why a request got no response.
#[derive(Debug)]
pub enum ConnError {
    /// Connecting failed: the request was not sent.
    Connect(io::Error),
    /// Writing the request or reading the response failed: the server may have acted on it.
    Exchange(io::Error),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Connect(error) => write!(f, "connect: {error}"),
            ConnError::Exchange(error) => write!(f, "exchange: {error}"),
        }
    }
}

/// A keep-alive connection to one address (reconnecting after any failure).
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buffer: Vec<u8>,
}

impl Conn {
    /// A connection to `addr`, opened by [`Conn::connect`] or the first request.
    pub fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            stream: None,
            buffer: Vec::new(),
        }
    }

    /// The address it talks to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Points the connection at another address (closing the current socket).
    pub fn retarget(&mut self, addr: SocketAddr) {
        if addr != self.addr {
            self.addr = addr;
            self.close();
        }
    }

    /// Drops the socket.
    pub fn close(&mut self) {
        self.stream = None;
        self.buffer.clear();
    }

    /// Opens the socket unless it is open. After this succeeds, the next request fails, if it does,
    /// with [`ConnError::Exchange`] only: a caller can tell "never sent" apart before it sends.
    pub fn connect(&mut self) -> Result<(), ConnError> {
        if self.stream.is_some() {
            return Ok(());
        }
        let stream = TcpStream::connect_timeout(&self.addr, HTTP_TIMEOUT)
            .and_then(|stream| {
                stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
                stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
                stream.set_nodelay(true)?;
                Ok(stream)
            })
            .map_err(ConnError::Connect)?;
        self.stream = Some(stream);
        self.buffer.clear();
        Ok(())
    }

    /// One request: `headers` as given, then `Host` and `Content-Length` ([`http1::request`]).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ConnError> {
        self.connect()?;
        let request = http1::request(method, path, &self.addr.to_string(), headers, body);
        match self.exchange(&request) {
            Ok((response, close)) => {
                if close {
                    self.close();
                }
                Ok(response)
            }
            Err(error) => {
                self.close();
                Err(ConnError::Exchange(error))
            }
        }
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> Result<Response, ConnError> {
        self.request("GET", path, &[], b"")
    }

    /// `POST path` with a body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> Result<Response, ConnError> {
        self.request("POST", path, &[], body)
    }

    /// Writes `request` and reads its response; also says whether the connection ends with it.
    fn exchange(&mut self, request: &[u8]) -> io::Result<(Response, bool)> {
        self.stream
            .as_mut()
            .expect("connected")
            .write_all(request)?;
        let head = loop {
            match http1::parse_head(&self.buffer).map_err(invalid)? {
                Some(head) => break head,
                None => self.fill()?,
            }
        };
        let headers = http1::header_fields(&self.buffer[..head.head_bytes])
            .map_err(invalid)?
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
            .collect();
        self.buffer.drain(..head.head_bytes);
        let body = match head.framing {
            Framing::Empty => Vec::new(),
            Framing::Length(length) => {
                while self.buffer.len() < length {
                    self.fill()?;
                }
                self.buffer.drain(..length).collect()
            }
            Framing::Chunked => loop {
                match http1::decode_chunked(&self.buffer).map_err(invalid)? {
                    Some((body, used)) => {
                        self.buffer.drain(..used);
                        break body;
                    }
                    None => self.fill()?,
                }
            },
            Framing::UntilClose => {
                while self.fill_or_end()? {
                    if self.buffer.len() > http1::BODY_BYTES_MAX {
                        return Err(invalid(ProtocolError::BodyTooLarge));
                    }
                }
                std::mem::take(&mut self.buffer)
            }
        };
        let response = Response {
            status: head.status,
            headers,
            body,
        };
        Ok((response, head.close))
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.fill_or_end()? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the response ended",
            ))
        }
    }

    /// Reads more bytes; false at the end of the stream.
    fn fill_or_end(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        let stream = self.stream.as_mut().expect("connected");
        let read = stream.read(&mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(read > 0)
    }
}

fn invalid(error: ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack
            .windows(needle.len())
            .position(|window| window == needle)
    }

    /// A one-connection server that answers each request with the next canned response, then closes.
    fn serve(responses: Vec<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut pending = Vec::new();
            for response in responses {
                while find(&pending, b"\r\n\r\n").is_none() {
                    let mut chunk = [0u8; 1024];
                    let read = stream.read(&mut chunk).unwrap();
                    pending.extend_from_slice(&chunk[..read]);
                }
                let end = find(&pending, b"\r\n\r\n").unwrap() + 4;
                pending.drain(..end);
                stream.write_all(response).unwrap();
            }
        });
        addr
    }

    #[test]
    fn one_connection_carries_length_chunked_and_bodiless_responses() {
        let addr = serve(vec![
            b"HTTP/1.1 202 Accepted\r\nnarad-durability: local-wal-fsync\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 27\r\n\r\n{\"error\":\"produce failed\"}\n",
        ]);
        let mut conn = Conn::new(addr);
        let accepted = conn.post("/p", b"x").unwrap();
        assert_eq!(accepted.status, 202);
        assert_eq!(accepted.header("Narad-Durability"), Some("local-wal-fsync"));
        let chunked = conn.get("/c").unwrap();
        assert_eq!((chunked.status, chunked.text().as_str()), (200, "abcde"));
        assert_eq!(conn.get("/e").unwrap().status, 204);
        let failed = conn.post("/p", b"y").unwrap();
        assert_eq!(
            (failed.status, failed.text().as_str()),
            (500, "{\"error\":\"produce failed\"}\n")
        );
        // The server is gone: the next request fails in the exchange or the connect.
        assert!(conn.get("/gone").is_err());
    }

    #[test]
    fn a_body_without_a_length_runs_to_the_end_of_the_connection() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end",
        ]);
        let mut conn = Conn::new(addr);
        let response = conn.get("/").unwrap();
        assert_eq!(
            (response.status, response.text().as_str()),
            (200, "to the end")
        );
        assert_eq!(response.header("content-type"), Some("text/plain"));
    }

    #[test]
    fn a_malformed_head_is_an_exchange_error_naming_it() {
        let addr = serve(vec![b"SMTP 220 hello\r\n\r\n"]);
        let error = Conn::new(addr).get("/").unwrap_err();
        assert!(
            error.to_string().contains("not an HTTP/1.x status line"),
            "{error}"
        );
    }

    #[test]
    fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert!(matches!(
            Conn::new(addr).get("/"),
            Err(ConnError::Connect(_))
        ));
    }
}

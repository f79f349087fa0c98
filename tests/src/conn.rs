//! A blocking keep-alive HTTP/1.1 connection, for tests that send thousands of requests (producers,
//! replay scans) where [`crate::http`]'s connection per request would spend its time in handshakes
//! and fill the port range with `TIME_WAIT` sockets.
//!
//! One request in flight at a time. Bodies are framed by `Content-Length` or chunked encoding; a
//! response without either and without a body status (204, 304, 1xx) is read to the end of the
//! connection. Every failure drops the socket, so the next request connects again; the error says
//! whether the request could have reached the server ([`ConnError::Exchange`]) or certainly did not
//! ([`ConnError::Connect`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

use crate::{parse_response, Response, HTTP_TIMEOUT};

/// The longest response accepted.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

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
    /// A connection to `addr`, opened by the first request.
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

    /// One request.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ConnError> {
        if self.stream.is_none() {
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
        }
        let result = self.exchange(method, path, headers, body);
        match result {
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

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<(Response, bool)> {
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(&bytes)?;
        let head_end = loop {
            if let Some(at) = find(&self.buffer, b"\r\n\r\n") {
                break at + 4;
            }
            self.fill()?;
        };
        let head = parse_response(&self.buffer[..head_end]).ok_or_else(|| invalid("bad head"))?;
        let close = head
            .header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"));
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|value| value.to_ascii_lowercase().contains("chunked"));
        let length = head
            .header("content-length")
            .map(|value| value.parse::<usize>().map_err(|_| invalid("bad length")))
            .transpose()?;
        let bodiless = matches!(head.status, 204 | 304 | 100..=199);
        self.buffer.drain(..head_end);
        let body = if bodiless {
            Vec::new()
        } else if chunked {
            self.read_chunked()?
        } else if let Some(length) = length {
            if length > RESPONSE_BYTES_MAX {
                return Err(invalid("response too large"));
            }
            while self.buffer.len() < length {
                self.fill()?;
            }
            self.buffer.drain(..length).collect()
        } else {
            while self.fill_or_end()? {}
            let body = std::mem::take(&mut self.buffer);
            return Ok((Response { body, ..head }, true));
        };
        Ok((Response { body, ..head }, close))
    }

    fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(at) = find(&self.buffer, b"\r\n") {
                    break at;
                }
                self.fill()?;
            };
            let line = String::from_utf8_lossy(&self.buffer[..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| invalid("bad chunk size"))?;
            self.buffer.drain(..line_end + 2);
            if size == 0 {
                // Skip trailers up to the blank line.
                loop {
                    let end = loop {
                        if let Some(at) = find(&self.buffer, b"\r\n") {
                            break at;
                        }
                        self.fill()?;
                    };
                    self.buffer.drain(..end + 2);
                    if end == 0 {
                        return Ok(body);
                    }
                }
            }
            if body.len() + size > RESPONSE_BYTES_MAX {
                return Err(invalid("response too large"));
            }
            while self.buffer.len() < size + 2 {
                self.fill()?;
            }
            body.extend_from_slice(&self.buffer[..size]);
            self.buffer.drain(..size + 2);
        }
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
        if self.buffer.len() > RESPONSE_BYTES_MAX {
            return Err(invalid("response too large"));
        }
        let mut chunk = [0u8; 16 * 1024];
        let stream = self.stream.as_mut().expect("connected");
        let read = stream.read(&mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(read > 0)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-connection server that answers each request with the next canned response.
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
            b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 27\r\n\r\n{\"error\":\"produce failed\"}\n",
        ]);
        let mut conn = Conn::new(addr);
        assert_eq!(conn.post("/p", b"x").unwrap().status, 202);
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

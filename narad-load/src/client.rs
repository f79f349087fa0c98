//! One keep-alive HTTP/1.1 connection on tokio: write a request, read its response, reuse the
//! socket. One request in flight per connection (no pipelining), as a producer waiting for its 202
//! behaves.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http1::{self, Framing};

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// A response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A keep-alive connection to one address.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
    closed: bool,
}

impl Connection {
    /// Connects (with `TCP_NODELAY`: a request is one write and waits for its answer).
    pub async fn connect(addr: SocketAddr) -> io::Result<Connection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buffer: Vec::with_capacity(READ_CHUNK_BYTES),
            closed: false,
        })
    }

    /// Whether the server said it closes the connection (the caller should connect again).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Sends `request` (bytes from [`http1::request`]) and reads the whole response.
    pub async fn exchange(&mut self, request: &[u8]) -> io::Result<Response> {
        if self.closed {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the server closed this connection",
            ));
        }
        self.stream.write_all(request).await?;
        let head = loop {
            match http1::parse_head(&self.buffer).map_err(invalid)? {
                Some(head) => break head,
                None => self.fill().await?,
            }
        };
        self.buffer.drain(..head.head_bytes);
        let body = match head.framing {
            Framing::Empty => Vec::new(),
            Framing::Length(length) => {
                while self.buffer.len() < length {
                    self.fill().await?;
                }
                self.buffer.drain(..length).collect()
            }
            Framing::Chunked => loop {
                match http1::decode_chunked(&self.buffer).map_err(invalid)? {
                    Some((body, used)) => {
                        self.buffer.drain(..used);
                        break body;
                    }
                    None => self.fill().await?,
                }
            },
            Framing::UntilClose => {
                while self.fill_or_end().await? {
                    if self.buffer.len() > http1::BODY_BYTES_MAX {
                        return Err(invalid(http1::ProtocolError::BodyTooLarge));
                    }
                }
                std::mem::take(&mut self.buffer)
            }
        };
        self.closed = head.close;
        Ok(Response {
            status: head.status,
            body,
        })
    }

    async fn fill(&mut self) -> io::Result<()> {
        if self.fill_or_end().await? {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the response ended",
        ))
    }

    /// Reads more bytes; false at the end of the stream (the connection is then closed).
    async fn fill_or_end(&mut self) -> io::Result<bool> {
        let start = self.buffer.len();
        self.buffer.resize(start + READ_CHUNK_BYTES, 0);
        let read = self.stream.read(&mut self.buffer[start..]).await;
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                self.buffer.truncate(start);
                return Err(error);
            }
        };
        self.buffer.truncate(start + read);
        if read == 0 {
            self.closed = true;
        }
        Ok(read > 0)
    }
}

fn invalid(error: http1::ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// Between a failed connect and the next request's.
const RECONNECT_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// One exchange on the worker's connection (opened first if needed): the response, or the kind of
/// failure. A failed connection is dropped so the next request opens a new one.
pub(crate) async fn exchange(
    connection: &mut Option<Connection>,
    addr: SocketAddr,
    request: &[u8],
) -> Result<Response, String> {
    if connection.as_ref().is_none_or(Connection::is_closed) {
        match Connection::connect(addr).await {
            Ok(fresh) => *connection = Some(fresh),
            Err(error) => {
                tokio::time::sleep(RECONNECT_DELAY).await;
                return Err(format!("connect: {}", error.kind()));
            }
        }
    }
    let open = connection.as_mut().expect("connected above");
    match open.exchange(request).await {
        Ok(response) => Ok(response),
        Err(error) => {
            *connection = None;
            Err(format!("io: {}", error.kind()))
        }
    }
}

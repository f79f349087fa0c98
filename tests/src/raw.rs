//! Raw sockets against a node, for the tests of its HTTP server's limits: bytes written as they are
//! (slow, oversized, or none at all), what the node does with them and when ([`read_until_end`]), and
//! the node process's memory ([`pid_listening_on`], [`vm_rss_kib`]).
//!
//! Every wait is bounded by the caller's `within`, never longer than [`crate::HTTP_TIMEOUT`].

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::HTTP_TIMEOUT;

/// Longest single blocking read while waiting for an end (so the wait is checked against its bound).
const READ_SLICE: Duration = Duration::from_millis(50);
/// Most bytes [`read_until_end`] keeps.
const KEPT_BYTES_MAX: usize = 1024 * 1024;

/// A connected socket with bounded reads and writes and no Nagle delay.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)
        .unwrap_or_else(|error| panic!("connect {addr}: {error}"));
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(HTTP_TIMEOUT))
        .expect("write timeout");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// How the node ended (or did not end) a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// An orderly close (FIN).
    Closed,
    /// A reset, or another read error.
    Reset,
    /// Still open when the wait ended.
    Open,
}

/// What a connection delivered until it ended or the wait did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The bytes read (at most 1 MiB).
    pub bytes: Vec<u8>,
    /// How it ended.
    pub end: End,
    /// From the start of the wait to its end.
    pub elapsed: Duration,
}

impl Outcome {
    /// The status of the first response read, if one began.
    pub fn status(&self) -> Option<u16> {
        let text = std::str::from_utf8(self.bytes.get(..12)?).ok()?;
        text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }

    /// The bytes after the first response's head.
    pub fn body(&self) -> &[u8] {
        match self
            .bytes
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
        {
            Some(end) => &self.bytes[end + 4..],
            None => &[],
        }
    }

    /// All the bytes read, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads until the node closes or resets the connection, or `within` passes (at most
/// [`HTTP_TIMEOUT`]).
#[allow(clippy::disallowed_methods)] // Timing a real process needs the real clock.
pub fn read_until_end(stream: &mut TcpStream, within: Duration) -> Outcome {
    let started = std::time::Instant::now();
    let deadline = started + within.min(HTTP_TIMEOUT);
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let end = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break End::Open;
        }
        stream
            .set_read_timeout(Some(left.min(READ_SLICE)))
            .expect("read timeout");
        match stream.read(&mut chunk) {
            Ok(0) => break End::Closed,
            Ok(read) => {
                let keep = read.min(KEPT_BYTES_MAX.saturating_sub(bytes.len()));
                bytes.extend_from_slice(&chunk[..keep]);
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break End::Reset,
        }
    };
    let _ = stream.set_read_timeout(Some(HTTP_TIMEOUT));
    Outcome {
        bytes,
        end,
        elapsed: started.elapsed(),
    }
}

/// The process listening on `addr` (TCP, on this machine), from `/proc/net/tcp` and the processes'
/// file handles; `None` when none is found (or this is not Linux).
pub fn pid_listening_on(addr: SocketAddr) -> Option<u32> {
    let table = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let port = format!(":{:04X}", addr.port());
    let listening = std::fs::read_to_string(table).ok()?;
    // Columns: sl local_address rem_address st ... inode (the tenth); state 0A is LISTEN.
    let inode = listening.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
        (local.ends_with(&port) && *state == "0A").then(|| inode.to_string())
    })?;
    let socket = format!("socket:[{inode}]");
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(handles) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        for handle in handles.flatten() {
            if std::fs::read_link(handle.path())
                .is_ok_and(|target| target.as_os_str() == socket.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// A process's resident memory (`VmRSS` of `/proc/<pid>/status`), KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The `fraction` quantile (0.5, 0.99, ...) of `samples`, by the nearest rank; zero when empty.
pub fn quantile(samples: &[Duration], fraction: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&samples, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn a_listening_socket_is_found_in_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(pid_listening_on(addr), Some(std::process::id()));
        assert!(vm_rss_kib(std::process::id()).is_some_and(|rss| rss > 0));
    }

    #[test]
    fn outcomes_read_their_status_and_body() {
        let outcome = Outcome {
            bytes: b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nno".to_vec(),
            end: End::Closed,
            elapsed: Duration::ZERO,
        };
        assert_eq!(outcome.status(), Some(503));
        assert_eq!(outcome.body(), b"no");
    }
}

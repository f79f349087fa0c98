//! The HTTP server: our accept loop driving hyper's connections, hardened against clients that hold a
//! connection without using it (the surface's read/write/idle timeouts of 10/30/60 s), oversized
//! heads, and more connections than the node serves. The router is served unchanged. Compiled only
//! outside madsim.
//!
//! Contract: [`serve`] answers every connection it admits with the router until `shutdown` completes;
//! then it closes the listener, tells every connection to finish its request in flight and close
//! (hyper's graceful shutdown: an idle keep-alive connection closes at once), and returns once every
//! connection is closed. Every connection is one task; nothing else is spawned per connection except a
//! refused connection's short linger ([`REFUSAL_LINGER`], at most [`REFUSALS_LINGERING_MAX`] at once).
//!
//! Limits, each with its refusal:
//! - **Connections**: at most `http.max_connections` at once (a semaphore's permits). One more is
//!   written a raw `503 {"error":"too many connections"}` with `Connection: close` and closed; on a
//!   TLS listener it is closed only (plain text means nothing to a TLS client, and a handshake would
//!   cost what the cap saves). Counted in `narad_http_connections_refused_total`; logged at most once
//!   every [`WARN_EVERY`].
//! - **Request head**: at most [`HEAD_BYTES_MAX`] bytes (request line and headers) and hyper's 100
//!   header fields, else 431 and the connection closes. The bound leaves room for a request target of
//!   hyper's 65,534 bytes, so a longer target is still hyper's 414.
//! - **Read timeout** (`http.read_timeout_ms`, 10 s): a request's head must arrive within it of the
//!   connection's accept (its first request, TLS handshake included) or of the head's first byte (a
//!   later request on a kept-alive connection); else the connection closes. The whole request, body
//!   included, must arrive within it of that same start ([`DeadlineBody`]); a body still arriving then
//!   is answered 408 `{"error":"request timeout"}` with `Connection: close`.
//! - **Write timeout** (`http.write_timeout_ms`, 30 s): a write to the socket that cannot progress for
//!   that long (the client does not read its answer) fails, and the connection closes ([`TimedIo`]).
//! - **Idle timeout** (`http.idle_timeout_ms`, 60 s): a connection with no request in flight and no
//!   byte moving for that long closes.
//!
//! Decision: the head timeout is ours, not hyper's `header_read_timeout`. hyper starts that timer
//! whenever it waits for a head, between the requests of a kept-alive connection too, so it would close
//! every idle keep-alive connection after 10 s instead of 60. Ours runs as Go's `net/http` does: from the
//! accept for the first request, from the first byte for each later one.
//!
//! How: a connection's socket is wrapped in [`TimedIo`] (notes bytes moving; fails a write stalled past
//! the write timeout), its request bodies in [`DeadlineBody`], and its task races hyper's connection
//! against [`Watch::expired`], the head and idle deadlines, which the socket wrapper and the service
//! ([`ConnService`]) keep current through the connection's [`Watch`].
//!
//! HTTPS (`http.tls_cert_file` and `tls_key_file`, [`load_tls`]): the listener serves TLS only, with
//! ALPN `h2` (served by hyper's HTTP/2) and `http/1.1`. Plain listeners serve HTTP/1.1 only.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body as AxumBody, Bytes};
use axum::http::{header, HeaderValue, Request, Response, StatusCode, Version};
use axum::Router;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulConnection;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use super::Reply;
use crate::config::HttpConfig;
use crate::metrics::{Metrics, TimeoutLabels};

/// Largest request head (request line and headers), bytes: 80 KiB. Room for hyper's longest request
/// target (65,534 bytes, a 414 beyond) and a few KiB of headers; a longer head is a 431.
pub const HEAD_BYTES_MAX: usize = 80 * 1024;
/// Most concurrent streams of one HTTP/2 connection.
pub const HTTP2_STREAMS_MAX: u32 = 128;
/// Longest a refused connection stays open to read (and drop) what its client sent, so that closing
/// it does not reset the connection before the client read its 503.
pub const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Most refused connections lingering at once; past it a refused connection closes at once.
pub const REFUSALS_LINGERING_MAX: usize = 256;
/// Bytes a lingering refused connection reads at most.
pub const REFUSAL_LINGER_BYTES_MAX: usize = 64 * 1024;
/// Least time between two warnings of refused connections (or of failed accepts).
pub const WARN_EVERY: Duration = Duration::from_secs(10);
/// The pause after an accept failed for want of resources (file handles, memory).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How the server treats its connections (from `[http]`).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The read timeout: a request's head, and the whole request, from its start.
    pub read_timeout: Duration,
    /// The write timeout: a socket write that cannot progress for this long fails.
    pub write_timeout: Duration,
    /// The idle timeout: no request in flight and no byte moving.
    pub idle_timeout: Duration,
    /// The most connections served at once.
    pub max_connections: u32,
    /// HTTPS: the TLS configuration (ALPN `h2`, `http/1.1`), or plain HTTP/1.1.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl ServeOptions {
    /// The options of `[http]`, reading the HTTPS certificate and key when they are configured.
    pub fn from_config(http: &HttpConfig) -> Result<ServeOptions, TlsLoadError> {
        let tls = match http.tls_files() {
            Some((cert, key)) => Some(load_tls(cert, key)?),
            None => None,
        };
        Ok(ServeOptions {
            read_timeout: Duration::from_millis(http.read_timeout_ms),
            write_timeout: Duration::from_millis(http.write_timeout_ms),
            idle_timeout: Duration::from_millis(http.idle_timeout_ms),
            max_connections: http.max_connections,
            tls,
        })
    }
}

/// Why the HTTPS certificate or key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsLoadError {
    /// The certificate file cannot be read, or holds no certificate.
    #[error("http.tls_cert_file {path}: {reason}")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key file cannot be read, or holds no private key.
    #[error("http.tls_key_file {path}: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The certificate and the key do not make a TLS configuration (the key is not the
    /// certificate's, say).
    #[error("http.tls_cert_file {cert} with http.tls_key_file {key}: {reason}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        reason: String,
    },
}

/// Reads the HTTPS certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, RSA or
/// SEC1), and makes the server's TLS configuration (TLS 1.2 and 1.3 on ring; ALPN `h2`, `http/1.1`).
pub fn load_tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsLoadError> {
    let cert_error = |reason: String| TlsLoadError::Certificate {
        path: cert.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|error| cert_error(pem_reason(error, "CERTIFICATE")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| cert_error(pem_reason(error, "CERTIFICATE")))?;
    if chain.is_empty() {
        return Err(cert_error("no CERTIFICATE block".to_string()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|error| TlsLoadError::Key {
        path: key.to_path_buf(),
        reason: pem_reason(error, "PRIVATE KEY (PKCS#8, RSA or EC)"),
    })?;
    let config_error = |reason: String| TlsLoadError::Config {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        reason,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| config_error(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|error| config_error(error.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

// `pem::Error` is non-exhaustive: every other error says itself.
#[allow(clippy::wildcard_enum_match_arm)]
fn pem_reason(error: rustls::pki_types::pem::Error, wanted: &str) -> String {
    match error {
        rustls::pki_types::pem::Error::NoItemsFound => format!("no {wanted} block"),
        rustls::pki_types::pem::Error::Io(error) => error.to_string(),
        other => format!("not PEM: {other}"),
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then closes the listener, lets the
/// requests in flight finish and returns once every connection is closed (see the module doc).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    assert!(
        options.max_connections >= 1,
        "max_connections is at least 1"
    );
    let shared = Arc::new(Shared::new(router, &options, &metrics));
    let connections = Arc::new(Semaphore::new(options.max_connections as usize));
    let lingering = Arc::new(Semaphore::new(REFUSALS_LINGERING_MAX));
    let refusal = refusal_bytes();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut refused_warning = Warning::default();
    let mut accept_warning = Warning::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                if let Some(count) = accept_warning.note(Instant::now()) {
                    tracing::warn!(%error, failures = count, "http accept failed; pausing");
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metrics.http_connections_refused.inc();
            if let Some(count) = refused_warning.note(Instant::now()) {
                tracing::warn!(
                    max_connections = options.max_connections,
                    refused = count,
                    "http connection refused: too many connections"
                );
            }
            refuse(stream, shared.tls.is_none().then_some(&refusal), &lingering);
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, shared.clone(), stop_rx.clone(), permit));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until its task ends: all of them back means all closed.
    let _all_closed = connections
        .acquire_many(options.max_connections)
        .await
        .expect("the semaphore is never closed");
    Ok(())
}

/// Whether an accept error concerns one connection only (the next accept may well succeed).
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The raw answer to a connection past the cap.
fn refusal_bytes() -> Arc<[u8]> {
    let reply = Reply::error(503, "too many connections");
    let mut bytes = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reply.content_type.unwrap_or(super::reply::JSON),
        reply.body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(&reply.body);
    bytes.into()
}

/// Answers a connection past the cap with `refusal` (when given) and closes it, after a bounded
/// linger when a lingering slot is free.
fn refuse(stream: TcpStream, refusal: Option<&Arc<[u8]>>, lingering: &Arc<Semaphore>) {
    let Some(refusal) = refusal else {
        return;
    };
    // A new socket's send buffer takes the few bytes whole; a partial write just closes sooner.
    let _ = stream.try_write(refusal);
    let Ok(slot) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let mut stream = stream;
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let _ = stream.shutdown().await;
            let mut discarded = 0;
            let mut buffer = [0u8; 4096];
            while discarded < REFUSAL_LINGER_BYTES_MAX {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(read) => discarded += read,
                }
            }
        })
        .await;
    });
}

/// Counts events and says when to log them: at most once every [`WARN_EVERY`].
#[derive(Debug, Default)]
struct Warning {
    logged_at: Option<Instant>,
    count: u64,
}

impl Warning {
    /// Notes one event; returns the events to report when a warning is due.
    fn note(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .logged_at
            .is_none_or(|logged| now.duration_since(logged) >= WARN_EVERY);
        if !due {
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// What every connection task shares.
struct Shared {
    router: Router,
    read_timeout: Duration,
    write_timeout: Duration,
    idle_timeout: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    connections_open: Gauge,
    timeouts: Timeouts,
}

impl Shared {
    fn new(router: Router, options: &ServeOptions, metrics: &Metrics) -> Shared {
        let mut http1 = http1::Builder::new();
        // No hyper head timer (ours is [`Watch`]); hyper's 100 header fields stay its default (setting
        // it moves them off the stack).
        http1
            .header_read_timeout(None)
            .max_buf_size(HEAD_BYTES_MAX)
            .max_header_size(HEAD_BYTES_MAX);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .max_header_list_size(HEAD_BYTES_MAX as u32)
            .max_concurrent_streams(HTTP2_STREAMS_MAX);
        let timeout = |kind: &str| {
            metrics
                .http_timeouts
                .get_or_create(&TimeoutLabels {
                    kind: kind.to_string(),
                })
                .clone()
        };
        Shared {
            // As axum's own `serve` does: resolve the routes once, not per request.
            router: router.with_state(()),
            read_timeout: options.read_timeout,
            write_timeout: options.write_timeout,
            idle_timeout: options.idle_timeout,
            tls: options.tls.clone().map(tokio_rustls::TlsAcceptor::from),
            http1,
            http2,
            connections_open: metrics.http_connections_open.clone(),
            timeouts: Timeouts {
                head: timeout("head"),
                body: timeout("body"),
                write: timeout("write"),
                idle: timeout("idle"),
            },
        }
    }
}

/// `narad_http_timeouts_total`'s series.
struct Timeouts {
    head: Counter,
    body: Counter,
    write: Counter,
    idle: Counter,
}

/// Decrements `narad_http_connections_open` when a connection task ends, however it ends.
struct OpenConnection(Gauge);

impl OpenConnection {
    fn new(gauge: &Gauge) -> OpenConnection {
        gauge.inc();
        OpenConnection(gauge.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One connection's task: serves it until it ends, fails, or a head or idle deadline passes.
async fn connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let _open = OpenConnection::new(&shared.connections_open);
    let watch = Arc::new(Watch::new());
    let io = TimedIo::new(
        stream,
        watch.clone(),
        shared.write_timeout,
        shared.timeouts.write.clone(),
    );
    let expired = watch.expired(shared.read_timeout, shared.idle_timeout);
    tokio::select! {
        result = serve_io(io, &shared, &watch, &mut stop) => {
            if let Err(error) = result {
                tracing::debug!(%error, "http connection failed");
            }
        }
        expiry = expired => {
            match expiry {
                Expiry::Head => shared.timeouts.head.inc(),
                Expiry::Idle => shared.timeouts.idle.inc(),
            };
            tracing::debug!(?expiry, "http connection closed for a timeout");
        }
    }
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("TLS handshake: {0}")]
    Handshake(io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// The TLS handshake when the listener is TLS, then hyper's connection.
async fn serve_io(
    io: TimedIo<TcpStream>,
    shared: &Shared,
    watch: &Arc<Watch>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let service = ConnService {
        router: shared.router.clone(),
        watch: watch.clone(),
        read_timeout: shared.read_timeout,
        body_timeouts: shared.timeouts.body.clone(),
    };
    let Some(acceptor) = &shared.tls else {
        let connection = shared.http1.serve_connection(TokioIo::new(io), service);
        return drive(connection, stop).await;
    };
    let tls = tokio::select! {
        tls = acceptor.accept(io) => tls.map_err(ConnectionError::Handshake)?,
        () = stopped(stop) => return Ok(()),
    };
    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
        watch.serve_http2();
        let connection = shared.http2.serve_connection(TokioIo::new(tls), service);
        drive(connection, stop).await
    } else {
        let connection = shared.http1.serve_connection(TokioIo::new(tls), service);
        drive(connection, stop).await
    }
}

/// Runs a hyper connection; once the server stops, shuts it down gracefully (the request in flight
/// finishes, then it closes) and runs it to its end.
async fn drive<C>(connection: C, stop: &mut watch::Receiver<bool>) -> Result<(), ConnectionError>
where
    C: GracefulConnection<Error = hyper::Error>,
{
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => return result.map_err(ConnectionError::from),
        () = stopped(stop) => {}
    }
    connection.as_mut().graceful_shutdown();
    connection.await.map_err(ConnectionError::from)
}

/// Completes once the server stops (or is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// No request head is arriving (in [`Watch::head_since_ms`]).
const NO_HEAD: u64 = u64::MAX;

/// A connection's state, shared by its task, its socket wrapper and its service: when bytes last
/// moved, whether a request head is arriving and since when, and how many requests are in flight.
/// Times are milliseconds since the accept.
#[derive(Debug)]
struct Watch {
    opened: Instant,
    /// The last read or write that moved bytes.
    io_last_ms: AtomicU64,
    /// When the head of the next request began: the accept for the first request, else its first
    /// byte; [`NO_HEAD`] while none is arriving.
    head_since_ms: AtomicU64,
    /// Requests whose answer is not made yet.
    in_flight: AtomicU32,
    /// Whether a byte read with no request in flight starts a head: HTTP/1 only (HTTP/2 reads
    /// frames that are not requests).
    heads: AtomicBool,
}

/// Why a connection's task closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    /// A request head (or the TLS handshake) took longer than the read timeout.
    Head,
    /// No request in flight and no byte moving for the idle timeout.
    Idle,
}

/// The outcome of one look at a connection's deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// A deadline passed: close.
    Expired(Expiry),
    /// Look again at this time (ms since the accept).
    At(u64),
}

/// Looks at a connection's deadlines at `now_ms`. With a request in flight none applies (its body
/// and its answer's writes have theirs); it may end at any time, and the next deadline is then at
/// least `min(read, idle)` away, so that is the longest wait before the next look.
fn check(
    now_ms: u64,
    in_flight: u32,
    head_since_ms: u64,
    io_last_ms: u64,
    read_ms: u64,
    idle_ms: u64,
) -> Check {
    let next_look = now_ms.saturating_add(read_ms.min(idle_ms));
    if in_flight > 0 {
        return Check::At(next_look);
    }
    if head_since_ms != NO_HEAD {
        let deadline = head_since_ms.saturating_add(read_ms);
        return if now_ms >= deadline {
            Check::Expired(Expiry::Head)
        } else {
            Check::At(deadline)
        };
    }
    let deadline = io_last_ms.saturating_add(idle_ms);
    if now_ms >= deadline {
        Check::Expired(Expiry::Idle)
    } else {
        // A head may start any moment, with a deadline `read` away.
        Check::At(deadline.min(next_look))
    }
}

impl Watch {
    fn new() -> Watch {
        Watch {
            opened: Instant::now(),
            io_last_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            heads: AtomicBool::new(true),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn instant(&self, ms: u64) -> Instant {
        self.opened + Duration::from_millis(ms)
    }

    /// Bytes were read.
    fn on_read(&self) {
        let now = self.now_ms();
        self.io_last_ms.store(now, Ordering::Relaxed);
        if self.heads.load(Ordering::Relaxed)
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since_ms.load(Ordering::Relaxed) == NO_HEAD
        {
            let _ = self.head_since_ms.compare_exchange(
                NO_HEAD,
                now,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Bytes were written.
    fn on_write(&self) {
        self.io_last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The TLS handshake chose HTTP/2: no more heads; the idle timeout runs from now.
    fn serve_http2(&self) {
        self.heads.store(false, Ordering::Relaxed);
        self.on_write();
        self.head_since_ms.store(NO_HEAD, Ordering::Release);
    }

    /// A request's head arrived: it is in flight until the returned guard drops; returns when the
    /// request began (its head's start).
    fn request_started(self: &Arc<Self>) -> (Instant, InFlight) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let head = self.head_since_ms.swap(NO_HEAD, Ordering::AcqRel);
        let started = if head == NO_HEAD {
            Instant::now()
        } else {
            self.instant(head)
        };
        (started, InFlight(self.clone()))
    }

    /// Completes when a head or idle deadline passed.
    async fn expired(&self, read: Duration, idle: Duration) -> Expiry {
        let read_ms = u64::try_from(read.as_millis()).unwrap_or(u64::MAX);
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        loop {
            let look = check(
                self.now_ms(),
                self.in_flight.load(Ordering::Acquire),
                self.head_since_ms.load(Ordering::Acquire),
                self.io_last_ms.load(Ordering::Relaxed),
                read_ms,
                idle_ms,
            );
            match look {
                Check::Expired(expiry) => return expiry,
                Check::At(ms) => tokio::time::sleep_until(self.instant(ms)).await,
            }
        }
    }
}

/// A request in flight on its connection, until dropped (its answer made).
struct InFlight(Arc<Watch>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.on_write();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's socket: notes the bytes moving in its [`Watch`], and fails a write (or flush, or
/// shutdown) that cannot progress for the write timeout.
struct TimedIo<T> {
    inner: T,
    watch: Arc<Watch>,
    write_timeout: Duration,
    /// Armed when a write could not progress; disarmed by the next write that does.
    write_stall: Option<Pin<Box<Sleep>>>,
    write_timeouts: Counter,
}

impl<T> TimedIo<T> {
    fn new(
        inner: T,
        watch: Arc<Watch>,
        write_timeout: Duration,
        write_timeouts: Counter,
    ) -> TimedIo<T> {
        TimedIo {
            inner,
            watch,
            write_timeout,
            write_stall: None,
            write_timeouts,
        }
    }

    /// Runs one write-side operation under the write timeout; `moved` says whether its result wrote
    /// bytes (a flush of a plain socket is always ready and moves nothing: it must not keep an idle
    /// connection alive).
    fn guard_write<R>(
        &mut self,
        cx: &mut Context<'_>,
        operation: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
        moved: impl FnOnce(&R) -> bool,
    ) -> Poll<io::Result<R>>
    where
        T: Unpin,
    {
        match operation(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.write_stall = None;
                if result.as_ref().is_ok_and(moved) {
                    self.watch.on_write();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let stall = self
                    .write_stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stall.as_mut().poll(cx).is_ready() {
                    self.write_timeouts.inc();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "http write timed out: the client does not read",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.watch.on_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().guard_write(
            cx,
            |inner, cx| inner.poll_write(cx, buf),
            |written| *written > 0,
        )
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().guard_write(
            cx,
            |inner, cx| inner.poll_write_vectored(cx, bufs),
            |written| *written > 0,
        )
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .guard_write(cx, |inner, cx| inner.poll_flush(cx), |()| false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .guard_write(cx, |inner, cx| inner.poll_shutdown(cx), |()| false)
    }
}

/// A request body that fails once its request's read deadline passed while it is still arriving.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    /// Armed when the body first waits for bytes.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Set when the deadline cut the body: the service answers 408.
    timed_out: Arc<AtomicBool>,
}

/// A request body cut by the read timeout.
#[derive(Debug, thiserror::Error)]
#[error("request timeout: the request body did not arrive within the read timeout")]
struct BodyTimedOut;

impl DeadlineBody {
    fn cut(&mut self) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        self.timed_out.store(true, Ordering::Release);
        Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
    }
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // A body trickling in frame by frame is cut at the deadline too.
                if !this.inner.is_end_stream() && Instant::now() >= this.deadline {
                    return this.cut();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Box::new(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return this.cut();
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The 408 of a request whose body did not arrive within the read timeout; HTTP/1 closes the
/// connection after it (the rest of the body would be read as the next request).
fn request_timeout(version: Version) -> Response<AxumBody> {
    let reply = Reply::error(408, "request timeout");
    let mut response = Response::new(AxumBody::from(reply.body));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::reply::JSON),
    );
    if version < Version::HTTP_2 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The router behind one connection: puts each request in flight on the connection's [`Watch`] and
/// its body under the read deadline.
#[derive(Clone)]
struct ConnService {
    router: Router,
    watch: Arc<Watch>,
    read_timeout: Duration,
    body_timeouts: Counter,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<AxumBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<AxumBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<Incoming>) -> ResponseFuture {
        let (started, in_flight) = self.watch.request_started();
        let version = request.version();
        let timed_out = (!request.body().is_end_stream()).then(|| Arc::new(AtomicBool::new(false)));
        let request = match &timed_out {
            None => request.map(AxumBody::new),
            Some(flag) => {
                let deadline = started + self.read_timeout;
                let flag = flag.clone();
                request.map(move |inner| {
                    AxumBody::new(DeadlineBody {
                        inner,
                        deadline,
                        sleep: None,
                        timed_out: flag,
                    })
                })
            }
        };
        let mut router = self.router.clone();
        let body_timeouts = self.body_timeouts.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| {
                <Router as tower_service::Service<Request<AxumBody>>>::poll_ready(&mut router, cx)
            })
            .await?;
            let response =
                <Router as tower_service::Service<Request<AxumBody>>>::call(&mut router, request)
                    .await?;
            drop(in_flight);
            if timed_out.is_some_and(|flag| flag.load(Ordering::Acquire)) {
                body_timeouts.inc();
                return Ok(request_timeout(version));
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests;

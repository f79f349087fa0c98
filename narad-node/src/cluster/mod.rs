//! The cluster transport: QUIC (quinn over rustls) on the cluster address, for every node-to-node
//! message: commits, raft, heartbeats, forwarded proposals, leader confirmations and replay reads.
//!
//! # Connections
//! One authenticated connection per peer carries this node's calls to it; either side may have dialled
//! it. A call uses the peer's live connection, or dials one (one dial at a time per peer). A connection
//! the peer dialled is preferred for this node's calls from then on, so two nodes mostly share one
//! connection. A connection this node dialled is adopted when none of the same boot is live; when
//! both dial at once, both connections serve until one closes. Every connection's incoming streams
//! are served, whoever dialled.
//!
//! Each hello carries the speaker's boot number, larger at every start (Unix milliseconds in its
//! high bits). A connection whose hello brings a later boot number replaces the peer's older one and
//! closes it: the peer restarted, the old connection goes nowhere (a restarted endpoint cannot reset
//! it), and calls in flight on it would otherwise wait for its idle timeout before they fail over. A
//! connection from an earlier boot than the one known is closed at once.
//!
//! # Authentication
//! A connection's first stream carries a [`Hello`] each way: the dialler's first, then the
//! acceptor's. Each holds the speaker's id, its boot number and its proof of the cluster secret bound to this
//! connection (see [`auth`]). A wrong or missing proof, an id that is not a configured peer, or no
//! hello within [`HELLO_TIMEOUT`] closes the connection; it is logged and counted
//! (`narad_cluster_auth_failures_total`). No other stream of the connection is served before both
//! hellos passed.
//!
//! # Calls
//! A bidirectional stream per call: one request frame, one answer frame (`narad_core::codec::cluster`),
//! at most 16 MiB each. A larger request is refused before anything is sent
//! ([`RpcError::TooLarge`], counted in `narad_cluster_frames_refused_total`); a larger frame received
//! resets its stream. The transport moves bytes only: the node's [`Inbound`] decodes a request and
//! writes its answer.

pub mod auth;
#[cfg(madsim)]
pub mod sim_runtime;
pub mod tls;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use narad_core::codec::cluster::{
    frame, frame_body_len, FrameError, Hello, FRAME_HEADER_BYTES, PROOF_BYTES,
};
use narad_core::ids::NodeId;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use self::auth::{Role, AUTH_LABEL, EXPORTER_BYTES};
use self::tls::{TlsError, TlsIdentity};
use crate::future::BoxFuture;
use crate::metrics::{Metrics, OpLabels};

/// How long a new connection's hellos may take.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a dial (QUIC handshake and hellos) may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with no traffic for this long is closed (keep-alives run well inside it).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive interval of every connection.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Streams a peer may have open on one connection at once.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1024;
/// Error code of a connection closed for a failed hello.
const CLOSE_AUTH_FAILED: u32 = 1;
/// Packets that may overtake one before it is declared lost (QUIC's default is 3).
const REORDER_PACKETS_MAX: u32 = 1000;
/// How late, in RTTs, a packet may be acknowledged behind later ones before it is declared lost
/// (QUIC's default is 9/8).
const REORDER_RTT_FACTOR: f32 = 2.0;
/// Error code of every connection closed when the node shuts its cluster transport.
const CLOSE_SHUTDOWN: u32 = 3;
/// Error code of a connection closed because its peer has restarted since.
const CLOSE_PEER_RESTARTED: u32 = 2;

/// What the transport is started with.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// This node's member id.
    pub node: NodeId,
    /// The UDP address to listen on.
    pub bind: SocketAddr,
    /// Every member's cluster address (this node's own entry is skipped).
    pub peers: BTreeMap<NodeId, String>,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// Seeds the QUIC endpoint's own random draws (its stateless-reset key and each connection's
    /// generator) and the low bits of the boot number, for a run that replays; `None` draws them
    /// from the system. quinn draws connection ids from the thread's RNG regardless, which under
    /// the simulator is madsim's, and seeded.
    pub rng_seed: Option<[u8; 32]>,
}

/// Why the transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The TLS configuration failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket could not be bound.
    #[error("binding cluster.addr {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a call got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The request frame is over the 16 MiB limit: refused before sending.
    #[error(transparent)]
    TooLarge(#[from] FrameError),
    /// The peer is not a configured member.
    #[error("node {0} is not a cluster peer")]
    UnknownPeer(NodeId),
    /// No connection, or the stream failed.
    #[error("peer {peer} unreachable: {reason}")]
    Unreachable {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: String,
    },
    /// No answer within the call's time.
    #[error("peer {0} did not answer in time")]
    Timeout(NodeId),
}

/// This process's boot number: Unix milliseconds in the high bits, so a later start has a larger
/// one, and 20 random low bits against two starts in one millisecond.
fn boot_number(seed: Option<[u8; 32]>) -> u64 {
    let low = match seed {
        Some(seed) => u64::from_le_bytes(seed[24..].try_into().expect("8 bytes")),
        None => rand::random(),
    };
    (crate::clock::unix_ms() << 20) | (low & 0xf_ffff)
}

/// A QUIC endpoint on a UDP socket bound to `addr`: the OS's, on tokio.
#[cfg(not(madsim))]
async fn endpoint(
    config: quinn::EndpointConfig,
    server: quinn::ServerConfig,
    addr: SocketAddr,
) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(addr)?;
    quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))
}

/// A QUIC endpoint on a UDP socket bound to `addr`: madsim's, in simulated time.
#[cfg(madsim)]
async fn endpoint(
    config: quinn::EndpointConfig,
    server: quinn::ServerConfig,
    addr: SocketAddr,
) -> std::io::Result<quinn::Endpoint> {
    let socket = sim_runtime::SimSocket::bind(addr).await?;
    quinn::Endpoint::new_with_abstract_socket(
        config,
        Some(server),
        socket,
        Arc::new(sim_runtime::SimRuntime),
    )
}

/// Serves the requests peers send: gets a request frame's body, returns the answer frame's body.
pub trait Inbound: Send + Sync + 'static {
    /// Answers one request from `from`.
    fn handle(&self, from: NodeId, body: Vec<u8>) -> BoxFuture<'static, Vec<u8>>;
}

/// The cluster transport; clones share it.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.inner.node)
            .field("peers", &self.inner.peers)
            .finish_non_exhaustive()
    }
}

struct Inner {
    node: NodeId,
    endpoint: quinn::Endpoint,
    peers: BTreeMap<NodeId, String>,
    secret: Vec<u8>,
    metrics: Arc<Metrics>,
    /// The connection calls to each peer use, and the boot number its hello gave.
    connections: Mutex<HashMap<NodeId, (quinn::Connection, u64)>>,
    /// This process's boot number (see [`Hello::boot`]).
    boot: u64,
    /// One dial at a time per peer.
    dials: HashMap<NodeId, tokio::sync::Mutex<()>>,
    /// Held weakly: the handler reaches back into the cluster (forwarded produce, the metastore's
    /// peers), and a strong reference here would make a cycle that outlives the node, keeping the
    /// endpoint, and its bound cluster port, alive after a restart in the same process.
    inbound: OnceLock<Weak<dyn Inbound>>,
    /// Set by [`Cluster::close`]; the cluster's own tasks end when it turns true.
    closed: tokio::sync::watch::Sender<bool>,
    /// Mutual TLS under an operator CA: dials ask for the peer's host as the server name.
    operator_tls: bool,
}

impl Cluster {
    /// Binds the cluster address and starts accepting peers. Requests that arrive before
    /// [`Cluster::serve`] names their handler are dropped (the peer times out and retries).
    pub async fn bind(
        options: ClusterOptions,
        identity: &TlsIdentity,
        metrics: Arc<Metrics>,
    ) -> Result<Cluster, ClusterError> {
        let transport = Arc::new(transport_config());
        let server_crypto = QuicServerConfig::try_from(identity.server_config()?)
            .map_err(|error| TlsError::Config(error.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        server.transport_config(transport.clone());
        let client_crypto = QuicClientConfig::try_from(identity.client_config()?)
            .map_err(|error| TlsError::Config(error.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
        client.transport_config(transport);
        let mut endpoint_config = quinn::EndpointConfig::default();
        endpoint_config.rng_seed(options.rng_seed);
        let mut endpoint = endpoint(endpoint_config, server, options.bind)
            .await
            .map_err(|source| ClusterError::Bind {
                addr: options.bind,
                source,
            })?;
        endpoint.set_default_client_config(client);
        let mut peers = options.peers;
        peers.remove(&options.node);
        let dials = peers
            .keys()
            .map(|peer| (*peer, tokio::sync::Mutex::new(())))
            .collect();
        let cluster = Cluster {
            inner: Arc::new(Inner {
                node: options.node,
                endpoint,
                peers,
                secret: options.secret,
                metrics,
                connections: Mutex::new(HashMap::new()),
                boot: boot_number(options.rng_seed),
                dials,
                inbound: OnceLock::new(),
                closed: tokio::sync::watch::channel(false).0,
                operator_tls: matches!(identity, TlsIdentity::Operator(_)),
            }),
        };
        let accepting = cluster.clone();
        tokio::spawn(async move { accepting.accept_loop().await });
        Ok(cluster)
    }

    /// Names the handler of incoming requests (once). The cluster keeps it weakly: the caller owns
    /// it for as long as requests should be served.
    pub fn serve(&self, inbound: &Arc<dyn Inbound>) {
        let _ = self.inner.inbound.set(Arc::downgrade(inbound));
    }

    /// Closes the cluster transport: every connection and the endpoint close, the transport's own
    /// tasks (accepting, serving, heartbeats, raft delivery) end, and the endpoint moves off the
    /// cluster port, which a new start in the same process can then bind. Calls after this fail
    /// at once.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
        lock(&self.inner.connections).clear();
        self.inner
            .endpoint
            .close(CLOSE_SHUTDOWN.into(), b"shutdown");
        self.release_port();
    }

    /// Moves the closed endpoint off the cluster port, so the port is free once the closing
    /// connections have switched sockets (milliseconds), not when the last handle of the endpoint
    /// is dropped: a start in the same process (a test, an embedding supervisor) must not wait on
    /// every clone the node handed out. quinn keeps the socket it replaces for packets still in
    /// flight, so it moves twice: the second move lets go of the cluster port.
    #[cfg(not(madsim))]
    fn release_port(&self) {
        let Ok(addr) = self.inner.endpoint.local_addr() else {
            return;
        };
        for _ in 0..2 {
            let moved = std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0))
                .and_then(|socket| self.inner.endpoint.rebind(socket));
            if let Err(error) = moved {
                tracing::warn!(%error, "the closed cluster endpoint keeps its port");
                return;
            }
        }
    }

    /// Under the simulator a process's sockets go with its node (the harness kills it).
    #[cfg(madsim)]
    fn release_port(&self) {}

    /// Returns once [`Cluster::close`] is called.
    pub async fn closed(&self) {
        let mut closed = self.inner.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// Waits until every connection has told its peer it is closed (bounded by `limit`).
    pub async fn wait_idle(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.inner.endpoint.wait_idle()).await;
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.inner.node
    }

    /// The other members, in id order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.inner.peers.keys().copied()
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// Sends `body` to `peer` as one request frame and returns its answer frame's body, within
    /// `timeout` (dial included). `op` labels the latency metric.
    pub async fn call(
        &self,
        peer: NodeId,
        op: &'static str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        let framed = frame(body).inspect_err(|_| {
            self.inner.metrics.cluster_frames_refused.inc();
        })?;
        let started = tokio::time::Instant::now();
        let answer = tokio::time::timeout(timeout, self.exchange(peer, &framed)).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(_) => Err(RpcError::Timeout(peer)),
        };
        if answer.is_ok() {
            self.inner
                .metrics
                .cluster_rpc_duration_seconds
                .get_or_create(&OpLabels { op: op.to_string() })
                .observe(started.elapsed().as_secs_f64());
        }
        answer
    }

    async fn exchange(&self, peer: NodeId, framed: &[u8]) -> Result<Vec<u8>, RpcError> {
        let connection = self.connection(peer).await?;
        let unreachable = |reason: String| RpcError::Unreachable { peer, reason };
        let (send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|error| unreachable(error.to_string()))?;
        // A caller that gives up (its timeout drops this future) resets the stream: quinn would
        // otherwise keep retransmitting a finished request, and a partition that heals later
        // delivers it long after the caller moved on: a forwarded delete of a topic then applied
        // after the same client's later create, and deleted the new incarnation.
        let mut send = ResetOnDrop(Some(send));
        let stream = send.0.as_mut().expect("set above");
        stream
            .write_all(framed)
            .await
            .map_err(|error| unreachable(error.to_string()))?;
        stream
            .finish()
            .map_err(|error| unreachable(error.to_string()))?;
        let answer = read_frame(&mut recv, &self.inner.metrics)
            .await
            .map_err(unreachable);
        send.0 = None; // Answered (or failed on the peer's side): nothing left to take back.
        answer
    }

    /// The peer's live connection, dialled if there is none.
    ///
    /// The dial runs in a task of its own, so a caller that gives up (a heartbeat's 1 s) does not cut
    /// a handshake short: the connection is still made, and adopted, for the next call.
    async fn connection(&self, peer: NodeId) -> Result<quinn::Connection, RpcError> {
        if let Some(connection) = self.live(peer) {
            return Ok(connection);
        }
        if !self.inner.dials.contains_key(&peer) {
            return Err(RpcError::UnknownPeer(peer));
        }
        let cluster = self.clone();
        let dialling = tokio::spawn(async move {
            let dial = cluster.inner.dials.get(&peer).expect("checked above");
            let Ok(_dialling) = dial.try_lock() else {
                // Another dial is under way: its outcome is this call's (no queue of dials to a
                // dead peer, one per heartbeat).
                let _dialled = dial.lock().await;
                return cluster.live(peer).ok_or_else(|| RpcError::Unreachable {
                    peer,
                    reason: "the dial under way failed".to_string(),
                });
            };
            if let Some(connection) = cluster.live(peer) {
                return Ok(connection);
            }
            tokio::time::timeout(DIAL_TIMEOUT, cluster.dial(peer))
                .await
                .unwrap_or(Err(RpcError::Timeout(peer)))
        });
        match dialling.await {
            Ok(outcome) => outcome,
            Err(error) => Err(RpcError::Unreachable {
                peer,
                reason: format!("the dial task ended: {error}"),
            }),
        }
    }

    fn live(&self, peer: NodeId) -> Option<quinn::Connection> {
        let mut connections = lock(&self.inner.connections);
        match connections.get(&peer) {
            Some((connection, _)) if connection.close_reason().is_none() => {
                Some(connection.clone())
            }
            Some(_) => {
                connections.remove(&peer);
                None
            }
            None => None,
        }
    }

    /// Makes `connection`, which `peer` just dialled and authenticated, the one calls to it use: a
    /// peer that dials anew restarted, or lost the connection this side still holds (whose packets
    /// now go nowhere until its idle timeout). The one it replaces is not closed: in a dial from both
    /// sides at once, the peer may be using it.
    fn prefer(&self, peer: NodeId, connection: &quinn::Connection, boot: u64) {
        let replaced = lock(&self.inner.connections).insert(peer, (connection.clone(), boot));
        if let Some((old, old_boot)) = replaced {
            self.close_if_restarted(peer, &old, old_boot, boot);
        }
    }

    /// Adopts `connection` for calls to `peer` unless a live one from the same boot of the peer is
    /// there.
    fn adopt(&self, peer: NodeId, connection: &quinn::Connection, boot: u64) {
        let mut connections = lock(&self.inner.connections);
        let replaced = match connections.get(&peer) {
            Some((known, known_boot)) if known.close_reason().is_none() && *known_boot == boot => {
                return;
            }
            _ => connections.insert(peer, (connection.clone(), boot)),
        };
        drop(connections);
        if let Some((old, old_boot)) = replaced {
            self.close_if_restarted(peer, &old, old_boot, boot);
        }
    }

    /// Closes `old` if the peer restarted since its hello: calls in flight on it would otherwise
    /// wait for its idle timeout, and fail over to the new connection only then.
    fn close_if_restarted(&self, peer: NodeId, old: &quinn::Connection, old_boot: u64, boot: u64) {
        if old_boot != boot && old.close_reason().is_none() {
            tracing::info!(
                peer = peer.0,
                "cluster peer restarted: its old connection is closed"
            );
            old.close(CLOSE_PEER_RESTARTED.into(), b"peer restarted");
        }
    }

    async fn dial(&self, peer: NodeId) -> Result<quinn::Connection, RpcError> {
        let unreachable = |reason: String| RpcError::Unreachable { peer, reason };
        let addr_text = self
            .inner
            .peers
            .get(&peer)
            .ok_or(RpcError::UnknownPeer(peer))?;
        let addr = resolve(addr_text).await.map_err(unreachable)?;
        let host = addr_text
            .rsplit_once(':')
            .map_or(addr_text.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let server_name = if self.inner.operator_tls {
            host
        } else {
            tls::SERVER_NAME
        };
        let connecting = self
            .inner
            .endpoint
            .connect(addr, server_name)
            .map_err(|error| unreachable(error.to_string()))?;
        let connection = connecting
            .await
            .map_err(|error| unreachable(error.to_string()))?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|error| unreachable(error.to_string()))?;
        let hello = self.hello(&connection, Role::Client).map_err(unreachable)?;
        let framed = frame(&hello.encode()).expect("a hello is far below the frame limit");
        send.write_all(&framed)
            .await
            .map_err(|error| unreachable(error.to_string()))?;
        send.finish()
            .map_err(|error| unreachable(error.to_string()))?;
        let answer = read_frame(&mut recv, &self.inner.metrics)
            .await
            .map_err(|reason| unreachable(format!("no hello from the peer: {reason}")))?;
        let boot = match self.check_hello(&connection, &answer, Role::Server, Some(peer)) {
            Ok((_, boot)) => boot,
            Err(reason) => {
                self.refuse(&connection, addr, &reason);
                return Err(unreachable(format!("peer failed authentication: {reason}")));
            }
        };
        self.adopt(peer, &connection, boot);
        let serving = self.clone();
        let served = connection.clone();
        tokio::spawn(async move { serving.serve_streams(peer, served).await });
        Ok(connection)
    }

    /// This side's hello on `connection`.
    fn hello(&self, connection: &quinn::Connection, role: Role) -> Result<Hello, String> {
        let exporter = exporter(connection, role)?;
        Ok(Hello {
            node: self.inner.node,
            boot: self.inner.boot,
            proof: auth::proof(&self.inner.secret, &exporter),
        })
    }

    /// Checks the peer's hello (spoken in `role`); returns the peer's id and boot number.
    fn check_hello(
        &self,
        connection: &quinn::Connection,
        body: &[u8],
        role: Role,
        expected: Option<NodeId>,
    ) -> Result<(NodeId, u64), String> {
        let hello = Hello::decode(body).map_err(|error| format!("malformed hello: {error}"))?;
        if expected.is_some_and(|expected| expected != hello.node) {
            return Err(format!(
                "expected node {}, it says it is node {}",
                expected.map_or(0, |node| node.0),
                hello.node
            ));
        }
        if !self.inner.peers.contains_key(&hello.node) {
            return Err(format!("node {} is not a configured peer", hello.node));
        }
        let exporter = exporter(connection, role)?;
        let proof: &[u8; PROOF_BYTES] = &hello.proof;
        if !auth::verify(&self.inner.secret, &exporter, proof) {
            return Err(format!(
                "node {} did not prove the cluster secret",
                hello.node
            ));
        }
        Ok((hello.node, hello.boot))
    }

    fn refuse(&self, connection: &quinn::Connection, addr: SocketAddr, reason: &str) {
        self.inner.metrics.cluster_auth_failures.inc();
        tracing::warn!(peer_addr = %addr, %reason, "cluster peer refused: authentication failed");
        connection.close(CLOSE_AUTH_FAILED.into(), b"authentication failed");
    }

    async fn accept_loop(self) {
        while let Some(incoming) = self.inner.endpoint.accept().await {
            let cluster = self.clone();
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else {
                    return;
                };
                let accepted =
                    tokio::time::timeout(HELLO_TIMEOUT, cluster.accept_hello(&connection))
                        .await
                        .unwrap_or_else(|_| {
                            Err(HelloError::Refused("no hello in time".to_string()))
                        });
                match accepted {
                    Ok((peer, boot)) => {
                        cluster.prefer(peer, &connection, boot);
                        cluster.serve_streams(peer, connection).await;
                    }
                    Err(HelloError::Refused(reason)) => {
                        cluster.refuse(&connection, connection.remote_address(), &reason)
                    }
                    // The dialler went away before its hello (it crashed, or gave up): no refusal.
                    Err(HelloError::Lost(reason)) => tracing::debug!(
                        peer_addr = %connection.remote_address(),
                        %reason,
                        "cluster connection lost before its hello"
                    ),
                }
            });
        }
    }

    /// The acceptor's side of the hellos: the dialler's first, then ours.
    async fn accept_hello(
        &self,
        connection: &quinn::Connection,
    ) -> Result<(NodeId, u64), HelloError> {
        let lost = |error: String| HelloError::Lost(error);
        let (mut send, mut recv) = connection
            .accept_bi()
            .await
            .map_err(|error| lost(error.to_string()))?;
        let body = read_frame(&mut recv, &self.inner.metrics)
            .await
            .map_err(|reason| match connection.close_reason() {
                Some(_) => HelloError::Lost(reason),
                // A stream that ended without a whole hello on a live connection: a missing proof.
                None => HelloError::Refused(format!("no hello: {reason}")),
            })?;
        let peer = self
            .check_hello(connection, &body, Role::Client, None)
            .map_err(HelloError::Refused)?;
        let hello = self
            .hello(connection, Role::Server)
            .map_err(HelloError::Refused)?;
        let framed = frame(&hello.encode()).expect("a hello is far below the frame limit");
        send.write_all(&framed)
            .await
            .map_err(|error| lost(error.to_string()))?;
        send.finish().map_err(|error| lost(error.to_string()))?;
        Ok(peer)
    }

    /// Serves every stream `peer` opens on `connection`, until it closes.
    async fn serve_streams(&self, peer: NodeId, connection: quinn::Connection) {
        while let Ok((send, recv)) = connection.accept_bi().await {
            let cluster = self.clone();
            tokio::spawn(async move { cluster.serve_stream(peer, send, recv).await });
        }
    }

    async fn serve_stream(
        &self,
        peer: NodeId,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        let body = match read_frame(&mut recv, &self.inner.metrics).await {
            Ok(body) => body,
            Err(reason) => {
                tracing::debug!(%peer, %reason, "cluster request unreadable");
                let _ = send.reset(0u32.into());
                return;
            }
        };
        let Some(inbound) = self.inner.inbound.get().and_then(Weak::upgrade) else {
            let _ = send.reset(0u32.into());
            return;
        };
        // A caller that gave up (its call timed out, its process died) stops reading the answer:
        // the request is dropped with it, so a commit still queued on an owner's combiner is left
        // out (appending it would only duplicate what the caller sends again).
        let caller_gone = send.stopped();
        let answer = tokio::select! {
            answer = inbound.handle(peer, body) => answer,
            _ = caller_gone => {
                tracing::debug!(%peer, "cluster request dropped: the caller stopped waiting");
                return;
            }
        };
        match frame(&answer) {
            Ok(framed) => {
                if send.write_all(&framed).await.is_ok() {
                    let _ = send.finish();
                }
            }
            Err(error) => {
                self.inner.metrics.cluster_frames_refused.inc();
                tracing::error!(%peer, %error, "cluster answer over the frame limit");
                let _ = send.reset(0u32.into());
            }
        }
    }
}

/// Why an accepted connection's hello did not pass.
enum HelloError {
    /// A wrong or missing proof, or an unknown id: refused, logged and counted.
    Refused(String),
    /// The connection went away first.
    Lost(String),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn transport_config() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE_INTERVAL));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("the idle timeout fits QUIC's varint"),
    ));
    transport.max_concurrent_bidi_streams(STREAMS_PER_CONNECTION_MAX.into());
    transport.max_concurrent_uni_streams(0u32.into());
    // Reordering is not loss. QUIC's defaults (a packet 3 behind, or 9/8 of an RTT late, is lost)
    // read every reordering as congestion and halve the window each time; on paths with jitter
    // (ECMP, a busy hypervisor, the simulator's per-packet latency) the window then stays at its
    // floor and a large commit crawls. A loss is declared only after twice the RTT, or
    // REORDER_PACKETS_MAX packets behind.
    transport.packet_threshold(REORDER_PACKETS_MAX);
    transport.time_threshold(REORDER_RTT_FACTOR);
    transport
}

fn exporter(connection: &quinn::Connection, role: Role) -> Result<[u8; EXPORTER_BYTES], String> {
    let mut exporter = [0u8; EXPORTER_BYTES];
    connection
        .export_keying_material(&mut exporter, AUTH_LABEL, role.context())
        .map_err(|_| "the connection has no TLS exporter".to_string())?;
    Ok(exporter)
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = addr.parse() {
        return Ok(addr);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|error| format!("resolving {addr}: {error}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to nothing"))
}

/// Reads one frame's body; refuses a header over the limit before reading the body.
async fn read_frame(recv: &mut quinn::RecvStream, metrics: &Metrics) -> Result<Vec<u8>, String> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    recv.read_exact(&mut header)
        .await
        .map_err(|error| error.to_string())?;
    let len = frame_body_len(header).map_err(|error| {
        metrics.cluster_frames_refused.inc();
        error.to_string()
    })?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body)
        .await
        .map_err(|error| error.to_string())?;
    Ok(body)
}

#[cfg(test)]
mod tests;

/// A request stream that is reset unless the exchange ended: see [`Cluster::exchange`].
struct ResetOnDrop(Option<quinn::SendStream>);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if let Some(mut stream) = self.0.take() {
            // Already fully acknowledged or closed: nothing to take back.
            let _ = stream.reset(quinn::VarInt::from_u32(0));
        }
    }
}

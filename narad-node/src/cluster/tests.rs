use super::*;

/// The test handler, alive for the whole test process (the cluster holds its handler weakly).
static ECHO: std::sync::LazyLock<Arc<dyn Inbound>> = std::sync::LazyLock::new(|| Arc::new(Echo));

struct Echo;

impl Inbound for Echo {
    fn handle(&self, from: NodeId, body: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
        let mut answer = from.0.to_be_bytes().to_vec();
        answer.extend_from_slice(&body);
        Box::pin(std::future::ready(answer))
    }
}

fn free_udp_port() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

async fn start(node: u32, addrs: &[SocketAddr], secret: &[u8]) -> (Cluster, Arc<Metrics>) {
    let identity = TlsIdentity::SelfSigned(tls::NodeIdentity::generate().unwrap());
    start_with(node, addrs, secret, &identity).await
}

async fn start_with(
    node: u32,
    addrs: &[SocketAddr],
    secret: &[u8],
    identity: &TlsIdentity,
) -> (Cluster, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(index, addr)| (NodeId(index as u32 + 1), addr.to_string()))
        .collect();
    let options = ClusterOptions {
        node: NodeId(node),
        bind: addrs[node as usize - 1],
        peers,
        secret: secret.to_vec(),
        rng_seed: None,
    };
    let cluster = Cluster::bind(options, identity, metrics.clone())
        .await
        .unwrap();
    cluster.serve(&ECHO);
    (cluster, metrics)
}

#[tokio::test]
async fn peers_with_the_secret_call_each_other_over_one_connection() {
    let addrs = [free_udp_port(), free_udp_port()];
    let (one, _) = start(1, &addrs, b"secret").await;
    let (two, _) = start(2, &addrs, b"secret").await;
    let answer = one
        .call(NodeId(2), "test", b"ping", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer, [&1u32.to_be_bytes()[..], b"ping"].concat());
    // Node 2 answers back on the connection node 1 dialled: it adopted it, and dials none.
    assert!(two.live(NodeId(1)).is_some());
    let answer = two
        .call(NodeId(1), "test", b"pong", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer, [&2u32.to_be_bytes()[..], b"pong"].concat());
    assert_eq!(one.inner.endpoint.open_connections(), 1);
    assert_eq!(two.inner.endpoint.open_connections(), 1);
    // An unknown peer is refused without a dial.
    assert_eq!(
        one.call(NodeId(9), "test", b"x", Duration::from_secs(1))
            .await,
        Err(RpcError::UnknownPeer(NodeId(9)))
    );
}

#[tokio::test]
async fn a_peer_without_the_secret_is_refused_and_counted_on_both_sides() {
    let addrs = [free_udp_port(), free_udp_port()];
    let (one, one_metrics) = start(1, &addrs, b"secret").await;
    let (two, two_metrics) = start(2, &addrs, b"wrong").await;
    let refused = two
        .call(NodeId(1), "test", b"ping", Duration::from_secs(5))
        .await;
    assert!(
        matches!(refused, Err(RpcError::Unreachable { .. })),
        "{refused:?}"
    );
    assert_eq!(one_metrics.cluster_auth_failures.get(), 1);
    assert!(one.live(NodeId(2)).is_none());
    let refused = one
        .call(NodeId(2), "test", b"ping", Duration::from_secs(5))
        .await;
    assert!(refused.is_err());
    // Node 2 refused node 1's proof (node 1 never reads node 2's hello: it got closed first).
    assert!(two_metrics.cluster_auth_failures.get() >= 1);
}

#[tokio::test]
async fn a_frame_over_16_mib_is_refused_before_sending() {
    let addrs = [free_udp_port(), free_udp_port()];
    let (one, metrics) = start(1, &addrs, b"secret").await;
    let body = vec![0u8; 17 * 1024 * 1024];
    let refused = one
        .call(NodeId(2), "test", &body, Duration::from_secs(5))
        .await;
    assert!(matches!(refused, Err(RpcError::TooLarge(_))), "{refused:?}");
    assert_eq!(metrics.cluster_frames_refused.get(), 1);
    // Nothing was dialled for it.
    assert!(one.live(NodeId(2)).is_none());
}

/// A CA and, for each name in `nodes`, a certificate it signed naming 127.0.0.1, as PEM files.
fn operator_ca(dir: &std::path::Path, nodes: &[&str]) -> std::path::PathBuf {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    for node in nodes {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.join(format!("{node}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{node}.key")), key.serialize_pem()).unwrap();
    }
    ca_path
}

fn operator(dir: &std::path::Path, node: &str, ca: &std::path::Path) -> TlsIdentity {
    let cert = dir.join(format!("{node}.pem"));
    let key = dir.join(format!("{node}.key"));
    TlsIdentity::Operator(tls::OperatorTls::load(&cert, &key, ca).unwrap())
}

#[tokio::test]
async fn under_an_operator_ca_peers_need_its_certificates_and_the_secret() {
    let ours = tempfile::tempdir().unwrap();
    let ca = operator_ca(ours.path(), &["one", "two"]);
    let theirs = tempfile::tempdir().unwrap();
    let other_ca = operator_ca(theirs.path(), &["three"]);
    let addrs = [free_udp_port(), free_udp_port(), free_udp_port()];
    let (one, _) = start_with(1, &addrs, b"secret", &operator(ours.path(), "one", &ca)).await;
    let (_two, _) = start_with(2, &addrs, b"secret", &operator(ours.path(), "two", &ca)).await;
    let answer = one
        .call(NodeId(2), "test", b"ping", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer, [&1u32.to_be_bytes()[..], b"ping"].concat());
    // The secret, but a certificate from another CA: the handshake fails before any hello.
    let (three, _) = start_with(
        3,
        &addrs,
        b"secret",
        &operator(theirs.path(), "three", &other_ca),
    )
    .await;
    let refused = three
        .call(NodeId(1), "test", b"ping", Duration::from_secs(5))
        .await;
    assert!(
        matches!(refused, Err(RpcError::Unreachable { .. })),
        "{refused:?}"
    );
    // A self-signed node is refused by the CA's members too.
    let (four, _) = start(3, &[addrs[0], addrs[1], free_udp_port()], b"secret").await;
    assert!(four
        .call(NodeId(1), "test", b"ping", Duration::from_secs(5))
        .await
        .is_err());
}

/// Node 2's connection as `cluster` holds it, once it satisfies `ready` (at most 5 s).
async fn wait_for_connection(
    cluster: &Cluster,
    ready: impl Fn(&quinn::Connection) -> bool,
) -> quinn::Connection {
    for _ in 0..500 {
        if let Some(connection) = cluster.live(NodeId(2)).filter(|c| ready(c)) {
            return connection;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("node 2's connection never became the expected one");
}

#[tokio::test]
async fn a_peer_that_dials_in_after_a_restart_replaces_and_closes_its_old_connection() {
    let addrs = [free_udp_port(), free_udp_port()];
    let (one, _) = start(1, &addrs, b"secret").await;
    let (two, _) = start(2, &addrs, b"secret").await;
    one.call(NodeId(2), "test", b"ping", Duration::from_secs(5))
        .await
        .unwrap();
    let dialled = one.live(NodeId(2)).unwrap();
    // The same boot dialling too (both sides dialled): node 1 prefers the new connection, and
    // the one it dialled stays open (node 2 may be using it).
    two.dial(NodeId(1)).await.unwrap();
    let preferred = wait_for_connection(&one, |connection| {
        connection.stable_id() != dialled.stable_id()
    })
    .await;
    assert_ne!(preferred.stable_id(), dialled.stable_id());
    assert!(dialled.close_reason().is_none());
    // Node 2 "restarts": a new process (a new boot number) on another port dials node 1.
    let restarted_addr = free_udp_port();
    let identity = TlsIdentity::SelfSigned(tls::NodeIdentity::generate().unwrap());
    let (restarted, _) = start_with(2, &[addrs[0], restarted_addr], b"secret", &identity).await;
    assert!(restarted.inner.boot > two.inner.boot);
    restarted
        .call(NodeId(1), "test", b"hello", Duration::from_secs(5))
        .await
        .unwrap();
    // Node 1's calls go to the new process at once, and the connection they used is closed (calls
    // in flight on it fail now instead of at its idle timeout).
    wait_for_connection(&one, |connection| {
        connection.remote_address() == restarted_addr
    })
    .await;
    assert!(preferred.close_reason().is_some());
    let answer = one
        .call(NodeId(2), "test", b"ping", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer, [&1u32.to_be_bytes()[..], b"ping"].concat());
}

use super::*;

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

fn start(node: u32, addrs: &[SocketAddr], secret: &[u8]) -> (Cluster, Arc<Metrics>) {
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
    };
    let identity = NodeIdentity::generate().unwrap();
    let cluster = Cluster::bind(options, &identity, metrics.clone()).unwrap();
    cluster.serve(Arc::new(Echo));
    (cluster, metrics)
}

#[tokio::test]
async fn peers_with_the_secret_call_each_other_over_one_connection() {
    let addrs = [free_udp_port(), free_udp_port()];
    let (one, _) = start(1, &addrs, b"secret");
    let (two, _) = start(2, &addrs, b"secret");
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
    let (one, one_metrics) = start(1, &addrs, b"secret");
    let (two, two_metrics) = start(2, &addrs, b"wrong");
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
    let (one, metrics) = start(1, &addrs, b"secret");
    let body = vec![0u8; 17 * 1024 * 1024];
    let refused = one
        .call(NodeId(2), "test", &body, Duration::from_secs(5))
        .await;
    assert!(matches!(refused, Err(RpcError::TooLarge(_))), "{refused:?}");
    assert_eq!(metrics.cluster_frames_refused.get(), 1);
    // Nothing was dialled for it.
    assert!(one.live(NodeId(2)).is_none());
}

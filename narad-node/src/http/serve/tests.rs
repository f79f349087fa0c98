//! The server's pure parts (deadlines, warnings, the refusal), HTTPS set-up errors, and one server in
//! this process speaking HTTP/2 and HTTP/1.1 over TLS. The timeouts and the cap are exercised against
//! real `narad` processes in `tests/blackbox_http_hardening.rs`.

use std::path::Path;

use axum::routing::get;

use super::*;

const READ_MS: u64 = 10_000;
const IDLE_MS: u64 = 60_000;

#[test]
fn the_first_head_runs_from_the_accept_and_closes_after_the_read_timeout() {
    assert_eq!(check(0, 0, 0, 0, READ_MS, IDLE_MS), Check::At(10_000));
    assert_eq!(
        check(9_999, 0, 0, 9_000, READ_MS, IDLE_MS),
        Check::At(10_000)
    );
    assert_eq!(
        check(10_000, 0, 0, 9_000, READ_MS, IDLE_MS),
        Check::Expired(Expiry::Head)
    );
}

#[test]
fn a_later_head_runs_from_its_first_byte() {
    // Idle from 5 s (the last answer's write), first byte of the next head at 40 s.
    assert_eq!(
        check(45_000, 0, 40_000, 45_000, READ_MS, IDLE_MS),
        Check::At(50_000)
    );
    assert_eq!(
        check(50_000, 0, 40_000, 50_000, READ_MS, IDLE_MS),
        Check::Expired(Expiry::Head)
    );
}

#[test]
fn an_idle_connection_closes_after_the_idle_timeout_not_the_read_timeout() {
    // The last byte moved at 5 s: no close at 15 s (the read timeout), a look at most 10 s on.
    assert_eq!(
        check(15_000, 0, NO_HEAD, 5_000, READ_MS, IDLE_MS),
        Check::At(25_000)
    );
    assert_eq!(
        check(60_000, 0, NO_HEAD, 5_000, READ_MS, IDLE_MS),
        Check::At(65_000)
    );
    assert_eq!(
        check(65_000, 0, NO_HEAD, 5_000, READ_MS, IDLE_MS),
        Check::Expired(Expiry::Idle)
    );
    // A short idle timeout: the look is at its deadline.
    assert_eq!(
        check(1_000, 0, NO_HEAD, 900, READ_MS, 500),
        Check::At(1_400)
    );
}

#[test]
fn a_request_in_flight_is_never_closed_by_the_connection_deadlines() {
    assert_eq!(
        check(500_000, 1, NO_HEAD, 0, READ_MS, IDLE_MS),
        Check::At(510_000)
    );
    assert_eq!(check(500_000, 3, 0, 0, READ_MS, 2_000), Check::At(502_000));
    assert_eq!(
        check(u64::MAX - 1, 1, NO_HEAD, 0, READ_MS, IDLE_MS),
        Check::At(u64::MAX)
    );
}

#[test]
fn warnings_are_logged_at_most_every_ten_seconds_with_the_count_since() {
    let start = Instant::now();
    let mut warning = Warning::default();
    assert_eq!(warning.note(start), Some(1));
    assert_eq!(warning.note(start + Duration::from_secs(1)), None);
    assert_eq!(warning.note(start + Duration::from_secs(9)), None);
    assert_eq!(warning.note(start + Duration::from_secs(10)), Some(3));
    assert_eq!(warning.note(start + Duration::from_secs(11)), None);
}

#[test]
fn the_refusal_is_a_complete_json_503_that_closes() {
    let refusal = refusal_bytes();
    let text = std::str::from_utf8(&refusal).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "{\"error\":\"too many connections\"}\n");
    assert_eq!(
        head,
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close",
            body.len()
        )
    );
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A self-signed certificate for `localhost` and 127.0.0.1: (certificate PEM, key PEM).
fn self_signed() -> (String, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    (certified.cert.pem(), certified.key_pair.serialize_pem())
}

fn load_error(cert: &Path, key: &Path) -> String {
    load_tls(cert, key).unwrap_err().to_string()
}

#[test]
fn https_files_load_and_their_errors_name_the_file() {
    let files = Files::new();
    let (cert_pem, key_pem) = self_signed();
    let cert = files.write("cert.pem", &cert_pem);
    let key = files.write("key.pem", &key_pem);
    let config = load_tls(&cert, &key).unwrap();
    assert_eq!(
        config.alpn_protocols,
        [b"h2".to_vec(), b"http/1.1".to_vec()]
    );

    let missing = files.dir.path().join("missing.pem");
    let error = load_error(&missing, &key);
    assert!(
        error.starts_with(&format!("http.tls_cert_file {}: ", missing.display())),
        "{error}"
    );
    assert!(error.contains("No such file"), "{error}");

    let error = load_error(&key, &key);
    assert_eq!(
        error,
        format!("http.tls_cert_file {}: no CERTIFICATE block", key.display())
    );

    let error = load_error(&cert, &cert);
    assert_eq!(
        error,
        format!(
            "http.tls_key_file {}: no PRIVATE KEY (PKCS#8, RSA or EC) block",
            cert.display()
        )
    );

    let garbled = files.write(
        "garbled.pem",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let error = load_error(&garbled, &key);
    assert!(
        error.starts_with(&format!(
            "http.tls_cert_file {}: not PEM",
            garbled.display()
        )),
        "{error}"
    );

    let (_, other_key_pem) = self_signed();
    let other_key = files.write("other-key.pem", &other_key_pem);
    let error = load_error(&cert, &other_key);
    assert!(
        error.starts_with(&format!(
            "http.tls_cert_file {} with http.tls_key_file {}: ",
            cert.display(),
            other_key.display()
        )),
        "{error}"
    );
}

/// A server in this process over TLS: its address, the client configuration trusting its
/// certificate, and the sender that stops it.
async fn tls_server() -> (
    std::net::SocketAddr,
    Arc<rustls::ClientConfig>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<io::Result<()>>,
) {
    let files = Files::new();
    let (cert_pem, key_pem) = self_signed();
    let cert = files.write("cert.pem", &cert_pem);
    let key = files.write("key.pem", &key_pem);
    let options = ServeOptions {
        read_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
        max_connections: 8,
        tls: Some(load_tls(&cert, &key).unwrap()),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/hello", get(|| async { "hi" }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        router,
        options,
        Arc::new(Metrics::new()),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    (addr, Arc::new(client), stop, server)
}

async fn tls_connect(
    addr: std::net::SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut config = (**client).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_http2_and_http1_by_alpn_and_stops_gracefully() {
    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (addr, client, stop, server) = tls_server().await;

    let tls = tls_connect(addr, &client, b"h2").await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    let driver = tokio::spawn(connection);
    let request = Request::get(format!("https://localhost:{}/hello", addr.port()))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hi");
    drop(sender);
    let _ = driver.await;

    let mut tls = tls_connect(addr, &client, b"http/1.1").await;
    tls.write_all(b"GET /hello HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhi"), "{answer}");

    // Plain HTTP to the TLS listener gets no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /hello HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

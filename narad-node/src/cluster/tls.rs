//! The cluster transport's TLS: a self-signed certificate per node, made at first start under the
//! data directory, and the rustls configurations quinn runs on (TLS 1.3, ring, ALPN
//! [`ALPN`]).
//!
//! With an operator CA ([`OperatorTls`]: `cluster.tls_cert_file`, `tls_key_file`, `tls_ca_file`) the
//! peers authenticate each other by mutual TLS as well: each presents its certificate from that CA,
//! which must name the host its peers dial (a DNS or IP subject alternative name), and checks the
//! other's. The secret's proof is required either way.
//!
//! Decision: a peer's self-signed certificate is not checked against anything. Who a peer is comes
//! from its proof of the cluster secret over this connection's exporter value (`auth.rs`), which a
//! man in the middle cannot produce; the certificate only keys the TLS session. The handshake's
//! signatures are still verified, so the peer holds the key of the certificate it sent.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The ALPN protocol of node-to-node traffic.
pub const ALPN: &[u8] = b"narad-cluster/1";
/// The directory (under the data dir) of the node's certificate and key.
pub const TLS_DIR: &str = "cluster";
/// The name the certificate is issued for, and the server name clients ask for.
pub const SERVER_NAME: &str = "narad-node";

/// Why the TLS set-up failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate files could not be read or written.
    #[error("cluster certificate {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The certificate could not be made or used.
    #[error("cluster TLS: {0}")]
    Config(String),
}

/// A node's certificate and its key.
#[derive(Debug)]
pub struct NodeIdentity {
    /// The DER certificate.
    pub cert: CertificateDer<'static>,
    /// The PKCS#8 DER key.
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl NodeIdentity {
    /// Reads the node's certificate and key from `data_dir/cluster/`, making them at first start.
    pub fn load_or_create(data_dir: &Path) -> Result<NodeIdentity, TlsError> {
        let dir = data_dir.join(TLS_DIR);
        let cert_path = dir.join("node.crt.der");
        let key_path = dir.join("node.key.der");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TlsError::Io { path, source }
        };
        if cert_path.exists() && key_path.exists() {
            let cert = std::fs::read(&cert_path).map_err(io(&cert_path))?;
            let key = std::fs::read(&key_path).map_err(io(&key_path))?;
            return Ok(NodeIdentity {
                cert: CertificateDer::from(cert),
                key: PrivatePkcs8KeyDer::from(key),
            });
        }
        let identity = NodeIdentity::generate()?;
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        // The key first, each through a temporary name: a crash leaves either both files or a
        // start that makes them again.
        write_atomically(&key_path, identity.key.secret_pkcs8_der()).map_err(io(&key_path))?;
        write_atomically(&cert_path, identity.cert.as_ref()).map_err(io(&cert_path))?;
        Ok(identity)
    }

    /// A fresh self-signed certificate (in memory only).
    pub fn generate() -> Result<NodeIdentity, TlsError> {
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|error| TlsError::Config(error.to_string()))?;
        Ok(NodeIdentity {
            cert: certified.cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()),
        })
    }
}

impl NodeIdentity {
    /// A self-signed Ed25519 certificate made from `seed` alone (in memory only): the same seed makes
    /// the same certificate and key. For the simulator, whose runs must replay; Ed25519's fixed-size
    /// signatures also keep every handshake's packet sizes the same from run to run.
    pub fn from_seed(seed: [u8; 32]) -> Result<NodeIdentity, TlsError> {
        // PKCS#8 v1 of an Ed25519 key (RFC 8410): a fixed prefix, then the 32-byte seed.
        const PREFIX: [u8; 16] = [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        let config = |error: rcgen::Error| TlsError::Config(error.to_string());
        let mut der = PREFIX.to_vec();
        der.extend_from_slice(&seed);
        let key = PrivatePkcs8KeyDer::from(der);
        let key_pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ED25519)
            .map_err(config)?;
        let cert = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(config)?
            .self_signed(&key_pair)
            .map_err(config)?;
        Ok(NodeIdentity {
            cert: cert.der().clone(),
            key,
        })
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let temp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temp, path)?;
    Ok(())
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server side's rustls configuration.
pub fn server_config(identity: &NodeIdentity) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TlsError::Config(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            vec![identity.cert.clone()],
            PrivateKeyDer::Pkcs8(identity.key.clone_key()),
        )
        .map_err(|error| TlsError::Config(error.to_string()))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// The client side's rustls configuration: any certificate, its handshake signatures verified.
pub fn client_config() -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TlsError::Config(error.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PeerCertificate { provider }))
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// Accepts any peer certificate (identity comes from the secret's proof); checks the signatures.
#[derive(Debug)]
struct PeerCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PeerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// This node's certificate chain and key from an operator CA, and that CA: mutual TLS.
#[derive(Debug)]
pub struct OperatorTls {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<rustls::RootCertStore>,
}

impl OperatorTls {
    /// Reads the PEM files: this node's certificate (chain), its key, and the CA.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<OperatorTls, TlsError> {
        let pem = |path: &Path, error: rustls::pki_types::pem::Error| {
            TlsError::Config(format!("{}: {error}", path.display()))
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|error| pem(cert, error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| pem(cert, error))?;
        if chain.is_empty() {
            return Err(TlsError::Config(format!(
                "{}: no certificate",
                cert.display()
            )));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|error| pem(key, error))?;
        let mut roots = rustls::RootCertStore::empty();
        for authority in CertificateDer::pem_file_iter(ca).map_err(|error| pem(ca, error))? {
            let authority = authority.map_err(|error| pem(ca, error))?;
            roots
                .add(authority)
                .map_err(|error| TlsError::Config(format!("{}: {error}", ca.display())))?;
        }
        if roots.is_empty() {
            return Err(TlsError::Config(format!(
                "{}: no CA certificate",
                ca.display()
            )));
        }
        Ok(OperatorTls {
            chain,
            key: key_der,
            roots: Arc::new(roots),
        })
    }
}

/// How a node proves who it is in TLS.
#[derive(Debug)]
pub enum TlsIdentity {
    /// Its self-signed certificate (identity comes from the secret's proof alone).
    SelfSigned(NodeIdentity),
    /// Mutual TLS under an operator CA (and the secret's proof).
    Operator(OperatorTls),
}

impl TlsIdentity {
    /// The server side's configuration.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let OperatorTls { chain, key, roots } = match self {
            TlsIdentity::SelfSigned(identity) => return server_config(identity),
            TlsIdentity::Operator(operator) => operator,
        };
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|error| TlsError::Config(error.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|error| TlsError::Config(error.to_string()))?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    /// The client side's configuration.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let OperatorTls { chain, key, roots } = match self {
            TlsIdentity::SelfSigned(_) => return client_config(),
            TlsIdentity::Operator(operator) => operator,
        };
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|error| TlsError::Config(error.to_string()))?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

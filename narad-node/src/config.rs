//! The node's configuration: embedded defaults, then a TOML file (`--config`), then `NARAD_*`
//! environment variables, then command-line flags — each layer overriding the one before.
//!
//! Decisions:
//! - The file is TOML (the Go release read JSON); unknown keys are refused with the key's name and
//!   place, so a misspelt setting never silently keeps its default.
//! - Environment variables are read from an explicit table ([`ENV_KEYS`]), not through clap, so the
//!   precedence file < env < flags holds for keys that have no flag as well. Any other `NARAD_*`
//!   variable is a start-up error naming it ([`check_env_names`]), so a misspelt variable never
//!   silently keeps its default; [`ENV_OTHER`] lists the few the node reads outside the table.
//! - `NARAD_CLUSTER_SECRET` is read from the environment only (never from the file, which is often
//!   world-readable or checked in), and required once peers are set.
//! - A node with `cluster.peers` set is a cluster member; without, it is a single node (its own sole
//!   voter), as with `--dev`.
//! - `--dev` is a flag only: single node, auth off, and the HTTP address must be a loopback one.
//! - Basic auth is on unless `--dev` or `security.enabled = false`. `NARAD_ADMIN_PASSWORD` (environment
//!   only, like the cluster secret) seeds the root user once; without it a random password is logged
//!   once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default HTTP listen address.
pub const HTTP_ADDR_DEFAULT: &str = "127.0.0.1:7942";
/// Default HTTP read timeout (head, and whole request), ms: the surface's 10 s.
pub const HTTP_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default HTTP write timeout, ms: the surface's 30 s.
pub const HTTP_WRITE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default HTTP keep-alive idle timeout, ms: the surface's 60 s.
pub const HTTP_IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Longest accepted HTTP timeout, ms (an hour): a longer one leaves a stuck client its connection
/// for good.
pub const HTTP_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// Default cap on HTTP connections served at once.
pub const HTTP_MAX_CONNECTIONS_DEFAULT: u32 = 4_096;
/// Largest accepted HTTP connection cap.
pub const HTTP_MAX_CONNECTIONS_MAX: u32 = 1_000_000;
/// Default data directory.
pub const DATA_DIR_DEFAULT: &str = "./narad-data";
/// Default ingress WAL group-commit backstop.
pub const INGRESS_WAL_SYNC_INTERVAL_MS_DEFAULT: u64 = 10;
/// Largest accepted ingress WAL backstop: beyond a second a missed wake-up would stall produces.
pub const INGRESS_WAL_SYNC_INTERVAL_MS_MAX: u64 = 1_000;
/// Default longest cohort wait of a group commit, µs (see `narad_core::wal::COMMIT_DELAY_US_MAX_DEFAULT`).
pub const INGRESS_WAL_COMMIT_DELAY_US_DEFAULT: u64 = narad_core::wal::COMMIT_DELAY_US_MAX_DEFAULT;
/// Default longest cohort wait of an owner journal flush, µs (see
/// `narad_core::partition::journal::COMMIT_DELAY_US_MAX_DEFAULT`).
pub const OWNER_JOURNAL_COMMIT_DELAY_US_DEFAULT: u64 =
    narad_core::partition::journal::COMMIT_DELAY_US_MAX_DEFAULT;
/// Largest accepted owner journal cohort wait, µs: the accept→visible target is 10 ms.
pub const OWNER_JOURNAL_COMMIT_DELAY_US_MAX: u64 = 5_000;
/// Default interval of each partition owner's retention check, ms (Narad's 60 s).
pub const RETENTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// Shortest accepted retention check interval, ms.
pub const RETENTION_CHECK_INTERVAL_MS_MIN: u64 = 100;
/// The smallest `storage.partition_segment_bytes`: a segment holds at least one largest frame's worth
/// of small records, and a file per 64 KiB is as many files as anyone should want.
pub const PARTITION_SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// The default free-space floor's cap: 1 GiB (see [`min_free_bytes_default`]).
pub const MIN_FREE_BYTES_DEFAULT_MAX: u64 = 1 << 30;
/// Default idle time after which a partition log closes its files, ms (Narad's 30 minutes).
pub const IDLE_LOG_EVICTION_MS_DEFAULT: u64 = 1_800_000;

/// The free space the disk guard keeps when `storage.min_free_bytes` is not set: 1 GiB, or 5% of the
/// data directory's file system (`total_bytes`) where that is less, so a small disk is not refused
/// produces while most of it is free.
pub fn min_free_bytes_default(total_bytes: u64) -> u64 {
    MIN_FREE_BYTES_DEFAULT_MAX.min(total_bytes / 20)
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line (the default, as in the Go release).
    #[default]
    Json,
    /// Human-readable lines.
    Text,
}

/// The whole node configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Development mode: single node, auth off, loopback only. Set by `--dev`, never by the file.
    #[serde(skip)]
    pub dev: bool,
    /// The config file this came from, if any.
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// `[http]`.
    pub http: HttpConfig,
    /// `[cluster]`.
    pub cluster: ClusterConfig,
    /// `[storage]`.
    pub storage: StorageConfig,
    /// `[topic]`.
    pub topic: TopicConfig,
    /// `[log]`.
    pub log: LogConfig,
    /// `[security]`.
    pub security: SecurityConfig,
}

/// `[http]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address (`NARAD_HTTP_ADDR`, `--http-addr`); port 0 picks a free port.
    pub addr: String,
    /// How long a graceful shutdown waits for requests in flight, ms.
    pub shutdown_grace_ms: u64,
    /// The read timeout, ms (`NARAD_HTTP_READ_TIMEOUT_MS`): a request's head must arrive within it
    /// of its first byte (of the connection's accept, for its first request, TLS handshake included),
    /// and its whole body within it of that same start; otherwise 408 or the connection is closed.
    pub read_timeout_ms: u64,
    /// The write timeout, ms (`NARAD_HTTP_WRITE_TIMEOUT_MS`): a response write that makes no
    /// progress for this long (the client does not read) closes the connection.
    pub write_timeout_ms: u64,
    /// The idle timeout, ms (`NARAD_HTTP_IDLE_TIMEOUT_MS`): a kept-alive connection with no request
    /// in flight and no bytes moving for this long is closed.
    pub idle_timeout_ms: u64,
    /// The most connections served at once (`NARAD_HTTP_MAX_CONNECTIONS`); one more is answered 503
    /// `too many connections` and closed. At least 1.
    pub max_connections: u32,
    /// HTTPS: the certificate chain (PEM), leaf first (`NARAD_HTTP_TLS_CERT_FILE`). With
    /// `tls_key_file`: both or neither; when set, the listener serves TLS only.
    pub tls_cert_file: String,
    /// HTTPS: the certificate's private key (PEM: PKCS#8, RSA or SEC1) (`NARAD_HTTP_TLS_KEY_FILE`).
    pub tls_key_file: String,
}

/// `[cluster]`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's member id (`NARAD_NODE_ID`, `--node-id`); never 0 (raft reserves it).
    pub node_id: u32,
    /// The UDP address of all node-to-node traffic (QUIC) (`NARAD_CLUSTER_ADDR`).
    pub addr: String,
    /// The members' cluster addresses, `id@host:port,...`; this node may be listed
    /// (`NARAD_CLUSTER_PEERS`). Empty: a single node.
    pub peers: String,
    /// The cluster secret peers prove to each other (`NARAD_CLUSTER_SECRET`, environment only).
    #[serde(skip)]
    pub secret: Option<String>,
    /// Mutual TLS under an operator CA: this node's certificate (PEM, its chain), naming the host its
    /// peers dial (`NARAD_CLUSTER_TLS_CERT_FILE`). With `tls_key_file` and `tls_ca_file`: all or none.
    pub tls_cert_file: String,
    /// Its private key (PEM) (`NARAD_CLUSTER_TLS_KEY_FILE`).
    pub tls_key_file: String,
    /// The operator CA (PEM) every peer's certificate must chain to (`NARAD_CLUSTER_TLS_CA_FILE`).
    pub tls_ca_file: String,
    /// Partition moves the cluster runs at once, at most (`NARAD_CLUSTER_MAX_MOVES_IN_FLIGHT`,
    /// at least 1).
    pub max_moves_in_flight: u32,
    /// Whether the leader rebalances by itself once a member joins or stops draining (as
    /// `POST /v1/cluster/rebalance` does, until nothing is left to plan)
    /// (`NARAD_CLUSTER_AUTO_REBALANCE`).
    pub auto_rebalance: bool,
    /// How long a member must have been dead before `decommission?force=true` reassigns its
    /// partitions (`NARAD_CLUSTER_FORCE_AFTER_MS`).
    pub force_after_ms: u64,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_id", &self.node_id)
            .field("addr", &self.addr)
            .field("peers", &self.peers)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("max_moves_in_flight", &self.max_moves_in_flight)
            .field("auto_rebalance", &self.auto_rebalance)
            .field("force_after_ms", &self.force_after_ms)
            .finish()
    }
}

/// Default cluster (QUIC, UDP) address.
pub const CLUSTER_ADDR_DEFAULT: &str = "127.0.0.1:7943";

impl ClusterConfig {
    /// The members listed in `peers`, by id (this node included when listed).
    pub fn peer_map(&self) -> Result<std::collections::BTreeMap<u32, String>, ConfigError> {
        let mut peers = std::collections::BTreeMap::new();
        for entry in self
            .peers
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            let parsed = entry.split_once('@').and_then(|(id, addr)| {
                let id: u32 = id.trim().parse().ok()?;
                let addr = addr.trim();
                (id != 0 && addr.rsplit_once(':').is_some()).then(|| (id, addr.to_string()))
            });
            let Some((id, addr)) = parsed else {
                return Err(ConfigError::Invalid(format!(
                    "cluster.peers entry {entry:?} is not id@host:port (id ≥ 1)"
                )));
            };
            if peers.insert(id, addr).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "cluster.peers lists node {id} twice"
                )));
            }
        }
        Ok(peers)
    }

    /// The operator CA's files (certificate, key, CA) when mutual TLS is configured.
    pub fn operator_tls(&self) -> Option<(&Path, &Path, &Path)> {
        (!self.tls_cert_file.is_empty()).then(|| {
            (
                Path::new(&self.tls_cert_file),
                Path::new(&self.tls_key_file),
                Path::new(&self.tls_ca_file),
            )
        })
    }

    /// Whether this node is a cluster member (peers are set).
    pub fn is_member(&self) -> bool {
        !self.peers.trim().is_empty()
    }

    /// The cluster address, parsed.
    pub fn socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.addr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "cluster.addr {:?} is not an IP:port address",
                self.addr
            ))
        })
    }
}

/// `[storage]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Root of everything the node stores (`NARAD_DATA_DIR`, `--data-dir`).
    pub data_dir: PathBuf,
    /// Prepare the next WAL segment off the append path (zero-filled, with a trailer). Off by default.
    pub ingress_wal_prealloc: bool,
    /// Zeros a partition log keeps written ahead of its frames, so that a commit's fdatasync writes
    /// data only, not the file's size and blocks; at most an eighth of a segment. 0 turns it off (on
    /// copy-on-write file systems, btrfs or ZFS, the zeros save nothing).
    pub partition_prealloc_bytes: u64,
    /// A partition log's segment size, bytes (`NARAD_STORAGE_PARTITION_SEGMENT_BYTES`; at least
    /// 64 KiB): the unit retention removes, so a partition with `retention_bytes` holds at most the
    /// bound plus one segment.
    pub partition_segment_bytes: u64,
    /// Group-commit backstop: bounds a missed wake-up of the WAL sync loop, ms.
    pub ingress_wal_sync_interval_ms: u64,
    /// Longest a group commit waits for the producers the previous one answered to come back, µs;
    /// only after a group commit that answered at least 4 appends, and never longer than 2.5 times that
    /// commit's duration. 0 turns it off: the spec's "group commit fires on every append". Must be
    /// below the backstop. On by default (a deviation from the spec): see the WAL's module doc.
    pub ingress_wal_commit_delay_us: u64,
    /// Make owner commits durable in one owner journal for every local partition (one fsync for
    /// every partition's queued commits; partition files synced lazily behind it). On by default;
    /// off, every partition commit pays its own fsync. A journal left by a run with it on is
    /// replayed at start either way.
    pub owner_journal: bool,
    /// Longest an owner journal flush waits for the partitions the previous one answered to come
    /// back, µs; only after a flush that answered at least 2 partitions, and never longer than 2.5
    /// times that flush's duration. It delays visibility, never a 202. 0 turns it off; at most
    /// 5,000.
    pub owner_journal_commit_delay_us: u64,
    /// How often each partition owner applies retention, ms
    /// (`NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS`); at least 100.
    pub retention_check_interval_ms: u64,
    /// The free space the data directory's file system keeps, bytes (`NARAD_STORAGE_MIN_FREE_BYTES`):
    /// with less, produces answer 507 until there is enough again. Unset: [`min_free_bytes_default`]
    /// of the file system's size. 0 turns the guard off.
    pub min_free_bytes: Option<u64>,
    /// How long a partition log nobody reads or writes keeps its files open, ms
    /// (`NARAD_STORAGE_IDLE_LOG_EVICTION_MS`).
    pub idle_log_eviction_ms: u64,
}

impl StorageConfig {
    /// The free-space floor of a data directory on a file system of `total_bytes`:
    /// `min_free_bytes` when set, else [`min_free_bytes_default`].
    pub fn min_free_bytes_for(&self, total_bytes: u64) -> u64 {
        self.min_free_bytes
            .unwrap_or_else(|| min_free_bytes_default(total_bytes))
    }
}

/// `[topic]`: rules this node applies to topic changes before proposing them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicConfig {
    /// The shortest `retention_ms` (0 aside) a create or PATCH through this node may ask for, ms
    /// (`NARAD_TOPIC_MIN_RETENTION_MS`); one hour by default, as Narad, and at least the metastore's
    /// floor (`narad_core::metastore::RETENTION_MS_FLOOR`, 100). Tests and small deployments lower it.
    pub min_retention_ms: u64,
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: `info`, `debug`, `narad_node=debug,info`, ...
    pub level: String,
    /// Line format.
    pub format: LogFormat,
}

/// `[security]`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// Basic auth on `/v1` (on by default, as in the Go release; `--dev` turns it off).
    pub enabled: bool,
    /// The root user's password when it is seeded (`NARAD_ADMIN_PASSWORD`, environment only).
    #[serde(skip)]
    pub admin_password: Option<String>,
}

impl std::fmt::Debug for SecurityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecurityConfig")
            .field("enabled", &self.enabled)
            .field(
                "admin_password",
                &self.admin_password.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            addr: HTTP_ADDR_DEFAULT.to_string(),
            shutdown_grace_ms: 10_000,
            read_timeout_ms: HTTP_READ_TIMEOUT_MS_DEFAULT,
            write_timeout_ms: HTTP_WRITE_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: HTTP_IDLE_TIMEOUT_MS_DEFAULT,
            max_connections: HTTP_MAX_CONNECTIONS_DEFAULT,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: 1,
            addr: CLUSTER_ADDR_DEFAULT.to_string(),
            peers: String::new(),
            secret: None,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_ca_file: String::new(),
            max_moves_in_flight: MAX_MOVES_IN_FLIGHT_DEFAULT,
            auto_rebalance: true,
            force_after_ms: FORCE_AFTER_MS_DEFAULT,
        }
    }
}

/// `cluster.max_moves_in_flight`'s default.
pub const MAX_MOVES_IN_FLIGHT_DEFAULT: u32 = 8;
/// `cluster.force_after_ms`'s default.
pub const FORCE_AFTER_MS_DEFAULT: u64 = 120_000;

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            ingress_wal_prealloc: false,
            partition_prealloc_bytes: narad_core::partition::PREALLOCATE_BYTES_DEFAULT,
            partition_segment_bytes: narad_core::partition::SEGMENT_BYTES_MAX_DEFAULT,
            owner_journal: true,
            owner_journal_commit_delay_us: OWNER_JOURNAL_COMMIT_DELAY_US_DEFAULT,
            ingress_wal_sync_interval_ms: INGRESS_WAL_SYNC_INTERVAL_MS_DEFAULT,
            ingress_wal_commit_delay_us: INGRESS_WAL_COMMIT_DELAY_US_DEFAULT,
            retention_check_interval_ms: RETENTION_CHECK_INTERVAL_MS_DEFAULT,
            min_free_bytes: None,
            idle_log_eviction_ms: IDLE_LOG_EVICTION_MS_DEFAULT,
        }
    }
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            min_retention_ms: narad_core::metastore::RETENTION_MS_MIN_DEFAULT,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_string(),
            format: LogFormat::Json,
        }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            enabled: true,
            admin_password: None,
        }
    }
}

/// Why the configuration could not be built.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The OS's reason.
        reason: String,
    },
    /// The file is not valid TOML for this schema (an unknown key is named here).
    #[error("config file {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, naming the key and its line.
        reason: String,
    },
    /// An environment variable holds a value its key cannot take.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A `NARAD_*` variable the node does not read (a typo would otherwise keep the default).
    #[error("unknown environment variable {0}: no such setting (see the configuration reference)")]
    UnknownEnv(String),
    /// The merged configuration breaks a rule.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The flags of `narad serve` that override configuration keys (`None` = not given).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlagOverrides {
    /// `--config FILE`.
    pub config: Option<PathBuf>,
    /// `--dev`.
    pub dev: bool,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--http-addr`.
    pub http_addr: Option<String>,
    /// `--node-id`.
    pub node_id: Option<u32>,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

/// A configuration key settable from the environment.
type EnvSetter = fn(&mut Config, &str) -> Result<(), String>;

/// Every `NARAD_*` variable the node reads, and the key it sets.
pub const ENV_KEYS: &[(&str, EnvSetter)] = &[
    ("NARAD_HTTP_ADDR", |config, value| {
        config.http.addr = value.to_string();
        Ok(())
    }),
    ("NARAD_HTTP_SHUTDOWN_GRACE_MS", |config, value| {
        config.http.shutdown_grace_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_HTTP_READ_TIMEOUT_MS", |config, value| {
        config.http.read_timeout_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_HTTP_WRITE_TIMEOUT_MS", |config, value| {
        config.http.write_timeout_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_HTTP_IDLE_TIMEOUT_MS", |config, value| {
        config.http.idle_timeout_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_HTTP_MAX_CONNECTIONS", |config, value| {
        config.http.max_connections = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_HTTP_TLS_CERT_FILE", |config, value| {
        config.http.tls_cert_file = value.to_string();
        Ok(())
    }),
    ("NARAD_HTTP_TLS_KEY_FILE", |config, value| {
        config.http.tls_key_file = value.to_string();
        Ok(())
    }),
    ("NARAD_NODE_ID", |config, value| {
        config.cluster.node_id = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_CLUSTER_ADDR", |config, value| {
        config.cluster.addr = value.to_string();
        Ok(())
    }),
    ("NARAD_CLUSTER_PEERS", |config, value| {
        config.cluster.peers = value.to_string();
        Ok(())
    }),
    ("NARAD_ADMIN_PASSWORD", |config, value| {
        config.security.admin_password = Some(value.to_string());
        Ok(())
    }),
    ("NARAD_CLUSTER_SECRET", |config, value| {
        config.cluster.secret = Some(value.to_string());
        Ok(())
    }),
    ("NARAD_CLUSTER_TLS_CERT_FILE", |config, value| {
        config.cluster.tls_cert_file = value.to_string();
        Ok(())
    }),
    ("NARAD_CLUSTER_TLS_KEY_FILE", |config, value| {
        config.cluster.tls_key_file = value.to_string();
        Ok(())
    }),
    ("NARAD_CLUSTER_TLS_CA_FILE", |config, value| {
        config.cluster.tls_ca_file = value.to_string();
        Ok(())
    }),
    ("NARAD_CLUSTER_MAX_MOVES_IN_FLIGHT", |config, value| {
        config.cluster.max_moves_in_flight = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_CLUSTER_AUTO_REBALANCE", |config, value| {
        config.cluster.auto_rebalance = parse_bool(value)?;
        Ok(())
    }),
    ("NARAD_CLUSTER_FORCE_AFTER_MS", |config, value| {
        config.cluster.force_after_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_DATA_DIR", |config, value| {
        config.storage.data_dir = PathBuf::from(value);
        Ok(())
    }),
    ("NARAD_STORAGE_INGRESS_WAL_PREALLOC", |config, value| {
        config.storage.ingress_wal_prealloc = parse_bool(value)?;
        Ok(())
    }),
    ("NARAD_STORAGE_PARTITION_PREALLOC_BYTES", |config, value| {
        config.storage.partition_prealloc_bytes = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_STORAGE_OWNER_JOURNAL", |config, value| {
        config.storage.owner_journal = parse_bool(value)?;
        Ok(())
    }),
    (
        "NARAD_STORAGE_OWNER_JOURNAL_COMMIT_DELAY_US",
        |config, value| {
            config.storage.owner_journal_commit_delay_us = parse_number(value)?;
            Ok(())
        },
    ),
    (
        "NARAD_STORAGE_INGRESS_WAL_SYNC_INTERVAL_MS",
        |config, value| {
            config.storage.ingress_wal_sync_interval_ms = parse_number(value)?;
            Ok(())
        },
    ),
    (
        "NARAD_STORAGE_INGRESS_WAL_COMMIT_DELAY_US",
        |config, value| {
            config.storage.ingress_wal_commit_delay_us = parse_number(value)?;
            Ok(())
        },
    ),
    ("NARAD_STORAGE_PARTITION_SEGMENT_BYTES", |config, value| {
        config.storage.partition_segment_bytes = parse_number(value)?;
        Ok(())
    }),
    (
        "NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS",
        |config, value| {
            config.storage.retention_check_interval_ms = parse_number(value)?;
            Ok(())
        },
    ),
    ("NARAD_STORAGE_MIN_FREE_BYTES", |config, value| {
        config.storage.min_free_bytes = Some(parse_number(value)?);
        Ok(())
    }),
    ("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", |config, value| {
        config.storage.idle_log_eviction_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_TOPIC_MIN_RETENTION_MS", |config, value| {
        config.topic.min_retention_ms = parse_number(value)?;
        Ok(())
    }),
    ("NARAD_LOG_LEVEL", |config, value| {
        config.log.level = value.to_string();
        Ok(())
    }),
    ("NARAD_LOG_FORMAT", |config, value| {
        config.log.format = match value {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            _ => return Err("expected json or text".to_string()),
        };
        Ok(())
    }),
    ("NARAD_SECURITY_ENABLED", |config, value| {
        config.security.enabled = parse_bool(value)?;
        Ok(())
    }),
];

/// `NARAD_*` variables the node reads outside [`ENV_KEYS`] (the failpoint build's disk faults), and the
/// client subcommands' (a shell that sets them for `narad pub` may start `narad serve` too).
pub const ENV_OTHER: &[&str] = &[
    "NARAD_FAILPOINTS",
    "NARAD_ADDR",
    "NARAD_USER",
    "NARAD_PASS",
    "NARAD_NEW_PASSWORD",
];

/// Refuses any `NARAD_*` variable among `names` that the node does not read, naming it.
pub fn check_env_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    for name in names {
        let known = ENV_KEYS.iter().any(|(var, _)| *var == name) || ENV_OTHER.contains(&name);
        if name.starts_with("NARAD_") && !known {
            return Err(ConfigError::UnknownEnv(name.to_string()));
        }
    }
    Ok(())
}

fn parse_number<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| "expected a non-negative integer".to_string())
}

fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err("expected true or false".to_string()),
    }
}

impl Config {
    /// Builds the configuration: defaults → `flags.config` file → environment (`env` looks a variable
    /// up) → flags, then checks the result.
    pub fn load(
        flags: &FlagOverrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut config = match &flags.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        for (var, set) in ENV_KEYS {
            if let Some(value) = env(var) {
                set(&mut config, &value).map_err(|reason| ConfigError::Env {
                    var,
                    value: value.clone(),
                    reason,
                })?;
            }
        }
        config.apply_flags(flags);
        config.check()?;
        Ok(config)
    }

    /// Parses TOML text; unknown keys are errors naming the key.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            reason: error.to_string().trim_end().replace('\n', " "),
        })?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
        Config::from_toml(&text, path)
    }

    fn apply_flags(&mut self, flags: &FlagOverrides) {
        if let Some(dir) = &flags.data_dir {
            self.storage.data_dir = dir.clone();
        }
        if let Some(addr) = &flags.http_addr {
            self.http.addr = addr.clone();
        }
        if let Some(node_id) = flags.node_id {
            self.cluster.node_id = node_id;
        }
        if let Some(level) = &flags.log_level {
            self.log.level = level.clone();
        }
        if let Some(format) = flags.log_format {
            self.log.format = format;
        }
        if flags.dev {
            self.dev = true;
            self.security.enabled = false;
        }
    }

    /// The HTTP listen address, parsed.
    pub fn http_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.http.addr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "http.addr {:?} is not an IP:port address",
                self.http.addr
            ))
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        let addr = self.http_addr()?;
        if self.dev && !addr.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "--dev serves on loopback only, but http.addr is {addr}"
            )));
        }
        self.http.check()?;
        if self.cluster.node_id == 0 {
            return Err(ConfigError::Invalid(
                "cluster.node_id must not be 0".to_string(),
            ));
        }
        let interval = self.storage.ingress_wal_sync_interval_ms;
        if interval == 0 || interval > INGRESS_WAL_SYNC_INTERVAL_MS_MAX {
            return Err(ConfigError::Invalid(format!(
                "storage.ingress_wal_sync_interval_ms must be between 1 and {INGRESS_WAL_SYNC_INTERVAL_MS_MAX}, got {interval}"
            )));
        }
        let delay = self.storage.ingress_wal_commit_delay_us;
        if delay >= interval * 1_000 {
            return Err(ConfigError::Invalid(format!(
                "storage.ingress_wal_commit_delay_us must be below the backstop \
                 (storage.ingress_wal_sync_interval_ms = {interval}, so at most {}), got {delay}",
                interval * 1_000 - 1
            )));
        }
        let delay = self.storage.owner_journal_commit_delay_us;
        if delay > OWNER_JOURNAL_COMMIT_DELAY_US_MAX {
            return Err(ConfigError::Invalid(format!(
                "storage.owner_journal_commit_delay_us must be at most \
                 {OWNER_JOURNAL_COMMIT_DELAY_US_MAX}, got {delay}"
            )));
        }
        let segment = self.storage.partition_segment_bytes;
        if segment < PARTITION_SEGMENT_BYTES_MIN {
            return Err(ConfigError::Invalid(format!(
                "storage.partition_segment_bytes must be at least \
                 {PARTITION_SEGMENT_BYTES_MIN}, got {segment}"
            )));
        }
        let interval = self.storage.retention_check_interval_ms;
        if interval < RETENTION_CHECK_INTERVAL_MS_MIN {
            return Err(ConfigError::Invalid(format!(
                "storage.retention_check_interval_ms must be at least \
                 {RETENTION_CHECK_INTERVAL_MS_MIN}, got {interval}"
            )));
        }
        let floor = narad_core::metastore::RETENTION_MS_FLOOR;
        let min = self.topic.min_retention_ms;
        if min < floor {
            return Err(ConfigError::Invalid(format!(
                "topic.min_retention_ms must be at least {floor}, got {min}"
            )));
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::Invalid(
                "storage.data_dir must not be empty".to_string(),
            ));
        }
        self.check_cluster()?;
        Ok(())
    }
}

impl HttpConfig {
    /// The HTTPS certificate and key files, when TLS is configured.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        (!self.tls_cert_file.is_empty()).then(|| {
            (
                Path::new(&self.tls_cert_file),
                Path::new(&self.tls_key_file),
            )
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("read_timeout_ms", self.read_timeout_ms),
            ("write_timeout_ms", self.write_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ] {
            if value == 0 || value > HTTP_TIMEOUT_MS_MAX {
                return Err(ConfigError::Invalid(format!(
                    "http.{name} must be between 1 and {HTTP_TIMEOUT_MS_MAX}, got {value}"
                )));
            }
        }
        let connections = self.max_connections;
        if connections == 0 || connections > HTTP_MAX_CONNECTIONS_MAX {
            return Err(ConfigError::Invalid(format!(
                "http.max_connections must be between 1 and {HTTP_MAX_CONNECTIONS_MAX}, got {connections}"
            )));
        }
        if self.tls_cert_file.is_empty() != self.tls_key_file.is_empty() {
            return Err(ConfigError::Invalid(
                "http.tls_cert_file and http.tls_key_file go together: both or neither \
                 (NARAD_HTTP_TLS_CERT_FILE, NARAD_HTTP_TLS_KEY_FILE)"
                    .to_string(),
            ));
        }
        Ok(())
    }
}

impl Config {
    fn check_cluster(&self) -> Result<(), ConfigError> {
        let cluster = &self.cluster;
        let peers = cluster.peer_map()?;
        if cluster.max_moves_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "cluster.max_moves_in_flight must be at least 1".to_string(),
            ));
        }
        if peers.is_empty() {
            return Ok(());
        }
        if self.dev {
            return Err(ConfigError::Invalid(
                "--dev is a single node: unset cluster.peers (NARAD_CLUSTER_PEERS)".to_string(),
            ));
        }
        cluster.socket_addr()?;
        let tls_files = [
            &cluster.tls_cert_file,
            &cluster.tls_key_file,
            &cluster.tls_ca_file,
        ];
        let given = tls_files.iter().filter(|file| !file.is_empty()).count();
        if given != 0 && given != tls_files.len() {
            return Err(ConfigError::Invalid(
                "cluster.tls_cert_file, tls_key_file and tls_ca_file go together: all or none"
                    .to_string(),
            ));
        }
        match &cluster.secret {
            Some(secret) if !secret.is_empty() => {}
            Some(_) | None => {
                return Err(ConfigError::Invalid(
                    "cluster.peers is set, so NARAD_CLUSTER_SECRET must be set (environment only)"
                        .to_string(),
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::*;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    move |key| map.get(key).cloned()
}

fn dev_flags() -> FlagOverrides {
    FlagOverrides {
        dev: true,
        ..FlagOverrides::default()
    }
}

fn with_file(text: &str) -> (tempfile::TempDir, FlagOverrides) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("narad.toml");
    std::fs::write(&path, text).unwrap();
    let flags = FlagOverrides {
        config: Some(path),
        ..dev_flags()
    };
    (dir, flags)
}

#[test]
fn dev_mode_uses_the_embedded_defaults() {
    let config = Config::load(&dev_flags(), &env_of(&[])).unwrap();
    assert_eq!(config.http.addr, "127.0.0.1:7942");
    assert_eq!(config.storage.data_dir, PathBuf::from("./narad-data"));
    assert!(!config.storage.ingress_wal_prealloc);
    assert_eq!(config.storage.partition_prealloc_bytes, 1024 * 1024);
    assert!(config.storage.owner_journal);
    assert_eq!(config.storage.owner_journal_commit_delay_us, 1_000);
    assert_eq!(config.storage.ingress_wal_sync_interval_ms, 10);
    assert_eq!(config.storage.ingress_wal_commit_delay_us, 1_000);
    assert_eq!(config.cluster.node_id, 1);
    assert_eq!(config.log.format, LogFormat::Json);
    assert!(config.dev);
    assert!(!config.security.enabled);
}

#[test]
fn file_then_env_then_flags_take_precedence() {
    let (_dir, mut flags) = with_file(
            "[http]\naddr = \"127.0.0.1:1\"\n[storage]\ndata_dir = \"/file\"\n\
             ingress_wal_sync_interval_ms = 20\ningress_wal_prealloc = true\n\
             ingress_wal_commit_delay_us = 300\npartition_prealloc_bytes = 4096\n[log]\nlevel = \"debug\"\n",
        );
    let env = env_of(&[
        ("NARAD_HTTP_ADDR", "127.0.0.1:2"),
        ("NARAD_DATA_DIR", "/env"),
        ("NARAD_STORAGE_PARTITION_PREALLOC_BYTES", "0"),
        ("NARAD_STORAGE_OWNER_JOURNAL", "false"),
        ("NARAD_LOG_FORMAT", "text"),
    ]);
    let config = Config::load(&flags, &env).unwrap();
    assert_eq!(config.http.addr, "127.0.0.1:2");
    assert_eq!(config.storage.data_dir, PathBuf::from("/env"));
    assert_eq!(config.storage.ingress_wal_sync_interval_ms, 20);
    assert_eq!(config.storage.ingress_wal_commit_delay_us, 300);
    assert!(config.storage.ingress_wal_prealloc);
    assert_eq!(config.storage.partition_prealloc_bytes, 0);
    assert!(!config.storage.owner_journal);
    assert_eq!(config.log.level, "debug");
    assert_eq!(config.log.format, LogFormat::Text);

    flags.http_addr = Some("127.0.0.1:3".to_string());
    flags.data_dir = Some(PathBuf::from("/flag"));
    let config = Config::load(&flags, &env).unwrap();
    assert_eq!(config.http.addr, "127.0.0.1:3");
    assert_eq!(config.storage.data_dir, PathBuf::from("/flag"));
}

#[test]
fn unknown_file_keys_are_refused_by_name() {
    let (_dir, flags) = with_file("[storage]\ningress_wal_shards = 4\n");
    let error = Config::load(&flags, &env_of(&[])).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("unknown field `ingress_wal_shards`"),
        "message: {text}"
    );
    assert!(text.contains("narad.toml"), "message: {text}");

    let (_dir, flags) = with_file("colour = \"blue\"\n");
    let text = Config::load(&flags, &env_of(&[])).unwrap_err().to_string();
    assert!(text.contains("unknown field `colour`"), "message: {text}");
}

#[test]
fn a_missing_config_file_is_an_error_naming_it() {
    let flags = FlagOverrides {
        config: Some(PathBuf::from("/nonexistent/narad.toml")),
        ..dev_flags()
    };
    let error = Config::load(&flags, &env_of(&[])).unwrap_err();
    assert!(
        matches!(error, ConfigError::Read { ref path, .. } if path == "/nonexistent/narad.toml")
    );
}

#[test]
fn bad_environment_values_are_refused_by_name() {
    let error = Config::load(
        &dev_flags(),
        &env_of(&[("NARAD_STORAGE_INGRESS_WAL_PREALLOC", "maybe")]),
    )
    .unwrap_err();
    assert_eq!(
        error,
        ConfigError::Env {
            var: "NARAD_STORAGE_INGRESS_WAL_PREALLOC",
            value: "maybe".to_string(),
            reason: "expected true or false".to_string(),
        }
    );
}

#[test]
fn dev_mode_refuses_a_non_loopback_address() {
    let flags = FlagOverrides {
        http_addr: Some("0.0.0.0:7942".to_string()),
        ..dev_flags()
    };
    assert_eq!(
        Config::load(&flags, &env_of(&[])).unwrap_err(),
        ConfigError::Invalid(
            "--dev serves on loopback only, but http.addr is 0.0.0.0:7942".to_string()
        )
    );
}

#[test]
fn without_dev_auth_is_on_unless_switched_off() {
    let config = Config::load(
        &FlagOverrides::default(),
        &env_of(&[("NARAD_ADMIN_PASSWORD", "hunter2hunter2")]),
    )
    .unwrap();
    assert!(config.security.enabled);
    assert_eq!(
        config.security.admin_password.as_deref(),
        Some("hunter2hunter2")
    );
    assert!(!format!("{config:?}").contains("hunter2"));
    let config = Config::load(
        &FlagOverrides::default(),
        &env_of(&[("NARAD_SECURITY_ENABLED", "false")]),
    )
    .unwrap();
    assert!(!config.dev);
    assert!(!config.security.enabled);
}

#[test]
fn sync_interval_is_bounded() {
    for bad in ["0", "1001"] {
        let env = env_of(&[("NARAD_STORAGE_INGRESS_WAL_SYNC_INTERVAL_MS", bad)]);
        assert!(matches!(
            Config::load(&dev_flags(), &env),
            Err(ConfigError::Invalid(_))
        ));
    }
}

#[test]
fn commit_delay_is_settable_off_and_below_the_backstop() {
    let env = env_of(&[("NARAD_STORAGE_INGRESS_WAL_COMMIT_DELAY_US", "0")]);
    let config = Config::load(&dev_flags(), &env).unwrap();
    assert_eq!(config.storage.ingress_wal_commit_delay_us, 0);
    let env = env_of(&[("NARAD_STORAGE_INGRESS_WAL_COMMIT_DELAY_US", "9999")]);
    let config = Config::load(&dev_flags(), &env).unwrap();
    assert_eq!(config.storage.ingress_wal_commit_delay_us, 9_999);
    let env = env_of(&[("NARAD_STORAGE_OWNER_JOURNAL_COMMIT_DELAY_US", "0")]);
    let config = Config::load(&dev_flags(), &env).unwrap();
    assert_eq!(config.storage.owner_journal_commit_delay_us, 0);
    let env = env_of(&[("NARAD_STORAGE_OWNER_JOURNAL_COMMIT_DELAY_US", "5001")]);
    assert_eq!(
        Config::load(&dev_flags(), &env).unwrap_err(),
        ConfigError::Invalid(
            "storage.owner_journal_commit_delay_us must be at most 5000, got 5001".to_string()
        )
    );
    let env = env_of(&[("NARAD_STORAGE_INGRESS_WAL_COMMIT_DELAY_US", "10000")]);
    assert_eq!(
        Config::load(&dev_flags(), &env).unwrap_err(),
        ConfigError::Invalid(
            "storage.ingress_wal_commit_delay_us must be below the backstop \
                 (storage.ingress_wal_sync_interval_ms = 10, so at most 9999), got 10000"
                .to_string()
        )
    );
}

#[test]
fn retention_and_disk_guard_settings_default_to_narad() {
    let config = Config::load(&dev_flags(), &env_of(&[])).unwrap();
    assert_eq!(config.storage.retention_check_interval_ms, 60_000);
    assert_eq!(config.storage.min_free_bytes, None);
    assert_eq!(config.storage.idle_log_eviction_ms, 1_800_000);
    assert_eq!(config.topic.min_retention_ms, 3_600_000);
}

#[test]
fn the_default_free_space_floor_is_1_gib_or_5_percent_where_less() {
    let storage = StorageConfig::default();
    let gib = 1u64 << 30;
    // 5% of 64 MiB is 3.2 MiB; of 20 GiB exactly 1 GiB; of 1 TiB far more than 1 GiB.
    assert_eq!(storage.min_free_bytes_for(64 << 20), (64 << 20) / 20);
    assert_eq!(storage.min_free_bytes_for(20 * gib), gib);
    assert_eq!(storage.min_free_bytes_for(1 << 40), gib);
    assert_eq!(storage.min_free_bytes_for(0), 0);
    let set = StorageConfig {
        min_free_bytes: Some(5),
        ..StorageConfig::default()
    };
    assert_eq!(set.min_free_bytes_for(1 << 40), 5);
}

#[test]
fn retention_and_disk_guard_settings_come_from_the_file_then_the_environment() {
    let (_dir, flags) = with_file(
        "[storage]\nretention_check_interval_ms = 500\nmin_free_bytes = 4096\n\
         idle_log_eviction_ms = 7000\n[topic]\nmin_retention_ms = 2000\n",
    );
    let config = Config::load(&flags, &env_of(&[])).unwrap();
    assert_eq!(config.storage.retention_check_interval_ms, 500);
    assert_eq!(config.storage.min_free_bytes, Some(4096));
    assert_eq!(config.storage.idle_log_eviction_ms, 7_000);
    assert_eq!(config.topic.min_retention_ms, 2_000);
    let env = env_of(&[
        ("NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS", "100"),
        ("NARAD_STORAGE_MIN_FREE_BYTES", "0"),
        ("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "9000"),
        ("NARAD_TOPIC_MIN_RETENTION_MS", "1000"),
    ]);
    let config = Config::load(&flags, &env).unwrap();
    assert_eq!(config.storage.retention_check_interval_ms, 100);
    assert_eq!(config.storage.min_free_bytes, Some(0));
    assert_eq!(config.storage.idle_log_eviction_ms, 9_000);
    assert_eq!(config.topic.min_retention_ms, 1_000);
}

#[test]
fn retention_check_interval_and_minimum_retention_are_bounded() {
    let env = env_of(&[("NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS", "99")]);
    assert_eq!(
        Config::load(&dev_flags(), &env).unwrap_err(),
        ConfigError::Invalid(
            "storage.retention_check_interval_ms must be at least 100, got 99".to_string()
        )
    );
    let env = env_of(&[("NARAD_TOPIC_MIN_RETENTION_MS", "99")]);
    assert_eq!(
        Config::load(&dev_flags(), &env).unwrap_err(),
        ConfigError::Invalid("topic.min_retention_ms must be at least 100, got 99".to_string())
    );
    let env = env_of(&[("NARAD_STORAGE_MIN_FREE_BYTES", "1GiB")]);
    assert!(matches!(
        Config::load(&dev_flags(), &env),
        Err(ConfigError::Env {
            var: "NARAD_STORAGE_MIN_FREE_BYTES",
            ..
        })
    ));
}

#[test]
fn http_timeouts_and_connection_cap_default_to_the_surface() {
    let config = Config::load(&dev_flags(), &env_of(&[])).unwrap();
    assert_eq!(config.http.read_timeout_ms, 10_000);
    assert_eq!(config.http.write_timeout_ms, 30_000);
    assert_eq!(config.http.idle_timeout_ms, 60_000);
    assert_eq!(config.http.max_connections, 4_096);
    assert_eq!(config.http.tls_files(), None);
}

#[test]
fn http_timeouts_and_connection_cap_come_from_the_file_then_the_environment() {
    let (_dir, flags) = with_file(
            "[http]\nread_timeout_ms = 1500\nwrite_timeout_ms = 2500\nidle_timeout_ms = 3500\n\
             max_connections = 50\ntls_cert_file = \"/file/cert.pem\"\ntls_key_file = \"/file/key.pem\"\n",
        );
    let config = Config::load(&flags, &env_of(&[])).unwrap();
    assert_eq!(config.http.read_timeout_ms, 1_500);
    assert_eq!(config.http.write_timeout_ms, 2_500);
    assert_eq!(config.http.idle_timeout_ms, 3_500);
    assert_eq!(config.http.max_connections, 50);
    assert_eq!(
        config.http.tls_files(),
        Some((Path::new("/file/cert.pem"), Path::new("/file/key.pem")))
    );
    let env = env_of(&[
        ("NARAD_HTTP_READ_TIMEOUT_MS", "1000"),
        ("NARAD_HTTP_WRITE_TIMEOUT_MS", "2000"),
        ("NARAD_HTTP_IDLE_TIMEOUT_MS", "3000"),
        ("NARAD_HTTP_MAX_CONNECTIONS", "1"),
        ("NARAD_HTTP_TLS_CERT_FILE", "/env/cert.pem"),
        ("NARAD_HTTP_TLS_KEY_FILE", "/env/key.pem"),
    ]);
    let config = Config::load(&flags, &env).unwrap();
    assert_eq!(
        (
            config.http.read_timeout_ms,
            config.http.write_timeout_ms,
            config.http.idle_timeout_ms,
            config.http.max_connections
        ),
        (1_000, 2_000, 3_000, 1)
    );
    assert_eq!(
        config.http.tls_files(),
        Some((Path::new("/env/cert.pem"), Path::new("/env/key.pem")))
    );
}

#[test]
fn http_timeouts_and_connection_cap_are_bounded() {
    for (var, value, message) in [
        (
            "NARAD_HTTP_READ_TIMEOUT_MS",
            "0",
            "http.read_timeout_ms must be between 1 and 3600000, got 0",
        ),
        (
            "NARAD_HTTP_WRITE_TIMEOUT_MS",
            "3600001",
            "http.write_timeout_ms must be between 1 and 3600000, got 3600001",
        ),
        (
            "NARAD_HTTP_IDLE_TIMEOUT_MS",
            "0",
            "http.idle_timeout_ms must be between 1 and 3600000, got 0",
        ),
        (
            "NARAD_HTTP_MAX_CONNECTIONS",
            "0",
            "http.max_connections must be between 1 and 1000000, got 0",
        ),
    ] {
        assert_eq!(
            Config::load(&dev_flags(), &env_of(&[(var, value)])).unwrap_err(),
            ConfigError::Invalid(message.to_string()),
            "{var}={value}"
        );
    }
    let error = Config::load(
        &dev_flags(),
        &env_of(&[("NARAD_HTTP_MAX_CONNECTIONS", "-1")]),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            ConfigError::Env {
                var: "NARAD_HTTP_MAX_CONNECTIONS",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn https_needs_both_the_certificate_and_the_key() {
    for half in ["NARAD_HTTP_TLS_CERT_FILE", "NARAD_HTTP_TLS_KEY_FILE"] {
        let error = Config::load(&dev_flags(), &env_of(&[(half, "/etc/narad/x.pem")])).unwrap_err();
        assert_eq!(
            error,
            ConfigError::Invalid(
                "http.tls_cert_file and http.tls_key_file go together: both or neither \
                     (NARAD_HTTP_TLS_CERT_FILE, NARAD_HTTP_TLS_KEY_FILE)"
                    .to_string()
            ),
            "{half}"
        );
    }
}

#[test]
fn node_id_zero_is_refused() {
    let env = env_of(&[("NARAD_NODE_ID", "0")]);
    assert_eq!(
        Config::load(&dev_flags(), &env).unwrap_err(),
        ConfigError::Invalid("cluster.node_id must not be 0".to_string())
    );
}

#[test]
fn an_unknown_narad_variable_is_refused_by_name() {
    assert_eq!(
        check_env_names([
            "PATH",
            "NARAD_NODE_ID",
            "NARAD_CLUSTER_SECRET",
            "NARAD_FAILPOINTS"
        ]),
        Ok(())
    );
    assert_eq!(
        check_env_names(["NARAD_NODE_ID", "NARAD_CLUSTER_PEER"]),
        Err(ConfigError::UnknownEnv("NARAD_CLUSTER_PEER".to_string()))
    );
}

fn member_env(secret: Option<&str>) -> Vec<(&str, &str)> {
    let mut env = vec![
        ("NARAD_NODE_ID", "2"),
        ("NARAD_CLUSTER_ADDR", "127.0.0.1:7962"),
        (
            "NARAD_CLUSTER_PEERS",
            "1@127.0.0.1:7961, 2@127.0.0.1:7962,3@localhost:7963",
        ),
        ("NARAD_SECURITY_ENABLED", "false"),
    ];
    if let Some(secret) = secret {
        env.push(("NARAD_CLUSTER_SECRET", secret));
    }
    env
}

#[test]
fn a_member_takes_its_peers_and_needs_the_secret() {
    let flags = FlagOverrides::default();
    let config = Config::load(&flags, &env_of(&member_env(Some("s3cret")))).unwrap();
    assert!(config.cluster.is_member());
    assert_eq!(config.cluster.node_id, 2);
    assert_eq!(
        config.cluster.peer_map().unwrap(),
        BTreeMap::from([
            (1, "127.0.0.1:7961".to_string()),
            (2, "127.0.0.1:7962".to_string()),
            (3, "localhost:7963".to_string()),
        ])
    );
    assert!(!format!("{config:?}").contains("s3cret"));
    let error = Config::load(&flags, &env_of(&member_env(None))).unwrap_err();
    assert!(
        error.to_string().contains("NARAD_CLUSTER_SECRET"),
        "{error}"
    );
    let mut bad = member_env(Some("s"));
    bad[2].1 = "1@127.0.0.1:7961,1@127.0.0.1:7962";
    assert!(Config::load(&flags, &env_of(&bad)).is_err());
    bad[2].1 = "x@127.0.0.1:7961";
    assert!(Config::load(&flags, &env_of(&bad)).is_err());
    // The operator CA's files: all or none.
    let mut partial = member_env(Some("s"));
    partial.push(("NARAD_CLUSTER_TLS_CERT_FILE", "/etc/narad/node.pem"));
    let error = Config::load(&flags, &env_of(&partial)).unwrap_err();
    assert!(error.to_string().contains("all or none"), "{error}");
    partial.push(("NARAD_CLUSTER_TLS_KEY_FILE", "/etc/narad/node.key"));
    partial.push(("NARAD_CLUSTER_TLS_CA_FILE", "/etc/narad/ca.pem"));
    let config = Config::load(&flags, &env_of(&partial)).unwrap();
    assert_eq!(
        config
            .cluster
            .operator_tls()
            .map(|(cert, _, ca)| (cert, ca)),
        Some((
            Path::new("/etc/narad/node.pem"),
            Path::new("/etc/narad/ca.pem")
        ))
    );
    // The secret is not a file key.
    let file = Config::from_toml("[cluster]\nsecret = \"s\"\n", Path::new("f.toml"));
    assert!(file.is_err());
}

//! The `narad` command line (clap). `narad serve` runs a node; `narad bench` loads one (see
//! [`crate::bench`]); the client subcommands (`pub`, `sub`, `replay`, `topic`, `cluster`) talk to one
//! over its `/v1` HTTP API (see `crate::client`, not under madsim).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{FlagOverrides, LogFormat};

/// The `narad` binary.
#[derive(Debug, Parser)]
#[command(
    name = "narad",
    version,
    about = "Narad: a durable HTTP message broker"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node.
    Serve(ServeArgs),
    /// Load a running node with produces and report throughput, latency and fsyncs per record.
    Bench(narad_load::BenchArgs),
    /// The client subcommands, at the top level as Narad's CLI has them.
    #[command(flatten)]
    Client(ClientCommand),
}

/// `narad serve` flags. Each overrides the config file and the `NARAD_*` environment.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct ServeArgs {
    /// TOML configuration file (unknown keys are refused).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Development mode: single node, auth off, loopback only.
    #[arg(long)]
    pub dev: bool,
    /// Data directory (default ./narad-data).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address (default 127.0.0.1:7942; port 0 picks a free one and logs it).
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// This node's member id (default 1).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<u32>,
    /// Log filter (`info`, `debug`, `narad_node=debug,info`, ...).
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Log line format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

impl ServeArgs {
    /// The flags as configuration overrides.
    pub fn overrides(&self) -> FlagOverrides {
        FlagOverrides {
            config: self.config.clone(),
            dev: self.dev,
            data_dir: self.data_dir.clone(),
            http_addr: self.http_addr.clone(),
            node_id: self.node_id,
            log_level: self.log_level.clone(),
            log_format: self.log_format,
        }
    }
}

/// The client subcommands: each talks to one node over its `/v1` HTTP API.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Produce a message (or the same one `--count` times) to a topic.
    Pub(PubArgs),
    /// Consume a topic: leased and acked (queue mode), or read from an offset on (`--peek`).
    Sub(SubArgs),
    /// Read a partition's offsets from `--from` up to `--to` (excluded), without leasing them.
    Replay(ReplayArgs),
    /// Create, list, inspect, alter and delete topics.
    Topic(TopicArgs),
    /// Inspect the cluster; move partitions, rebalance, decommission members (admin).
    Cluster(ClusterArgs),
    /// Manage users and their grants (admin).
    User(UserArgs),
}

/// The flags every client subcommand takes: where the node is, who is asking, how to print.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct ClientOpts {
    /// The node's HTTP address (`http://host:port`; `host:port` means http).
    #[arg(
        short = 's',
        long = "server",
        env = "NARAD_ADDR",
        default_value = "http://127.0.0.1:7942",
        value_name = "URL",
        global = true
    )]
    pub server: String,
    /// User name for HTTP Basic auth (none sent without it).
    #[arg(
        short = 'u',
        long,
        env = "NARAD_USER",
        value_name = "USER",
        global = true
    )]
    pub user: Option<String>,
    /// Password for HTTP Basic auth (with `--user`; empty when not given).
    #[arg(
        short = 'p',
        long,
        env = "NARAD_PASS",
        hide_env_values = true,
        value_name = "PASSWORD",
        global = true
    )]
    pub password: Option<String>,
    /// Machine output: one JSON value per result line.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `narad pub` flags.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct PubArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// Topic to produce to.
    pub topic: String,
    /// The message, sent as the raw body; `-` reads all of stdin as one message.
    #[arg(value_name = "MSG|-", conflicts_with = "file")]
    pub message: Option<String>,
    /// Message key: picks the partition (FNV-1a of the key); none means round-robin.
    #[arg(short = 'k', long, value_name = "KEY")]
    pub key: Option<String>,
    /// Partition to produce to, instead of the key's.
    #[arg(long, value_name = "P")]
    pub partition: Option<u32>,
    /// Send this file's bytes as the message.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Send the message this many times.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// At most this many messages per second.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: Option<u32>,
}

/// `narad sub` flags.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct SubArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// Topic to consume.
    pub topic: String,
    /// Read without leasing or acking, from `--from` (default: the high watermark) on.
    #[arg(long)]
    pub peek: bool,
    /// Only this partition (every partition without it).
    #[arg(long, value_name = "P")]
    pub partition: Option<u32>,
    /// With `--peek`: the first offset to read (needs `--partition`).
    #[arg(long, value_name = "OFFSET", requires = "peek", requires = "partition")]
    pub from: Option<u64>,
    /// Print only each payload's bytes (base64 payloads decoded), one per line.
    #[arg(long)]
    pub raw: bool,
    /// Queue mode: leave the messages unacked (redelivered when their lease times out).
    #[arg(long, conflicts_with = "peek")]
    pub no_ack: bool,
    /// Stop after this many messages (default: run until interrupted).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

/// `narad replay` flags.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct ReplayArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// Topic to read.
    pub topic: String,
    /// Partition to read.
    #[arg(long, value_name = "P")]
    pub partition: u32,
    /// First offset to read.
    #[arg(long, value_name = "OFFSET", default_value_t = 0)]
    pub from: u64,
    /// Offset to stop before (default: the partition's high watermark at start).
    #[arg(long, value_name = "OFFSET")]
    pub to: Option<u64>,
    /// Print only each payload's bytes (base64 payloads decoded), one per line.
    #[arg(long)]
    pub raw: bool,
}

/// `narad topic` and its subcommand.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct TopicArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: TopicCommand,
}

/// `narad topic` subcommands.
#[derive(Debug, Subcommand, Clone, PartialEq, Eq)]
pub enum TopicCommand {
    /// Create a topic.
    Add(TopicAddArgs),
    /// List every topic.
    Ls(TopicLsArgs),
    /// Show a topic and its partitions.
    Info {
        /// Topic name.
        name: String,
    },
    /// Alter a topic (partitions can only grow).
    Edit(TopicEditArgs),
    /// Delete a topic and its messages.
    Rm {
        /// Topic name.
        name: String,
    },
}

/// `narad topic add` flags. Every value left out takes the node's default.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct TopicAddArgs {
    /// Topic name (`[A-Za-z0-9._-]`, up to 255).
    pub name: String,
    /// Partition count (3 to 108; default 3).
    #[arg(long, value_name = "N")]
    pub partitions: Option<u32>,
    /// How long messages are kept (`7d`, `2h`, `90m`, `30s`, `500ms`; a bare number is ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub retention: Option<u64>,
    /// Bytes of its newest messages each partition keeps at least, older ones going past it
    /// (`10GiB`, `512MiB`, `2GB`; a bare number is bytes; 0: no bound; else at least 1MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_bytes)]
    pub retention_bytes: Option<u64>,
    /// Queue-mode lease length (a duration as for `--retention`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub visibility: Option<u64>,
    /// Most messages leased at once per partition.
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u32>,
    /// Most messages acked ahead of the oldest unacked one per partition.
    #[arg(long, value_name = "N")]
    pub max_acked_ahead: Option<u32>,
}

/// `narad topic ls` flags.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct TopicLsArgs {
    /// Topics asked for per request (the listing follows every page).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
}

/// `narad topic edit` flags: at least one.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct TopicEditArgs {
    /// Topic name.
    pub name: String,
    /// New partition count (only growing).
    #[arg(long, value_name = "N")]
    pub partitions: Option<u32>,
    /// How long messages are kept (a duration as for `topic add --retention`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub retention: Option<u64>,
    /// Bytes each partition keeps at least (a size as for `topic add --retention-bytes`; 0: no
    /// bound).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_bytes)]
    pub retention_bytes: Option<u64>,
    /// Most messages leased at once per partition (0: the default).
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u32>,
    /// Most messages acked ahead of the oldest unacked one per partition (0: the default).
    #[arg(long, value_name = "N")]
    pub max_acked_ahead: Option<u32>,
}

/// `narad cluster` and its subcommand.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct ClusterArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// `narad user` and its subcommand.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct UserArgs {
    /// Connection and output.
    #[command(flatten)]
    pub client: ClientOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: UserCommand,
}

/// `narad user` subcommands.
#[derive(Debug, Subcommand, Clone, PartialEq, Eq)]
pub enum UserCommand {
    /// Create a user.
    Add {
        /// Its name (`[A-Za-z0-9._-]`, at most 64 bytes).
        name: String,
        /// Its password (8 to 1024 bytes; `-p` is the caller's).
        #[arg(
            long = "new-password",
            env = "NARAD_NEW_PASSWORD",
            hide_env_values = true
        )]
        new_password: String,
        /// A grant, `ACTION:PATTERN[,PATTERN…]` (`produce:orders-*,audit`) or `admin`; repeatable.
        #[arg(long = "grant", value_name = "GRANT", value_parser = parse_grant)]
        grants: Vec<GrantArg>,
    },
    /// Replace a user's whole grant set (no `--grant`: none).
    Grant {
        /// The user.
        name: String,
        /// A grant, `ACTION:PATTERN[,PATTERN…]` or `admin`; repeatable.
        #[arg(long = "grant", value_name = "GRANT", value_parser = parse_grant)]
        grants: Vec<GrantArg>,
    },
    /// List the users.
    Ls,
    /// Delete a user.
    Rm {
        /// The user.
        name: String,
    },
    /// Change a password: your own with `--current-password`, or another's as an admin.
    Passwd {
        /// The user.
        name: String,
        /// The new password.
        #[arg(
            long = "new-password",
            env = "NARAD_NEW_PASSWORD",
            hide_env_values = true
        )]
        new_password: String,
        /// The current password (changing your own).
        #[arg(long = "current-password")]
        current_password: Option<String>,
    },
}

/// One `--grant`: an action and its patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantArg {
    /// `produce`, `consume`, `create` or `admin`.
    pub action: String,
    /// Topic names or `prefix*` (none for admin).
    pub patterns: Vec<String>,
}

/// Parses `ACTION:PATTERN[,PATTERN…]`, or `admin`.
pub fn parse_grant(text: &str) -> Result<GrantArg, String> {
    let (action, patterns) = text.split_once(':').unwrap_or((text, ""));
    if !matches!(action, "produce" | "consume" | "create" | "admin") {
        return Err(format!(
            "{action:?} is not an action (produce, consume, create or admin)"
        ));
    }
    let patterns: Vec<String> = patterns
        .split(',')
        .filter(|pattern| !pattern.is_empty())
        .map(str::to_string)
        .collect();
    match (action, patterns.is_empty()) {
        ("admin", false) => Err("admin takes no patterns".to_string()),
        ("admin", true) => Ok(GrantArg {
            action: action.to_string(),
            patterns,
        }),
        (_, true) => Err(format!("{action} needs patterns: {action}:orders-*,audit")),
        (_, false) => Ok(GrantArg {
            action: action.to_string(),
            patterns,
        }),
    }
}

/// `narad cluster` subcommands.
#[derive(Debug, Subcommand, Clone, PartialEq, Eq)]
pub enum ClusterCommand {
    /// List the cluster's members.
    Members,
    /// List the partition moves in flight.
    Moves,
    /// Move a partition to another member (`narad cluster moves` follows it).
    Move {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: u32,
        /// The member to move it to (alive, not draining, not its owner).
        #[arg(long, value_name = "ID")]
        to: u32,
    },
    /// Plan the moves that even out the partitions over the members, and print how many.
    Rebalance,
    /// Decommission a member: it drains, its partitions moving to the others.
    Decommission {
        /// Member id.
        id: u32,
        /// Stop draining instead (its moves not yet switched are aborted).
        #[arg(long, conflicts_with = "force")]
        cancel: bool,
        /// Decommission a member marked dead anyway.
        #[arg(long)]
        force: bool,
    },
}

/// A duration flag in milliseconds: digits with an optional unit (`ms`, `s`, `m`, `h`, `d`); bare
/// digits are milliseconds, as the API's `*_ms` fields are.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("unknown unit {unit:?} (use ms, s, m, h or d)")),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 7d, 2h, 30s or 500ms"))?;
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A size flag in bytes: digits with an optional unit, binary (`KiB`, `MiB`, `GiB`, `TiB`) or
/// decimal (`KB`, `MB`, `GB`, `TB`), in any case; bare digits (or `B`) are bytes, as the API's
/// `*_bytes` fields are.
pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let unit = unit.trim();
    let not_a_size = || format!("{text:?} is not a size such as 10GiB, 512MiB or 1048576");
    if number.is_empty() || !unit.bytes().all(|byte| byte.is_ascii_alphabetic()) {
        return Err(not_a_size());
    }
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} (use KiB, MiB, GiB, TiB, KB, MB, GB, TB, or bytes)"
            ))
        }
    };
    let number: u64 = number.parse().map_err(|_| not_a_size())?;
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_dev_command_parses_exactly() {
        let cli = Cli::try_parse_from([
            "narad",
            "serve",
            "--dev",
            "--data-dir",
            "DIR",
            "--http-addr",
            "127.0.0.1:9",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("parsed serve")
        };
        assert_eq!(
            args.overrides(),
            FlagOverrides {
                config: None,
                dev: true,
                data_dir: Some(PathBuf::from("DIR")),
                http_addr: Some("127.0.0.1:9".to_string()),
                node_id: None,
                log_level: None,
                log_format: None,
            }
        );
    }

    #[test]
    fn log_format_takes_json_or_text_only() {
        let parse = |value: &str| {
            Cli::try_parse_from(["narad", "serve", "--log-format", value]).map(|cli| {
                let Command::Serve(args) = cli.command else {
                    panic!("parsed serve")
                };
                args.log_format
            })
        };
        assert_eq!(parse("json").unwrap(), Some(LogFormat::Json));
        assert_eq!(parse("text").unwrap(), Some(LogFormat::Text));
        assert!(parse("xml").is_err());
    }

    #[test]
    fn bench_is_a_subcommand() {
        let cli = Cli::try_parse_from(["narad", "bench", "orders", "--workers", "64"]).unwrap();
        let Command::Bench(args) = cli.command else {
            panic!("parsed bench")
        };
        assert_eq!((args.topic.as_str(), args.workers), ("orders", 64));
    }

    fn client(cli: Cli) -> ClientCommand {
        let Command::Client(command) = cli.command else {
            panic!("parsed a client command")
        };
        command
    }

    #[test]
    fn pub_takes_narads_flags() {
        let parsed = Cli::try_parse_from([
            "narad",
            "pub",
            "orders",
            "hello",
            "-k",
            "customer-42",
            "--partition",
            "2",
            "--count",
            "10",
            "--rate",
            "5",
            "-s",
            "http://10.0.0.1:7942",
            "-u",
            "admin",
            "-p",
            "secret",
            "--json",
        ])
        .unwrap();
        let ClientCommand::Pub(args) = client(parsed) else {
            panic!("parsed pub")
        };
        assert_eq!(
            args,
            PubArgs {
                client: ClientOpts {
                    server: "http://10.0.0.1:7942".to_string(),
                    user: Some("admin".to_string()),
                    password: Some("secret".to_string()),
                    json: true,
                },
                topic: "orders".to_string(),
                message: Some("hello".to_string()),
                key: Some("customer-42".to_string()),
                partition: Some(2),
                file: None,
                count: 10,
                rate: Some(5),
            }
        );
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        assert!(parse(&["narad", "pub", "t", "m", "-f", "F"]).is_err());
        assert!(parse(&["narad", "pub", "t", "m", "--count", "0"]).is_err());
        assert!(parse(&["narad", "pub", "t", "m", "--rate", "0"]).is_err());
    }

    #[test]
    fn sub_and_replay_flags_parse_and_depend() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied()).map(client);
        let Ok(ClientCommand::Sub(sub)) = parse(&[
            "narad",
            "sub",
            "t",
            "--peek",
            "--partition",
            "0",
            "--from",
            "5",
            "--raw",
            "--count",
            "3",
        ]) else {
            panic!("parsed sub")
        };
        assert_eq!(
            (
                sub.peek,
                sub.partition,
                sub.from,
                sub.raw,
                sub.no_ack,
                sub.count
            ),
            (true, Some(0), Some(5), true, false, Some(3))
        );
        // --from belongs to --peek, on one partition; --no-ack to queue mode.
        assert!(parse(&["narad", "sub", "t", "--from", "5", "--partition", "0"]).is_err());
        assert!(parse(&["narad", "sub", "t", "--peek", "--from", "5"]).is_err());
        assert!(parse(&["narad", "sub", "t", "--peek", "--no-ack"]).is_err());

        let Ok(ClientCommand::Replay(replay)) =
            parse(&["narad", "replay", "t", "--partition", "1", "--to", "9"])
        else {
            panic!("parsed replay")
        };
        assert_eq!(
            (replay.partition, replay.from, replay.to, replay.raw),
            (1, 0, Some(9), false)
        );
        assert!(parse(&["narad", "replay", "t"]).is_err());
    }

    #[test]
    fn topic_flags_parse_and_the_global_flags_go_anywhere() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied()).map(client);
        let Ok(ClientCommand::Topic(topic)) = parse(&[
            "narad",
            "topic",
            "-s",
            "h:1",
            "add",
            "orders",
            "--partitions",
            "6",
            "--retention",
            "7d",
            "--retention-bytes",
            "10GiB",
            "--visibility",
            "30s",
            "--json",
        ]) else {
            panic!("parsed topic")
        };
        assert_eq!(
            (topic.client.server.as_str(), topic.client.json),
            ("h:1", true)
        );
        assert_eq!(
            topic.command,
            TopicCommand::Add(TopicAddArgs {
                name: "orders".to_string(),
                partitions: Some(6),
                retention: Some(604_800_000),
                retention_bytes: Some(10 << 30),
                visibility: Some(30_000),
                max_in_flight: None,
                max_acked_ahead: None,
            })
        );
        let Ok(ClientCommand::Topic(topic)) = parse(&["narad", "topic", "ls", "-s", "h:2"]) else {
            panic!("parsed topic ls")
        };
        assert_eq!(
            (topic.client.server.as_str(), topic.command),
            ("h:2", TopicCommand::Ls(TopicLsArgs { limit: 100 }))
        );
        assert!(parse(&["narad", "topic", "ls", "--limit", "1001"]).is_err());
        let error = parse(&["narad", "topic", "edit", "t", "--retention-bytes", "10XB"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("unknown unit \"XB\""), "{error}");
        let Ok(ClientCommand::User(user)) = parse(&[
            "narad",
            "user",
            "add",
            "svc",
            "--new-password",
            "long-enough",
            "--grant",
            "produce:orders-*,audit",
            "--grant",
            "admin",
        ]) else {
            panic!("parsed user add")
        };
        assert_eq!(
            user.command,
            UserCommand::Add {
                name: "svc".to_string(),
                new_password: "long-enough".to_string(),
                grants: vec![
                    GrantArg {
                        action: "produce".to_string(),
                        patterns: vec!["orders-*".to_string(), "audit".to_string()]
                    },
                    GrantArg {
                        action: "admin".to_string(),
                        patterns: vec![]
                    }
                ],
            }
        );
        for bad in ["fly:x", "produce", "produce:", "admin:x"] {
            assert!(parse_grant(bad).is_err(), "{bad}");
        }
        let Ok(ClientCommand::Cluster(cluster)) = parse(&["narad", "cluster", "members"]) else {
            panic!("parsed cluster")
        };
        assert_eq!(cluster.command, ClusterCommand::Members);
    }

    #[test]
    fn cluster_subcommands_parse_and_refuse_what_they_cannot_send() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(args.iter().copied()).map(|cli| {
                let ClientCommand::Cluster(cluster) = client(cli) else {
                    panic!("parsed cluster")
                };
                (cluster.client.json, cluster.command)
            })
        };
        assert_eq!(
            parse(&["narad", "cluster", "moves", "--json"]).unwrap(),
            (true, ClusterCommand::Moves)
        );
        assert_eq!(
            parse(&["narad", "cluster", "rebalance"]).unwrap(),
            (false, ClusterCommand::Rebalance)
        );
        assert_eq!(
            parse(&["narad", "cluster", "move", "orders", "2", "--to", "3"])
                .unwrap()
                .1,
            ClusterCommand::Move {
                topic: "orders".to_string(),
                partition: 2,
                to: 3
            }
        );
        let decommission = |id, cancel, force| ClusterCommand::Decommission { id, cancel, force };
        assert_eq!(
            parse(&["narad", "cluster", "decommission", "4"]).unwrap().1,
            decommission(4, false, false)
        );
        assert_eq!(
            parse(&["narad", "cluster", "decommission", "4", "--cancel"])
                .unwrap()
                .1,
            decommission(4, true, false)
        );
        assert_eq!(
            parse(&["narad", "cluster", "decommission", "--force", "4"])
                .unwrap()
                .1,
            decommission(4, false, true)
        );
        // A move names its destination; ids and partitions are numbers; cancelling forces nothing.
        for bad in [
            &["narad", "cluster", "move", "orders", "2"][..],
            &["narad", "cluster", "move", "orders", "x", "--to", "3"],
            &["narad", "cluster", "move", "orders", "2", "--to", "-1"],
            &["narad", "cluster", "decommission"],
            &["narad", "cluster", "decommission", "four"],
            &[
                "narad",
                "cluster",
                "decommission",
                "4",
                "--cancel",
                "--force",
            ],
            &["narad", "cluster", "rebalance", "now"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_are_milliseconds_or_carry_a_unit() {
        assert_eq!(parse_duration_ms("3600000"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("90m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("d").is_err());
        assert!(parse_duration_ms("1w").is_err());
        assert!(parse_duration_ms("-1s").is_err());
        assert!(parse_duration_ms("99999999999999999999d").is_err());
        assert!(parse_duration_ms("999999999999999d").is_err());
    }

    #[test]
    fn sizes_are_bytes_or_carry_a_binary_or_decimal_unit() {
        assert_eq!(parse_size_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_size_bytes("0"), Ok(0));
        assert_eq!(parse_size_bytes("512B"), Ok(512));
        assert_eq!(parse_size_bytes("4KiB"), Ok(4_096));
        assert_eq!(parse_size_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size_bytes("10gib"), Ok(10 << 30));
        assert_eq!(parse_size_bytes("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size_bytes("3KB"), Ok(3_000));
        assert_eq!(parse_size_bytes("5MB"), Ok(5_000_000));
        assert_eq!(parse_size_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size_bytes("10 GiB"), Ok(10 << 30));
        for bad in ["", "GiB", "-1", "10XB", "10G", "99999999999TiB"] {
            assert!(parse_size_bytes(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_size_bytes("1.5GiB"),
            Err("\"1.5GiB\" is not a size such as 10GiB, 512MiB or 1048576".to_string())
        );
    }
}

//! The `narad` command line (clap). `narad serve` runs a node; other subcommands (the `bench` client)
//! come later.

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
        let Command::Serve(args) = cli.command;
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
                let Command::Serve(args) = cli.command;
                args.log_format
            })
        };
        assert_eq!(parse("json").unwrap(), Some(LogFormat::Json));
        assert_eq!(parse("text").unwrap(), Some(LogFormat::Text));
        assert!(parse("xml").is_err());
    }

    #[test]
    fn there_is_no_bench_subcommand_yet() {
        assert!(Cli::try_parse_from(["narad", "bench"]).is_err());
    }
}
